"""Each stage boundary's messages, as delivered, against the model's FIFO link (pure).

The simulator times a message across a boundary as a FIFO link: it starts when the link
is free after its send, occupies it for its serialisation time and arrives a one-way
latency later. The workers' records hold when each message was sent (the end of the op
that made it: the worker posts its send right after) and, where the receiver waited for
it, when it arrived (the end of that wait: workloads.executor records every wait over
0.1 ms). Per boundary and direction this gives the emulation's excess over the model per
message, in scenario time:

    excess = (arrival_emulated - arrival_model) / time_factor

arrival_model = max(send, link free) + serialisation + latency, all in emulated time
(the model's figures x time_factor), the link's FIFO carried from message to message.
A message the receiver did not wait for (it arrived before it was wanted) has no arrival
time and is not counted. What it tells: where an iteration's excess over the simulator
is spent (a lightpath, or a boundary inside a DC whose 5 us the emulated switch cannot
give), which the iteration totals alone cannot.

Only stages timed on one clock can be compared (one machine's CLOCK_MONOTONIC), and only
schedules without interleaving (one model chunk per device: boundary h joins devices h
and h+1).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from testbed.schedule import Action, PipelineProblem

DIRECTIONS = ("act", "grad")


def _q(xs: Sequence[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def _ops(rec: dict[str, Any]) -> dict[str, tuple[float, float]]:
    return {str(n): (float(a), float(b)) for n, a, b in rec.get("ops", [])}


def _waits(rec: dict[str, Any]) -> dict[str, tuple[float, float]]:
    return {str(n): (float(a), float(b)) for n, a, b in rec.get("waits", [])}


def _sends(actions: Sequence[Sequence[Action]], hop: int,
           direction: str) -> tuple[int, list[tuple[str, str]]]:
    """(sending device, [(sender's op, receiver's op)]) of one boundary's direction, in
    the sender's order."""
    src = hop if direction == "act" else hop + 1
    out = []
    for a in actions[src]:
        if direction == "act" and a.kind == "F":
            out.append((str(a), str(Action("F", a.microbatch))))
        elif direction == "grad" and a.kind in ("B", "I"):
            # the receiver's B (or I, where the schedule splits backward) of the micro-batch
            want = next((str(b) for b in actions[hop] if b.kind in ("B", "I")
                         and b.microbatch == a.microbatch), None)
            if want is not None:
                out.append((str(a), want))
    return src, out


def transfer_excess(records: Sequence[Sequence[dict[str, Any]]], problem: PipelineProblem,
                    actions: Sequence[Sequence[Action]], time_factor: float,
                    stage_dcs: Sequence[str] | None = None, virtual_stages: int = 1,
                    one_clock: bool = True) -> dict[str, Any]:
    """Per boundary and direction: the messages seen arriving and their excess over the
    model's FIFO link (scenario ms: median, p90, worst, mean), over the measured (not
    warm-up) iterations. `records`: each stage's worker records; `actions`: each device's
    actions of the schedule; `stage_dcs`: each stage's DC (labels a boundary inside one).
    {"skipped": why} where the records cannot be compared."""
    p = len(problem.forward_ms)
    if virtual_stages != 1:
        return {"skipped": "an interleaved schedule (a boundary per model chunk)"}
    if not one_clock:
        return {"skipped": "stages on several machines (no common clock)"}
    if len(records) != p or len(actions) != p or p < 2:
        return {"skipped": "no boundary" if p < 2 else "records of another pipeline"}
    if not time_factor > 0:
        raise ValueError(f"time_factor must be > 0, got {time_factor!r}")
    iters = [{int(r["iteration"]): r for r in stage if r.get("type") == "iteration"
              and not r.get("warmup")} for stage in records]
    common = sorted(set.intersection(*(set(i) for i in iters))) if iters else []
    act_mb = problem.activation_mb
    rows = []
    for hop, h in enumerate(problem.hops):
        size_mb = act_mb[hop] if isinstance(act_mb, tuple) else act_mb
        ser_ms = h.serialisation_ms(float(size_mb)) * time_factor
        lat_ms = h.latency_ms * time_factor
        for direction in DIRECTIONS:
            src, pairs = _sends(actions, hop, direction)
            dst = hop + 1 if direction == "act" else hop
            excess_ms: list[float] = []
            sent = 0
            link_free_s = float("-inf")
            for it in common:
                s_ops, d_waits = _ops(iters[src][it]), _waits(iters[dst][it])
                for send_op, recv_op in pairs:
                    if send_op not in s_ops:
                        continue
                    sent += 1
                    start_s = max(s_ops[send_op][1], link_free_s)
                    link_free_s = start_s + ser_ms / 1e3
                    model_s = link_free_s + lat_ms / 1e3
                    w = d_waits.get(recv_op)
                    if w is not None and w[1] >= s_ops[send_op][1]:
                        excess_ms.append((w[1] - model_s) * 1e3 / time_factor)
            row: dict[str, Any] = {
                "boundary": hop, "direction": direction, "from_stage": src, "to_stage": dst,
                "model_ms": round(h.latency_ms + h.serialisation_ms(float(size_mb)), 4),
                "messages": sent, "seen": len(excess_ms)}
            if stage_dcs is not None:
                row["dcs"] = f"{stage_dcs[src]}->{stage_dcs[dst]}"
                row["inside_dc"] = stage_dcs[src] == stage_dcs[dst]
            if excess_ms:
                row.update({"excess_ms_median": round(statistics.median(excess_ms), 4),
                            "excess_ms_p90": round(_q(excess_ms, 0.9), 4),
                            "excess_ms_max": round(max(excess_ms), 4),
                            "excess_ms_mean": round(statistics.fmean(excess_ms), 4)})
            rows.append(row)
    return {"iterations": len(common), "boundaries": rows}
