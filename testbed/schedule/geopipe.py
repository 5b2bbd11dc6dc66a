"""`geopipe`: 1F1B whose warm-up grows to hide cross-DC round trips, bounded by a buffer.

GeoPipe (Oct 2025, abstract only; see docs/schedules.md) overlaps cross-DC transfers
with computation, limited by cross-DC bandwidth and by the device memory that buffers
in-flight activations. Our model: stage s keeps enough micro-batches in flight to
cover the round trip across each hop. In the steady state of a 1F1B-shaped order the
k+1 micro-batches in flight between stages s and s+1 (k = w_s - w_{s+1}) must cover one
cycle F/B on both stages plus the two transfers, so with P = max_s (f_s + b_s)

    c_s = l_s + 8a/g_s,   k_s = max(1, ceil((f_s+b_s + f_{s+1}+b_{s+1} + 2 c_s) / P) - 1),
    w_{p-1} = 0,   w_s = w_{s+1} + k_s,

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
    period = max(f[s] + b[s] for s in range(p))  # steady-state time per micro-batch
    warm = [0] * p
    for s in range(p - 2, -1, -1):
        comm = problem.hops[s].latency_ms + problem.hop_serialisation_ms(s)
        cycle = f[s] + b[s] + f[s + 1] + b[s + 1] + 2 * comm
        gap = max(1, math.ceil(cycle / period - 1e-9) - 1)
        warm[s] = warm[s + 1] + gap
    for s in range(p):
        warm[s] = min(warm[s], m)
        for cap in (buffer_microbatches, problem.caps[s]):
            if cap is not None:
                warm[s] = min(warm[s], int(cap) - 1)
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
