"""Job iteration time from the schedule engine, cached by (stages, schedule, boundary profile).

Each boundary is a `testbed.schedule.model.Hop`: latency = the lightpath's latency
(length x propagation_us_per_km + node delay, from the optical layer) or the DC fabric
latency, bandwidth = the lightpath's capacity or the fabric bandwidth. Latencies are
rounded to 0.01 ms before timing so that jobs on similar routes share cache entries.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from testbed.schedule.model import Hop, PipelineProblem

log = logging.getLogger(__name__)

LATENCY_QUANTUM_MS = 0.01


@dataclass(frozen=True)
class PipeTiming:
    """Iteration time (ms) and bubble ratio of one job's pipeline."""

    iteration_ms: float
    bubble_ratio: float
    schedule: str


def _build(name: str, problem: PipelineProblem):  # type: ignore[no-untyped-def]
    """The schedule engine's schedule `name` for the problem (its registry)."""
    from testbed.schedule.registry import build_schedule

    return build_schedule(name, problem)


class Timer:
    """Times pipelines with the schedule engine; memoises by the full input."""

    def __init__(self, max_entries: int = 200_000) -> None:
        self._cache: dict[tuple, PipeTiming] = {}
        self.max_entries = max_entries
        self.hits = 0
        self.misses = 0

    def time(self, forward_ms: Sequence[float], backward_ms: Sequence[float],
             hops: Sequence[tuple[float, float]], activation_mb: float, microbatches: int,
             schedule: str) -> PipeTiming:
        """hops: (latency_ms, bandwidth_gbps) per boundary."""
        q = LATENCY_QUANTUM_MS
        hop_key = tuple((round(lat / q) * q, bw) for lat, bw in hops)
        key = (tuple(forward_ms), tuple(backward_ms), hop_key, activation_mb, microbatches,
               schedule)
        hit = self._cache.get(key)
        if hit is not None:
            self.hits += 1
            return hit
        self.misses += 1
        from testbed.schedule.timer import time_schedule

        problem = PipelineProblem(tuple(forward_ms), tuple(backward_ms),
                                  tuple(Hop(lat, bw) for lat, bw in hop_key), activation_mb,
                                  microbatches)
        sched = _build(schedule, problem)
        t = time_schedule(problem, sched, check_memory_cap=False, record=False)
        out = PipeTiming(t.iteration_time_ms, t.bubble_ratio, schedule)
        if len(self._cache) >= self.max_entries:
            self._cache.clear()
        self._cache[key] = out
        return out
