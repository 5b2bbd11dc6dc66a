"""The jobs' side of an emulation's network events: summary.json `fault_impact`,
`fault_iterations.csv` and `fault_agreement` (issue 58; docs/faults.md, "The job's side").

Pure (no torch, no root): from the workers' records (every stage's iterations on the
machine's monotonic clock, the faults and restarts they lived through, their error) and
the fault injector's summary (when each network event was applied, on the same clock),
the marks of testbed.analysis.faultimpact on the events' clock in scenario seconds
((monotonic - the clock's zero) / time_factor), so that the figures compare with the
simulator's (testbed.jobs.outage.predict_outage), which builds the same marks from its
model and calls the same function.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping, Sequence
from itertools import pairwise
from pathlib import Path
from typing import Any

from testbed.analysis.faultimpact import (
    EventMark,
    IterationMark,
    impact_rows,
    iteration_rows,
    window_marks,
)
from testbed.emu.scale import Scale
from testbed.orchestrate.cutphase import hit_cuts, phases_at_marks
from testbed.spec.models import EventSpec, Scenario

log = logging.getLogger(__name__)

JOB_KINDS = ("fiber_cut", "fiber_repair", "link_flap", "wavelength_loss", "wavelength_repair")
"""The network events a job's traffic can feel (the testbed's own are not in it)."""
AGREEMENT_REL = 0.10
AGREEMENT_ABS_S = 0.020
"""The emulation's stall agrees with the simulator's within max(10 %, 20 ms)."""


def agreement_band_s(sim_stall_s: float) -> float:
    """The allowed difference of the emulated stall from the simulated one."""
    return max(AGREEMENT_REL * abs(sim_stall_s), AGREEMENT_ABS_S)


def job_marks(job: str, stages: Sequence[Sequence[dict[str, Any]]], zero_s: float,
              time_factor: float) -> list[IterationMark]:
    """Every iteration all of the job's stages finished, in its last run (a redone
    iteration replaces the interrupted one), as IterationMarks on the events' clock:
    end = the last stage's end, start = stage 0's start, redone = run again after a
    restart (workloads.faulttol)."""
    latest: list[dict[int, dict[str, Any]]] = []
    for recs in stages:
        by_it: dict[int, dict[str, Any]] = {}
        for r in recs:
            if r.get("type") == "iteration":
                by_it[int(r["iteration"])] = r
        latest.append(by_it)
    if not latest:
        return []
    common = sorted(set.intersection(*(set(d) for d in latest)))
    out = []
    for it in common:
        recs = [d[it] for d in latest]
        end = max(float(r["end_s"]) for r in recs)
        out.append(IterationMark(job, it, (end - zero_s) / time_factor,
                                 (float(recs[0]["start_s"]) - zero_s) / time_factor,
                                 any(bool(r.get("redone")) for r in recs)))
    return out


def job_outcome(stages: Sequence[Sequence[dict[str, Any]]], failure: str | None,
                failed_mono_s: float | None, zero_s: float, time_factor: float,
                planned: int) -> dict[str, Any]:
    """outcomes[job] of impact_rows: failed, the error (the launcher's failure text,
    which carries the worker's own: gloo's "Timed out waiting Nms ..."), when (the first
    stage's error record, else when the launcher noticed), the iterations planned; and
    the restarts the job's stages made (`restarts`: [events' clock s of each])."""
    errors = [float(r["t_s"]) for recs in stages for r in recs
              if r.get("type") == "error" and isinstance(r.get("t_s"), int | float)]
    t_fail = min(errors) if errors else failed_mono_s
    restarts = sorted((round((float(r["fault_s"]) - zero_s) / time_factor, 6),
                       str(r.get("error", "")))
                      for r in (stages[0] if stages else []) if r.get("type") == "restart")
    return {"failed": failure is not None,
            "error": failure,
            "failed_at_s": None if failure is None or t_fail is None
            else (t_fail - zero_s) / time_factor,
            "planned_iterations": planned, "restarts": restarts}
    # restarts: [(events' clock s of the fault, its error)] (stage 0's records)


def _spec_index(scenario: Scenario, row: Mapping[str, Any], used: set[int]) -> int | None:
    """The spec event a faults row is of (rows are in time order, spec events need not
    be): the first unused one of the same kind, target and time."""
    for i, ev in enumerate(scenario.events):
        if i not in used and ev.kind == row.get("kind") and ev.target == row.get("target") \
                and math.isclose(ev.at_s, float(row.get("at_s", -1.0)), abs_tol=1e-9):
            used.add(i)
            return i
    return None


def _applied_s(rec: Mapping[str, Any], zero_s: float, time_factor: float) -> float | None:
    mono = rec.get("monotonic_s")
    return None if mono is None else (float(mono) - zero_s) / time_factor


def event_marks(scenario: Scenario, faults: Mapping[str, Any], zero_s: float,
                time_factor: float, static: bool = False
                ) -> list[tuple[EventMark, float, Mapping[str, Any]]]:
    """(EventMark, the spec's at_s, the faults row) of every applied network event. The
    mark's at_s is when the injector applied it (events' clock, scenario s); its outage
    is what the job's traffic saw: a cut restored by the controller its restoration
    (cut_to_restored_s / time_factor), a static circuit's until its fibre's repair, a
    flap from its first cut to its last repair (static) or the longest restoration of
    the cuts that took a lightpath down (hit_cuts); a lost lightpath: none (math.inf is
    not JSON: None, 'never back')."""
    rows = list(faults.get("faults") or [])
    used: set[int] = set()
    indexed = [(r, _spec_index(scenario, r, used)) for r in rows]
    out = []
    for k, (row, idx) in enumerate(indexed):
        if row.get("kind") not in JOB_KINDS or not row.get("applied") or idx is None:
            continue
        at = _applied_s(row, zero_s, time_factor)
        if at is None:
            continue
        outage = _outage_s(row, indexed[k + 1:], zero_s, time_factor, at, static)
        if row["kind"] == "link_flap" and static:
            outage = _flap_outage_s(scenario.events[idx])
        out.append((EventMark(idx, str(row["kind"]), str(row["target"]), at, outage),
                    float(row["at_s"]), row))
    return out


def _outage_s(row: Mapping[str, Any], later: Sequence[tuple[Mapping[str, Any], int | None]],
              zero_s: float, time_factor: float, at_s: float, static: bool
              ) -> float | None:
    kind = row["kind"]
    if kind in ("fiber_repair", "wavelength_repair"):
        return 0.0
    if kind == "link_flap":
        times = [c["cut_to_restored_s"] for c in hit_cuts(row) if "cut_to_restored_s" in c]
        return max(times) / time_factor if times else None
    if static and kind == "fiber_cut":
        for nxt, _ in later:  # the fibre's repair (not applied: the jobs ended first,
            # and the outage was the spec's, cut to repair)
            if nxt.get("kind") == "fiber_repair" and nxt.get("target") == row["target"]:
                t = _applied_s(nxt, zero_s, time_factor)
                if t is None:
                    return max(0.0, float(nxt["at_s"]) - float(row["at_s"]))
                return max(0.0, t - at_s)
        return None
    if row.get("cut_to_restored_s") is not None and not (row.get("lost") or {}).get(
            "lightpaths"):
        return float(row["cut_to_restored_s"]) / time_factor
    if row.get("recovery_s") is not None and kind == "wavelength_loss":
        return float(row["recovery_s"]) / time_factor
    return None


def _flap_outage_s(ev: EventSpec | None) -> float | None:
    """A static flap's outage: its first cut to its last repair (scenario s)."""
    if ev is None or ev.period_s is None or ev.count is None:
        return None
    return (ev.count - 1) * ev.period_s + ev.period_s / 2.0


def job_fibres(lightpaths: Sequence[Mapping[str, Any] | None],
               emulated_routes: Mapping[frozenset[str], Sequence[str]],
               stage_dcs: Sequence[str]) -> set[frozenset[str]]:
    """The fibres a job's traffic crosses at its start: its boundaries' lightpaths
    (`fibres` from the controller), else the DC pair's emulated lightpath
    (`emulated_routes`: {DC pair: node path}, static forwarding)."""
    out: set[frozenset[str]] = set()
    for lp in lightpaths:
        if lp and lp.get("fibres"):
            out |= {frozenset(map(str, f)) for f in lp["fibres"]}
    if out:
        return out
    for a, b in pairwise(stage_dcs):
        path = emulated_routes.get(frozenset((a, b)))
        if a != b and path:
            out |= {frozenset(p) for p in pairwise(map(str, path))}
    return out


def emu_fault_impact(scenario: Scenario, records: Mapping[str, Sequence[Sequence[dict]]],
                     faults: Mapping[str, Any], per_job: Sequence[Mapping[str, Any]],
                     time_factor: float,
                     fibres_of: Mapping[str, set[frozenset[str]]] | None = None,
                     planned: Mapping[str, int] | None = None,
                     failed_mono_s: Mapping[str, float | None] | None = None
                     ) -> dict[str, Any]:
    """summary.json's `fault_impact` (one row per job and applied network event, source
    emu), the fault_iterations.csv rows and `fault_agreement` (against the simulator's
    predict_outage with the measured outages). {} without a clock zero (no event ran).
    `per_job`: worker_jobs rows (job, failure); `fibres_of[job]`: the fibres its traffic
    crosses (hit); `planned[job]`: its iterations planned."""
    zero = faults.get("events_clock_zero_monotonic_s")
    if zero is None:
        return {}
    zero = float(zero)
    marks_ev = event_marks(scenario, faults, zero, time_factor,
                           static=scenario.emulation.forwarding == "static")
    if not marks_ev:
        return {}
    events = [m for m, _at, _row in marks_ev]
    by_job = {str(s["job"]): s for s in per_job}
    iterations = {job: job_marks(job, stages, zero, time_factor)
                  for job, stages in records.items()}
    outcomes = {job: job_outcome(records[job], by_job.get(job, {}).get("failure"),
                                 (failed_mono_s or {}).get(job), zero, time_factor,
                                 (planned or {}).get(job, 0))
                for job in records}
    hit = None
    if fibres_of is not None:
        rows_of = {m.index: row for m, _at, row in marks_ev}
        hit = {job: {e.index for e in events
                     if _hits(e, rows_of[e.index], fibres_of.get(job, set()),
                              _lightpath_ids(by_job.get(job, {})))}
               for job in records}
    rows = impact_rows(iterations, events, outcomes, hit, source="emu")
    planned_at = {m.index: at for m, at, _ in marks_ev}
    for r in rows:
        r["applied_at_s"] = r["at_s"]
        r["at_s"] = planned_at.get(r["event"], r["at_s"])
        out = outcomes.get(r["job"], {})
        hits = None if hit is None else hit.get(r["job"], set())
        t0, t1 = r["applied_at_s"], _next_at(events, r["event"], hits)
        mine = [err for t, err in out.get("restarts", []) if t0 <= t < t1]
        r["restarts"] = len(mine)
        if mine and r.get("error") is None:  # lived through it by a restart: its error
            r["error"] = mine[0]
    # each (job, event) that hit the job, as the simulator's file (a repair's window would
    # show the cut's stall again: it is in the cut's, which runs on through the repair)
    its = []
    for job, marks in iterations.items():
        for m in events:
            if hit is None or m.index in hit.get(job, set()):
                its += iteration_rows("emu", job, m.index, window_marks(marks, m.at_s))
    return {"fault_impact": rows, "fault_iterations": its}


HIT_KINDS = ("fiber_cut", "link_flap", "wavelength_loss")
"""The events that take down or move a lightpath (a repair hits nothing: the job's
window of a cut runs on through its repair, as the simulator's does)."""


def _lightpath_ids(job: Mapping[str, Any]) -> set[int]:
    out = set()
    for lp in job.get("lightpaths") or []:
        for key in ("lightpath_id", "own_lightpath_id"):
            if lp and isinstance(lp.get(key), int):
                out.add(int(lp[key]))
    return out


def _hits(ev: EventMark, row: Mapping[str, Any], fibres: set[frozenset[str]],
          ids: set[int]) -> bool:
    """Whether the event took down or moved one of the job's lightpaths: by the
    controller's ids where the row names them (restored or lost), else by the fibres
    of the job's route at its start (static forwarding)."""
    if ev.kind not in HIT_KINDS:
        return False
    lost = row.get("lost") or {}
    named = set(lost.get("lightpaths") or []) | set(lost.get("restored") or [])
    named |= {int(m["id"]) for m in row.get("moved") or [] if isinstance(m.get("id"), int)}
    if ids and (named or ev.kind == "wavelength_loss"):
        return bool(ids & named)
    return frozenset(ev.target.split("-", 1)) in fibres


def _next_at(events: Sequence[EventMark], index: int,
             hits: set[int] | None = None) -> float:
    """When the job's restarts stop being charged to this event: at the next event that
    hit the job (`hits`: its events; None: every one that takes a lightpath down; a
    repair does not end a cut's window; math.inf: none). An event that did not hit the
    job (a repair) is charged no restart."""
    me = next(e for e in events if e.index == index)
    if me.kind not in HIT_KINDS or (hits is not None and index not in hits):
        return me.at_s
    later = [e.at_s for e in events if e.at_s > me.at_s and e.kind in HIT_KINDS
             and (hits is None or e.index in hits)]
    return min(later) if later else math.inf


def fault_agreement(scenario: Scenario, emu_rows: Sequence[Mapping[str, Any]],
                    policy: Mapping[str, Any] | None = None,
                    phases: Mapping[str, Mapping[int, Any]] | None = None) -> dict[str, Any]:
    """The emulated stalls against the simulator's prediction for the same outages
    (testbed.jobs.outage.predict_outage with each event's measured outage; the spec's
    tcp_rto_min_s: the emulation dilates the kernel's, testbed.emu.tcp_tuning): per
    (job, event) that hit the job (a repair's row is not compared: it hit nothing) the
    stalls, their difference and the band max(10 %, 20 ms); `collective_timeout_s` the
    time-out each side applied, scenario seconds (`policy`: summary.json
    worker_fault_policy). {"rows": [], "note": why} when nothing could be compared."""
    from testbed.jobs.outage import predict_outage

    outages = {int(r["event"]): float(r["outage_s"]) for r in emu_rows
               if r.get("outage_s") is not None and r.get("hit", True)}
    try:
        pred = predict_outage(scenario, outages or None, phases=phases or None)
    except Exception as exc:  # the comparison is a record; the run's figures stand
        log.warning("fault agreement: no prediction: %s", exc)
        return {"rows": [], "note": f"no simulator prediction: {exc}"}
    sim = {(r["job"], int(r["event"])): r for r in pred["fault_impact"]}
    rows = []
    for e in emu_rows:
        s = sim.get((e["job"], int(e["event"])))
        if s is None or not e.get("hit", True):
            continue
        es, ss = e.get("stall_s"), s.get("stall_s")
        row: dict[str, Any] = {
            "job": e["job"], "event": e["event"], "kind": e["kind"], "target": e["target"],
            "outage_s": e.get("outage_s"), "emu_stall_s": es, "sim_stall_s": ss,
            "emu_survived": e.get("survived"), "sim_survived": s.get("survived"),
            "emu_error": e.get("error"), "sim_error": s.get("error"),
            "cut_phase": (phases or {}).get(e["job"], {}).get(int(e["event"]))}
        if es is not None and ss is not None:
            band = agreement_band_s(ss)
            row.update(difference_s=es - ss, band_s=band, within=abs(es - ss) <= band)
        else:
            row["within"] = None
        row["same_outcome"] = e.get("survived") == s.get("survived")
        rows.append(row)
    checked = [r for r in rows if r["within"] is not None]
    model = pred.get("model") or {}
    return {"rows": rows, "compared": len(checked),
            "within": sum(1 for r in checked if r["within"]),
            "band": f"max({AGREEMENT_REL:.0%}, {AGREEMENT_ABS_S * 1e3:.0f} ms)",
            "collective_timeout_s": {
                "emu": (policy or {}).get("collective_timeout_scenario_s"),
                "emu_source": (policy or {}).get("collective_timeout_source"),
                "sim": model.get("collective_timeout_s")},
            "sim_model": pred.get("model")}


def record_fault_impact(scenario: Scenario, run_dir: Path, result: Mapping[str, Any],
                        faults: Mapping[str, Any],
                        emulated_routes: Mapping[frozenset[str], Sequence[str]]
                        ) -> dict[str, Any]:
    """The summary part (`fault_impact`, `fault_agreement`) of a pp_jobs emulation with
    network events, from the records in run_dir (workers/JOB/stageN.jsonl and plan.json),
    with fault_iterations.csv written there; {} when no network event was applied."""
    from testbed.analysis.faultimpact import iterations_csv_text
    from testbed.io.atomic import atomic_write_text
    from testbed.orchestrate.results import read_records

    per_job = list(result.get("worker_jobs") or [])
    records: dict[str, list[list[dict[str, Any]]]] = {}
    planned: dict[str, int] = {}
    plans: dict[str, dict[str, Any]] = {}
    fibres: dict[str, set[frozenset[str]]] = {}
    for s in per_job:
        job = str(s["job"])
        jdir = Path(run_dir) / "workers" / job
        stages = sorted(jdir.glob("stage*.jsonl"), key=lambda p: int(p.stem[5:] or 0))
        records[job] = [read_records(p) for p in stages]
        try:
            plan = plans[job] = json.loads((jdir / "plan.json").read_text())
            planned[job] = int(plan["iterations"]) + int(plan.get("warmup_iterations", 0))
        except (OSError, ValueError, KeyError, TypeError):
            planned[job] = 0
        fibres[job] = job_fibres(s.get("lightpaths") or [], emulated_routes,
                                 s.get("stage_dcs") or [])
    tf = (Scale.of_record(result.get("worker_jobs", [{}])[0], "summary.json worker_jobs")
          .time_factor if per_job else 1.0)
    out = emu_fault_impact(scenario, records, faults, per_job, tf, fibres, planned)
    if not out:
        return {}
    atomic_write_text(Path(run_dir) / "fault_iterations.csv",
                      iterations_csv_text(out.pop("fault_iterations")))
    out["fault_agreement"] = fault_agreement(scenario, out["fault_impact"],
                                             result.get("worker_fault_policy"),
                                             cut_phases(scenario, records, faults, tf, plans))
    return out


def cut_phases(scenario: Scenario, records: Mapping[str, Sequence[Sequence[Mapping[str, Any]]]],
               faults: Mapping[str, Any], time_factor: float,
               plans: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[int, dict[str, Any]]]:
    """Per job and applied network event (spec index): the phase of its worst hit
    boundary (the most segments lost) at the event's first cut, as CutPhase.as_dict()
    (predict_outage's `phases`). Boundaries: those between stages in different DCs
    (plan.json info.stage_dcs; all when unknown). The outage: the event's measured one
    (testbed.orchestrate.impact.event_marks). {} (logged) when the records do not tell:
    the prediction is then the phase-free one, the run's figures stand."""
    zero = faults.get("events_clock_zero_monotonic_s")
    if zero is None:
        return {}
    try:
        marks = event_marks(scenario, faults, float(zero), time_factor,
                            static=scenario.emulation.forwarding == "static")
        return phases_at_marks(marks, records, time_factor, plans)
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        log.warning("cut phases: not from these records: %s", exc)
        return {}


def run_phases(run_dir: Path, scenario: Scenario) -> dict[str, dict[int, dict[str, Any]]]:
    """cut_phases of an emulation's run directory (summary.json, workers/JOB/)."""
    from testbed.orchestrate.results import read_records as _read_records

    summary = json.loads((Path(run_dir) / "summary.json").read_text())
    records: dict[str, list[list[dict[str, Any]]]] = {}
    plans: dict[str, dict[str, Any]] = {}
    for s in summary.get("worker_jobs") or []:
        job = str(s["job"])
        jdir = Path(run_dir) / "workers" / job
        paths = sorted(jdir.glob("stage*.jsonl"), key=lambda p: int(p.stem[5:] or 0))
        records[job] = [_read_records(p) for p in paths]
        try:
            plans[job] = json.loads((jdir / "plan.json").read_text())
        except (OSError, ValueError):
            plans[job] = {}
    tf = Scale.of_record(summary, f"{run_dir}/summary.json").time_factor
    return cut_phases(scenario, records, summary, tf, plans)


def reagree(run_dir: Path, scenario: Scenario | None = None) -> dict[str, Any]:
    """The run's fault_agreement computed again with today's model from its own records
    (the emulated rows as recorded, the phases of its cuts): for runs made before the
    phase was recorded, or to compare models. The scenario: the run's manifest spec."""
    from testbed.spec.load import parse_scenario

    summary = json.loads((Path(run_dir) / "summary.json").read_text())
    if scenario is None:
        manifest = json.loads((Path(run_dir) / "manifest.json").read_text())
        scenario = parse_scenario(manifest["spec"])
    phases = run_phases(run_dir, scenario)
    return fault_agreement(scenario, summary.get("fault_impact") or [],
                           summary.get("worker_fault_policy"), phases)
