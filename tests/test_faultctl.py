"""`lightpipe fault` on a held run: the control channel's protocol over a real Unix socket
(validation with the spec's EventSpec and checks, size and time bounds, busy, socket file
life cycle), a real FaultInjector applying requests now through an in-process controller
(no root), the CLI end to end against a served channel; and one root emulation that holds
a network, cuts and repairs a fibre and kills the controller through the CLI."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from testbed.emu.forwarder import read_reply
from testbed.errors import InputError, RuntimeFailure
from testbed.orchestrate.faultctl import (
    MAX_CLIENTS,
    MAX_REQUEST_BYTES,
    SOCKET_NAME,
    FaultServer,
    parse_request,
    request_fault,
)
from testbed.spec import Scenario, parse_scenario

from .conftest import load_yaml
from .waiting import wait_until

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def quick() -> Scenario:
    return parse_scenario(load_yaml("quickstart.yaml"))


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A directory with a path short enough for a Unix socket (tmp_path may not be)."""
    d = Path(tempfile.mkdtemp(prefix="lpf", dir="/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _line(obj: Any) -> bytes:
    return json.dumps(obj).encode()


# ---- validation (the spec's own model and checks) ----------------------------------------
def test_good_requests_parse_as_events(quick: Scenario) -> None:
    ev = parse_request(_line({"kind": "fiber_cut", "link": [1, 3]}), quick)
    assert ev.kind == "fiber_cut" and ev.link == ["1", "3"] and ev.at_s == 0.0
    ev = parse_request(_line({"kind": "link_flap", "link": ["1", "3"], "period_s": 0.5,
                              "count": 2}), quick)
    assert (ev.period_s, ev.count) == (0.5, 2)
    ev = parse_request(_line({"kind": "controller_kill", "down_s": 1}), quick)
    assert ev.down_s == 1.0


BAD: list[tuple[str, Any, str, str]] = [
    ("unknown-fibre", {"kind": "fiber_cut", "link": ["1", "5"]}, "link", "no fibre 1-5"),
    ("unknown-kind", {"kind": "fibre_cut", "link": ["1", "3"]}, "kind", "fiber_cut"),
    ("missing-count", {"kind": "link_flap", "link": ["1", "3"], "period_s": 1}, "kind",
     "link_flap needs count"),
    ("extra-field", {"kind": "controller_kill", "down_s": 1, "link": ["1", "3"]}, "kind",
     "takes no link"),
    ("zero-down", {"kind": "prometheus_kill", "down_s": 0}, "down_s", "> 0"),
    ("typo", {"kind": "fiber_cut", "lnk": ["1", "3"]}, "lnk", "did you mean link"),
    ("slots-beyond-grid", {"kind": "wavelength_loss", "link": ["1", "3"], "first_slot": 79,
                           "slots": 4}, "slots", "exceed the grid"),
    ("at-s", {"kind": "fiber_cut", "link": ["1", "3"], "at_s": 5}, "at_s", "applies now"),
    ("worker-kill", {"kind": "worker_kill", "job": 0, "stage": 0}, "kind", "held network"),
    ("not-object", ["fiber_cut"], "request", "JSON object"),
]


@pytest.mark.parametrize("case,request_,field,fragment", BAD, ids=[b[0] for b in BAD])
def test_bad_requests_name_the_field(quick: Scenario, case: str, request_: Any, field: str,
                                     fragment: str) -> None:
    with pytest.raises(InputError) as info:
        parse_request(_line(request_), quick)
    assert info.value.path == field, info.value.line()
    assert fragment in info.value.message, info.value.line()


@pytest.mark.parametrize("raw", [b'{"kind": "prometheus_kill", "down_s": NaN}',
                                 b'{"kind": "prometheus_kill", "down_s": Infinity}',
                                 b"\xff\xfe", b"[" * 3000, b"{not json",
                                 b'{"kind": "fiber_cut", "link": [' + b"9" * 4000 + b", 1]}"])
def test_malformed_requests_are_input_errors(quick: Scenario, raw: bytes) -> None:
    with pytest.raises(InputError) as info:
        parse_request(raw, quick)
    assert info.value.path in ("request", "link[0]"), info.value.line()


def test_oversized_request_is_refused_before_parsing(quick: Scenario) -> None:
    with pytest.raises(InputError, match=f"over {MAX_REQUEST_BYTES} bytes"):
        parse_request(b" " * (MAX_REQUEST_BYTES + 1), quick)


# ---- the channel over a real Unix socket -------------------------------------------------
def _refused(ev: Any) -> dict[str, Any]:
    raise AssertionError(f"nothing valid was sent, yet {ev} was applied")


def _raw(path: Path, data: bytes, close_write: bool = True) -> dict[str, Any]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(10)
        s.connect(str(path))
        try:  # a server without a free slot answers "busy" and closes before it reads
            s.sendall(data)
            if close_write:
                s.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            pass
        return read_reply(s)


def test_socket_file_is_private_and_removed(quick: Scenario, short_dir: Path) -> None:
    path = short_dir / SOCKET_NAME
    path.touch()  # not a socket: never removed or reused
    with pytest.raises(RuntimeFailure, match="not a socket"):
        FaultServer(path, quick, _refused)
    path.unlink()
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(path))  # a dead run's socket file at the same place: replaced
    stale.close()
    with FaultServer(path, quick, _refused) as server:
        st = os.lstat(path)
        assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600
        assert st.st_uid == os.geteuid()
        assert sorted(p.name for p in short_dir.iterdir()) == [SOCKET_NAME]  # no temp dir
        reply = _raw(path, b'{"kind": "fiber_cut", "link": ["1", "5"]}\n')
        assert reply == {"ok": False, "error": {"type": "input", "field": "link",
                         "message": "no fibre 1-5 in topology nsfnet"}}
        assert server.served == 0
    assert not path.exists()
    with pytest.raises(RuntimeFailure, match="gone"):
        request_fault(path, {"kind": "fiber_cut", "link": ["1", "3"]}, timeout_s=5)


def test_size_and_time_bounds(quick: Scenario, short_dir: Path) -> None:
    path = short_dir / SOCKET_NAME
    with FaultServer(path, quick, _refused, read_timeout_s=0.3):
        reply = _raw(path, b"x" * (MAX_REQUEST_BYTES + 10), close_write=False)
        assert reply["error"]["field"] == "request" and "over" in reply["error"]["message"]
        reply = _raw(path, b'{"kind": "fiber_cut"', close_write=False)  # never a newline
        assert "no complete line" in reply["error"]["message"]
        reply = _raw(path, b"")  # connected and closed
        assert reply["error"]["type"] == "input"
        with pytest.raises(InputError) as info:
            request_fault(path, {"kind": "fiber_cut", "link": ["1", "x" * 40]}, 5)
        assert info.value.path == "link[1]"


def test_more_clients_than_slots_are_told_busy(quick: Scenario, short_dir: Path) -> None:
    path = short_dir / SOCKET_NAME
    with FaultServer(path, quick, _refused, read_timeout_s=30), \
            contextlib.ExitStack() as stack:
        idle = []
        for _ in range(MAX_CLIENTS):  # each holds a slot: connected, sends nothing yet
            s = stack.enter_context(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM))
            s.connect(str(path))
            idle.append(s)
        reply = _raw(path, b'{"kind": "controller_kill", "down_s": 1}\n')
        assert reply["error"]["type"] == "busy"
        for s in idle:
            s.shutdown(socket.SHUT_WR)
            assert json.loads(s.makefile("rb").readline())["error"]["type"] == "input"

        def served() -> bool:
            try:
                request_fault(path, {"kind": "nope"}, 30)
            except RuntimeFailure as exc:
                assert "already running" in str(exc)
                return False
            except InputError as exc:  # served, and refused (bad kind)
                assert exc.path == "kind"
                return True
            raise AssertionError("a request of kind 'nope' was applied")

        # slots free again once the handlers have answered (was: 100 tries 50 ms apart)
        wait_until(served, "the fault channel's slots to free again")


def test_busy_answer_is_read_even_when_the_run_closed_before_reading(
        short_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run without a free slot answers "busy" and closes without reading: the client's
    send then meets a closed socket (EPIPE, seen under load in the test above), and must
    still read the answer that is waiting for it."""
    import threading

    from testbed.orchestrate import faultctl

    path = short_dir / SOCKET_NAME
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(str(path))
    os.chmod(path, 0o600)
    srv.listen(1)
    closed = threading.Event()

    def answer_busy_and_close() -> None:
        conn, _ = srv.accept()
        with conn:
            faultctl._send(conn, faultctl._error("busy", "", "4 fault requests already "
                                                 "running; try again"))
        closed.set()

    server = threading.Thread(target=answer_busy_and_close, daemon=True)
    server.start()
    real_peer_uid = faultctl.peer_uid

    def peer_uid_after_the_close(sock: socket.socket) -> int:
        uid = real_peer_uid(sock)
        assert closed.wait(30), "the run never answered"
        return uid

    monkeypatch.setattr(faultctl, "peer_uid", peer_uid_after_the_close)
    try:
        with pytest.raises(RuntimeFailure, match="already running"):
            request_fault(path, {"kind": "controller_kill", "down_s": 1}, 30)
    finally:
        server.join(30)
        srv.close()


# ---- a real FaultInjector and an in-process controller (no root) --------------------------
@pytest.fixture
def controller(quick: Scenario, tmp_path: Path) -> Iterator[Any]:
    from controllers.api import RestApi
    from controllers.core import ControllerCore
    from controllers.layout import default_layout
    from controllers.store import Store
    from testbed.orchestrate.ctl_process import rest_call

    api = RestApi(ControllerCore(quick, Store(tmp_path / "s.db"), layout=default_layout(quick)),
                  port=0, token="tok")
    api.serve()

    def client(m: str, p: str, b: Any) -> tuple[int, Any]:
        return rest_call(api.url, m, p, b, "tok", timeout_s=10)

    try:
        yield client
    finally:
        api.close()


def test_requests_are_applied_now_by_the_injector(quick: Scenario, short_dir: Path,
                                                   controller: Any) -> None:
    from testbed.orchestrate.faultctl import apply_timeout_s
    from testbed.orchestrate.faults import FaultInjector

    status, lp = controller("POST", "/lightpaths", {"src_dc": "dc-a", "dst_dc": "dc-b",
                                                    "slots": 2})
    assert status == 201 and lp["nodes"][:2] == ["1", "3"]
    inj = FaultInjector([], scale=1.0, client=controller).start()
    path = short_dir / SOCKET_NAME
    with FaultServer(path, quick, lambda ev: inj.apply_now(ev, apply_timeout_s(ev, 1.0))):
        cut = request_fault(path, {"kind": "fiber_cut", "link": ["1", "3"]}, 30)
        assert cut["applied"] and cut["via"] == "rest" and cut["target"] == "1-3"
        assert cut["lost"] == {"lightpaths": [], "restored": [lp["id"]]}
        status, body = controller("GET", f"/lightpaths/{lp['id']}", None)
        assert status == 200 and body["nodes"][:2] != ["1", "3"]  # re-routed around 1-3
        rep = request_fault(path, {"kind": "fiber_repair", "link": ["3", "1"]}, 30)
        assert rep["applied"] and rep["at_s"] >= cut["at_s"]
        # A flap's steps are planned at once; the answer comes after the last one.
        flap = request_fault(path, {"kind": "link_flap", "link": ["1", "2"],
                                    "period_s": 0.1, "count": 2}, 30)
        assert flap["applied"] and flap["cuts_applied"] == 2 and len(flap["cuts"]) == 2
        assert all("repair_seen_s" in c for c in flap["cuts"])
        ctl = request_fault(path, {"kind": "controller_kill", "down_s": 1}, 30)
        assert not ctl["applied"] and "no SDN controller" in ctl["note"]
        wl = request_fault(path, {"kind": "wavelength_loss", "link": ["1", "3"],
                                  "first_slot": 0, "slots": 2}, 30)
        assert wl["kind"] == "wavelength_loss"  # applied once the injector replays it
    out = inj.stop()
    assert [r["kind"] for r in out["faults"]] == ["fiber_cut", "fiber_repair", "link_flap",
                                                  "controller_kill", "wavelength_loss"]
    assert out["faults"][0]["lost"] == cut["lost"]  # the rows stay in the run's records
    assert [s["kind"] for s in out["events"]][:6] == ["fiber_cut", "fiber_repair"] * 3


# ---- the CLI against a served channel ----------------------------------------------------
@pytest.fixture
def held(quick: Scenario, short_dir: Path, monkeypatch: pytest.MonkeyPatch,
         controller: Any, tmp_path: Path) -> Iterator[Path]:
    """A run state owned by this (live) process, its network.json naming the channel,
    and the channel served by a real injector: what `lightpipe emu --hold` leaves."""
    from testbed.emu.state import new_state
    from testbed.io.atomic import atomic_write_json
    from testbed.orchestrate.faults import FaultInjector

    monkeypatch.setenv("LIGHTPIPE_STATE_DIR", str(short_dir))
    st = new_state("lp" + os.urandom(2).hex())
    path = Path(st.state_dir) / SOCKET_NAME
    out = tmp_path / "held"
    out.mkdir()
    inj = FaultInjector([], scale=1.0, client=controller).start()
    with FaultServer(path, quick, lambda ev: inj.apply_now(ev, 30)):
        atomic_write_json(out / "network.json", {
            "prefix": st.prefix, "state_dir": st.state_dir, "time_factor": 1.0,
            "fault_socket": str(path)})
        yield out
    inj.stop()


def test_cli_prints_the_row_and_names_bad_fields(cli: Any, held: Path,
                                                 controller: Any) -> None:
    status, _lp = controller("POST", "/lightpaths", {"src_dc": "dc-a", "dst_dc": "dc-b",
                                                     "slots": 2})
    assert status == 201
    res = cli("fault", "fiber_cut", "1", "3", "--network", str(held), "--json")
    assert res.code == 0, res.err
    row = json.loads(res.out)
    assert row["kind"] == "fiber_cut" and row["applied"] and row["lost"]["restored"]
    res = cli("fault", "fiber_repair", "1", "3", "--network", str(held))
    assert res.code == 0 and res.out.startswith("fault: fiber_repair 1-3: applied")
    res = cli("fault", "controller_kill", "--network", str(held))  # no controller process
    assert res.code == 1 and "not applied" in res.out and "no SDN controller" in res.out
    for argv, field in ((["fiber_cut", "1", "5"], "U V: no fibre 1-5"),
                        (["link_flap", "1", "3", "--period-s", "-1", "--count", "2"],
                         "--period-s: must be > 0"),
                        (["worker_kill"], "KIND: worker_kill needs running"),
                        (["fibre_cut", "1", "3"], "KIND: unknown fault kind"),
                        (["prometheus_kill", "--down-s", "nan"],
                         "--down-s: must be a finite number")):
        res = cli("fault", *argv, "--network", str(held))
        lines = res.err.strip().splitlines()
        assert res.code == 2 and len(lines) == 1 and field in lines[0], (argv, res.err)


def test_cli_says_when_the_run_is_gone(cli: Any, held: Path, short_dir: Path) -> None:
    net = json.loads((held / "network.json").read_text())
    Path(net["fault_socket"]).unlink()  # the channel closed (the run ending)
    res = cli("fault", "fiber_cut", "1", "3", "--network", str(held))
    assert res.code == 1 and "gone" in res.err
    (Path(net["state_dir"]) / "state.json").unlink()  # torn down
    res = cli("fault", "fiber_cut", "1", "3", "--network", str(held))
    assert res.code == 1 and f"held run {net['prefix']} is gone" in res.err


# ---- root: a held emulation, faults through the CLI --------------------------------------
LIGHTPIPE = [sys.executable, "-c",
             "import sys; from testbed.cli.main import main; sys.exit(main(sys.argv[1:]))"]


def _triangle() -> dict[str, Any]:
    """Two DCs on a triangle: cutting A-B re-routes their lightpath over C."""
    return {"name": "held-faults",
            "topology": {"links": [{"u": "A", "v": "B", "length_km": 400},
                                   {"u": "B", "v": "C", "length_km": 400},
                                   {"u": "A", "v": "C", "length_km": 400}]},
            "optical": {"grid": "flex", "slots": 16, "k_paths": 2},
            "dcs": [{"name": "dc-a", "node": "A", "gpus": 8},
                    {"name": "dc-b", "node": "B", "gpus": 8}],
            "workload": {"kind": "lightpath_requests"},
            "emulation": {"bandwidth_divisor": 10000, "hosts_per_dc": 1,
                          "forwarding": "controller"}}


@pytest.mark.root
@pytest.mark.slow
@pytest.mark.timeout(400)
def test_held_network_takes_faults_from_the_cli(tmp_path: Path) -> None:
    import yaml

    from .test_faults import _skip_reason

    why = _skip_reason()
    if why:
        pytest.skip(why)
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(_triangle()))
    out = tmp_path / "held"
    env = {**os.environ, "PYTHONPATH": str(ROOT),
           "LIGHTPIPE_MONITOR_DIR": str(tmp_path / "monitor")}
    log = open(tmp_path / "hold.log", "w")  # closed in finally
    proc = subprocess.Popen([*LIGHTPIPE, "emu", str(spec), "--out", str(out), "--hold", "-q"],
                            cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=log,
                            stderr=subprocess.STDOUT)

    def fault(*argv: str) -> dict[str, Any]:
        r = subprocess.run([*LIGHTPIPE, "fault", *argv, "--network", str(out), "--json"],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=200)
        assert r.returncode == 0, (argv, r.stdout, r.stderr)
        row: dict[str, Any] = json.loads(r.stdout)
        return row

    try:
        wait_until((out / "network.json").exists, "the held network to come up",
                   timeout_s=240, interval_s=0.2, alive=lambda: None if proc.poll() is None
                   else (tmp_path / "hold.log").read_text()[-3000:])
        net = json.loads((out / "network.json").read_text())
        sock = Path(net["fault_socket"])
        assert stat.S_IMODE(os.lstat(sock).st_mode) == 0o600
        (lp,) = net["lightpaths"]
        assert lp["path"] == ["A", "B"]
        cut = fault("fiber_cut", "A", "B")
        assert cut["via"] == "port_status" and cut["recovery_s"] is not None
        assert cut["lost"]["lightpaths"] == [] and len(cut["lost"]["restored"]) == 1
        rep = fault("fiber_repair", "A", "B")
        assert rep["detection_s"] is not None
        bad = subprocess.run([*LIGHTPIPE, "fault", "fiber_cut", "A", "D", "--network",
                              str(out)], cwd=ROOT, env=env, capture_output=True, text=True)
        assert bad.returncode == 2 and "U V: no fibre A-D" in bad.stderr
        old_pid = net["controller"]["pid"]
        ctl = fault("controller_kill", "--down-s", "1")
        assert ctl["pid_killed"] == old_pid and ctl["pid_restarted"] != old_pid
        assert ctl["lightpaths_before"] == ctl["lightpaths_after"] == ctl["lightpaths_kept"] == 1
        assert ctl["lost"] == {"lightpaths": [], "requests_refused": 0}
        assert ctl["down_wall_s"] >= 1.0
        assert json.loads((out / "network.json").read_text())["controller"]["pid"] == \
            ctl["pid_restarted"]
        # The lightpath stayed on A-C-B after the repair: the restarted controller moves
        # it back onto A-B when A-C goes.
        again = fault("fiber_cut", "A", "C")
        assert again["lost"] == {"lightpaths": [], "restored": cut["lost"]["restored"]}
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=120)
        assert proc.returncode == 0, (tmp_path / "hold.log").read_text()[-3000:]
    finally:
        if proc.poll() is None:  # a failed assertion above: stop it as a user would
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()  # no tear-down: the run's own clean removes what it left
                proc.wait(timeout=30)
                subprocess.run([*LIGHTPIPE, "clean"], cwd=ROOT, env=env,
                               capture_output=True, check=False, timeout=120)
        log.close()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["held"] is True
    assert [(r["kind"], r["source"]) for r in summary["faults"]] == [
        ("fiber_cut", "lightpipe fault"), ("fiber_repair", "lightpipe fault"),
        ("controller_kill", "lightpipe fault"), ("fiber_cut", "lightpipe fault")]
    assert summary["faults"][2]["pid_restarted"] == ctl["pid_restarted"]
    assert "fault_socket" not in json.loads((out / "network.json").read_text())
    assert not sock.exists() and not Path(net["state_dir"]).exists()
    for pid in (old_pid, ctl["pid_restarted"]):
        assert not Path(f"/proc/{pid}").exists()
    res = subprocess.run([*LIGHTPIPE, "fault", "fiber_repair", "A", "B", "--network",
                          str(out)], cwd=ROOT, env=env, capture_output=True, text=True)
    assert res.returncode == 1 and "gone" in res.stderr
