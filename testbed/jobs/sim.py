"""pp_jobs entry points: `run_jobs` (the sim backend) and `plan_jobs` (`lightpipe plan`)."""

from __future__ import annotations

import csv
import io
import logging
import random
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from testbed.analysis.stats import batch_means, mean_ci95
from testbed.errors import InputError
from testbed.io.atomic import atomic_write_json, atomic_write_text
from testbed.jobs.cluster import Cluster
from testbed.jobs.engine import JobSimulator, JobState
from testbed.jobs.model import model_catalog
from testbed.jobs.outcome import Job, Placed
from testbed.jobs.policies import Planner
from testbed.jobs.timing import Timer
from testbed.progress import progress
from testbed.runs.records import write_manifest
from testbed.runs.rundir import RunDir
from testbed.spec.check import check_scenario
from testbed.spec.models import PPJobsWorkload, Scenario
from testbed.traces import JobRequest, generate_jobs

log = logging.getLogger(__name__)

JOBS_COLUMNS = ("job_id", "model", "stages", "gpus_per_stage", "microbatches", "iterations",
                "arrival_s", "start_s", "end_s", "placement", "lightpaths", "schedule",
                "iteration_time_s", "bubble_ratio", "wait_s", "jct_s", "energy_kwh",
                "cost_usd", "blocked", "reason")

SUMMARY_KEYS = ("jobs", "blocked", "blocking_ratio", "blocking_ci95", "mean_iteration_time_s",
                "mean_bubble_ratio", "mean_wait_s", "mean_jct_s", "jct_ci95",
                "total_energy_kwh", "total_cost_usd", "gpu_utilization",
                "spectrum_utilization", "interrupted", "lightpaths_restored")


def resolve_jobs(workload: PPJobsWorkload, requests: Sequence[JobRequest]) -> list[Job]:
    cat = model_catalog(workload.models)
    out = []
    for r in requests:
        if r.model not in cat:
            raise InputError("workload.trace", f"job {r.job_id}: unknown model {r.model!r} "
                             f"(known: {', '.join(sorted(cat))})")
        out.append(Job(r, cat[r.model]))
    return out


def simulate(scenario: Scenario, quiet: bool = True,
             requests: Sequence[JobRequest] | None = None,
             timer: Timer | None = None,
             on_done: Callable[[JobState], None] | None = None,
             outages_s: Mapping[int, float] | None = None,
             cut_phases: Mapping[tuple[int, int], Any] | None = None
             ) -> tuple[list[JobState], dict[str, Any]]:
    """Run the scenario's jobs through its policy; return (job states, summary).
    `on_done(state)` is called once per job as soon as it ends (finished, blocked or
    interrupted), in the order they end. `outages_s`: spec event index -> the outage a
    job restored or switched at that event sees (default policy.protection's);
    `cut_phases`: (job id, spec event index) -> what the hit lightpath carried at the cut
    (testbed.jobs.faults.CutPhase; default: the phase-free transport model)."""
    wl = scenario.workload
    if not isinstance(wl, PPJobsWorkload):
        raise InputError("workload.kind", "expected a pp_jobs workload")
    check_scenario(scenario)
    t0 = time.perf_counter()
    reqs = list(requests) if requests is not None else generate_jobs(wl)
    jobs = resolve_jobs(wl, reqs)
    cluster = Cluster.from_scenario(scenario)
    planner = Planner(cluster, scenario.policy, timer or Timer(), random.Random(wl.seed),
                      wl.max_stages_per_dc)
    reported = 0

    def report_done(s: JobSimulator) -> None:
        nonlocal reported
        while on_done is not None and reported < len(s.done):
            on_done(s.done[reported])
            reported += 1

    sim = JobSimulator(cluster, planner, scenario.policy.admission, scenario.events,
                       on_change=report_done if on_done is not None else None,
                       outages_s=outages_s, cut_phases=cut_phases)
    with progress(len(jobs), f"jobs ({scenario.policy.placement})", quiet) as bar:
        states = sim.run(jobs, [r.arrival_s for r in reqs], tick=bar.advance)
    report_done(sim)
    states.sort(key=lambda s: s.job.req.job_id)
    summary = summarize(states, sim, planner)
    wall = time.perf_counter() - t0
    summary["wall_s"] = round(wall, 4)
    summary["jobs_per_s"] = round(len(states) / wall, 1) if wall > 0 else None
    if scenario.events:
        from testbed.jobs.impact import fault_summary

        fault_summary(summary, scenario, states, sim)
    return states, summary


def _ci95(values: Sequence[float], batches: int = 10) -> float:
    """Half-width of a 95 % confidence interval of the mean: over `batches` batch means
    (jobs of one run are correlated) when there are enough values, else over the values."""
    if len(values) < 2:
        return 0.0
    return mean_ci95(batch_means(values, batches) if len(values) >= 2 * batches
                     else values)[1]


def summarize(states: Sequence[JobState], sim: JobSimulator, planner: Planner) -> dict[str, Any]:
    placed = [s for s in states if not s.blocked]
    done = [s for s in placed if s.reason == ""]
    blocked_flags = [1.0 if s.blocked else 0.0 for s in states]
    jct = [s.end_s - s.arrival_s for s in done if s.end_s is not None]
    iters = [s.run_s / s.iterations_done for s in placed if s.iterations_done > 0]
    out: dict[str, Any] = {
        "policy": planner.name,
        "admission": sim.admission,
        "schedule": planner.policy.schedule,
        "jobs": len(states),
        "blocked": int(sum(blocked_flags)),
        "blocking_ratio": sum(blocked_flags) / len(states) if states else 0.0,
        "blocking_ci95": _ci95(blocked_flags),
        "mean_iteration_time_s": statistics.fmean(iters) if iters else None,
        "mean_bubble_ratio": statistics.fmean(s.bubble_ratio for s in placed) if placed
        else None,
        "mean_wait_s": statistics.fmean((s.start_s or 0) - s.arrival_s for s in placed)
        if placed else None,
        "mean_jct_s": statistics.fmean(jct) if jct else None,
        "jct_ci95": _ci95(jct) if jct else None,
        "total_energy_kwh": sum(s.energy_kwh for s in states),
        "total_cost_usd": sum(s.cost_usd for s in states),
        "gpu_utilization": sim.gpu_utilization(),
        "spectrum_utilization": sim.spectrum_utilization(),
        "interrupted": sum(s.interrupted for s in states),
        "lightpaths_restored": sim.restored_lightpaths,
        "lightpaths_upgraded": sim.upgraded_lightpaths,
        "lightpaths_lost": sim.lost_lightpaths,
        "makespan_s": sim.makespan_s,
        "timer_cache": {"hits": planner.timer.hits, "misses": planner.timer.misses},
    }
    if planner.ilp_stats:
        gaps = [float(s["gap"]) for s in planner.ilp_stats]  # type: ignore[arg-type]
        out["ilp"] = {"solves": len(gaps), "max_gap": max(gaps),
                      "optimal": sum(1 for s in planner.ilp_stats if s["status"] == "optimal"),
                      "mean_solve_s": statistics.fmean(
                          float(s["solve_s"]) for s in planner.ilp_stats)}  # type: ignore[arg-type]
    return out


def _fmt(v: float | None, nd: int = 6) -> str:
    return "" if v is None else f"{v:.{nd}g}"


def job_row(s: JobState) -> list[Any]:
    """The jobs.csv row of an ended job."""
    r = s.job.req
    placed = not s.blocked
    return [r.job_id, r.model, r.stages, r.gpus_per_stage, r.microbatches, r.iterations,
            _fmt(s.arrival_s, 10), _fmt(s.start_s, 10), _fmt(s.end_s, 10),
            "|".join(s.placement), "|".join(s.routes), s.schedule,
            _fmt(s.run_s / s.iterations_done if s.iterations_done > 0 else
                 (s.iteration_ms / 1000.0 if placed else None)),
            _fmt(s.bubble_ratio if placed else None, 4),
            _fmt((s.start_s - s.arrival_s) if s.start_s is not None else None),
            _fmt((s.end_s - s.arrival_s) if placed and s.reason == "" and
                 s.end_s is not None else None),
            _fmt(s.energy_kwh), _fmt(s.cost_usd), int(s.blocked), s.reason]


def jobs_csv(states: Sequence[JobState]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(JOBS_COLUMNS)
    for s in states:
        w.writerow(job_row(s))
    return buf.getvalue()


LIGHTPATHS_COLUMNS = ("job_id", "boundary", "path", "first_slot", "slots", "modulation",
                      "capacity_gbps", "setup_s", "teardown_s", "role")


def lightpaths_csv(states: Sequence[JobState]) -> str:
    """One row per lightpath a job held (a restored or upgraded one is a new row): its
    stage boundary, route (nodes joined by '-'), slot block, set-up/tear-down times and
    role (working, or standby: protection 1+1 / backup)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(LIGHTPATHS_COLUMNS)
    rows = [(s.job.req.job_id, *entry, role) for s in states
            for entry, role in zip(s.lightpath_log, _roles(s), strict=True)]
    for job_id, b, lp, up, down, role in sorted(rows, key=lambda r: (r[3], r[0], r[1])):
        w.writerow(_lightpath_row(job_id, b, lp, up, down, role))
    return buf.getvalue()


def _lightpath_row(job_id: int, b: int, lp: Any, up: float, down: float | None,
                   role: str) -> list[Any]:
    return [job_id, b, "-".join(lp.nodes), lp.first_slot, lp.n_slots, lp.modulation,
            f"{lp.capacity_gbps:g}", _fmt(up, 10), _fmt(down, 10), role]


def lightpath_rows(s: JobState) -> list[list[Any]]:
    """The lightpaths.csv rows of an ended job (in set-up order)."""
    return [_lightpath_row(s.job.req.job_id, *entry, role)
            for entry, role in zip(s.lightpath_log, _roles(s), strict=True)]


def _roles(s: JobState) -> list[str]:
    """Each logged lightpath's role (a state built without roles: all working)."""
    return s.lightpath_roles or ["working"] * len(s.lightpath_log)


def run_jobs(scenario: Scenario, out_dir: Path, quiet: bool = False,
             rundir: RunDir | None = None) -> dict[str, Any]:
    """Simulate a pp_jobs scenario; write jobs.csv, lightpaths.csv, summary.json and
    manifest.json. With `rundir` (a run directory at out_dir) each job's rows are
    appended to jobs.csv and lightpaths.csv as soon as it ends; at the end both files
    are rewritten whole, sorted (jobs by id, lightpaths by set-up time), and the run is
    marked finished."""
    out_dir = Path(out_dir)
    on_done = None
    if rundir is not None:
        jobs_out = rundir.stream("jobs.csv", JOBS_COLUMNS)
        lps_out = rundir.stream("lightpaths.csv", LIGHTPATHS_COLUMNS)

        def on_done(s: JobState) -> None:
            for row in lightpath_rows(s):
                lps_out.write(row)
            jobs_out.write(job_row(s))  # after its lightpaths: a job row means all there

    states, summary = simulate(scenario, quiet=quiet, on_done=on_done)
    if rundir is not None:
        rundir.close_streams()
    atomic_write_text(out_dir / "jobs.csv", jobs_csv(states))
    atomic_write_text(out_dir / "lightpaths.csv", lightpaths_csv(states))
    records = ["summary.json", "jobs.csv", "lightpaths.csv"]
    if scenario.events:
        from testbed.analysis.faultimpact import iterations_csv_text
        from testbed.jobs.impact import hit_records

        its = hit_records(states, scenario)[1]
        atomic_write_text(out_dir / "fault_iterations.csv", iterations_csv_text(its))
        records.append("fault_iterations.csv")
    atomic_write_json(out_dir / "summary.json", summary)
    if rundir is not None:
        rundir.finish(records=records)
    else:
        write_manifest(out_dir, scenario, "sim", records=records)
    return summary


def plan_jobs(scenario: Scenario) -> dict[str, Any]:
    """Static view: every job placed at once (arrival order, no departures)."""
    wl = scenario.workload
    if not isinstance(wl, PPJobsWorkload):
        raise InputError("workload.kind", "expected a pp_jobs workload")
    check_scenario(scenario)
    reqs = generate_jobs(wl)
    jobs = resolve_jobs(wl, reqs)
    cluster = Cluster.from_scenario(scenario)
    planner = Planner(cluster, scenario.policy, Timer(), random.Random(wl.seed),
                      wl.max_stages_per_dc)
    out_jobs = []
    for job in jobs:
        res = planner.place(job, 0.0)
        row: dict[str, Any] = {"job_id": job.req.job_id, "model": job.req.model,
                               "stages": job.req.stages,
                               "gpus_per_stage": job.req.gpus_per_stage}
        if isinstance(res, Placed):
            row.update({
                "placed": True,
                "placement": [cluster.dcs[d].name for d in res.alloc.stage_dcs],
                "schedule": res.timing.schedule,
                "iteration_time_s": res.timing.iteration_ms / 1000.0,
                "bubble_ratio": res.timing.bubble_ratio,
                "lightpaths": [None if lp is None else {
                    "boundary": b, "route": list(lp.nodes),
                    "fibres": [list(f) for f in lp.fibres], "first_slot": lp.first_slot,
                    "slots": lp.n_slots, "modulation": lp.modulation,
                    "capacity_gbps": lp.capacity_gbps, "latency_ms": lp.latency_ms}
                    for b, lp in enumerate(res.alloc.lightpaths)],
            })
            if res.solver:
                row["solver"] = res.solver
        else:
            row.update({"placed": False, "reason": res.reason})
        out_jobs.append(row)
    placed = sum(1 for r in out_jobs if r["placed"])
    return {"scenario": scenario.name, "policy": scenario.policy.placement,
            "jobs": out_jobs, "placed": placed, "blocked": len(out_jobs) - placed,
            "gpu_utilization": cluster.used_gpus / cluster.total_gpus,
            "spectrum_utilization": cluster.network.utilization()}
