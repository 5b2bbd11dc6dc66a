"""A job's side of a network event: stall, recovery, survival, from iteration completions.

Pure (no mininet, os-ken or torch): the emulation calls it on the workers' measured
iterations, the simulator on the iterations its model predicts, so both backends report
the same figures by the same definitions (docs/faults.md, "The job's side"):

* an iteration's time is the time between its completion and the previous one's (a
  stall, an abandoned and redone iteration or a restart all land in that gap);
* steady = median of the (up to) `STEADY_ITERATIONS` iterations completed before the event;
* touched = the first iteration completing after the event, each later one that began
  before the outage ended, then each following one still slower than (1 + tolerance) x
  the steady after the event;
* stall = the touched iterations' time beyond steady; recovery = event until the end of
  the last iteration outside (1 + tolerance) x steady (null if the job never gets back).

The model of what an outage does to the workers (`outage_effect`) is here too: the
transport's resume time (TCP's retransmission back-off, or ideal), the collective's
time-out, and fail / retry (restart the process group, redo the interrupted iteration).
"""

from __future__ import annotations

import csv
import io
import math
import statistics
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

TOLERANCE = 0.05
"""Back to steady: within 5 % of the steady iteration time."""
STEADY_ITERATIONS = 10
"""Iterations before an event whose median is the steady iteration time."""
WINDOW_BEFORE = 20
"""Iterations before an event kept in fault_iterations.csv."""
WINDOW_AFTER = 40
"""Iterations after an event kept in fault_iterations.csv."""
GLOO_DEFAULT_TIMEOUT_S = 1800.0
"""torch.distributed's default process-group time-out for gloo (30 min)."""
NCCL_DEFAULT_TIMEOUT_S = 600.0
"""torch.distributed's default process-group time-out for NCCL (10 min)."""
TCP_RTO_MAX_S = 120.0
"""Linux TCP_RTO_MAX: the longest retransmission interval."""
TCP_RETRIES2 = 15
"""Linux net.ipv4.tcp_retries2: retransmissions of one segment before the connection
is given up (ETIMEDOUT)."""
ITERATION_COLUMNS = ("source", "job", "event", "iteration", "end_s", "iteration_time_s",
                     "redone")


# ------------------------------------------------------------------ the outage model
def effective_timeout_s(collective_timeout_s: float | None) -> float:
    """A spec's collective time-out, None meaning torch's gloo default (1800 s)."""
    return GLOO_DEFAULT_TIMEOUT_S if collective_timeout_s is None else collective_timeout_s


def tcp_rto0_s(rtt_s: float, rto_min_s: float) -> float:
    """Linux's first retransmission time-out on a path of round trip rtt_s: srtt + the
    minimum RTO (rttvar is held at least at rto_min)."""
    return rtt_s + rto_min_s


def tcp_retransmits_s(rtt_s: float, rto_min_s: float,
                      limit: int = TCP_RETRIES2) -> list[float]:
    """Times after the loss at which Linux TCP sends the lost data again: the tail loss
    probe at 2 x srtt, then `limit` retransmissions at intervals rto0, 2 rto0, 4 rto0, ...
    (at most TCP_RTO_MAX_S each). Measured in the emulation (tcp:tcp_retransmit_skb, a
    300 ms cut on a 6 ms RTT: +7.6 ms, +227 ms, +637 ms)."""
    t = 2.0 * rtt_s
    out = [t]
    rto = tcp_rto0_s(rtt_s, rto_min_s)
    for _ in range(limit):
        t += rto
        out.append(t)
        rto = min(2.0 * rto, TCP_RTO_MAX_S)
    return out


def tcp_give_up_s(rto_min_s: float) -> float:
    """When Linux gives a connection up after tcp_retries2 retransmissions
    (tcp_model_timeout: doubling from the minimum RTO, linear once TCP_RTO_MAX_S is
    reached): 924.6 s with the 200 ms minimum."""
    if rto_min_s <= 0:
        return 0.0
    thresh = int(math.log2(TCP_RTO_MAX_S / rto_min_s))
    if TCP_RETRIES2 <= thresh:
        return ((2 << TCP_RETRIES2) - 1) * rto_min_s
    return ((2 << thresh) - 1) * rto_min_s + (TCP_RETRIES2 - thresh) * TCP_RTO_MAX_S


def resume_wait_s(outage_s: float, transport: str, rtt_s: float,
                  rto_min_s: float) -> float:
    """Seconds from the cut until the job's traffic flows again: `ideal` at once when the
    path is back; `tcp` at its first (re)transmission at or after that (math.inf when the
    path is back only after the last of TCP_RETRIES2 retransmissions)."""
    if outage_s <= 0:
        return 0.0
    if transport == "ideal":
        return outage_s
    for t in tcp_retransmits_s(rtt_s, rto_min_s):
        if t >= outage_s:
            return t
    return math.inf


@dataclass(frozen=True)
class WorkerModel:
    """The workers' fault behaviour (spec policy.workers), in scenario seconds."""

    collective_timeout_s: float = GLOO_DEFAULT_TIMEOUT_S
    on_fault: str = "fail"
    restart_s: float = 30.0
    max_restarts: int = 3
    transport: str = "tcp"
    tcp_rto_min_s: float = 0.2

    @classmethod
    def from_spec(cls, spec: Any, rto_min_s: float | None = None) -> WorkerModel:
        """From a WorkersFaultSpec (or anything with its fields)."""
        return cls(effective_timeout_s(spec.collective_timeout_s), spec.on_fault,
                   spec.restart_s, spec.max_restarts, spec.transport,
                   spec.tcp_rto_min_s if rto_min_s is None else rto_min_s)


@dataclass(frozen=True)
class Effect:
    """What one outage does to one job: freeze (no progress) for `freeze_s` from the cut,
    redo `redo_fraction` of an iteration, or fail `fail_after_s` after the cut."""

    survived: bool
    freeze_s: float
    redo_fraction: float = 0.0
    restarts: int = 0
    fail_after_s: float | None = None
    error: str | None = None
    wait_s: float = 0.0
    recovery_s: float = 0.0
    rto0_s: float = 0.0
    notes: dict[str, Any] = field(default_factory=dict)


def gloo_timeout_error(timeout_s: float) -> str:
    """The message of gloo's time-out, as torch raises it (without the source location)."""
    return f"Timed out waiting {round(timeout_s * 1000)}ms for recv operation to complete"


def outage_effect(*, phase: float, steady_s: float, outage_s: float, rtt_s: float,
                  rtt_after_s: float, workers: WorkerModel,
                  restarts_used: int = 0) -> Effect:
    """The model of one job hit by an outage of `outage_s` (math.inf: never back) while
    `phase` (0..1) of its current iteration of `steady_s` is done. The whole pipeline is
    charged (every stage waits on the hit boundary within the iteration):

    * the transport resumes after `resume_wait_s` (TCP: the tail loss probe at 2 rtt, then
      retransmissions rto0 = rtt + tcp_rto_min_s apart, doubling: the first at or after
      the path's return), then recovers in 2 round trips of the new path (the lost window
      sent again, the ACK clock restarted; `ideal`: none);
    * a wait longer than the collective time-out (or TCP giving up first) raises in the
      blocked op: `fail` ends the job there; `retry` restarts the process group once the
      time-out has fired and the path is back, `restart_s` later, and redoes the
      interrupted iteration from its start (its done part, `phase`, is lost)."""
    tcp = workers.transport == "tcp"
    rto0 = tcp_rto0_s(rtt_s, workers.tcp_rto_min_s)
    wait = resume_wait_s(outage_s, workers.transport, rtt_s, workers.tcp_rto_min_s)
    timeout = workers.collective_timeout_s
    give_up = tcp_give_up_s(workers.tcp_rto_min_s) if tcp else math.inf
    recovery = 2.0 * rtt_after_s if tcp and wait > 0 else 0.0
    if wait <= timeout and wait <= give_up and math.isfinite(wait):
        return Effect(True, wait + recovery, wait_s=wait, recovery_s=recovery, rto0_s=rto0)
    err_after = min(timeout, give_up)
    error = gloo_timeout_error(timeout) if timeout <= give_up else (
        f"Connection timed out (TCP gave up after {TCP_RETRIES2} retransmissions, "
        f"{give_up:.1f} s)")
    can_retry = workers.on_fault == "retry" and restarts_used < workers.max_restarts
    if not can_retry or not math.isfinite(outage_s):
        why = "" if math.isfinite(outage_s) or not can_retry else \
            " (the restarted group never met: the path did not come back)"
        return Effect(False, err_after, fail_after_s=err_after, error=error + why,
                      wait_s=wait, rto0_s=rto0,
                      notes={"restarts_left": workers.max_restarts - restarts_used})
    back = max(err_after, outage_s)
    return Effect(True, back + workers.restart_s, redo_fraction=phase, restarts=1,
                  error=error, wait_s=wait, rto0_s=rto0,
                  notes={"restart_at_s": back, "restart_s": workers.restart_s})


def touched_iteration_s(phase: float, steady_s: float, after_s: float,
                        effect: Effect) -> float:
    """The hand-derived time of the iteration the outage hits (completion to
    completion): survived, phase x steady + freeze + (1 - phase) x after; retried,
    phase x steady + freeze + after (the whole iteration again)."""
    if not effect.survived:
        return math.inf
    if effect.redo_fraction > 0 or effect.restarts:
        return phase * steady_s + effect.freeze_s + after_s
    return phase * steady_s + effect.freeze_s + (1.0 - phase) * after_s


# ------------------------------------------------------------------ measured figures
@dataclass(frozen=True)
class IterationMark:
    """One completed iteration of a job, on the events' clock (scenario seconds)."""

    job: str
    iteration: int
    end_s: float
    start_s: float | None = None
    redone: bool = False


@dataclass(frozen=True)
class EventMark:
    """A network event as the job analysis needs it (index into the spec's events)."""

    index: int
    kind: str
    target: str
    at_s: float
    outage_s: float | None = None


def iteration_times(marks: Sequence[IterationMark]) -> list[tuple[IterationMark, float]]:
    """(mark, completion-to-completion time) in completion order; the first uses its own
    start when known, else is left out."""
    out = []
    prev: float | None = None
    for m in sorted(marks, key=lambda m: (m.end_s, m.iteration)):
        if prev is not None:
            out.append((m, m.end_s - prev))
        elif m.start_s is not None:
            out.append((m, m.end_s - m.start_s))
        prev = m.end_s
    return out


def _median(vals: Sequence[float]) -> float | None:
    return statistics.median(vals) if vals else None


def _back_within(times: Sequence[tuple[IterationMark, float]], ref: float | None,
                 at_s: float, tolerance: float) -> float | None:
    """Event until the end of the last iteration slower than (1 + tolerance) x ref
    (0 when none was); None when the last iteration is still outside (never back)."""
    if ref is None or not times:
        return None
    bound = ref * (1.0 + tolerance)
    bad = [m.end_s for m, t in times if t > bound]
    if not bad:
        return 0.0
    if times[-1][1] > bound:
        return None
    return max(bad) - at_s


def job_event_impact(job: str, iterations: Sequence[IterationMark], event: EventMark, *,
                     next_at_s: float | None = None, planned_iterations: int | None = None,
                     failed: bool = False, error: str | None = None,
                     failed_at_s: float | None = None, steady_s: float | None = None,
                     tolerance: float = TOLERANCE, hit: bool = True,
                     source: str = "emu",
                     claimed: Collection[int] = ()) -> dict[str, Any]:
    """One `fault_impact` row: the job's iterations through one event (docs/faults.md).
    `claimed`: iterations another event's row already charged (impact_rows): left out of
    this row's steady, touched, stall, recovery and redone figures, so that an event that
    did not hit the job (a repair) is not charged the stall of the cut before it. Each
    iteration's time stays completion to completion over all of them."""
    taken = frozenset(claimed)
    times = iteration_times(iterations)
    at = event.at_s
    before = [t for m, t in times if m.end_s <= at
              and m.iteration not in taken][-STEADY_ITERATIONS:]
    steady = steady_s if steady_s is not None else _median(before)
    end = next_at_s if next_at_s is not None else math.inf
    after_all = [(m, t) for m, t in times if at < m.end_s <= end
                 and m.iteration not in taken]
    outage_end = at + (event.outage_s or 0.0)
    touched: list[tuple[IterationMark, float]] = []
    rest = list(after_all)
    if rest:
        touched.append(rest.pop(0))
        while rest and rest[0][0].end_s - rest[0][1] < outage_end:
            touched.append(rest.pop(0))
    # the steady after the event: the median of what follows the outage's iterations
    after = _median([t for _, t in rest[1:]] or [t for _, t in rest])
    if after is not None:
        while rest and rest[0][1] > after * (1.0 + tolerance) and len(rest) > 1:
            touched.append(rest.pop(0))
        after = _median([t for _, t in rest]) or after
    if not touched and failed:
        touched = []
    stall = None if steady is None else sum(t - steady for _, t in touched)
    if failed and steady is not None and failed_at_s is not None:
        last = touched[-1][0].end_s if touched else max(
            (m.end_s for m, _ in times if m.end_s <= at), default=at)
        stall = (stall or 0.0) + max(0.0, failed_at_s - max(last, at))
    redone = sum(1 for m, _ in after_all if m.redone)
    done_after = [m for m, _ in times if m.end_s > at]
    done_all = max((m.iteration for m in iterations), default=-1) + 1
    lost = 0.0
    if failed and planned_iterations is not None:
        lost = float(max(0, planned_iterations - done_all))
    win = [m.iteration for m in iterations]
    row: dict[str, Any] = {
        "source": source, "job": job, "event": event.index, "kind": event.kind,
        "target": event.target, "at_s": at, "hit": hit, "outage_s": event.outage_s,
        "steady_iteration_s": steady, "after_iteration_s": after if not failed or rest
        else None,
        "slowdown_after": (after / steady - 1.0) if after is not None and steady and
        (not failed or rest) else None,
        "iterations_touched": len(touched),
        "touched_iteration_s": [t for _, t in touched],
        "touched_iterations": [m.iteration for m, _ in touched],
        "stall_s": stall,
        "stall_iterations": stall / steady if stall is not None and steady else None,
        "iterations_redone": redone,
        "iterations_lost": lost,
        "recovery_s": None if failed else _back_within(after_all, steady, at, tolerance),
        "settle_s": None if failed else _back_within(after_all, after, at, tolerance),
        "survived": not failed,
        "error": error,
        "failed_at_s": failed_at_s,
        "restarts": 0,
        "iterations_after": len(done_after),
        "window": [min(win), max(win)] if win else None,
    }
    return row


def impact_rows(iterations_by_job: Mapping[str, Sequence[IterationMark]],
                events: Sequence[EventMark],
                outcomes: Mapping[str, Mapping[str, Any]] | None = None,
                hit: Mapping[str, set[int]] | None = None,
                source: str = "emu", tolerance: float = TOLERANCE) -> list[dict[str, Any]]:
    """`fault_impact` rows of every job through every event (emulation records), in time
    order: `outcomes[job]` may give failed / error / failed_at_s / planned_iterations;
    `hit[job]` the events that touched the job's traffic (None: all of them).

    Figures are per event: an iteration is charged to one row only, the first event that
    touched it, the events that hit the job first (their windows, each up to the job's
    next hit, do not overlap), then the others (a repair, a cut of another fibre) in time
    order on what is left: a repair right after a cut is not charged the cut's stall
    again. A failure belongs to the last hit event before it (else the last event); the
    other rows of a failed job say so in `note`."""
    outcomes = outcomes or {}
    evs = sorted(events, key=lambda e: e.at_s)
    rows: list[dict[str, Any]] = []
    for job, marks in iterations_by_job.items():
        out = outcomes.get(job, {})
        failed_at = out.get("failed_at_s")
        hits = {e.index for e in evs} if hit is None else set(hit.get(job, set()))
        mine = [e for e in evs if e.index in hits]
        owner = None  # the event the job's failure is charged to
        if out.get("failed") and failed_at is not None:
            owner = next((e.index for e in reversed(mine) if e.at_s <= failed_at), None)
            if owner is None:
                owner = next((e.index for e in reversed(evs) if e.at_s <= failed_at), None)
        claimed: set[int] = set()
        by_index: dict[int, dict[str, Any]] = {}
        for ev in sorted(evs, key=lambda e: (e.index not in hits, e.at_s)):
            # the job's window ends at the next event that hits it
            nxt = next((e.at_s for e in mine if e.at_s > ev.at_s), None)
            fails_here = owner == ev.index
            row = job_event_impact(
                job, marks, ev, next_at_s=nxt,
                planned_iterations=out.get("planned_iterations"), failed=fails_here,
                error=out.get("error") if fails_here else None,
                failed_at_s=failed_at if fails_here else None, tolerance=tolerance,
                hit=ev.index in hits, source=source, claimed=claimed)
            claimed.update(row["touched_iterations"])
            if owner is not None and not fails_here:
                row["note"] = (f"the job failed at {failed_at:.6g} s, charged to event "
                               f"{owner}")
            by_index[ev.index] = row
        rows += [by_index[e.index] for e in evs]
    return rows


def window_marks(marks: Sequence[IterationMark], at_s: float,
                 before: int = WINDOW_BEFORE, after: int = WINDOW_AFTER
                 ) -> list[IterationMark]:
    """The marks around one event: up to `before` completed at or before at_s and up to
    `after` completed after it."""
    ordered = sorted(marks, key=lambda m: m.end_s)
    pre = [m for m in ordered if m.end_s <= at_s][-(before + 1):]
    post = [m for m in ordered if m.end_s > at_s][:after]
    return pre + post


def iteration_rows(source: str, job: str, event: int,
                   marks: Sequence[IterationMark]) -> list[dict[str, Any]]:
    """fault_iterations.csv rows (ITERATION_COLUMNS) of one job's window of one event."""
    return [{"source": source, "job": job, "event": event, "iteration": m.iteration,
             "end_s": m.end_s, "iteration_time_s": t, "redone": int(m.redone)}
            for m, t in iteration_times(marks)]


def iterations_csv_text(rows: Iterable[Mapping[str, Any]]) -> str:
    """fault_iterations.csv: a header (ITERATION_COLUMNS) and the rows."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(ITERATION_COLUMNS)
    for r in rows:
        w.writerow([_cell(r.get(c)) for c in ITERATION_COLUMNS])
    return buf.getvalue()


def _cell(v: Any) -> Any:
    return f"{v:.9g}" if isinstance(v, float) else ("" if v is None else v)
