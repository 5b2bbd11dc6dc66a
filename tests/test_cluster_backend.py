"""The cluster backend (testbed.backends.cluster) without root: registered beside sim and
emu, `lightpipe run --backend cluster` refusing bad input in one line (exit 2), and taking
the path `lightpipe emu --cluster` takes, up to a machine that does not answer (exit 1,
the same lines). A run across real machines is the harness's
(tests/cluster/test_cluster_emu.py)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from testbed.backends import BACKENDS, get_backend
from testbed.backends.cluster import ClusterBackend
from testbed.errors import InputError
from testbed.spec import load_scenario

SCENARIOS = Path(__file__).parent.parent / "scenarios"


def test_the_cluster_backend_is_registered_and_needs_a_cluster_file(tmp_path: Path) -> None:
    assert BACKENDS["cluster"] is ClusterBackend
    backend = get_backend("cluster")
    assert backend.name == "cluster"
    ok, why = backend.available()
    assert ok == (shutil.which("ssh") is not None), why
    scenario = load_scenario(SCENARIOS / "quickstart.yaml")
    with pytest.raises(InputError, match="--cluster: the cluster backend needs"):
        backend.run(scenario, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_run_backend_cluster_without_cluster_is_one_line_exit_2(cli: Any, tmp_path: Path
                                                                ) -> None:
    out = tmp_path / "out"
    res = cli("run", str(SCENARIOS / "quickstart.yaml"), "--backend", "cluster",
              "--out", str(out))
    assert res.code == 2, (res.out, res.err)
    assert res.err == ("lightpipe: error: --cluster: --backend cluster needs a cluster file "
                       "(--cluster FILE; docs/cluster.md)\n"), res.err
    assert not out.exists()


def test_cluster_options_only_with_the_cluster_backend(cli: Any, tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("machines:\n  - {name: m1, address: 192.0.2.1}\n")
    spec = str(SCENARIOS / "quickstart.yaml")
    out = str(tmp_path / "out")
    for argv, words in (
            (["--backend", "sim", "--cluster", str(f)], "--cluster: only with --backend "
             "cluster"),
            (["--backend", "emu", "--place", "dc-a=m1"], "--place: only with --backend "
             "cluster"),
            (["--backend", "cluster", "--cluster", str(f), "--place", "dc-a=m9"],
             "--place"),
            (["--backend", "cluster", "--cluster", str(tmp_path / "none.yaml")],
             "none.yaml"),
            ([str(SCENARIOS / "routing-leafspine.yaml"), "--backend", "cluster",
              "--cluster", str(f)], "workload.kind: allreduce_jobs runs in one DC's")):
        given = argv if argv[0].endswith(".yaml") else [spec, *argv]
        res = cli("run", *given, "--out", out)
        assert res.code == 2 and words in res.err and res.err.count("\n") == 1, res.err
    assert not Path(out).exists()


@pytest.mark.skipif(shutil.which("ssh") is None, reason="needs the OpenSSH client")
@pytest.mark.parametrize("auto", [False, True])
def test_run_backend_cluster_takes_the_emu_cluster_path(cli: Any, tmp_path: Path,
                                                        auto: bool) -> None:
    """`run --backend cluster --cluster FILE` (or `--cluster` alone: auto picks it) and
    `emu --cluster FILE` on a machine nobody answers on: the same `cluster up` lines and
    the same one-line error (exit 1), no share anywhere, no finished run."""
    from tests.test_cluster import _free_port

    port = _free_port()  # nothing listens there: a real "connection refused"
    f = tmp_path / "c.yaml"
    f.write_text(f"ssh: {{port: {port}, connect_timeout_s: 3}}\nmachines:\n"
                 "  - {name: near, address: 127.0.0.1}\n")
    spec = str(SCENARIOS / "calib-latency-1f1b.yaml")
    backend = [] if auto else ["--backend", "cluster"]
    ran = cli("run", spec, *backend, "--cluster", str(f), "--out", str(tmp_path / "r"))
    emu = cli("emu", spec, "--cluster", str(f), "--out", str(tmp_path / "e"))
    for res in (ran, emu):
        assert res.code == 1, (res.out, res.err)
        assert "up near (127.0.0.1): unreachable (" in res.out
        assert res.err.startswith("lightpipe: error: machine near (127.0.0.1): unreachable (")
        assert res.err.count("\n") == 1
    assert ran.out.startswith("lightpipe: running the cluster backend")

    def shape(text: str) -> list[str]:  # each run plans under a prefix of its own
        return [re.sub(r"\blp[0-9a-f]{4}\b", "lpXXXX", x) for x in text.splitlines()]

    assert shape(ran.out)[1:] == shape(emu.out)
