"""Soak, the CI version (root): 5 emulation runs in a row leave nothing behind.

bench/bench_soak.py runs `lightpipe emu` (network, controller, Prometheus, calibration,
verification, 20 replayed requests, a fibre cut and repair, teardown) again and again
and counts what the machine holds after each run (testbed.emu.census).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_controller_ovs import _why_skip

pytestmark = [pytest.mark.root, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[1]
RUNS = 5
OPEN_FILES_SLACK = 500   # machine-wide handles: pytest and its neighbours move it too
MEM_SLACK_MB = 150.0     # page tables, OVS's caches; a leak per run would add up past it


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
    for x in runs:  # nothing of a run survives it: exact counts as before the first
        for key in ("netns", "ns_processes", "veths", "ovs_bridges", "state_dirs"):
            assert x["census"][key] == before[key], (x["run"], key, x["census"], before)
    g = data["growth_first_to_last"]
    assert g["open_files"] <= OPEN_FILES_SLACK and g["mem_used_mb"] <= MEM_SLACK_MB, g
    assert r.returncode == 0, r.stdout[-3000:]
