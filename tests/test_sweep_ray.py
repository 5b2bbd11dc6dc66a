"""Sweeps on Ray: the same rows as local processes, failures named, bad addresses refused.

One local Ray instance (2 CPUs, no dashboard) serves the module; the CLI joins it from a
subprocess by its GCS address, as it would join a cluster.
"""

from __future__ import annotations

import contextlib
import csv
import json
import logging
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from testbed.cli.main import main
from testbed.experiments import sweep, sweep_ray

ROOT = Path(__file__).resolve().parent.parent
QUICKSTART = ROOT / "scenarios" / "quickstart.yaml"
# A small grid of the quickstart: 2 loads x 2 seeds, 2000 requests a point.
GRID = ["--set", "workload.load_erlang=10,20", "--set", "workload.requests=2000",
        "--seeds", "2"]
TIMING = {"wall_s", "requests_per_s"}  # measured, not computed: differ run to run
CLI = "import sys; from testbed.cli.main import main; sys.exit(main(sys.argv[1:]))"


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [*extra.pop("PYTHONPATH_FIRST", "").split(os.pathsep), str(ROOT),
         env.get("PYTHONPATH", "")]).strip(os.pathsep)
    return env | extra


@pytest.fixture(scope="module")
def ray_gcs() -> Iterator[str]:
    """A local Ray instance for the module; yields its GCS address (HOST:PORT)."""
    ray = pytest.importorskip("ray")
    saved = dict(os.environ)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    with sweep_ray.signal_handlers_kept():  # Ray's shutdown resets SIGTERM in the kernel
        sweep_ray.start_local(ray, 2, include_dashboard=False, log_to_driver=False,
                              logging_level=logging.WARNING)
        try:
            yield ray.get_runtime_context().gcs_address
        finally:
            ray.shutdown()
            os.environ.clear()  # ray.init sets RAY_AUTH_MODE=token for this process
            os.environ.update(saved)


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open() as fh:
        return [{k: v for k, v in r.items() if k not in TIMING} for r in csv.DictReader(fh)]


@pytest.mark.slow
def test_ray_sweep_gives_the_local_rows_and_records(ray_gcs: str, tmp_path: Path) -> None:
    local, on_ray = tmp_path / "local", tmp_path / "ray"
    assert main(["sweep", str(QUICKSTART), *GRID, "--jobs", "2", "--records", "--quiet",
                 "--out", str(local)]) == 0
    proc = subprocess.run([sys.executable, "-c", CLI, "sweep", str(QUICKSTART), *GRID,
                           "--ray-address", ray_gcs, "--records", "--out", str(on_ray)],
                          env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    # the progress line counts the points (a bar on a terminal)
    assert "sweep points (4 steps)" in proc.stderr and "2 CPUs" in proc.stderr
    rows = _rows(on_ray / "sweep.csv")
    assert len(rows) == 4 and [r["point"] for r in rows] == ["0", "1", "2", "3"]
    assert rows == _rows(local / "sweep.csv")
    assert (on_ray / "sweep_mean.csv").read_text() == (local / "sweep_mean.csv").read_text()
    executor = json.loads((on_ray / "manifest.json").read_text())["executor"]
    assert executor["kind"] == "ray" and executor["address"] == ray_gcs
    # each point's run directory came back from its task, byte for byte as run locally
    for i in range(4):
        point = f"points/{i:04d}/requests.csv"
        assert (on_ray / point).read_bytes() == (local / point).read_bytes()


@pytest.mark.slow
def test_failing_point_on_ray_is_named_and_others_kept(ray_gcs: str) -> None:
    good = yaml.safe_load(QUICKSTART.read_text())
    good["workload"]["requests"] = 1000
    bad = dict(good, name="")  # fails validation inside the Ray task: an InputError
    points = [({"case": "good"}, good), ({"case": "bad"}, bad),
              ({"case": "good2"}, dict(good, name="other"))]
    finished: list[int] = []
    with pytest.raises(sweep.SweepFailure) as info:
        sweep.run_sweep(points, 2, runner=sweep_ray.RayRunner(),
                        on_done=lambda: finished.append(1))
    err = info.value
    assert "point 1" in str(err) and "'bad'" in str(err) and "name" in str(err)
    assert err.exit_code == 2 and len(err.failures) == 1
    assert [r["point"] for r in err.rows] == [0, 2]
    assert len(finished) == 3  # the progress callback counts failed points too


def test_task_on_a_node_with_other_code_fails_named() -> None:
    row, error, code, files = sweep_ray.run_task((7, {"x": 1}, {}, None), "0" * 64)
    assert row is None and code == 1 and files == {}
    assert error is not None and error.startswith("point 7 {'x': 1}: node ")
    assert "other LightPipe code" in error


class StartsThenFails:
    """Stands in for ray's init/shutdown in start_local: every init starts a child process
    (as Ray's starts its GCS and raylet) and the first `failures` inits then give up as
    Ray does when its raylet does not register within 30 s."""

    def __init__(self, failures: int) -> None:
        self.failures, self.children = failures, []  # type: ignore[var-annotated]

    def init(self, num_cpus: int, **_: object) -> None:
        self.children.append(subprocess.Popen(["sleep", "300"]))
        if len(self.children) <= self.failures:
            raise Exception("The current node timed out during startup. This could happen")

    def shutdown(self) -> None:
        pass


def test_a_local_start_that_times_out_is_ended_and_tried_again(
        caplog: pytest.LogCaptureFixture) -> None:
    ray = StartsThenFails(failures=2)
    try:
        with caplog.at_level(logging.WARNING, logger=sweep_ray.__name__):
            sweep_ray.start_local(ray, 2)
        assert len(ray.children) == 3
        # what each failed attempt started was ended; the instance that came up is kept
        assert [c.wait(timeout=10) for c in ray.children[:2]] == [-15, -15]
        assert ray.children[2].poll() is None
        assert sum("attempt" in r.getMessage() for r in caplog.records) == 2
    finally:
        for c in ray.children:
            c.kill()
            c.wait()


def test_a_local_start_that_never_comes_up_is_one_failure() -> None:
    ray = StartsThenFails(failures=9)
    try:
        with pytest.raises(sweep_ray.RuntimeFailure) as err:
            sweep_ray.start_local(ray, 2, attempts=2)
        assert "cannot start a local Ray instance (2 attempts)" in str(err.value)
        assert len(ray.children) == 2
        assert [c.wait(timeout=10) for c in ray.children] == [-15, -15]
    finally:
        for c in ray.children:
            c.kill()
            c.wait()


@pytest.mark.parametrize("text", ["", "host", "host:0", "host:70000", "host:x",
                                  "ray://host:10001", "a b:1"])
def test_bad_address_forms_exit_2(text: str, tmp_path: Path,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "sw"
    assert main(["sweep", str(QUICKSTART), "--ray-address", text, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--ray-address" in err[0] and "HOST:PORT" in err[0]
    assert not out.exists()
    for ok in ("auto", "local", "10.0.0.1:6379", "[::1]:6379", "head.example:6379"):
        assert sweep_ray.check_address(ok) == ok


def _http_server() -> tuple[socket.socket, int]:
    """A listener that answers any connection as an HTTP/1.1 server would (not gRPC)."""
    srv = socket.create_server(("127.0.0.1", 0))

    srv.settimeout(0.2)  # closing a socket does not wake a blocked accept(): poll

    def serve() -> None:
        while srv.fileno() != -1:
            try:
                conn, _ = srv.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with conn:
                conn.recv(1024)
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")

    threading.Thread(target=serve, daemon=True).start()
    return srv, srv.getsockname()[1]


@pytest.mark.parametrize("kind", ["closed", "http"])
def test_unreachable_address_is_one_line_exit_2_nothing_written(
        kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("ray")
    if kind == "closed":  # bound, not listening: connection refused, and no one else's port
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        port, expect = sock.getsockname()[1], "connection refused"
    else:
        sock, port = _http_server()
        expect = "does not answer as a Ray GCS port"
    out = tmp_path / "sw"
    try:
        code = main(["sweep", str(QUICKSTART), "--ray-address", f"127.0.0.1:{port}",
                     "--quiet", "--out", str(out)])
    finally:
        sock.close()
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and expect in err[0] and f"127.0.0.1:{port}" in err[0], err
    assert list(tmp_path.iterdir()) == []  # no output, no staging directory


def test_without_ray_one_line_exit_2(tmp_path: Path) -> None:
    """The CLI in a Python where `import ray` fails as when it is not installed."""
    blocker = tmp_path / "site"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text("import sys\nsys.modules['ray'] = None\n")
    out = tmp_path / "sw"
    proc = subprocess.run([sys.executable, "-c", CLI, "sweep", str(QUICKSTART),
                           "--ray-address", "local", "--out", str(out)],
                          env=_env(PYTHONPATH_FIRST=str(blocker)), capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        "lightpipe: error: --ray-address: ray is not installed: pip install 'lightpipe[ray]'"]
    assert not out.exists()


def test_importing_lightpipe_does_not_import_ray() -> None:
    code = ("import sys, testbed.cli.main, testbed.cli.sweep_cmd, testbed.experiments.sweep, "
            "testbed.experiments.sweep_ray; print('ray' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"


@pytest.mark.slow
def test_two_node_cluster_runs_every_point_on_the_other_node(tmp_path: Path) -> None:
    """A Ray cluster of two nodes (two raylets; here on one machine): the head has no
    CPUs, so every point runs as a task on the worker node and its results travel back
    through the object store; the rows are the local run's."""
    pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    made: list[Cluster] = []

    def two_nodes() -> Cluster:  # Ray gives each raylet a fixed 30 s to register: on a
        # busy 2-core machine (CI of 2026-12-02, three lanes beside it) it can miss them
        made.append(Cluster(initialize_head=True,
                            head_node_args={"num_cpus": 0, "include_dashboard": False}))
        made[-1].add_node(num_cpus=2)
        made[-1].wait_for_nodes()
        return made[-1]

    def undo() -> None:
        if made:
            with contextlib.suppress(Exception):
                made.pop().shutdown()

    cluster = sweep_ray.started_with_retries(two_nodes, undo, "a two-node Ray cluster")
    try:
        local, on_ray = tmp_path / "local", tmp_path / "ray"
        assert main(["sweep", str(QUICKSTART), *GRID, "--jobs", "2", "--quiet",
                     "--out", str(local)]) == 0
        proc = subprocess.run([sys.executable, "-c", CLI, "sweep", str(QUICKSTART), *GRID,
                               "--ray-address", cluster.address, "--out", str(on_ray)],
                              env=_env(), capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        assert _rows(on_ray / "sweep.csv") == _rows(local / "sweep.csv")
        executor = json.loads((on_ray / "manifest.json").read_text())["executor"]
        assert executor["kind"] == "ray" and executor["address"] == cluster.address
        # Every point on the worker node, none on the head; the manifest says so.
        ran = executor["points_by_node"]
        assert [r["node_id"] for r in ran] == [cluster.list_all_nodes()[1].node_id], ran
        assert ran[0]["points"] == len(_rows(local / "sweep.csv")) and ran[0]["address"]
    finally:
        cluster.shutdown()
