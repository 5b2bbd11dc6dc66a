"""Training through a known outage, emulated (root, slow): scenarios/fault-outage.yaml
(one 2-stage job across two DCs joined by one fibre, static forwarding, the fibre cut
for 300 ms). The job's stall, measured from the workers' iteration times, is within
max(10 %, 20 ms) of the simulator's prediction for the same outage; with the collective
time-out below the stall, `fail` ends the job with gloo's time-out and `retry` restarts
its process group and redoes the interrupted iteration, as the simulator predicts."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from testbed.orchestrate.impact import agreement_band_s

from .test_faults import _skip_reason

ROOT = Path(__file__).resolve().parent.parent
SCENARIO = ROOT / "scenarios" / "fault-outage.yaml"

pytestmark = [pytest.mark.root, pytest.mark.slow, pytest.mark.timeout(600)]


def _emulate(tmp_path: Path, variant: dict[str, Any] | None = None) -> tuple[dict, Path]:
    why = _skip_reason()
    if why:
        pytest.skip(why)
    from testbed.emu.outage import run_emulation

    spec = SCENARIO
    if variant is not None:
        spec = tmp_path / "scenario.yaml"
        spec.write_text(yaml.safe_dump(variant, sort_keys=False))
    out = tmp_path / "run"
    os.environ.setdefault("LIGHTPIPE_MONITOR_DIR", str(tmp_path / "monitor"))
    return run_emulation(spec, out, timeout_s=500), out


def _hit_row(summary: dict[str, Any]) -> dict[str, Any]:
    (row,) = [r for r in summary["fault_impact"] if r["hit"]]
    return row


def _agreement(summary: dict[str, Any]) -> dict[str, Any]:
    (row,) = summary["fault_agreement"]["rows"]
    return row


def test_a_known_outage_stalls_the_job_as_the_simulator_predicts(tmp_path: Path) -> None:
    summary, out = _emulate(tmp_path)
    cut, repair = summary["faults"]
    assert cut["applied"] and cut["via"] == "data_plane" and repair["applied"]
    assert (repair["monotonic_s"] - cut["monotonic_s"]) / 10 == pytest.approx(0.3, abs=0.01)
    row = _hit_row(summary)
    assert (row["job"], row["event"], row["kind"], row["source"]) == ("job0", 0, "fiber_cut",
                                                                      "emu")
    assert row["survived"] and row["error"] is None and row["restarts"] == 0
    assert row["outage_s"] == pytest.approx(0.3, abs=0.01)
    # TCP's back-off makes the stall longer than the outage (the simulator's model)
    assert row["stall_s"] > row["outage_s"]
    assert row["recovery_s"] is not None and row["recovery_s"] >= row["stall_s"]
    agree = _agreement(summary)
    assert agree["emu_stall_s"] == row["stall_s"]
    band = agreement_band_s(agree["sim_stall_s"])
    assert abs(agree["emu_stall_s"] - agree["sim_stall_s"]) <= band, agree
    assert agree["within"] and agree["same_outcome"]
    # the workers used the scenario's time-out: 2 s x time_factor 10
    starts = [json.loads(line) for p in sorted((out / "workers" / "job0").glob("stage*.jsonl"))
              for line in p.read_text().splitlines() if '"start"' in line]
    assert {s["collective"]["timeout_ms"] for s in starts} == {20000}
    with open(out / "fault_iterations.csv", encoding="utf-8", newline="") as fh:
        its = [r for r in csv.DictReader(fh) if r["event"] == "0"]
    longest = max(float(r["iteration_time_s"]) for r in its)
    assert longest == pytest.approx(row["stall_s"] + row["steady_iteration_s"], rel=0.01)


def _short_timeout(on_fault: str) -> dict[str, Any]:
    from testbed.emu.outage import outage_variant

    base = yaml.safe_load(SCENARIO.read_text())
    # 0.4 s: above the outage (0.3 s) but below TCP's resume (~0.62 s)
    return outage_variant(base, 0.3, collective_timeout_s=0.4, on_fault=on_fault,
                          restart_s=0.1)


def test_a_time_out_below_the_stall_fails_the_job_naming_it(tmp_path: Path) -> None:
    summary, _out = _emulate(tmp_path, _short_timeout("fail"))
    (job,) = summary["worker_jobs"]
    assert not job["ok"] and "Timed out waiting 4000ms" in job["failure"], job["failure"]
    row = _hit_row(summary)
    assert not row["survived"] and "Timed out waiting 4000ms" in row["error"]
    assert row["failed_at_s"] - row["applied_at_s"] >= 0.4 - 0.02  # the time-out, from the cut
    agree = _agreement(summary)
    assert agree["same_outcome"] and agree["sim_survived"] is False, agree


def test_retry_restarts_the_group_and_the_job_lives(tmp_path: Path) -> None:
    summary, out = _emulate(tmp_path, _short_timeout("retry"))
    (job,) = summary["worker_jobs"]
    assert job["ok"], job["failure"]
    row = _hit_row(summary)
    assert row["survived"] and row["restarts"] == 1
    # the restart came after the time-out: the stall is more than it
    assert row["stall_s"] >= 0.4
    records = [json.loads(line) for p in sorted((out / "workers" / "job0").glob("stage*.jsonl"))
               for line in p.read_text().splitlines()]
    faults = [r for r in records if r["type"] == "fault"]
    assert faults and all("Timed out waiting 4000ms" in r["error"]
                          or "closed by peer" in r["error"].lower() for r in faults)
    assert len({r["iteration"] for r in records if r["type"] == "restart"}) == 1
    agree = _agreement(summary)
    assert agree["sim_survived"] is True and agree["same_outcome"], agree
