"""The phase of a fibre cut for each job (what was on the wire across each hit boundary
at the cut instant), read from the workers' records: what the simulator's transport model
needs to predict the emulated stall (testbed.jobs.faults.CutPhase; docs/faults.md "The
cut's phase")."""

from __future__ import annotations

import itertools
import math
import re
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from testbed.jobs import faults as jf

_OP = re.compile(r"^([FBIW])(\d+)$")


def transfers(stages: Sequence[Sequence[Mapping[str, Any]]], plan: Mapping[str, Any],
               boundary: int) -> list[dict[str, Any]]:
    """The messages across `boundary` (between stages b and b + 1) that the workers'
    records show, in time order: {dir: act | grad | barrier, send (monotonic s, the
    sending op's end or the stage's iteration end), arrival (the receiver's wait end
    when it waited, else None), segments}. Activations and gradients from the ops of
    one-chunk schedules (F/B/I op names), barrier messages from each stage's iteration
    ends."""
    nbytes = list(plan.get("activation_bytes") or [])
    size = int(nbytes[boundary]) if boundary < len(nbytes) else 0
    seg = jf.message_segments(size)
    a, b = boundary, boundary + 1
    if b >= len(stages):
        return []
    waits: dict[tuple[int, int, str], float] = {}
    for s in (a, b):
        for r in stages[s]:
            if r.get("type") == "iteration":
                for name, _t0, t1 in r.get("waits") or []:
                    waits[(s, int(r["iteration"]), str(name))] = float(t1)
    out: list[dict[str, Any]] = []
    for s, kind, dst, other in ((a, "F", b, "act"), (b, "B", a, "grad"), (b, "I", a, "grad")):
        for r in stages[s]:
            if r.get("type") != "iteration":
                continue
            it = int(r["iteration"])
            for name, _start, end in r.get("ops") or []:
                m = _OP.match(str(name))
                if m is None or m.group(1) != kind:
                    continue
                want = f"F{m.group(2)}" if other == "act" else f"B{m.group(2)}"
                out.append({"dir": other, "send": float(end), "segments": seg,
                            "arrival": waits.get((dst, it, want)) or
                            waits.get((dst, it, f"I{m.group(2)}"))})
    ends: dict[int, dict[int, float]] = {}
    for s in (a, b):
        for r in stages[s]:
            if r.get("type") == "iteration" and not r.get("projected"):
                # the barrier before the next iteration (not one that a projected
                # iteration, stopped by the cut, would reach)
                ends.setdefault(int(r["iteration"]), {})[s] = float(r["end_s"])
    for it, e in sorted(ends.items()):
        if len(e) == 2:  # each stage enters at its iteration's end
            out.append({"dir": "barrier", "send": min(e.values()), "arrival": None,
                        "segments": jf.CONTROL_MESSAGE_SEGMENTS, "ends": (e[a], e[b]),
                        "iteration": it})
    out.sort(key=lambda t: t["send"])
    return out


BARRIER_ROUNDS = 2
"""Message rounds of the barrier between iterations (its exchange lasts this many
transits after the later stage entered it: measured, a cut 23 ms of wall time after the
later stage's entry still caught a barrier message on the wire)."""


def _transit_s(transfers: Sequence[Mapping[str, Any]], before: float) -> float | None:
    """A message's one-way time on the boundary (wall s): the median over the messages
    that arrived before `before` while their receiver waited (steady, not the cut's)."""
    vals = [t["arrival"] - t["send"] for t in transfers
            if t.get("arrival") is not None and t["arrival"] <= before
            and t["arrival"] >= t["send"]]
    return statistics.median(vals[-64:]) if vals else None


def cut_phase_at(transfers: Sequence[Mapping[str, Any]], cut_mono_s: float,
                 outage_wall_s: float, time_factor: float,
                 transit_s: float | None = None) -> jf.CutPhase:
    """The phase of one boundary at a cut at `cut_mono_s` (monotonic s) for an outage of
    `outage_wall_s`: every message on the wire at the cut (sent less than a transit
    before it) or sent into the outage is lost; per direction they are one flight. bulk:
    an activation or gradient among them; control: barrier messages only; idle: none,
    `next_send_s` the first message after the cut. Scenario seconds (/ time_factor)."""
    tf = time_factor
    transit = transit_s if transit_s is not None else _transit_s(transfers, cut_mono_s)
    transit = transit or 0.0
    lo, hi = cut_mono_s - transit, cut_mono_s + max(0.0, outage_wall_s)
    hit = [t for t in transfers if t["dir"] != "barrier" and lo <= t["send"] <= hi]
    for t in transfers:  # a barrier's messages are on the wire from the first stage's
        # entry until BARRIER_ROUNDS transits after the later one's
        if t["dir"] == "barrier" and t["send"] <= hi and \
                max(t["ends"]) + BARRIER_ROUNDS * transit >= cut_mono_s:
            ea, eb = t["ends"]  # round one at each entry, round two once the other's came
            sends = (ea, eb, max(ea, eb + transit), max(eb, ea + transit))
            last = max([x for x in sends if x <= cut_mono_s], default=min(sends))
            hit.append({**t, "send": last})
    detail = {"transit_s": round(transit / tf, 6),
              "in_flight": [{"dir": t["dir"], "send_s": round((t["send"] - cut_mono_s) / tf, 6),
                             "segments": t["segments"]} for t in hit]}
    if not hit:
        nxt = next((t["send"] for t in transfers if t["send"] > cut_mono_s), None)
        return jf.CutPhase("idle", 0, 0.0, None if nxt is None else (nxt - cut_mono_s) / tf,
                           detail=detail)
    flights: dict[str, list[Mapping[str, Any]]] = {}
    for t in hit:  # a direction: activations go b -> b+1, gradients back, barrier both
        way = {"act": "down", "grad": "up"}.get(t["dir"], "both")
        flights.setdefault(way, []).append(t)
    if "both" in flights:  # the barrier's message joins the flight of either direction
        ctl = flights.pop("both")
        for way in ("down", "up"):
            flights[way] = flights.get(way, []) + ctl
    way, flight = max(flights.items(), key=lambda kv: (sum(t["segments"] for t in kv[1]),
                                                        max(t["send"] for t in kv[1])))
    kind = "bulk" if any(t["dir"] != "barrier" for t in hit) else "control"
    detail["direction"] = way
    # the flow going on once the path is back: the next message in that direction
    want = {"down": "act", "up": "grad"}.get(way)
    later = next((t for t in transfers if t["send"] > hi and t["dir"] == want), None)
    return jf.CutPhase(kind, sum(t["segments"] for t in flight),
                       (max(t["send"] for t in flight) - cut_mono_s) / tf,
                       continued_s=None if later is None else (later["send"] - cut_mono_s) / tf,
                       continued_segments=0 if later is None else later["segments"],
                       detail=detail)


def phases_at_marks(marks: Sequence[tuple[Any, Any, Mapping[str, Any]]],
                    records: Mapping[str, Sequence[Sequence[Mapping[str, Any]]]],
                    time_factor: float,
                    plans: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[int, dict[str, Any]]]:
    """Per job and event of `marks` (testbed.orchestrate.impact.event_marks: (mark, at,
    the injector's row)): the phase of the job's worst hit boundary (the most segments
    lost) at the event's first cut, as CutPhase.as_dict(). Boundaries: those between
    stages in different DCs (plan.json info.stage_dcs; all when unknown)."""
    out: dict[str, dict[int, dict[str, Any]]] = {}
    for job, stages in records.items():
        plan = plans.get(job) or {}
        dcs = list((plan.get("info") or {}).get("stage_dcs") or [])
        bounds = [b for b in range(len(stages) - 1)
                  if len(dcs) != len(stages) or dcs[b] != dcs[b + 1]]
        per = {b: transfers(stages, plan, b) for b in bounds}
        total = _total_iterations(plan)
        for mark, _at, row in marks:
            if mark.kind not in ("fiber_cut", "link_flap", "wavelength_loss") \
                    or mark.outage_s is None or row.get("monotonic_s") is None:
                continue
            cut_mono, outage_wall = _cut_instant(row, float(mark.outage_s) * time_factor)
            seen, projected = with_iteration_in_progress(stages, cut_mono, total)
            wire = per if not projected else {b: transfers(seen, plan, b) for b in bounds}
            phases = [cut_phase_at(wire[b], cut_mono, outage_wall, time_factor) for b in bounds]
            if not phases:
                continue
            rank = {"idle": 0, "control": 1, "bulk": 2}
            worst = max(phases, key=lambda c: (rank[c.kind], c.lost_segments))
            phase = worst.as_dict()
            if projected:
                phase["projected_stages"] = projected
            out.setdefault(job, {})[mark.index] = phase
    return out


def _total_iterations(plan: Mapping[str, Any]) -> int | None:
    """The iterations a stage runs, warm-up included (workloads.worker), from plan.json."""
    try:
        return int(plan["iterations"]) + int(plan.get("warmup_iterations", 1))
    except (KeyError, TypeError, ValueError):
        return None


PERIOD_SAMPLES = 8
"""Steady iterations whose start-to-start times give the period of a projection."""


def with_iteration_in_progress(stages: Sequence[Sequence[Mapping[str, Any]]], cut_mono_s: float,
                               total: int | None
                               ) -> tuple[list[list[Mapping[str, Any]]], list[int]]:
    """The stages' records, each with the iteration it was running at the cut added when
    its records stop before the cut although it had iterations left (a worker writes an
    iteration's record when it ends: a job that failed in the outage never wrote the one
    the cut interrupted): its last iteration shifted by the median period of its steady
    ones, with the ops under way at the cut and the next one only (no waits: no transit
    sample; no barrier at its end). Returns (records, the stages projected)."""
    out: list[list[Mapping[str, Any]]] = []
    projected: list[int] = []
    for s, recs in enumerate(stages):
        its = [r for r in recs if r.get("type") == "iteration"]
        last = its[-1] if its else None
        try:
            if last is None or total is None or int(last["iteration"]) + 1 >= total \
                    or float(last["end_s"]) >= cut_mono_s:
                raise ValueError("nothing to project")
            last_start, last_end = float(last["start_s"]), float(last["end_s"])
            starts = [float(r["start_s"]) for r in its
                      if not r.get("warmup")][-PERIOD_SAMPLES - 1:]
        except (KeyError, TypeError, ValueError):  # complete, or records that do not tell
            out.append(list(recs))
            continue
        gaps = [b - a for a, b in itertools.pairwise(starts) if b > a]
        if not gaps:
            out.append(list(recs))
            continue
        period = statistics.median(gaps)
        k = max(1, math.ceil((cut_mono_s - last_end) / period))
        shift = k * period  # the iteration running at the cut (one per period after the last)
        ops = sorted(([str(name), float(a) + shift, float(b) + shift]
                      for name, a, b in last.get("ops") or []), key=lambda o: o[1])
        began = [o for o in ops if o[1] <= cut_mono_s]
        # the ops under way at the cut and the next one (its inputs came before the cut);
        # later ones may wait for what the outage holds back
        ops = began + [o for o in ops if o[1] > cut_mono_s][:1]
        nxt = {**last, "iteration": int(last["iteration"]) + k, "projected": True,
               "start_s": last_start + shift, "end_s": last_end + shift,
               "ops": ops, "waits": []}
        out.append([*recs, nxt])
        projected.append(s)
    return out, projected


def hit_cuts(row: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """A flap's cuts that took down a lightpath (the injector's `restored` or `lost`
    lists; after the first, the controller's detour may no longer cross the fibre), or
    every cut where the row does not say."""
    cuts = list(row.get("cuts") or [])
    return [c for c in cuts if c.get("restored") or c.get("lost")] or cuts


def _cut_instant(row: Mapping[str, Any], outage_wall_s: float) -> tuple[float, float]:
    """(when the data plane went down, monotonic s; for how long, wall s) of an event's
    first cut that took a lightpath down (else its first): the injector's
    link_set_monotonic_s (taken as it sets the link down, after its look at the
    controller's lightpaths) and that cut's own cut_to_restored_s where
    the row has them, else the row's stamp and the event's outage."""
    first = (hit_cuts(row) or [row])[0]
    t = first.get("link_set_monotonic_s", row.get("link_set_monotonic_s"))
    restored = first.get("cut_to_restored_s")
    out = float(restored) if isinstance(restored, int | float) and t is not None \
        else outage_wall_s
    return float(t if t is not None else row["monotonic_s"]), out
