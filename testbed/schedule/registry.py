"""Schedule name registry: `get_schedule(name)`, `build_schedule(name, problem, **opts)`."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass

from testbed.errors import InputError
from testbed.schedule.model import PipelineProblem, Schedule
from testbed.schedule.timer import Timing, time_schedule


@dataclass(frozen=True)
class ScheduleKind:
    """A registered schedule generator and what it is."""

    name: str
    build: Callable[..., Schedule]
    description: str
    split_backward: bool = False


def _gpipe(problem: PipelineProblem) -> Schedule:
    from testbed.schedule.classic import gpipe
    return gpipe(problem)


def _1f1b(problem: PipelineProblem) -> Schedule:
    from testbed.schedule.classic import one_f_one_b
    return one_f_one_b(problem)


def _interleaved(problem: PipelineProblem, virtual_stages: int = 2) -> Schedule:
    from testbed.schedule.classic import interleaved_1f1b
    return interleaved_1f1b(problem, virtual_stages)


def _zb(problem: PipelineProblem) -> Schedule:
    from testbed.schedule.greedy import best_list_schedule, zero_bubble_caps
    return best_list_schedule(problem, split_backward=True, caps=zero_bubble_caps(problem),
                              name="zb-h1")


def _greedy(problem: PipelineProblem, split_backward: bool = False) -> Schedule:
    # List scheduling (two rules); without split backward also the latency-sized
    # 1F1B orders under the same cap, so the result is never worse than 1F1B/GeoPipe.
    best = best_heuristic(problem, split_backward=bool(split_backward), with_gpipe=False)
    return Schedule("crosspipe-greedy", best.actions, info={"from": best.name, **best.info})


def _opt(problem: PipelineProblem, time_limit_s: float = 30.0, split_backward: bool = False,
         workers: int = 2, scale: float = 1000.0) -> Schedule:
    from testbed.schedule.cpsat import solve
    hint = best_heuristic(problem, split_backward=bool(split_backward))
    return solve(problem, split_backward=bool(split_backward), time_limit_s=float(time_limit_s),
                 hint=hint, workers=int(workers), scale=float(scale))


def _geopipe(problem: PipelineProblem, buffer_microbatches: int | None = None) -> Schedule:
    from testbed.schedule.geopipe import geopipe
    return geopipe(problem, buffer_microbatches)


SCHEDULES: dict[str, ScheduleKind] = {k.name: k for k in (
    ScheduleKind("gpipe", _gpipe, "all forwards then all backwards"),
    ScheduleKind("1f1b", _1f1b, "one-forward-one-backward (PipeDream-flush)"),
    ScheduleKind("interleaved-1f1b", _interleaved,
                 "Megatron interleaved 1F1B with virtual_stages chunks per device"),
    ScheduleKind("zb-h1", _zb, "zero-bubble: backward split into I and W, W fills bubbles "
                 "(1F1B memory)", split_backward=True),
    ScheduleKind("crosspipe-greedy", _greedy,
                 "latency/bandwidth-aware list scheduling under the memory cap"),
    ScheduleKind("crosspipe-opt", _opt, "exact CP-SAT schedule under the memory cap"),
    ScheduleKind("geopipe", _geopipe,
                 "1F1B with warm-up sized to hide cross-DC round trips, bounded by a buffer"),
)}
ALIASES = {"zero-bubble": "zb-h1", "zb": "zb-h1", "interleaved": "interleaved-1f1b",
           "greedy": "crosspipe-greedy", "opt": "crosspipe-opt", "pipedream-flush": "1f1b"}


def schedule_names() -> list[str]:
    return list(SCHEDULES)


def get_schedule(name: str) -> ScheduleKind:
    """Look a schedule up by name (or alias); the error lists the valid names."""
    kind = SCHEDULES.get(ALIASES.get(name, name))
    if kind is None:
        raise InputError("schedule", f"unknown schedule {name!r}; valid: "
                         f"{', '.join(SCHEDULES)}")
    return kind


def schedule_options(name: str) -> list[str]:
    """Keyword options a schedule generator accepts."""
    params = inspect.signature(get_schedule(name).build).parameters
    return [p for p in params if p != "problem"]


def build_schedule(name: str, problem: PipelineProblem, **opts: object) -> Schedule:
    """Generate the named schedule for `problem`. Unknown options are an InputError."""
    kind = get_schedule(name)
    valid = schedule_options(kind.name)
    for key in opts:
        if key not in valid:
            raise InputError(key, f"not an option of schedule {kind.name!r}; valid: "
                             f"{', '.join(valid) or 'none'}")
    return kind.build(problem, **opts)


def simulate(name: str, problem: PipelineProblem, **opts: object) -> Timing:
    """Build the named schedule and time it (the one call the job simulator needs)."""
    return time_schedule(problem, build_schedule(name, problem, **opts))


def best_heuristic(problem: PipelineProblem, split_backward: bool = False,
                   with_gpipe: bool = True) -> Schedule:
    """The fastest valid in-order heuristic schedule (hint/upper bound for the solver)."""
    from testbed.schedule.greedy import best_list_schedule

    cands = [best_list_schedule(problem, split_backward=split_backward)]
    unsplit = [_1f1b(problem), _geopipe(problem)]
    if with_gpipe and all(c is None or c >= problem.microbatches for c in problem.caps):
        unsplit.append(_gpipe(problem))
    if split_backward:
        # B -> I W at once is never slower and holds the same count: the split optimum's
        # hint is never worse than the unsplit heuristics, nor than zb-h1
        cands += [c.split() for c in unsplit] + [_zb(problem)]
    else:
        cands += unsplit
    best: tuple[float, Schedule] | None = None
    for c in cands:
        try:
            t = time_schedule(problem, c, record=False).iteration_time_ms
        except InputError:
            continue
        if best is None or t < best[0]:
            best = (t, c)
    assert best is not None
    return best[1]
