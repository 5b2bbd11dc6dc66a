"""Executes one device's action list of a LightPipe schedule with torch.distributed p2p.

The executor is the communication half of a pipeline stage; what an op computes is
the `StageProgram`'s business (shadow work or a real model). Every transfer has a tag
derived from (iteration parity, direction, receiving virtual stage, micro-batch), so
the receives of an iteration can be posted ahead of time: the receives of iteration
i+1 are posted when iteration i starts, so a sender never waits for its peer to post
(gloo sends only once the receiver is ready). Sends are asynchronous (`isend`), so
they overlap computation as in the schedule model; one TCP connection per peer pair
keeps each direction FIFO, as the simulator's links are.

Times are `time.monotonic()` seconds, a clock shared by all processes of a machine
(network namespaces do not change it), so op times of different stages compare.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Protocol

import torch
import torch.distributed as dist

from testbed.schedule.model import Action, Schedule
from workloads.metrics import WorkerMetrics


class StageProgram(Protocol):
    """What a stage computes; the executor handles all communication."""

    def recv_buffer(self, direction: str, virtual_stage: int) -> torch.Tensor:
        """An empty tensor for an incoming activation ("act") or gradient ("grad")."""
        ...

    def forward(self, it: int, action: Action, virtual_stage: int,
                inp: torch.Tensor | None) -> tuple[torch.Tensor | None, float]:
        """Run F; return (activation to send or None on the last stage, compute seconds)."""
        ...

    def backward(self, it: int, action: Action, virtual_stage: int,
                 grad: torch.Tensor | None) -> tuple[torch.Tensor | None, float]:
        """Run B or I; return (gradient to send or None on the first stage, compute s)."""
        ...

    def weight(self, it: int, action: Action, virtual_stage: int) -> float:
        """Run W (weight-gradient half); return compute seconds."""
        ...

    def end_iteration(self, it: int) -> dict[str, Any]:
        """Optimizer step etc.; return extra per-iteration record fields."""
        ...


@dataclass
class IterationRecord:
    """One iteration on one stage: op times (monotonic s) and traffic."""

    iteration: int
    start_s: float
    end_s: float
    ops: list[tuple[str, float, float]] = field(default_factory=list)
    waits: list[tuple[str, float, float]] = field(default_factory=list)
    compute_s: float = 0.0
    sent_bytes: int = 0
    received_bytes: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"iteration": self.iteration, "start_s": self.start_s, "end_s": self.end_s,
                "ops": self.ops, "waits": self.waits, "compute_s": self.compute_s,
                "sent_bytes": self.sent_bytes, "received_bytes": self.received_bytes,
                **self.extra}


class Executor:
    """Runs device `rank`'s list of `schedule` for successive iterations."""

    def __init__(self, schedule: Schedule, rank: int, microbatches: int,
                 program: StageProgram, metrics: WorkerMetrics | None = None,
                 timeout_s: float | None = None) -> None:
        """timeout_s: how long one send or receive may wait (the collective time-out;
        None: the process group's own, the one it was created with)."""
        self.schedule = schedule
        self.rank = rank
        self.p = schedule.stages
        self.v = schedule.virtual_stages
        self.nv = self.p * self.v
        self.m = microbatches
        self.program = program
        self.metrics = metrics
        self.actions = schedule.actions[rank]
        self._pending: dict[int, dict[tuple[str, int, int], tuple[Any, torch.Tensor]]] = {}
        self._wait_args: tuple[timedelta, ...] = (
            () if timeout_s is None else (timedelta(seconds=timeout_s),))

    def reset(self) -> None:
        """Forget the receives posted ahead: they belonged to a process group that is gone
        (a restart after a fault, workloads.faulttol)."""
        self._pending = {}

    # -- tags and peers ----------------------------------------------------------------
    def vstage(self, a: Action) -> int:
        return a.chunk * self.p + self.rank

    def tag(self, it: int, direction: str, recv_vstage: int, mb: int) -> int:
        d = 0 if direction == "act" else 1
        return (((it % 2) * 2 + d) * self.nv + recv_vstage) * self.m + mb

    def _needs(self, a: Action) -> tuple[str, int] | None:
        """(direction, source device) of the input this action waits for, if any."""
        k = self.vstage(a)
        if a.kind == "F" and k > 0:
            return "act", (k - 1) % self.p
        if a.kind in ("B", "I") and k < self.nv - 1:
            return "grad", (k + 1) % self.p
        return None

    def post_receives(self, it: int) -> None:
        posted = {}
        for a in self.actions:
            need = self._needs(a)
            if need is None:
                continue
            direction, src = need
            k = self.vstage(a)
            buf = self.program.recv_buffer(direction, k)
            work = dist.irecv(buf, src=src, tag=self.tag(it, direction, k, a.microbatch))
            posted[(direction, k, a.microbatch)] = (work, buf)
        self._pending[it] = posted

    # -- one iteration -----------------------------------------------------------------
    def run_iteration(self, it: int, total: int) -> IterationRecord:
        if it not in self._pending:
            self.post_receives(it)
        if it + 1 < total:
            self.post_receives(it + 1)
        pending = self._pending.pop(it)
        sends: list[Any] = []
        rec = IterationRecord(it, time.monotonic(), 0.0)
        for a in self.actions:
            k = self.vstage(a)
            need = self._needs(a)
            inp = None
            if need is not None:
                direction, _ = need
                work, buf = pending.pop((direction, k, a.microbatch))
                t0 = time.monotonic()
                work.wait(*self._wait_args)
                t1 = time.monotonic()
                if t1 - t0 > 1e-4:
                    rec.waits.append((str(a), t0, t1))
                rec.received_bytes += buf.numel() * buf.element_size()
                inp = buf
            start = time.monotonic()
            out: torch.Tensor | None = None
            if a.kind == "F":
                out, comp = self.program.forward(it, a, k, inp)
                dst_vs, direction = k + 1, "act"
            elif a.kind in ("B", "I"):
                out, comp = self.program.backward(it, a, k, inp)
                dst_vs, direction = k - 1, "grad"
            else:
                comp = self.program.weight(it, a, k)
            end = time.monotonic()
            rec.ops.append((str(a), start, end))
            rec.compute_s += comp
            if out is not None and a.kind != "W" and 0 <= dst_vs < self.nv:
                out = out.contiguous()
                sends.append(dist.isend(out, dst=dst_vs % self.p,
                                        tag=self.tag(it, direction, dst_vs, a.microbatch)))
                rec.sent_bytes += out.numel() * out.element_size()
        for w in sends:
            w.wait(*self._wait_args)
        rec.extra = self.program.end_iteration(it)
        rec.end_s = time.monotonic()
        if self.metrics is not None:
            dur = rec.end_s - rec.start_s
            mt = self.metrics
            mt.iteration.observe(dur)
            mt.bubble.set(max(0.0, 1.0 - rec.compute_s / dur) if dur > 0 else 0.0)
            mt.sent.inc(rec.sent_bytes)
            mt.received.inc(rec.received_bytes)
            mt.compute.inc(rec.compute_s)
            mt.wait.inc(sum(e - s for _, s, e in rec.waits))
            mt.iterations.inc()
            if "loss" in rec.extra:
                mt.loss.set(rec.extra["loss"])
        return rec
