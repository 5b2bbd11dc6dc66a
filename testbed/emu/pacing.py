"""Paced work: one op's chunks spread over its time, for a shadow CPU worker and the load probe.

`paced_op(work, duration_s, chunk_s, duty)` runs `work()` (one chunk, about `chunk_s` of
CPU) for an op of `duration_s`:
- duty 1: chunks back to back until less than half a chunk is left before the deadline;
- duty < 1: round(duration x duty / chunk) chunks (at least one), chunk k due at
  start + k x duration / chunks; it sleeps to each chunk's start and, after the last, to
  the deadline (sleep_until, so never early). A process that falls behind (starved) runs
  its chunks back to back and begins none with less than half a chunk left: the work not
  done shows in its CPU share (chunks / asked), not in a longer op.

workloads.compute.Burner runs it with torch matmuls; testbed.emu.loadprobe with a pure
Python loop (no torch, to start in a fraction of a second); both thus pace alike.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from testbed.emu.slack import sleep_until


def chunks_asked(duration_s: float, chunk_s: float, duty: float) -> int:
    """How many chunks an op of duration_s asks for at `duty` (duty < 1; at least one)."""
    return max(1, round(duration_s * duty / chunk_s))


def paced_op(work: Callable[[], None], duration_s: float, chunk_s: float,
             duty: float) -> int:
    """Run one op (module docstring); the number of chunks run."""
    if duration_s <= 0:
        return 0
    start = time.perf_counter()
    end = start + duration_s
    half = 0.5 * chunk_s
    chunks = 0
    if duty >= 1.0:
        while end - time.perf_counter() > half:
            work()
            chunks += 1
        return chunks
    asked = chunks_asked(duration_s, chunk_s, duty)
    step = duration_s / asked
    while chunks < asked:
        now = time.perf_counter()
        due = start + chunks * step
        if due > now:
            time.sleep(due - now)
            now = time.perf_counter()
        if end - now <= half:
            break  # out of time: starved, and the share says so
        work()
        chunks += 1
    sleep_until(end)
    return chunks
