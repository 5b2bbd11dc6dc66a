"""Soak, the CI version (root): 5 emulation runs in a row leave nothing behind.

bench/bench_soak.py runs `lightpipe emu` (network, controller, Prometheus, calibration,
verification, 20 replayed requests, a fibre cut and repair, teardown) again and again
and counts what its runs hold after each (testbed.emu.census, scoped to its own runs).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml

from tests.ctl_ring import why_skip as _why_skip
from tests.waiting import wait_until

pytestmark = [pytest.mark.root, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[1]
RUNS = 5


def test_five_runs_in_a_row_leave_nothing_behind(tmp_path: Path) -> None:
    why = _why_skip()
    if why:
        pytest.skip(why)
    out = tmp_path / "soak.json"
    r = subprocess.run([sys.executable, str(REPO / "bench" / "bench_soak.py"), "--runs",
                        str(RUNS), "--json", str(out)], capture_output=True, text=True,
                       timeout=900, check=False)
    assert out.exists(), r.stdout[-3000:] + r.stderr[-3000:]
    data = json.loads(out.read_text())
    runs = data["runs"]
    assert len(runs) == RUNS
    assert [x["rc"] for x in runs] == [0] * RUNS, [x["error"] for x in runs]
    assert all(x["leaks"] == {} for x in runs), [x["leaks"] for x in runs]
    before = data["before"]
    # Nothing of a run survives it: exact counts as before the first. The census counts
    # only the soak's own runs (make test runs other emulations beside it), so the file
    # descriptors and memory are those its processes hold: none once they are gone. The
    # machine-wide handles and memory are the benchmark's (bench_soak.py --machine-wide,
    # on an idle machine).
    for x in runs:
        for key in ("netns", "ns_processes", "processes", "veths", "ovs_bridges",
                    "state_dirs", "open_files", "mem_used_mb"):
            assert x["census"][key] == before[key], (x["run"], key, x["census"], before)
    assert r.returncode == 0, r.stdout[-3000:]


def test_scoped_census_sees_a_live_run_and_nothing_of_anothers(tmp_path: Path) -> None:
    """The soak's scope counts its own held run (namespaces, processes in them, veths,
    its state directory), a scope with another tag and prefix counts none of it, and
    after the run the scope is back to zero."""
    why = _why_skip()
    if why:
        pytest.skip(why)
    from testbed.emu.census import TAG_VAR, Scope, take

    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "census", "topology": {"links": [{"u": "A", "v": "B", "length_km": 500}]},
        "dcs": [{"name": "dc-a", "node": "A", "gpus": 8}, {"name": "dc-b", "node": "B", "gpus": 8}],
        "workload": {"kind": "lightpath_requests"},
        "emulation": {"bandwidth_divisor": 10000, "forwarding": "static"}}))
    state, out, tag = tmp_path / "state", tmp_path / "held", uuid.uuid4().hex
    env = {**os.environ, TAG_VAR: tag, "LIGHTPIPE_STATE_DIR": str(state)}
    proc = subprocess.Popen([str(Path(sys.executable).parent / "lightpipe"), "emu", str(spec),
                             "--out", str(out), "--hold", "-q"], env=env, cwd=REPO,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        wait_until((out / "network.json").exists, "the held network to come up",
                   timeout_s=240, interval_s=0.2, alive=lambda: None if proc.poll() is None
                   else f"lightpipe emu --hold exited: {proc.communicate()[1][-2000:]}")
        prefix = json.loads((out / "network.json").read_text())["prefix"]
        mine = take(Scope(tag, frozenset({prefix}), state))
        other = take(Scope(uuid.uuid4().hex, frozenset({"lpzzzz"}), tmp_path / "none"))
    finally:
        proc.send_signal(signal.SIGTERM)
        _stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr
    # 2 hosts + the switch namespace (named after the prefix) and their processes; the
    # veths live inside the run's namespaces (a root-namespace one would be a leak)
    assert mine.netns >= 3 and mine.ns_processes >= 2 and mine.processes >= 3, mine
    assert mine.open_files >= mine.processes and mine.mem_used_mb > 10, mine  # held by them
    assert mine.state_dirs == 1, mine
    assert (other.netns, other.ns_processes, other.processes, other.veths,
            other.ovs_bridges, other.state_dirs) == (0, 0, 0, 0, 0, 0), other
    after = take(Scope(tag, frozenset({prefix}), state))
    assert (after.netns, after.ns_processes, after.processes, after.veths,
            after.state_dirs, after.open_files, after.mem_used_mb) == (0, 0, 0, 0, 0, 0, 0), after
