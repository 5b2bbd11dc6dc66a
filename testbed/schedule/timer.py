"""Exact timer of a schedule under the reference model (FIFO links, latency, bandwidth).

Model (docs/schedules.md): each device runs its actions in list order, one at a time;
an action starts at the latest of the device becoming free and its inputs arriving.
After F(k, j) the activation goes to virtual stage k+1, after B/I(k, j) the gradient
goes to k-1. Each direction of each hop is a FIFO link: a transfer starts when it is
ready and the link is free, occupies it for 8a/g ms and arrives l ms after leaving.
Sends overlap computation. Since a link direction has one sending device, which
produces its transfers in list order, FIFO order is that device's list order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from testbed.schedule.model import Action, PipelineProblem, Schedule, ScheduleError

_F, _B, _I, _W = 0, 1, 2, 3
_KIND = {"F": _F, "B": _B, "I": _I, "W": _W}


class OpRecord(NamedTuple):
    """One executed action: device (stage), action, start and end time (ms)."""

    stage: int
    action: Action
    start_ms: float
    end_ms: float


class TransferRecord(NamedTuple):
    """One transfer on a link direction ("h0+" = hop 0 forward, "h0-" backward, "wrap+")."""

    link: str
    src: int
    dst: int
    kind: str  # "activation" or "gradient"
    microbatch: int
    virtual_stage: int  # the sending virtual stage
    ready_ms: float
    start_ms: float
    leave_ms: float
    arrive_ms: float


@dataclass
class Timing:
    """Result of timing a schedule."""

    schedule: str
    iteration_time_ms: float
    bubble_ratio: float
    peak_inflight: list[int]
    busy_ms: list[float]
    raw_ops: list[tuple] = field(repr=False)
    raw_transfers: list[tuple] = field(repr=False)

    @property
    def ops(self) -> list[OpRecord]:
        """Executed actions in execution order per device (built on first access)."""
        cached = self.__dict__.get("_ops")
        if cached is None:
            cached = [OpRecord._make(r) for r in self.raw_ops]
            self.__dict__["_ops"] = cached
        return cached

    @property
    def transfers(self) -> list[TransferRecord]:
        """Transfers in the order they were issued per link direction."""
        cached = self.__dict__.get("_transfers")
        if cached is None:
            cached = [TransferRecord._make(r) for r in self.raw_transfers]
            self.__dict__["_transfers"] = cached
        return cached

    def summary(self) -> dict:
        return {"schedule": self.schedule, "iteration_time_ms": self.iteration_time_ms,
                "bubble_ratio": self.bubble_ratio, "peak_inflight": list(self.peak_inflight),
                "busy_ms": list(self.busy_ms)}

    def stage_ops(self, stage: int) -> list[OpRecord]:
        return [o for o in self.ops if o.stage == stage]


def check_structure(problem: PipelineProblem, schedule: Schedule) -> list[int]:
    """Check every device does each of its operations exactly once; return peak in-flight.

    Peak in-flight per device counts (micro-batch, chunk) activation sets held at once:
    one is taken when its F starts and released when its B (or W) ends.
    """
    p, m, v = problem.stages, problem.microbatches, schedule.virtual_stages
    if schedule.stages != p:
        raise ScheduleError(f"schedule {schedule.name!r} has {schedule.stages} stage lists, "
                            f"problem has {p} stages")
    peaks: list[int] = []
    for d, acts in enumerate(schedule.actions):
        seen = bytearray(4 * v * m)
        held = peak = 0
        for a in acts:
            if a.microbatch >= m:
                raise ScheduleError(f"stage {d}: action {a} names micro-batch {a.microbatch}, "
                                    f"only {m} exist")
            if a.chunk >= v:
                raise ScheduleError(f"stage {d}: action {a} names chunk {a.chunk}, "
                                    f"schedule has {v} per device")
            kind = _KIND[a.kind]
            base = a.chunk * m + a.microbatch
            idx = kind * v * m + base
            if seen[idx]:
                raise ScheduleError(f"stage {d}: action {a} appears twice")
            seen[idx] = 1
            if kind == _F:
                held += 1
                peak = max(peak, held)
            else:
                if not seen[base]:
                    raise ScheduleError(f"stage {d}: {a} comes before F{a.microbatch}"
                                        + (f"@{a.chunk}" if a.chunk else "")
                                        + " on the same stage (deadlock)")
                if kind == _W and not seen[2 * v * m + base]:
                    raise ScheduleError(f"stage {d}: {a} comes before its I (deadlock)")
                if kind == _B and seen[2 * v * m + base]:
                    raise ScheduleError(f"stage {d}: micro-batch {a.microbatch} has both B "
                                        "and I/W")
                if kind == _I and seen[v * m + base]:
                    raise ScheduleError(f"stage {d}: micro-batch {a.microbatch} has both B "
                                        "and I/W")
                if kind in (_B, _W):
                    held -= 1
        for c in range(v):
            for j in range(m):
                base = c * m + j
                tag = f"{j}@{c}" if c else f"{j}"
                if not seen[base]:
                    raise ScheduleError(f"stage {d}: missing F{tag}")
                has_b = seen[v * m + base]
                has_i, has_w = seen[2 * v * m + base], seen[3 * v * m + base]
                if not has_b and not (has_i and has_w):
                    missing = "B" if not (has_i or has_w) else ("W" if has_i else "I")
                    raise ScheduleError(f"stage {d}: missing {missing}{tag}")
        peaks.append(peak)
    return peaks


def check_memory(problem: PipelineProblem, schedule: Schedule, peaks: list[int]) -> None:
    for d, (peak, cap) in enumerate(zip(peaks, problem.caps, strict=True)):
        if cap is not None and peak > cap:
            raise ScheduleError(f"stage {d} holds {peak} micro-batches of activations at once, "
                                f"over the memory cap of {cap}", path="memory_cap")


def _links(problem: PipelineProblem, v: int) -> tuple[list[float], list[float], list[str]]:
    """Per link direction: serialisation ms, latency ms, name. Link 2h fwd, 2h+1 bwd."""
    p = problem.stages
    ser: list[float] = []
    lat: list[float] = []
    names: list[str] = []
    for h, hop in enumerate(problem.hops):
        s = problem.hop_serialisation_ms(h)
        ser += [s, s]
        lat += [hop.latency_ms, hop.latency_ms]
        names += [f"h{h}+", f"h{h}-"]
    if v > 1 and p > 1:
        # Interleaved wrap-around (device p-1 -> device 0): a path back along the chain,
        # modelled as its own FIFO link with the summed latency and the narrowest hop.
        bw = min(h.bandwidth_gbps for h in problem.hops)
        from testbed.schedule.model import Hop
        s = Hop(0.0, bw).serialisation_ms(problem.max_activation_mb())
        wl = sum(h.latency_ms for h in problem.hops)
        ser += [s, s]
        lat += [wl, wl]
        names += ["wrap+", "wrap-"]
    return ser, lat, names


def time_schedule(problem: PipelineProblem, schedule: Schedule, *, check_memory_cap: bool = True,
                  record: bool = True) -> Timing:
    """Time `schedule` on `problem` exactly; raises ScheduleError if invalid or deadlocked."""
    peaks = check_structure(problem, schedule)
    if check_memory_cap:
        check_memory(problem, schedule, peaks)
    p, m, v = problem.stages, problem.microbatches, schedule.virtual_stages
    nv = p * v
    ser, lat, link_names = _links(problem, v)
    wf = problem.weight_grad_fraction
    # Compile each device's list: (kind, k*m+j, duration, action).
    prog: list[list[tuple[int, int, float, Action]]] = []
    for d, acts in enumerate(schedule.actions):
        f_ms = problem.forward_ms[d] / v
        b_ms = problem.backward_ms[d] / v
        dur = (f_ms, b_ms, b_ms * (1.0 - wf), b_ms * wf)
        row = []
        for a in acts:
            kind = _KIND[a.kind]
            row.append((kind, (a.chunk * p + d) * m + a.microbatch, dur[kind], a))
        prog.append(row)

    unk = -1.0
    act_ready = [unk] * (nv * m)   # activation for F(k, j) present at k's device
    for j in range(m):
        act_ready[j] = 0.0
    grad_ready = [unk] * (nv * m)  # gradient for B/I(k, j) present at k's device
    f_done = [unk] * (nv * m)
    i_done = [unk] * (nv * m)
    last = (nv - 1) * m
    link_free = [0.0] * len(ser)
    wrap = 2 * (p - 1)
    ptr = [0] * p
    free = [0.0] * p
    busy = [0.0] * p
    blocked = [False] * p
    ops: list[tuple] = []
    transfers: list[tuple] = []
    stack = list(range(p - 1, -1, -1))
    while stack:
        d = stack.pop()
        blocked[d] = False
        row = prog[d]
        i = ptr[d]
        n = len(row)
        t = free[d]
        while i < n:
            kind, idx, dur, a = row[i]
            if kind == _F:
                r = act_ready[idx]
                if r < 0:
                    break
            elif kind == _W:
                r = i_done[idx]  # same device; always known by structure check
            else:
                r = f_done[idx]
                if idx < last:
                    g = grad_ready[idx]
                    if g < 0:
                        break
                    if g > r:
                        r = g
            start = t if t >= r else r
            t = start + dur
            busy[d] += dur
            if record:
                ops.append((d, a, start, t))
            i += 1
            if kind == _F:
                f_done[idx] = t
                if idx < last:
                    k = idx // m
                    nd = d + 1 if d + 1 < p else 0
                    if p == 1:
                        arr = t
                    else:
                        lk = 2 * d if d + 1 < p else wrap
                        tx = link_free[lk]
                        if tx < t:
                            tx = t
                        leave = tx + ser[lk]
                        link_free[lk] = leave
                        arr = leave + lat[lk]
                        if record:
                            transfers.append((link_names[lk], d, nd, "activation",
                                       idx % m, k, t, tx, leave, arr))
                    act_ready[idx + m] = arr
                    if blocked[nd]:
                        blocked[nd] = False
                        stack.append(nd)
            elif kind != _W:
                i_done[idx] = t
                if idx >= m:
                    k = idx // m
                    nd = d - 1 if d > 0 else p - 1
                    if p == 1:
                        arr = t
                    else:
                        lk = 2 * (d - 1) + 1 if d > 0 else wrap + 1
                        tx = link_free[lk]
                        if tx < t:
                            tx = t
                        leave = tx + ser[lk]
                        link_free[lk] = leave
                        arr = leave + lat[lk]
                        if record:
                            transfers.append((link_names[lk], d, nd, "gradient",
                                       idx % m, k, t, tx, leave, arr))
                    grad_ready[idx - m] = arr
                    if blocked[nd]:
                        blocked[nd] = False
                        stack.append(nd)
        ptr[d] = i
        free[d] = t
        if i < n:
            blocked[d] = True  # woken when the missing input is produced
    if any(ptr[d] < len(prog[d]) for d in range(p)):
        raise ScheduleError(_deadlock_message(prog, ptr, m, p))
    iteration = max(free) if p else 0.0
    total_busy = sum(busy)
    bubble = 1.0 - total_busy / (p * iteration) if iteration > 0 else 0.0
    return Timing(schedule.name, iteration, bubble, peaks, busy, ops, transfers)


def _deadlock_message(prog: list, ptr: list[int], m: int, p: int) -> str:
    waits = []
    for d in range(p):
        if ptr[d] < len(prog[d]):
            kind, idx, _, a = prog[d][ptr[d]]
            k = idx // m
            need = (f"activation from virtual stage {k - 1}" if kind == _F
                    else f"gradient from virtual stage {k + 1}")
            waits.append(f"stage {d} waits at {a} for the {need}")
    return "deadlock: " + "; ".join(waits)
