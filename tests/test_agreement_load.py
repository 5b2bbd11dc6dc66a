"""A calibration scenario under CPU load (root): the agreement holds, or the run says it
is unreliable and why (issue 16: "agreement that holds")."""

from __future__ import annotations

import json
import multiprocessing
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import SCENARIOS
from tests.test_controller_ovs import _why_skip

pytestmark = [pytest.mark.root, pytest.mark.slow]

AGREEMENT_TOLERANCE = 0.05  # every job, median of 20 measured iterations


def _spin() -> None:  # one core busy for as long as the process lives
    while True:
        pass


@pytest.mark.timeout(900)
def test_calibration_under_one_busy_core_agrees_or_is_flagged(tmp_path: Path) -> None:
    why = _why_skip()
    if why:
        pytest.skip(why)
    out = tmp_path / "run"
    spinner = multiprocessing.get_context("spawn").Process(target=_spin, daemon=True)
    spinner.start()
    try:
        r = subprocess.run([str(Path(sys.executable).parent / "lightpipe"), "run",
                            str(SCENARIOS / "calib-latency-1f1b.yaml"), "--backend", "both",
                            "--out", str(out), "-q"],
                           capture_output=True, text=True, timeout=840, cwd=SCENARIOS.parent)
    finally:
        spinner.kill()
        spinner.join(5)
    assert r.returncode == 0, r.stderr[-2000:]
    summary = json.loads((out / "emu" / "summary.json").read_text())
    verdict = summary["agreement_verdict"]
    rows = summary["agreement"]
    assert verdict["jobs_measured"] == len(rows) == 2
    assert all(row["iterations_measured"] >= 20 for row in rows)
    assert verdict["host"]["busy_frac"] > 0.4  # the spinner's core was busy
    table = (out / "agreement.md").read_text()
    if verdict["reliable"]:
        assert verdict["worst_relative_error"] <= AGREEMENT_TOLERANCE, (verdict, table)
        assert "UNRELIABLE" not in table
    else:
        assert verdict["reasons"], verdict
        assert "UNRELIABLE" in table and verdict["reasons"][0] in table
    for row in rows:
        assert row["relative_error_p10"] <= row["relative_error_p90"]
        assert 0.0 < row["cpu_share_median"] <= 1.5
