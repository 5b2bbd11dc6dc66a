"""`lightpipe reproduce outage`: how long may an outage be before training notices, or fails?

The job simulator runs one scenario (default scenarios/outage-sweep.yaml) with its fibre
cut at the scenario's cut time and repaired after each swept fault length (10 ms to
60 s), under each protection scheme (none, controller restoration, 1+1, pre-planned
backup) and each collective time-out; per point the job's stall, recovery, survival and
the detour's cost afterwards, from the same `fault_impact` rows as any run
(testbed/jobs/impact.py). Ablations: the transport (TCP against an ideal one that resumes
the instant the path is back), fail against retry, the 1+1 switch time. Emulation points
come from a file the emulation side writes (`emu_points`); without it the page says they
are absent. Writes summary.json, summary.csv, summary.md, outage.png, outage_ablation.png.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from testbed.analysis.faultimpact import (
    TOLERANCE,
    WorkerModel,
    resume_wait_s,
    tcp_retransmits_s,
)
from testbed.errors import InputError
from testbed.io.atomic import atomic_write_json, atomic_write_text, staged_dir
from testbed.progress import progress
from testbed.spec.models import EventSpec, Scenario

log = logging.getLogger(__name__)

FAULTS_S = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 60.0)
QUICK_FAULTS_S = (0.01, 0.1, 1.0, 10.0, 60.0)
SCHEMES = ("none", "restoration", "1+1", "backup")
TIMEOUTS_S = (1.0, 10.0, 600.0, 1800.0)
QUICK_TIMEOUTS_S = (1.0, 10.0, 1800.0)
SWITCH_ABLATION_S = (0.002, 0.005, 0.01, 0.05)
CLAIM_S = 0.1
"""The field trials' figure: outages longer than about 100 ms can halt training."""
DEFAULT_SCENARIO = "scenarios/outage-sweep.yaml"
POINT_KEYS = ("source", "case", "protection", "collective_timeout_s", "on_fault",
              "transport", "fault_s", "outage_s", "steady_iteration_s",
              "after_iteration_s", "slowdown_after", "stall_s", "stall_iterations",
              "noticed", "survived", "error", "failed_after_s", "restarts",
              "iterations_lost", "recovery_s", "settle_s", "jct_delta_s",
              "detour_cost_s", "spectrum_utilization", "runs", "stall_ci95_s")


def _cut_of(scen: Scenario) -> tuple[list[str], float]:
    """The fibre and time of the scenario's first fiber_cut; InputError if it has none."""
    for ev in scen.events:
        if ev.kind == "fiber_cut" and ev.link is not None:
            return list(ev.link), ev.at_s
    raise InputError("scenario", f"{scen.name}: the outage sweep needs a fiber_cut in "
                     "events (its fibre and time are swept)")


def variant(scen: Scenario, fault_s: float | None, scheme: str, timeout_s: float,
            on_fault: str = "fail", transport: str = "tcp",
            restoration_s: float | None = None, switch_s: float | None = None) -> Scenario:
    """The scenario with its cut repaired fault_s later (None: no events) and the given
    protection and worker settings."""
    link, at = _cut_of(scen)
    events = [] if fault_s is None else [
        EventSpec(at_s=at, kind="fiber_cut", link=link),
        EventSpec(at_s=at + fault_s, kind="fiber_repair", link=link)]
    prot = scen.policy.protection.model_copy(update={
        "scheme": scheme,
        **({"restoration_s": restoration_s} if restoration_s is not None else {}),
        **({"switch_s": switch_s} if switch_s is not None else {})})
    workers = scen.policy.workers.model_copy(update={
        "collective_timeout_s": timeout_s, "on_fault": on_fault, "transport": transport})
    policy = scen.policy.model_copy(update={"protection": prot, "workers": workers})
    return scen.model_copy(update={"events": events, "policy": policy})


def _job_end(states: Sequence[Any]) -> float | None:
    ends = [s.end_s for s in states if s.end_s is not None]
    return max(ends) if ends else None


def run_point(scen: Scenario, fault_s: float, scheme: str, timeout_s: float, *,
              case: str = "sweep", on_fault: str = "fail", transport: str = "tcp",
              restoration_s: float | None = None, switch_s: float | None = None,
              baseline_end_s: float | None = None) -> dict[str, Any]:
    """One simulated point: the first job's fault_impact row for the cut, flattened."""
    from testbed.jobs.sim import simulate

    sc = variant(scen, fault_s, scheme, timeout_s, on_fault, transport, restoration_s,
                 switch_s)
    states, summ = simulate(sc)
    rows = [r for r in summ.get("fault_impact", []) if r["event"] == 0]
    if not rows:
        raise InputError("scenario", f"{scen.name}: the cut at {sc.events[0].at_s:g} s hits "
                         "no running job (is a job running across that fibre then?)")
    r = rows[0]
    steady = r["steady_iteration_s"]
    stall = r["stall_s"]
    end = _job_end(states)
    jct_delta = end - baseline_end_s if end is not None and baseline_end_s is not None \
        and r["survived"] else None
    return {
        "source": "sim", "case": case, "protection": scheme,
        "collective_timeout_s": timeout_s, "on_fault": on_fault, "transport": transport,
        "fault_s": fault_s, "outage_s": r["outage_s"], "steady_iteration_s": steady,
        "after_iteration_s": r["after_iteration_s"], "slowdown_after": r["slowdown_after"],
        "stall_s": stall, "stall_iterations": r["stall_iterations"],
        "noticed": bool(stall is not None and steady and stall > TOLERANCE * steady),
        "survived": r["survived"], "error": r["error"],
        "failed_after_s": (r["failed_at_s"] - r["at_s"]) if r["failed_at_s"] is not None
        else None,
        "restarts": r["restarts"], "iterations_lost": r["iterations_lost"],
        "recovery_s": r["recovery_s"], "settle_s": r["settle_s"], "jct_delta_s": jct_delta,
        "detour_cost_s": (jct_delta - stall) if jct_delta is not None and stall is not None
        else None,
        "spectrum_utilization": summ.get("spectrum_utilization"), "runs": 1,
        "stall_ci95_s": None,
    }


def failure_boundary_s(workers: WorkerModel, rtt_s: float) -> float | None:
    """The longest outage a job survives without protection, from the model: the last
    (re)transmission time at or before the time-out (TCP), or the time-out itself
    (ideal); an outage past it fails (on_fault: fail)."""
    if workers.transport == "ideal":
        return workers.collective_timeout_s
    ok = [t for t in tcp_retransmits_s(rtt_s, workers.tcp_rto_min_s)
          if t <= workers.collective_timeout_s]
    return max(ok) if ok else None


def _boundaries(points: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (protection, time-out) of the main sweep: the longest fault length not
    noticed / survived and the shortest noticed / failed (grid points)."""
    out = []
    keys = sorted({(p["protection"], p["collective_timeout_s"]) for p in points
                   if p["case"] == "sweep" and p["source"] == "sim"},
                  key=lambda k: (SCHEMES.index(k[0]) if k[0] in SCHEMES else 9, k[1]))
    for scheme, t in keys:
        pts = sorted((p for p in points if p["case"] == "sweep" and p["source"] == "sim"
                      and p["protection"] == scheme and p["collective_timeout_s"] == t),
                     key=lambda p: p["fault_s"])
        quiet = [p["fault_s"] for p in pts if not p["noticed"] and p["survived"]]
        noticed = [p["fault_s"] for p in pts if p["noticed"] or not p["survived"]]
        alive = [p["fault_s"] for p in pts if p["survived"]]
        failed = [p["fault_s"] for p in pts if not p["survived"]]
        out.append({"protection": scheme, "collective_timeout_s": t,
                    "longest_unnoticed_s": max(quiet) if quiet else None,
                    "shortest_noticed_s": min(noticed) if noticed else None,
                    "longest_survived_s": max(alive) if alive else None,
                    "shortest_failed_s": min(failed) if failed else None})
    return out


def load_emu_points(path: str | None) -> tuple[list[dict[str, Any]], str]:
    """Emulation points from the emu side's file (a JSON list, or {"points": [...]});
    ([], why) when there is none."""
    if not path:
        return [], "emu points: absent (no --set emu_points=FILE given; the emulation " \
            "side writes them, docs/faults.md)"
    p = Path(path)
    if p.is_dir():  # the emulation side's run directories (bench/bench_fault_stall.py)
        try:
            from testbed.emu.outage import sweep_points
        except ImportError:
            raise InputError("emu_points", f"{path}: a directory, but this LightPipe has "
                             "no testbed.emu.outage.sweep_points to read it; give the "
                             "points' JSON file") from None
        data: Any = sweep_points(p)
    elif not p.is_file():
        raise InputError("emu_points", f"{path}: no such file or directory")
    else:
        try:
            data = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise InputError("emu_points", f"{path}: not JSON ({exc})") from None
    pts = data.get("points") if isinstance(data, dict) else data
    if not isinstance(pts, list):
        raise InputError("emu_points", f"{path}: expected a list of points")
    out = []
    for i, q in enumerate(pts):
        if not isinstance(q, dict) or "protection" not in q or "stall_s" not in q or \
                not ({"fault_s", "outage_s"} & set(q)):
            raise InputError("emu_points", f"{path}: point {i} needs protection, stall_s "
                             "and fault_s or outage_s")
        row = {k: q.get(k) for k in POINT_KEYS}
        row["source"] = "emu"
        row["case"] = q.get("case", "sweep")
        row["fault_s"] = q.get("fault_s", q.get("outage_s"))
        row["survived"] = q.get("survived", True)
        out.append(row)
    return out, f"emu points: {len(out)} from {path}"


def _check_values(name: str, values: Sequence[Any], lo_exclusive: float = 0.0
                  ) -> list[float]:
    if isinstance(values, int | float):
        values = [values]
    if not isinstance(values, list | tuple) or not values:
        raise InputError(name, f"expected a list of numbers, got {values!r}")
    out = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) \
                or v <= lo_exclusive:
            raise InputError(name, f"must be > {lo_exclusive:g} seconds (got {v!r})")
        out.append(float(v))
    return out


def outage(out_dir: Path, quiet: bool = False, quick: bool = False,
           scenario: str = DEFAULT_SCENARIO, faults_s: Sequence[float] | None = None,
           schemes: Sequence[str] | None = None, timeouts_s: Sequence[float] | None = None,
           restoration_s: float | None = None, emu_points: str | None = None
           ) -> dict[str, Any]:
    """The sweep, its ablations and boundaries; the tables and figures written
    atomically into out_dir."""
    from testbed.jobs.sim import simulate
    from testbed.spec import load_scenario

    scen = load_scenario(scenario)
    faults = _check_values("faults_s", list(faults_s) if faults_s is not None else
                           list(QUICK_FAULTS_S if quick else FAULTS_S))
    timeouts = _check_values("timeouts_s", list(timeouts_s) if timeouts_s is not None else
                             list(QUICK_TIMEOUTS_S if quick else TIMEOUTS_S))
    sch = list(schemes) if schemes is not None else list(SCHEMES)
    for s in sch:
        if s not in SCHEMES:
            raise InputError("schemes", f"unknown protection scheme {s!r} (known: "
                             f"{', '.join(SCHEMES)})")
    if restoration_s is not None:
        _check_values("restoration_s", [restoration_s], -1e-12)
    emu, emu_note = load_emu_points(emu_points)
    link, at = _cut_of(scen)
    base_states, base = simulate(variant(scen, None, "restoration", max(timeouts)))
    end0 = _job_end(base_states)
    if end0 is None or not base_states or base_states[0].reason:
        raise InputError("scenario", f"{scen.name}: its first job does not run to its end "
                         "without events")
    run_left = end0 - at
    longest = max(faults)
    if longest >= run_left:
        raise InputError("faults_s", f"outage {longest:g} s is longer than the run: the job "
                         f"ends {run_left:.1f} s after the cut at {at:g} s "
                         f"({scen.name}); give shorter outages or more iterations")
    extra = ([("transport-ideal", "none", max(timeouts), "fail", "ideal", None)]
             + [(f"retry-{t:g}s", "none", t, "retry", "tcp", None) for t in timeouts[:2]]
             + [(f"1+1-switch-{round(sw * 1000)}ms", "1+1", max(timeouts), "fail",
                 "tcp", sw) for sw in (() if quick else SWITCH_ABLATION_S)])
    n = len(faults) * (len(sch) * len(timeouts) + len(extra))
    points: list[dict[str, Any]] = []
    with progress(n, "reproduce outage", quiet) as bar:
        for t in timeouts:
            for s in sch:
                for f in faults:
                    points.append(run_point(scen, f, s, t, restoration_s=restoration_s,
                                            baseline_end_s=end0))
                    bar.advance()
        for case, s, t, onf, tr, sw in extra:
            for f in faults:
                points.append(run_point(scen, f, s, t, case=case, on_fault=onf,
                                        transport=tr, restoration_s=restoration_s,
                                        switch_s=sw, baseline_end_s=end0))
                bar.advance()
    points += emu
    steady = points[0]["steady_iteration_s"]
    rtt_s = _rtt_s(scen)
    model_bound = {str(t): failure_boundary_s(WorkerModel.from_spec(
        scen.policy.workers.model_copy(update={"collective_timeout_s": t})), rtt_s)
        for t in timeouts}
    bounds = _boundaries(points)
    claim = _claim(points, steady, rtt_s, scen)
    summary = {
        "experiment": "outage",
        "reproduces": "How long can an optical outage be before a pipeline job notices, "
                      "and before it fails? (field trials: outages longer than ~100 ms can "
                      "halt training)",
        "scenario": scen.name, "cut": {"link": link, "at_s": at},
        "steady_iteration_s": steady, "rtt_s": rtt_s,
        "baseline_jct_s": end0 - (base_states[0].arrival_s or 0.0),
        "boundaries": bounds, "model_failure_boundary_s": model_bound,
        "claim_100ms": claim, "emu_points": emu_note, "rows": points,
        "setup": {"faults_s": faults, "schemes": sch, "timeouts_s": timeouts,
                  "restoration_s": restoration_s if restoration_s is not None
                  else scen.policy.protection.restoration_s,
                  "switch_s": scen.policy.protection.switch_s,
                  "tcp_rto_min_s": scen.policy.workers.tcp_rto_min_s,
                  "restart_s": scen.policy.workers.restart_s,
                  "tolerance": TOLERANCE, "quick": bool(quick), "scenario_file": scenario,
                  "spectrum_utilization_no_fault": base.get("spectrum_utilization")},
    }
    with staged_dir(out_dir) as stage:
        atomic_write_text(stage / "summary.csv", _csv(points))
        atomic_write_text(stage / "summary.md", _markdown(summary))
        from testbed.report.figures import save
        from testbed.report.repro_plots import outage_ablation_figure, outage_figure

        save(outage_figure(points, summary), stage / "outage.png")
        save(outage_ablation_figure(points, summary), stage / "outage_ablation.png")
        atomic_write_json(stage / "summary.json", summary)
    return summary


def _rtt_s(scen: Scenario) -> float:
    """The cut fibre's round trip as the job sees it (2 x the lightpath's latency)."""
    from testbed.jobs.cluster import Cluster

    link, _ = _cut_of(scen)
    net = Cluster.from_scenario(scen).network
    for p in net.candidate_paths(link[0], link[1]):
        if p.hops == 1:
            return 2.0 * net.latency_ms(p) / 1000.0
    return 0.0


def _claim(points: Sequence[dict[str, Any]], steady: float, rtt_s: float,
           scen: Scenario) -> dict[str, Any]:
    """The 'about 100 ms' claim against the sweep: what a 100 ms outage does here."""
    near = [p for p in points if p["case"] == "sweep" and p["source"] == "sim"
            and p["protection"] == "none" and abs(p["fault_s"] - CLAIM_S) < 1e-9]
    w = scen.policy.workers
    wait = resume_wait_s(CLAIM_S, "tcp", rtt_s, w.tcp_rto_min_s)
    fails = sorted({p["collective_timeout_s"] for p in near if not p["survived"]})
    return {
        "outage_s": CLAIM_S,
        "stall_s": near[0]["stall_s"] if near else None,
        "stall_iterations": near[0]["stall_iterations"] if near else None,
        "tcp_resume_s": wait,
        "fails_with_timeouts_s": fails,
        "verdict": (
            f"a {CLAIM_S * 1000:.0f} ms outage without protection stalls the job "
            f"{near[0]['stall_s']:.3f} s ({near[0]['stall_iterations']:.2f} iterations of "
            f"{steady:.3f} s): TCP resumes only at its retransmission {wait * 1000:.0f} ms "
            "after the cut, so training notices; it halts (fails) only where the "
            "collective time-out is shorter than that"
            + (f" ({', '.join(f'{t:g} s' for t in fails)} here)" if fails else
               " (none of the swept time-outs)") + ". The knee is TCP's, not 100 ms: an "
            f"outage under the tail-loss probe (2 x RTT = {2 * rtt_s * 1000:.0f} ms) costs "
            f"a few RTTs, a longer one at least RTT + {w.tcp_rto_min_s * 1000:.0f} ms.")
        if near else "no 100 ms point in the sweep"}


def _csv(rows: Sequence[dict[str, Any]]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(POINT_KEYS), lineterminator="\n",
                       extrasaction="ignore")
    w.writeheader()
    for r in rows:
        w.writerow({k: _fmt(r.get(k)) for k in POINT_KEYS})
    return buf.getvalue()


def _fmt(v: Any) -> Any:
    return f"{v:.6g}" if isinstance(v, float) else ("" if v is None else v)


def _ms(v: Any) -> str:
    return "—" if not isinstance(v, int | float) else (
        f"{v * 1000:.0f} ms" if v < 1 else f"{v:.3g} s")


def _markdown(s: dict[str, Any]) -> str:
    """summary.md: the boundaries, the claim, the ablations, every point."""
    rows = s["rows"]
    lines = [f"# lightpipe reproduce outage ({s['scenario']})", "",
             f"Cut of fibre {'-'.join(s['cut']['link'])} at {s['cut']['at_s']:g} s; steady "
             f"iteration {s['steady_iteration_s']:.4f} s; RTT {s['rtt_s'] * 1000:.1f} ms. "
             f"Noticed: stall > {TOLERANCE:.0%} of a steady iteration. {s['emu_points']}.",
             "", "## Boundaries (fault length, grid points)", "",
             "| protection | time-out | longest unnoticed | shortest noticed | longest "
             "survived | shortest failed |", "|---|---|---|---|---|---|"]
    for b in s["boundaries"]:
        lines.append(f"| {b['protection']} | {b['collective_timeout_s']:g} s | "
                     f"{_ms(b['longest_unnoticed_s'])} | {_ms(b['shortest_noticed_s'])} | "
                     f"{_ms(b['longest_survived_s'])} | {_ms(b['shortest_failed_s'])} |")
    lines += ["", "Model failure boundary without protection (the last TCP retransmission "
              "before the time-out): " + ", ".join(
                  f"{t} s time-out: {_ms(v)}" for t, v in
                  s["model_failure_boundary_s"].items()) + ".", "",
              "## The ~100 ms claim", "", s["claim_100ms"]["verdict"], "",
              "## Every point", "",
              "| source | case | protection | time-out | on_fault | transport | fault | "
              "outage | stall | survived | after (slowdown) | JCT change |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        slow = r.get("slowdown_after")
        lines.append(
            f"| {r['source']} | {r['case']} | {r['protection']} | "
            f"{_ms(r['collective_timeout_s'])} | {r.get('on_fault') or ''} | "
            f"{r.get('transport') or ''} | {_ms(r['fault_s'])} | {_ms(r.get('outage_s'))} | "
            f"{_ms(r.get('stall_s'))} | {'yes' if r['survived'] else 'no: ' + str(r['error'])}"
            f" | {'' if slow is None else f'{slow:+.1%}'} | {_ms(r.get('jct_delta_s'))} |")
    return "\n".join(lines) + "\n"
