"""Per-boundary message excess (testbed.metrics.transfers): zero on the simulator's own
timeline, for every schedule without interleaving; a delay added on one boundary is found
there, in scenario time, and nowhere else."""

from __future__ import annotations

from typing import Any

import pytest

from testbed.metrics.transfers import transfer_excess
from testbed.schedule import Hop, PipelineProblem, build_schedule, time_schedule

FACTOR = 2.5


def _problem() -> PipelineProblem:
    # a lightpath (12 ms, 2 Gb/s: 8 ms a message, longer than an op, so messages queue),
    # a boundary inside a DC, another lightpath
    return PipelineProblem((3.0, 4.0, 3.0, 5.0), (6.0, 7.0, 6.0, 8.0),
                           (Hop(12.0, 2.0), Hop(0.005, 400.0), Hop(7.0, 4.0)), 2.0, 6)


def _records(problem: PipelineProblem, name: str, iterations: int = 3,
             late_ms: dict[tuple[int, str], float] | None = None
             ) -> tuple[list[list[dict[str, Any]]], Any]:
    """Worker records as the simulator's timeline would write them at FACTOR (emulated
    seconds), the receiver waiting from its previous op's end whenever its input came
    after it; `late_ms[(receiving stage, kind)]` delays those arrivals (emulated ms)."""
    sched = build_schedule(name, problem)
    timing = time_schedule(problem, sched)
    late_ms = late_ms or {}
    period_ms = timing.iteration_time_ms * 3
    out: list[list[dict[str, Any]]] = [[{"type": "start"}] for _ in range(problem.stages)]
    for it in range(iterations):
        t0 = it * period_ms
        for stage in range(problem.stages):
            prev_end = t0
            ops, waits = [], []
            for rec in (r for r in timing.ops if r.stage == stage):
                start, end = t0 + rec.start_ms, t0 + rec.end_ms
                kind = {"F": "act", "B": "grad", "I": "grad"}.get(rec.action.kind)
                extra = late_ms.get((stage, kind or ""), 0.0) / FACTOR
                needs = (rec.action.kind == "F" and stage > 0) or (
                    rec.action.kind in ("B", "I") and stage < problem.stages - 1)
                if needs and start > prev_end + 1e-9:
                    waits.append((str(rec.action), prev_end * FACTOR / 1e3,
                                  (start + extra) * FACTOR / 1e3))
                ops.append((str(rec.action), start * FACTOR / 1e3, end * FACTOR / 1e3))
                prev_end = end
            out[stage].append({"type": "iteration", "iteration": it, "warmup": it == 0,
                               "ops": ops, "waits": waits})
    return out, sched


@pytest.mark.parametrize("name", ["gpipe", "1f1b", "zb-h1", "crosspipe-greedy"])
def test_the_simulators_own_timeline_has_no_excess(name: str) -> None:
    prob = _problem()
    records, sched = _records(prob, name)
    got = transfer_excess(records, prob, sched.actions, FACTOR, ["a", "b", "b", "c"])
    assert got["iterations"] == 2  # the warm-up left out
    rows = got["boundaries"]
    assert [(r["boundary"], r["direction"]) for r in rows] == [
        (0, "act"), (0, "grad"), (1, "act"), (1, "grad"), (2, "act"), (2, "grad")]
    assert sum(r["seen"] for r in rows) > 0
    for r in rows:
        assert r["messages"] == 2 * prob.microbatches
        if r["seen"]:
            assert abs(r["excess_ms_max"]) < 1e-6 and abs(r["excess_ms_median"]) < 1e-6, r
    assert [r["inside_dc"] for r in rows] == [False, False, True, True, False, False]
    assert rows[0]["model_ms"] == pytest.approx(12.0 + 8 * 2.0 / 2.0)


def test_a_late_boundary_is_found_in_scenario_time() -> None:
    prob = _problem()
    # stage 2's activations arrive 1.5 emulated ms late: 0.6 scenario ms at 2.5
    records, sched = _records(prob, "gpipe", late_ms={(2, "act"): 1.5})
    rows = {(r["boundary"], r["direction"]): r
            for r in transfer_excess(records, prob, sched.actions, FACTOR)["boundaries"]}
    late = rows[(1, "act")]
    assert late["seen"] > 0
    assert late["excess_ms_median"] == pytest.approx(0.6)
    assert late["excess_ms_max"] == pytest.approx(0.6)
    for key, r in rows.items():
        if key != (1, "act") and r["seen"]:
            assert abs(r["excess_ms_max"]) < 1e-6, (key, r)
    assert "dcs" not in late  # no DCs given


def test_what_cannot_be_compared_says_why() -> None:
    prob = _problem()
    records, sched = _records(prob, "1f1b")
    assert "interleaved" in transfer_excess(records, prob, sched.actions, FACTOR,
                                            virtual_stages=2)["skipped"]
    assert "machines" in transfer_excess(records, prob, sched.actions, FACTOR,
                                         one_clock=False)["skipped"]
    assert "skipped" in transfer_excess(records[:2], prob, sched.actions, FACTOR)
    with pytest.raises(ValueError, match="time_factor"):
        transfer_excess(records, prob, sched.actions, 0.0)
    # a stage that never got past its warm-up: no iteration in common, nothing seen
    cut = [list(s) for s in records]
    cut[3] = cut[3][:2]
    got = transfer_excess(cut, prob, sched.actions, FACTOR)
    assert got["iterations"] == 0 and all(r["seen"] == 0 for r in got["boundaries"])
