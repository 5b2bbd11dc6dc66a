"""What a placement policy answers: a committed placement or a refusal reason; the job."""

from __future__ import annotations

from dataclasses import dataclass

from testbed.catalog import ModelArch
from testbed.jobs.cluster import Allocation
from testbed.jobs.model import activation_mb
from testbed.jobs.timing import PipeTiming
from testbed.traces import JobRequest

# refusal reasons (jobs.csv `reason`)
NO_GPUS = "no_gpus"
NO_SPECTRUM = "no_spectrum"
NO_BANDWIDTH = "no_bandwidth"  # bace-pipe: no path carries the transfer without stalling
ILP_TIME_LIMIT = "ilp_time_limit"  # cba-ilp: out of time before any placement was found


@dataclass
class Placed:
    """A committed placement and its pipeline timing."""

    alloc: Allocation
    timing: PipeTiming
    solver: dict[str, object] | None = None


@dataclass(frozen=True)
class Refused:
    reason: str


@dataclass(frozen=True)
class Job:
    """A job request resolved against the model catalogue."""

    req: JobRequest
    arch: ModelArch

    @property
    def act_mb(self) -> float:
        return activation_mb(self.arch)
