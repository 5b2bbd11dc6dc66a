"""Real tensor work that occupies a worker for a given wall-clock time (not sleep).

At start-up `Burner.calibrate()` times small float32 matrix products and sizes a chunk
of them to about `chunk_ms`. `burn(duration_s)` then runs whole chunks until the
deadline; it stops early when the remaining time is under half a chunk, so the error
is at most half a chunk (plus scheduler preemption on a busy machine). Keeping the
deadline on the wall clock makes op times right even when other workers share the CPU.

`duty` < 1 spreads the work: after each chunk the worker pauses so that work takes
about `duty` of the op's time. With more stage processes than cores, busy-waiting
stages would otherwise be descheduled at their deadlines (ops overrun by a scheduler
slice) and starve the link emulators; the launcher sets duty ~ cores / workers.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

CALIBRATION_RUN_S = 0.005  # each timing run of Burner.calibrate lasts about this long
MAX_CALIBRATION_REPS = 50


@dataclass
class Calibration:
    """What start-up calibration found."""

    matrix_n: int
    mm_per_chunk: int
    chunk_s: float
    gflops: float

    def as_dict(self) -> dict[str, float]:
        return {"matrix_n": self.matrix_n, "mm_per_chunk": self.mm_per_chunk,
                "chunk_ms": 1e3 * self.chunk_s, "gflops": self.gflops}


class Burner:
    """Busy-works with real matmuls for a requested duration."""

    def __init__(self, matrix_n: int = 64, chunk_ms: float = 0.25, duty: float = 1.0) -> None:
        if not 0 < duty <= 1:
            raise ValueError(f"duty must be in (0, 1], got {duty}")
        self.duty = duty
        gen = torch.Generator().manual_seed(0)
        self.n = matrix_n
        self.a = torch.randn(matrix_n, matrix_n, generator=gen)
        self.b = torch.randn(matrix_n, matrix_n, generator=gen) / matrix_n
        self.c = torch.empty(matrix_n, matrix_n)
        self.chunk_ms = chunk_ms
        self.cal = self.calibrate()
        self.asked_s = 0.0  # op time asked for so far (burn's durations)
        self.chunks_run = 0  # chunks of work done in it

    def cpu_share(self, asked_s: float, chunks: int) -> float | None:
        """Work done / work asked for over a window: chunks x chunk time / (asked x duty).
        About 1 when the process had the CPU whenever it wanted it; a starved process
        finishes fewer chunks in the same wall time (< 1)."""
        want = asked_s * self.duty
        if want < 4 * self.cal.chunk_s:  # too short a window to say
            return None
        return chunks * self.cal.chunk_s / want

    def _mm(self, reps: int) -> None:
        for _ in range(reps):
            torch.mm(self.a, self.b, out=self.c)

    def calibrate(self) -> Calibration:
        """Time the products: the fastest of 5 runs of `reps` products each, `reps` sized
        from one timed product so that a run lasts about CALIBRATION_RUN_S (50 products on
        the build machines; 1 under software emulation, where a 64x64 product takes ~0.1 s
        and the fixed 270 products of before took minutes with 8 workers on 2 vCPUs)."""
        self._mm(3)  # warm up (the first products pay torch's lazy set-up)
        t0 = time.perf_counter()
        self._mm(1)
        one = max(time.perf_counter() - t0, 1e-9)
        reps = max(1, min(MAX_CALIBRATION_REPS, round(CALIBRATION_RUN_S / one)))
        self._mm(min(20, reps) - 4)  # the rest of the warm-up, where products are cheap
        best = one
        for _ in range(5):  # the fastest of a few runs: least disturbed by other processes
            t0 = time.perf_counter()
            self._mm(reps)
            best = min(best, (time.perf_counter() - t0) / reps)
        per_chunk = max(1, round(self.chunk_ms * 1e-3 / best))
        flops = 2.0 * self.n ** 3 / best
        return Calibration(self.n, per_chunk, per_chunk * best, flops / 1e9)

    def burn(self, duration_s: float) -> int:
        """Work until `duration_s` has passed; return the number of chunks run."""
        if duration_s <= 0:
            return 0
        self.asked_s += duration_s
        reps = self.cal.mm_per_chunk
        end = time.perf_counter() + duration_s
        half = 0.5 * self.cal.chunk_s
        pause = self.cal.chunk_s * (1.0 / self.duty - 1.0)
        chunks = 0
        while True:
            left = end - time.perf_counter()
            if left <= half:
                break
            self._mm(reps)
            chunks += 1
            self.chunks_run += 1
            if pause > 0:
                left = end - time.perf_counter()
                if left > pause + half:
                    time.sleep(pause)
        return chunks
