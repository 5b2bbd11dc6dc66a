"""Pipeline schedule engine: schedules as data, an exact timer, generators, bounds.

Public API (docs/schedules.md, "API"):
    PipelineProblem, Hop, Action, Schedule, ScheduleError
    build_schedule(name, problem, **opts) -> Schedule; get_schedule(name); schedule_names()
    time_schedule(problem, schedule) -> Timing; simulate(name, problem, **opts) -> Timing
    validate(problem, schedule); lower_bound_ms(problem, ...)
"""

from testbed.schedule.bounds import lower_bound_ms
from testbed.schedule.model import Action, Hop, PipelineProblem, Schedule, ScheduleError
from testbed.schedule.registry import (
    SCHEDULES,
    build_schedule,
    get_schedule,
    schedule_names,
    simulate,
)
from testbed.schedule.timer import OpRecord, Timing, TransferRecord, time_schedule
from testbed.schedule.validate import validate

__all__ = [
    "SCHEDULES",
    "Action",
    "Hop",
    "OpRecord",
    "PipelineProblem",
    "Schedule",
    "ScheduleError",
    "Timing",
    "TransferRecord",
    "build_schedule",
    "get_schedule",
    "lower_bound_ms",
    "schedule_names",
    "simulate",
    "time_schedule",
    "validate",
]
