"""Schedule validator: every op once, dependencies in order, memory cap, no deadlock."""

from __future__ import annotations

from testbed.schedule.model import PipelineProblem, Schedule
from testbed.schedule.timer import check_memory, check_structure, time_schedule


def validate(problem: PipelineProblem, schedule: Schedule, *,
             check_memory_cap: bool = True) -> list[int]:
    """Raise ScheduleError (an InputError: exit 2 on the CLI) if `schedule` is invalid.

    Checks: one stage list per problem stage; each device does F, and B or I+W, of
    every (micro-batch, chunk) exactly once, with F before B/I and I before W; the
    activations held never exceed the memory cap; and a dry run of the exact timer
    completes (a deadlock names the stages and what each waits for).
    Returns the peak in-flight micro-batches per stage.
    """
    peaks = check_structure(problem, schedule)
    if check_memory_cap:
        check_memory(problem, schedule, peaks)
    time_schedule(problem, schedule, check_memory_cap=False, record=False)
    return peaks
