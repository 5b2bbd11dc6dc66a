"""Workers through a fault, on localhost (no root): a stage frozen (SIGSTOP) past the
collective time-out. `fail`: the job fails naming gloo's time-out; `retry`: the stages
restart their process group, redo the interrupted iteration and finish every planned
one (workloads.faulttol)."""

from __future__ import annotations

import itertools
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from testbed.orchestrate.launch import FaultPolicy, Host, Launcher
from testbed.orchestrate.results import job_iterations, read_records
from testbed.schedule import PipelineProblem, build_schedule
from tests.waiting import scaled, wait_until
from workloads.plan import shadow_plan

LOCAL = Host("local", "127.0.0.1", "lo")
FREEZE_S = 3.0
TIMEOUT_S = 1.0
PLANNED = 20


def _run_frozen(tmp_path: Path, on_fault: str) -> tuple[dict[str, Any], list[list[dict]]]:
    """A 2-stage shadow job; its stage 1 frozen FREEZE_S after 4 iterations."""
    prob = PipelineProblem.uniform(2, 4, 5.0, 10.0, activation_mb=0.01)
    plan = shadow_plan("j0", prob, build_schedule("1f1b", prob), iterations=PLANNED - 1,
                       bandwidth_divisor=1.0, time_factor=1.0, compute="device")
    policy = FaultPolicy(TIMEOUT_S, on_fault, max_restarts=2, restart_s=0.2)
    with Launcher(tmp_path, timeout_s=scaled(60), fault_policy=policy) as la:
        la.start([(plan, [LOCAL, LOCAL])])
        w = la.jobs["j0"].workers[1]
        wait_until(lambda: sum(r.get("type") == "iteration"
                               for r in read_records(w.record_path)) >= 4,
                   "4 iterations of stage 1", timeout_s=scaled(120), interval_s=0.05,
                   alive=lambda: None if w.proc.poll() is None else "stage 1 exited")
        os.kill(w.proc.pid, signal.SIGSTOP)
        try:
            time.sleep(FREEZE_S)
        finally:
            os.kill(w.proc.pid, signal.SIGCONT)
        la.wait(scaled(120))
        return la.outcome()["j0"], la.records()["j0"]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_fail_names_the_collective_time_out(tmp_path: Path) -> None:
    outcome, stages = _run_frozen(tmp_path, "fail")
    assert not outcome["ok"]
    assert "Timed out waiting 1000ms" in outcome["failure"], outcome["failure"]
    starts = [r for st in stages for r in st if r["type"] == "start"]
    assert {s["collective"]["timeout_ms"] for s in starts} == {1000}
    assert all(s["collective"]["on_fault"] == "fail" and s["collective"]["collectives_bounded"]
               for s in starts)
    assert 4 <= len(job_iterations(stages)) < PLANNED  # kept what it finished


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_retry_restarts_the_group_and_finishes_every_iteration(tmp_path: Path) -> None:
    outcome, stages = _run_frozen(tmp_path, "retry")
    assert outcome["ok"], outcome
    its = job_iterations(stages)
    assert [r["iteration"] for r in its] == list(range(PLANNED))
    for st in stages:
        faults = [r for r in st if r["type"] == "fault"]
        restarts = [r for r in st if r["type"] == "restart"]
        (done,) = [r for r in st if r["type"] == "done"]
        assert len(faults) == len(restarts) == done["restarts"] == 1, st[-3:]
        err = faults[0]["error"]
        assert "Timed out waiting 1000ms" in err or "closed by peer" in err.lower(), err
        rs = restarts[0]
        # met again once the frozen stage came back, then the stand-in reload
        assert rs["met_s"] >= rs["fault_s"] and rs["t_s"] - rs["met_s"] >= 0.2 - 1e-3
        after = [r for r in st if r["type"] == "iteration" and r["attempt"] == 1]
        assert after and after[0]["iteration"] == rs["iteration"]
        assert after[0]["redone"] == rs["redo"]
    # the stages agreed where to go on
    assert len({r["iteration"] for st in stages for r in st if r["type"] == "restart"}) == 1
    # the frozen time is in the job's iteration times: one gap of about the freeze
    ends = sorted(max(r["end_s"] for st in stages for r in st
                      if r["type"] == "iteration" and r["iteration"] == i
                      and r.get("attempt") == max(x.get("attempt", 0) for x in st
                                                  if x["type"] == "iteration"
                                                  and x["iteration"] == i))
                  for i in range(PLANNED))
    gaps = [b - a for a, b in itertools.pairwise(ends)]
    assert max(gaps) >= FREEZE_S - 0.5
