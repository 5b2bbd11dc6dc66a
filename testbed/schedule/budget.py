"""Schedules compared at one explicit per-stage HBM byte budget: peaks, fit, the optimum.

The budget is in bytes per GPU (testbed.schedule.memory). `one_f_one_b_budget` is
what 1F1B needs on its most loaded stage, the budget every schedule gets in the
reproductions. `best_fitting` is the fastest heuristic that fits; `optimal` is the
exact CP-SAT schedule over in-order schedules with split backward (I/W), which also
covers every B schedule (`Schedule.split` is never slower and never larger), hinted
with the best fitting heuristic and with the exact unsplit optimum, so it is never
worse than either.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from testbed.errors import InputError
from testbed.schedule.memory import MemoryModel
from testbed.schedule.model import PipelineProblem, Schedule
from testbed.schedule.timer import time_schedule


@dataclass(frozen=True)
class Fitted:
    """A schedule timed on the uncapped problem, with its byte peaks against a budget."""

    schedule: Schedule
    iteration_time_ms: float
    bubble_ratio: float
    peak_bytes: tuple[int, ...]
    fits: bool


def measure(problem: PipelineProblem, memory: MemoryModel, schedule: Schedule,
            budget_bytes: int | Sequence[int] | None) -> Fitted:
    """Time `schedule` (memory cap in micro-batches ignored) and check it against bytes."""
    t = time_schedule(problem.with_memory_cap(None), schedule, record=False)
    peaks = tuple(memory.peak_bytes(schedule))
    fits = True if budget_bytes is None else memory.fits(schedule, budget_bytes)
    return Fitted(schedule, t.iteration_time_ms, t.bubble_ratio, peaks, fits)


def one_f_one_b_peaks(problem: PipelineProblem, memory: MemoryModel) -> list[int]:
    """1F1B's peak bytes per stage (no cap)."""
    from testbed.schedule.classic import one_f_one_b
    return memory.peak_bytes(one_f_one_b(problem.with_memory_cap(None)))


def one_f_one_b_budget(problem: PipelineProblem, memory: MemoryModel) -> int:
    """What 1F1B needs on its most loaded stage: the equal per-GPU budget."""
    return max(one_f_one_b_peaks(problem, memory))


def _candidates(problem: PipelineProblem, memory: MemoryModel,
                budget_bytes: int | Sequence[int] | None) -> list[Schedule]:
    from testbed.schedule.classic import gpipe, one_f_one_b
    from testbed.schedule.geopipe import geopipe
    from testbed.schedule.greedy import best_list_schedule, zero_bubble_caps

    free = problem.with_memory_cap(None)
    capped = free if budget_bytes is None else \
        free.with_memory_cap(memory.microbatch_caps(budget_bytes))
    out = [one_f_one_b(free), gpipe(free), geopipe(free), one_f_one_b(capped),
           geopipe(capped),
           best_list_schedule(capped, name="crosspipe-greedy"),
           best_list_schedule(capped, split_backward=True, name="list-split"),
           best_list_schedule(capped, split_backward=True, caps=zero_bubble_caps(capped),
                              name="zb-h1")]
    return out


def best_fitting(problem: PipelineProblem, memory: MemoryModel,
                 budget_bytes: int | Sequence[int] | None) -> Fitted:
    """The fastest heuristic (1F1B, GPipe, GeoPipe, list schedules, zb-h1) that fits."""
    best: Fitted | None = None
    for sched in _candidates(problem, memory, budget_bytes):
        f = measure(problem, memory, sched, budget_bytes)
        if f.fits and (best is None or f.iteration_time_ms < best.iteration_time_ms - 1e-12):
            best = f
    if best is None:
        raise InputError("budget_bytes", "no heuristic schedule fits the byte budget")
    return best


def optimal(problem: PipelineProblem, memory: MemoryModel,
            budget_bytes: int | Sequence[int] | None, *, time_limit_s: float = 5.0,
            workers: int = 2, name: str = "crosspipe-opt") -> Schedule:
    """Exact CP-SAT schedule with split backward within the byte budget (None: no limit).

    Two solves, each with `time_limit_s`: the unsplit one with the budget as
    micro-batch caps (fast; its optimum becomes a hint), then the split one with the
    exact byte constraint. info: solver_status, gap (proven, vs the split solve's
    bound), bound_ms, objective_ms, solve_s (both solves), hint (what the hint was).
    """
    from testbed.schedule.cpsat import proven_gap, solve

    free = problem.with_memory_cap(None)
    hint = best_fitting(problem, memory, budget_bytes)
    capped = free if budget_bytes is None else \
        free.with_memory_cap(memory.microbatch_caps(budget_bytes))
    unsplit_hint = hint.schedule if not hint.schedule.split_backward else None
    if unsplit_hint is not None and not _fits_caps(capped, unsplit_hint):
        unsplit_hint = None
    if unsplit_hint is None:
        # Never a solve without a hint: on a loaded machine CP-SAT may find nothing within
        # time_limit_s (UNKNOWN), and a solve without a hint then failed the whole command.
        unsplit_hint = _fastest_fitting_unsplit(capped,
                                                _candidates(problem, memory, budget_bytes))
    unsplit = solve(capped, split_backward=False, time_limit_s=time_limit_s, workers=workers,
                    hint=unsplit_hint, name="unsplit-opt")
    solve_s = float(unsplit.info.get("solve_s", 0.0))
    u = measure(problem, memory, unsplit, budget_bytes)
    if u.fits and u.iteration_time_ms < hint.iteration_time_ms - 1e-12:
        hint = u
    split_hint = hint.schedule.split()
    budgets = None if budget_bytes is None else memory.budgets(budget_bytes)
    sched = solve(free, split_backward=True, time_limit_s=time_limit_s, workers=workers,
                  hint=split_hint, name=name, memory=memory if budgets else None,
                  budget_bytes=budgets)
    res = measure(problem, memory, sched, budget_bytes)
    if not res.fits or res.iteration_time_ms > hint.iteration_time_ms + 1e-9:
        res = measure(problem, memory, split_hint, budget_bytes)
    info = dict(sched.info)
    bound = info.get("bound_ms")
    exact = res.iteration_time_ms
    info.update(solve_s=solve_s + float(info.get("solve_s", 0.0)), exact_ms=exact,
                hint=hint.schedule.name, hint_ms=hint.iteration_time_ms,
                unsplit_opt_ms=u.iteration_time_ms,
                unsplit_status=unsplit.info.get("solver_status"),
                gap=proven_gap(info.get("solver_status"), exact, bound))
    # proven: the solver said so, or its bound already meets the schedule returned
    info["proven_optimal"] = info["gap"] == 0.0
    return Schedule(name, res.schedule.actions, res.schedule.virtual_stages, info)


def _fits_caps(problem: PipelineProblem, schedule: Schedule) -> bool:
    try:
        time_schedule(problem, schedule, record=False)
    except InputError:
        return False
    return True


def _fastest_fitting_unsplit(capped: PipelineProblem, candidates: Sequence[Schedule]
                             ) -> Schedule | None:
    """The fastest schedule without split backward that keeps the micro-batch caps."""
    best: tuple[float, Schedule] | None = None
    for sched in candidates:
        if sched.split_backward:
            continue
        try:
            t = time_schedule(capped, sched, record=False).iteration_time_ms
        except InputError:  # over a cap
            continue
        if best is None or t < best[0] - 1e-12:
            best = (t, sched)
    return None if best is None else best[1]
