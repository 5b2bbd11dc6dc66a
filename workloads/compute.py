"""A shadow stage's compute: real tensor work on the host CPU, or a stand-in accelerator.

`Burner` (`emulation.worker_compute: cpu`) does real float32 work for the op's wall-clock
time. `DeviceStandIn` (`worker_compute: device`) models compute on an accelerator: the op's
time passes on a timer and the host CPU stays free for gloo and the network, as a GPU
kernel leaves its host; both keep the op's deadline on the same clock.

At start-up `Burner.calibrate()` times small float32 matrix products and sizes a chunk
of them to about `chunk_ms`. At duty 1, `burn(duration_s)` then runs whole chunks until
the deadline; it stops early when the remaining time is under half a chunk, so the error
is at most half a chunk (plus scheduler preemption on a busy machine). Keeping the
deadline on the wall clock makes op times right even when other workers share the CPU.

`duty` < 1 spreads the work (testbed.emu.pacing): the op asks for round(duration x
duty / chunk) chunks (at least one), each due at an even step of the op's time; the
worker sleeps to each chunk's start and, after the last, to the op's deadline. A worker
that falls behind (starved) runs its chunks back to back and stops at the deadline, so
the work it did not do shows in its CPU share, never in a longer op; one that keeps up
does what was asked, no more (it used to work through the last pause whenever that no
longer fit before the deadline: 110-127 % of the asked work at duty 0.06, and a busy
stretch at the end of each op that a spinning neighbour preempted). With more
stage processes than cores, busy-waiting stages would otherwise be descheduled at
their deadlines (ops overrun by a scheduler slice) and starve the link emulators; the
launcher sets duty ~ 0.5 x the cores free when the workers start / workers
(testbed.orchestrate.launch.fitting_duty).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from testbed.emu.pacing import paced_op
from testbed.emu.slack import set_timer_slack_ns, sleep_until
from workloads.plan import COMPUTES

TIMER_SLACK_NS = 1  # the kernel's least: wake-ups on the deadline, not 50 us after

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
        # wake-ups on the chunk's and the op's deadlines, not 50 us after
        self.timer_slack_ns = set_timer_slack_ns(TIMER_SLACK_NS) if duty < 1 else 0
        self.cal = self.calibrate()
        self.asked_s = 0.0  # op time asked for so far (burn's durations)
        self.chunks_run = 0  # chunks of work done in it

    def as_dict(self) -> dict[str, float | str]:
        """What the worker's start record says of its compute."""
        return {"compute": "cpu", "duty": self.duty, **self.cal.as_dict()}

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
        """Work for `duration_s`, paced by duty (testbed.emu.pacing.paced_op: at duty 1 busy
        to the deadline, below it the op's chunks spread over its time); the chunks run."""
        if duration_s <= 0:
            return 0
        self.asked_s += duration_s
        reps = self.cal.mm_per_chunk
        chunks = paced_op(lambda: self._mm(reps), duration_s, self.cal.chunk_s, self.duty)
        self.chunks_run += chunks
        return chunks


class DeviceStandIn:
    """Stands in for a stage's accelerator: each op's time passes on a timer (the host
    thread sleeps to the deadline, as it would block on a GPU kernel), so the host CPU is
    free for gloo and the emulated network. Same interface as Burner: burn() returns no
    chunks and cpu_share() has nothing to say; what is left to measure is how late the
    wake-ups came (`late_s`, and each op's end in the worker's records)."""

    def __init__(self) -> None:
        self.timer_slack_ns = set_timer_slack_ns(TIMER_SLACK_NS)
        self.asked_s = 0.0
        self.chunks_run = 0
        self.late_s = 0.0
        self.ops = 0

    def cpu_share(self, asked_s: float, chunks: int) -> float | None:
        return None  # no host CPU is asked for

    def burn(self, duration_s: float) -> int:
        """Wait until `duration_s` has passed (at least that long: the op's deadline)."""
        if duration_s <= 0:
            return 0
        self.asked_s += duration_s
        self.late_s += sleep_until(time.perf_counter() + duration_s)
        self.ops += 1
        return 0

    def as_dict(self) -> dict[str, float | str]:
        """What the worker's start record says of its compute."""
        return {"compute": "device", "timer_slack_ns": float(self.timer_slack_ns)}


def make_compute(compute: str, duty: float) -> Burner | DeviceStandIn:
    """The shadow stage's compute for `emulation.worker_compute`."""
    if compute == "device":
        return DeviceStandIn()
    if compute != "cpu":
        raise ValueError(f"unknown compute {compute!r} (known: {', '.join(COMPUTES)})")
    return Burner(duty=duty)
