"""The job simulator's side of network events: protection, a hit job's outage, its records.

`JobSimulator` (engine.py) calls these: `reserve_standby` holds the link-disjoint standby
lightpaths of schemes 1+1 and backup; `repair_at_s` finds when a cut fibre comes back
(scheme none, or a restoration that found no spectrum); `hop_rtts_s` gives the hit
boundaries' round trips before and after; `job_marks` turns a job's progress
trace into the iteration completions that `testbed.analysis.faultimpact` reads, so the
simulator's figures come from the same definitions as the emulation's.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

from testbed.analysis.faultimpact import (
    WINDOW_AFTER,
    WINDOW_BEFORE,
    EventMark,
    IterationMark,
    iteration_rows,
    job_event_impact,
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
    return row, iteration_rows("sim", job, rec["index"], marks)
