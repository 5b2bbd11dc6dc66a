"""The job simulator's side of network events: protection, a hit job's outage, its records.

`JobSimulator` (engine.py) calls these: `reserve_standby` holds the link-disjoint standby
lightpaths of schemes 1+1 and backup; `repair_at_s` finds when a cut fibre comes back
(scheme none, or a restoration that found no spectrum); `hop_rtts_s` gives the hit
boundaries' round trips before and after; `job_marks` turns a job's progress
trace into the iteration completions that `testbed.analysis.faultimpact` reads, so the
simulator's figures come from the same definitions as the emulation's.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from testbed.analysis.faultimpact import (
    TCP_RETRIES2,
    TCP_RTO_MAX_S,
    WINDOW_AFTER,
    WINDOW_BEFORE,
    Effect,
    EventMark,
    IterationMark,
    WorkerModel,
    iteration_rows,
    job_event_impact,
    outage_effect,
    tcp_give_up_s,
    tcp_rto0_s,
    window_marks,
)
from testbed.jobs.cluster import Allocation, Cluster
from testbed.optical import Lightpath
from testbed.spec.models import EventSpec

_EPS = 1e-9
REPAIRS = {"fiber_cut": "fiber_repair", "wavelength_loss": "wavelength_repair"}


def repair_at_s(events: Sequence[tuple[int, EventSpec]], ev: EventSpec, now_s: float) -> float:
    """When the fibre (or slot block) `ev` took down is repaired: the first matching
    repair at or after now (math.inf: never)."""
    want = REPAIRS.get(ev.kind)
    if want is None or ev.link is None:
        return math.inf
    key = frozenset(ev.link)
    for _, e in events:
        if e.kind != want or e.link is None or frozenset(e.link) != key or e.at_s < now_s:
            continue
        if want == "wavelength_repair" and not _overlaps(e, ev):
            continue
        return e.at_s
    return math.inf


def _overlaps(a: EventSpec, b: EventSpec) -> bool:
    assert a.first_slot is not None and a.slots is not None
    assert b.first_slot is not None and b.slots is not None
    return a.first_slot < b.first_slot + b.slots and b.first_slot < a.first_slot + a.slots


def reserve_standby(cluster: Cluster, alloc: Allocation, spectrum: str, rng: Any) -> int:
    """1+1 / backup: for every inter-DC boundary without one, hold a standby lightpath
    (same slot count) on the first candidate route sharing no fibre with the working
    one; returns how many boundaries stay unprotected (no such route or no spectrum)."""
    net = cluster.network
    unprotected = 0
    for b, lp in enumerate(alloc.lightpaths):
        if lp is None or b in alloc.standby or lp.id not in net.lightpaths:
            continue
        used = set(lp.path.links)
        got = None
        for path in cluster.paths(alloc.stage_dcs[b], alloc.stage_dcs[b + 1]):
            if used & set(path.links):
                continue
            first = net.find_block(path, lp.n_slots, spectrum, rng)
            if first is not None:
                got = net.assign(path, first, lp.n_slots)
                break
        if got is None:
            unprotected += 1
        else:
            alloc.standby[b] = got
    return unprotected


def hop_rtts_s(old: Sequence[Lightpath], new: Sequence[Lightpath | None]
               ) -> tuple[float, float]:
    """(round trip of the hit boundaries before the cut, after it), seconds: the longest
    over the boundaries (the pipeline waits for the slowest)."""
    before = max((2.0 * lp.latency_ms for lp in old), default=0.0) / 1000.0
    after = max((2.0 * lp.latency_ms for lp in new if lp is not None),
                default=before * 1000.0) / 1000.0
    return before, after


def _completions(trace: Sequence[tuple[float, float]], n_lo: int, n_hi: int,
                 job: str) -> list[IterationMark]:
    """Completions of iterations n_lo..n_hi (1-based counts) from a (time, progress)
    trace: linear between points, flat while frozen, a drop where an interrupted
    iteration was thrown away (its completion after the drop is marked redone)."""
    out: list[IterationMark] = []
    redo: set[int] = set()
    for (ta, pa), (tb, pb) in itertools.pairwise(trace):
        if pb < pa - _EPS:
            redo.add(math.floor(pb + _EPS) + 1)
            continue
        if pb - pa <= _EPS:
            continue
        first = max(math.floor(pa + _EPS) + 1, n_lo)
        last = min(math.floor(pb + _EPS), n_hi)
        for n in range(first, last + 1):
            t = ta + (n - pa) / (pb - pa) * (tb - ta)
            out.append(IterationMark(job, n - 1, t, redone=n in redo))
    return out


def progress_at(trace: Sequence[tuple[float, float]], t_s: float) -> float:
    """Iterations done at time t_s (the last trace value at or before it)."""
    p = 0.0
    for t, v in trace:
        if t > t_s + _EPS:
            break
        p = v
    return p


def job_marks(trace: Sequence[tuple[float, float]], at_s: float, job: str,
              start_s: float | None) -> list[IterationMark]:
    """The iteration completions around an event at at_s (WINDOW_BEFORE before,
    WINDOW_AFTER after), the first with its start when it is the job's first."""
    p0 = progress_at(trace, at_s)
    n_lo = max(1, math.floor(p0 + _EPS) - WINDOW_BEFORE)
    n_hi = math.floor(p0 + _EPS) + WINDOW_AFTER + 2
    marks = _completions(trace, n_lo, n_hi, job)
    if marks and marks[0].iteration == 0 and start_s is not None:
        m = marks[0]
        marks[0] = IterationMark(m.job, m.iteration, m.end_s, start_s, m.redone)
    return window_marks(marks, at_s)


def impact_of(job: str, trace: Sequence[tuple[float, float]], start_s: float | None,
              rec: dict[str, Any], next_at_s: float | None, planned: int,
              done_iterations: float) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The fault_impact row and fault_iterations.csv rows of one hit (rec: what the
    engine recorded at the event: index, kind, target, at_s, outage_s, effect, ...)."""
    effect = rec["effect"]
    at = rec["at_s"]
    marks = job_marks(trace, at, job, start_s)
    failed = not effect.survived
    failed_at = at + effect.fail_after_s if failed else None
    ev = EventMark(rec["index"], rec["kind"], rec["target"], at,
                   rec["outage_s"] if math.isfinite(rec["outage_s"]) else None)
    row = job_event_impact(job, marks, ev, next_at_s=next_at_s, planned_iterations=planned,
                           failed=failed, error=effect.error, failed_at_s=failed_at,
                           steady_s=rec["steady_s"], hit=True, source="sim")
    row["protection"] = rec["scheme"]
    row["restarts"] = effect.restarts
    row["error"] = effect.error
    row["iterations_lost"] = effect.redo_fraction + (
        max(0.0, planned - done_iterations) if failed else 0.0)
    row["iterations_redone"] = 1 if effect.restarts else 0
    if not math.isfinite(rec["outage_s"]):
        row["outage_s"] = None
        row["note"] = "the path never came back (no repair, no detour)"
    row["model"] = {
        "phase": rec["phase"], "transport": rec["transport"],
        "resume_wait_s": effect.wait_s if math.isfinite(effect.wait_s) else None,
        "recovery_s": effect.recovery_s, "rto0_s": effect.rto0_s, "freeze_s": effect.freeze_s,
        "collective_timeout_s": rec["timeout_s"], "on_fault": rec["on_fault"],
        "restart_s": rec["restart_s"], "route": rec["route"],
        "predicted_touched_s": rec["predicted_touched_s"]
        if math.isfinite(rec["predicted_touched_s"]) else None,
        "after_iteration_s": rec["after_s"]}
    if effect.notes.get("cut_phase") is not None:  # the phase's transport model
        row["model"]["cut"] = {k: v for k, v in effect.notes.items()
                               if not isinstance(v, float) or math.isfinite(v)}
    return row, iteration_rows("sim", job, rec["index"], marks)


# ------------------------------------------------------------------ the cut's phase
# What TCP does after a cut depends on what the hit lightpath carried at the cut instant
# (docs/faults.md, "The cut's phase"). Linux (6.x, net/ipv4/tcp_output.c, tcp_recovery.c):
# * the tail loss probe fires PTO = 2 srtt + TCP_TIMEOUT_MIN (2 ms, a constant of the
#   kernel's clock) after the flight's last transmission, or 2 srtt + the socket's
#   rto_min (tcp_rto_min_us: the route's rto_min) when one segment is outstanding; never
#   later than the retransmission time-out, which then doubles from srtt + rto_min;
# * the probe (the flight's last segment sent again) is SACKed one round trip of the new
#   route later; RACK then marks the rest of the flight lost and fast recovery sends it
#   again under PRR (RFC 6937, its slow-start bound): with every other segment of the
#   flight lost, the only ACKs are those of the retransmissions, so recovery grows from
#   one segment a round trip like slow start, 1, 2, 4, ...: a flight of k lost segments
#   is delivered ceil(log2(k + 1)) round trips of the new route after the first
#   retransmission (the same after a time-out: cwnd 1, slow start).
# Measured in the emulation (fault-link-flap, kernel trace tcp:tcp_probe /
# tcp_retransmit_skb, 2026-12-07): a lost flight of 2 segments (a barrier message) is
# back 2 round trips after the probe, one of 17 segments (two activations) 5-6.
TCP_TIMEOUT_MIN_S = 0.002
"""Linux TCP_TIMEOUT_MIN_US: the loss probe's slack when more than one segment is out."""
MSS_BYTES = 1448
"""A segment's payload (1500 MTU, timestamps)."""
MESSAGE_HEADER_SEGMENTS = 1
"""gloo writes each message's preamble (48 bytes) as a segment of its own."""
CONTROL_MESSAGE_SEGMENTS = 2
"""A control message (a barrier's): its preamble and a small payload."""
PHASE_KINDS = ("idle", "control", "bulk")


def message_segments(nbytes: int) -> int:
    """The segments one gloo message of `nbytes` payload takes on the wire."""
    return MESSAGE_HEADER_SEGMENTS + max(1, math.ceil(max(0, nbytes) / MSS_BYTES))


@dataclass(frozen=True)
class CutPhase:
    """What the hit lightpath carried at a cut, for the transport model (scenario s).

    kind: `idle` (nothing on it: no loss unless a send falls in the outage), `control`
    (only small control messages: a barrier's), `bulk` (a transfer mid-way: activations
    or gradients). `lost_segments`: the flight the outage takes (every transfer on the
    wire at the cut or sent into the outage, the largest direction); `last_send_s`: that
    flight's last transmission, from the cut (<= 0: before it); `next_send_s` (idle): the
    first send on the boundary after the cut (None: none known); `srtt_s`: the smoothed
    RTT the probe uses (None: the route's RTT before the cut); `tlp_slack_s`: the
    probe's constant (TCP_TIMEOUT_MIN_S, over time_factor as emulated)."""

    kind: str
    lost_segments: int = 0
    last_send_s: float = 0.0
    next_send_s: float | None = None
    srtt_s: float | None = None
    continued_s: float | None = None
    continued_segments: int = 0
    tlp_slack_s: float = TCP_TIMEOUT_MIN_S
    detail: dict[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if self.kind not in PHASE_KINDS:
            raise ValueError(f"cut phase kind must be one of {PHASE_KINDS} (got {self.kind!r})")
        if self.lost_segments < 0:
            raise ValueError(f"lost_segments must be >= 0 (got {self.lost_segments})")

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "lost_segments": self.lost_segments,
                "last_send_s": self.last_send_s, "next_send_s": self.next_send_s,
                "srtt_s": self.srtt_s, "tlp_slack_s": self.tlp_slack_s,
                "continued_s": self.continued_s,
                "continued_segments": self.continued_segments, **self.detail}

    @classmethod
    def of(cls, value: CutPhase | Mapping[str, Any] | str) -> CutPhase:
        """From a CutPhase, its as_dict() (extra keys kept as detail) or a kind."""
        if isinstance(value, CutPhase):
            return value
        if isinstance(value, str):
            return cls(value, CONTROL_MESSAGE_SEGMENTS if value == "control" else 0)
        known = {f.name for f in fields(cls)} - {"detail"}
        return cls(**{k: v for k, v in value.items() if k in known},
                   detail={k: v for k, v in value.items() if k not in known})


def recovery_rounds(lost_segments: int) -> int:
    """Round trips of the new route from the first retransmission until a tail-lost
    flight of `lost_segments` is delivered (PRR / slow start from one segment)."""
    return math.ceil(math.log2(max(1, lost_segments) + 1))


def cut_transport(cut: CutPhase, *, outage_s: float, rtt_s: float, rtt_after_s: float,
                  rto_min_s: float) -> tuple[float, float, dict[str, Any]]:
    """(wait, recovery, notes) of TCP through an outage of `outage_s` that hit a
    lightpath in phase `cut`: wait from the cut until the lost flight's first
    retransmission that finds the path back (math.inf: none before TCP gives up), then
    recovery, the round trips of the new route that deliver the flight. Nothing lost (an
    idle path whose next send comes after the outage, or no outage): (0, 0)."""
    srtt = cut.srtt_s if cut.srtt_s is not None else rtt_s
    notes: dict[str, Any] = {"cut_phase": cut.kind, "lost_segments": cut.lost_segments}
    if outage_s <= 0:
        return 0.0, 0.0, notes
    if cut.kind == "idle":
        if cut.next_send_s is None or cut.next_send_s >= outage_s or cut.lost_segments <= 0:
            notes["lost_segments"] = 0
            return 0.0, 0.0, notes
        start = cut.next_send_s  # the first send after the cut is lost: a tail from then
    else:
        start = cut.last_send_s
    lost = max(1, cut.lost_segments)
    rto0 = srtt + rto_min_s
    pto = min(2.0 * srtt + (rto_min_s if lost == 1 else cut.tlp_slack_s), rto0)
    t, rto = pto, rto0
    sends = [t]
    for _ in range(TCP_RETRIES2):
        t += rto
        sends.append(t)
        rto = min(2.0 * rto, TCP_RTO_MAX_S)
    back = next((s for s in sends if start + s >= outage_s), None)
    notes.update(loss_probe_s=start + pto, rto0_s=rto0)
    cont = cut.continued_s
    if cont is not None and cont >= outage_s and (back is None or cont < start + back):
        # the flow went on after the path's return, before the probe: the SACKs of that
        # data come back a round trip later and RACK marks the flight lost; each SACKed
        # segment lets PRR send one more, so the flight goes in ceil(log2(k / m + 1))
        # rounds (m: the segments sent on; one when m >= k)
        m = max(1, cut.continued_segments)
        rounds = recovery_rounds(math.ceil(lost / m))
        notes.update(resumed_by="SACKs of the data sent after the return",
                     recovery_rounds=rounds)
        return cont + rtt_after_s, rounds * rtt_after_s, notes
    if back is None:
        return math.inf, 0.0, notes
    rounds = recovery_rounds(lost)
    notes.update(resumed_by="loss probe" if back == pto else "retransmission time-out",
                 recovery_rounds=rounds)
    return max(0.0, start + back), rounds * rtt_after_s, notes


def phase_effect(cut: CutPhase | None, *, phase: float, steady_s: float, outage_s: float,
                 rtt_s: float, rtt_after_s: float, workers: WorkerModel,
                 restarts_used: int = 0) -> Effect:
    """outage_effect with the transport's wait and recovery from the cut's phase (TCP);
    without a phase, or with the ideal transport, outage_effect itself. A wait past the
    collective time-out (or TCP giving up) fails or restarts as outage_effect says."""
    kw = dict(phase=phase, steady_s=steady_s, outage_s=outage_s, rtt_s=rtt_s,
              rtt_after_s=rtt_after_s, workers=workers, restarts_used=restarts_used)
    if cut is None or workers.transport != "tcp" or not math.isfinite(outage_s):
        return outage_effect(**kw)  # type: ignore[arg-type]
    wait, recovery, notes = cut_transport(cut, outage_s=outage_s, rtt_s=rtt_s,
                                          rtt_after_s=rtt_after_s,
                                          rto_min_s=workers.tcp_rto_min_s)
    give_up = tcp_give_up_s(workers.tcp_rto_min_s)
    if math.isfinite(wait) and wait <= workers.collective_timeout_s and wait <= give_up:
        return Effect(True, wait + recovery, wait_s=wait, recovery_s=recovery,
                      rto0_s=tcp_rto0_s(rtt_s, workers.tcp_rto_min_s), notes=notes)
    base = outage_effect(**kw)  # type: ignore[arg-type]
    return dataclasses.replace(base, notes={**base.notes, **notes})
