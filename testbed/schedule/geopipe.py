"""`geopipe`: 1F1B whose warm-up grows to hide cross-DC round trips, bounded by a buffer.

GeoPipe (Oct 2025, abstract only; see docs/schedules.md) overlaps cross-DC transfers
with computation, limited by cross-DC bandwidth and by the device memory that buffers
in-flight activations. Our model: stage s keeps enough micro-batches in flight to
cover the round trip of a micro-batch from s to the last stage and back,

    RT_s = sum_{k>s} (f_k + b_k) + sum_{h>=s} 2 (l_h + 8a/g_h),
    warm-up_s = max(p-s-1, ceil(RT_s / (f_s + b_s))),

clipped to `buffer_microbatches - 1` (the buffer holds the in-flight activations, the
current micro-batch included) and to m, and made strictly decreasing along the chain
(w_{s+1} <= w_s - 1, as in 1F1B) so that neighbours never wait on each other's
round trip every step and the order cannot deadlock. With no delay it is exactly 1F1B.
"""

from __future__ import annotations

import math

from testbed.errors import InputError
from testbed.schedule.classic import one_f_one_b_rows
from testbed.schedule.model import PipelineProblem, Schedule


def geopipe_warmups(problem: PipelineProblem, buffer_microbatches: int | None = None) -> list[int]:
    p, m = problem.stages, problem.microbatches
    if buffer_microbatches is not None and (isinstance(buffer_microbatches, bool)
                                            or int(buffer_microbatches) < 1):
        raise InputError("buffer_microbatches", f"must be an integer >= 1, got "
                         f"{buffer_microbatches}")
    f, b = problem.forward_ms, problem.backward_ms
    warm = []
    for s in range(p):
        rt = sum(f[k] + b[k] for k in range(s + 1, p))
        rt += sum(2 * (problem.hops[h].latency_ms + problem.hop_serialisation_ms(h))
                  for h in range(s, p - 1))
        w = max(p - s - 1, math.ceil(rt / (f[s] + b[s]) - 1e-9))
        w = min(w, m)
        for cap in (buffer_microbatches, problem.caps[s]):
            if cap is not None:
                w = min(w, int(cap) - 1)
        warm.append(w)
    # Strictly decreasing warm-ups leave each stage a round trip of slack (equal ones
    # would make neighbours wait on each other every step); also deadlock-free.
    for s in range(1, p):
        warm[s] = min(warm[s], max(warm[s - 1] - 1, 0))
    return warm


def geopipe(problem: PipelineProblem, buffer_microbatches: int | None = None) -> Schedule:
    """Latency-hiding 1F1B; `buffer_microbatches` bounds in-flight activations per stage."""
    warm = geopipe_warmups(problem, buffer_microbatches)
    return Schedule("geopipe", tuple(one_f_one_b_rows(problem.microbatches, warm)),
                    info={"warmup": warm, "buffer_microbatches": buffer_microbatches})
