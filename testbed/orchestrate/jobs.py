"""From a pp_jobs scenario to running workers: placement, plans, simulated times, records.

`plan_emulated_jobs` places the scenario's first `emulation.max_jobs` jobs at once
(the same Planner and policy as the simulator, static view as `lightpipe plan`), and
for each builds the real-units `PipelineProblem` (stage times from FLOPs, one hop per
stage boundary: the lightpath's latency and capacity, or the DC fabric), the
schedule from the schedule engine, its simulated iteration time, and the workers'
`JobPlan` in emulation units.

`run_jobs_on_hosts` starts the workers on hosts given per DC (Mininet hosts, or the
local machine), supervises them, feeds Prometheus, and writes the run records:
`iterations.csv`, `trace.json` (Chrome trace), `workers/` (per-stage records and
logs) and returns the summary part with `agreement` and per-job outcomes.
"""

from __future__ import annotations

import csv
import io
import logging
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from testbed.emu.plan import EmuPlan
from testbed.emu.scale import Scale
from testbed.emu.tcp_tuning import TCP_GOODPUT
from testbed.errors import InputError
from testbed.io.atomic import atomic_write_json, atomic_write_text
from testbed.metrics.agreement import agreement_rows, agreement_verdict
from testbed.metrics.transfers import transfer_excess
from testbed.orchestrate.launch import FaultPolicy, Host, Launcher
from testbed.orchestrate.results import chrome_trace, job_iterations, summarize_job
from testbed.schedule import Hop, PipelineProblem, Schedule, build_schedule, time_schedule
from testbed.spec.models import PPJobsWorkload, Scenario
from workloads.plan import JobPlan, TinyGPTConfig, model_plan, scaled_plan

log = logging.getLogger(__name__)
MODEL_MODE_SCHEDULES = ("gpipe", "1f1b", "crosspipe-greedy", "geopipe")


@dataclass
class EmuJob:
    """One job to emulate: where its stages run, its pipeline and its workers' plan."""

    job: str
    model: str
    stage_dcs: list[str]
    problem: PipelineProblem
    schedule: Schedule
    simulated_iteration_time_s: float
    simulated_bubble_ratio: float
    plan: JobPlan
    lightpaths: list[dict[str, Any] | None] = field(default_factory=list)


def plan_emulated_jobs(scenario: Scenario, mode: str | None = None,
                       emu_plan: EmuPlan | None = None) -> list[EmuJob]:
    """Place the first `emulation.max_jobs` jobs of the scenario and plan their workers
    (timed on `emu_plan`'s lightpaths where given: `emulated_hops`)."""
    from testbed.jobs.cluster import Cluster
    from testbed.jobs.outcome import Placed
    from testbed.jobs.policies import Planner
    from testbed.jobs.sim import resolve_jobs
    from testbed.jobs.timing import Timer
    from testbed.traces import generate_jobs

    wl = scenario.workload
    if not isinstance(wl, PPJobsWorkload):
        raise InputError("workload.kind", "PyTorch workers need a pp_jobs workload")
    em = scenario.emulation
    mode = mode or em.workers
    cluster = Cluster.from_scenario(scenario)
    planner = Planner(cluster, scenario.policy, Timer(), random.Random(wl.seed))
    out: list[EmuJob] = []
    for job in resolve_jobs(wl, generate_jobs(wl)):
        if len(out) >= em.max_jobs:
            break
        res = planner.place(job, 0.0)
        if not isinstance(res, Placed):
            log.info("job %s not placed (%s); skipped", job.req.job_id, res.reason)
            continue
        dcs = res.alloc.stage_dcs
        hops = planner.hops(res.alloc.lightpaths, dcs)
        if emu_plan is not None:
            hops = emulated_hops(hops, [cluster.dcs[d].name for d in dcs], emu_plan)
        lps = [None if lp is None else {"boundary": i, "route": list(lp.nodes),
                                        "slots": lp.n_slots, "capacity_gbps": lp.capacity_gbps,
                                        "latency_ms": lp.latency_ms}
               for i, lp in enumerate(res.alloc.lightpaths)]
        out.append(build_emu_job(scenario, planner, job, dcs, hops, mode, lps))
    if not out:
        raise InputError("workload", "no job of the scenario could be placed for emulation")
    return out


def emulated_hops(hops: Sequence[tuple[float, float]], stage_dcs: Sequence[str],
                  emu_plan: EmuPlan) -> list[tuple[float, float]]:
    """(latency_ms, bandwidth_gbps) per boundary with the emulated network's lightpaths:
    a boundary between two DCs gets the DC pair's lightpath (real latency = its emulated
    delay, unscaled; bandwidth = its real capacity x TCP goodput); one inside a DC keeps
    its figures."""
    by_pair = {frozenset((lp.dc_a, lp.dc_b)): lp for lp in emu_plan.lightpaths}
    out = list(hops)
    for b in range(len(out)):
        lp = by_pair.get(frozenset((stage_dcs[b], stage_dcs[b + 1])))
        if stage_dcs[b] != stage_dcs[b + 1] and lp is not None:
            out[b] = (emu_plan.scale.real_ms(lp.delay_ms), lp.real_gbps * TCP_GOODPUT)
    return out


def build_emu_job(scenario: Scenario, planner: Any, job: Any, dcs: Sequence[int],
                  hops: Sequence[tuple[float, float]], mode: str,
                  lightpaths: list[dict[str, Any] | None]) -> EmuJob:
    """The EmuJob of a placed job: stage times in its DCs, the given (latency_ms,
    bandwidth_gbps) per boundary, schedule, simulated timing and the workers' plan."""
    em = scenario.emulation
    f, b = planner.stage_fb(job, dcs)
    problem = PipelineProblem(tuple(f), tuple(b), tuple(Hop(lat, bw) for lat, bw in hops),
                              job.act_mb, job.req.microbatches)
    name = f"job{job.req.job_id}"
    sched_name = scenario.policy.schedule
    if mode == "model" and sched_name not in MODEL_MODE_SCHEDULES:
        sched_name = "1f1b"
    schedule = build_schedule(sched_name, problem)
    timing = time_schedule(problem, schedule, check_memory_cap=False, record=False)
    info = {"model": job.req.model, "stage_dcs": [planner.cluster.dcs[d].name for d in dcs]}
    if mode == "shadow":
        plan = scaled_plan(name, problem, schedule, Scale.of(em),
                           iterations=em.worker_iterations,
                           warmup_iterations=em.worker_warmup_iterations, info=info,
                           compute=em.worker_compute)
    else:
        plan = model_plan(name, schedule, problem.microbatches,
                          iterations=em.worker_iterations,
                          warmup_iterations=em.worker_warmup_iterations,
                          config=TinyGPTConfig(layers=max(4, problem.stages)), info=info)
    return EmuJob(name, job.req.model, info["stage_dcs"], problem, schedule,
                  timing.iteration_time_ms / 1e3, timing.bubble_ratio, plan, lightpaths)


def pipeline_record(problem: PipelineProblem) -> dict[str, Any]:
    """The job's pipeline as JSON (the report re-times it with the schedule engine);
    an unlimited bandwidth is null."""
    act = problem.activation_mb
    return {"forward_ms": list(problem.forward_ms), "backward_ms": list(problem.backward_ms),
            "hops": [[h.latency_ms, h.bandwidth_gbps if h.bandwidth_gbps != float("inf")
                      else None] for h in problem.hops],
            "activation_mb": list(act) if isinstance(act, tuple | list) else act,
            "microbatches": problem.microbatches}


def assign_hosts(jobs: Sequence[EmuJob], hosts_by_dc: Mapping[str, Sequence[Host]]
                 ) -> list[list[Host]]:
    """Stage i of a job runs on a host of its DC; hosts of a DC are used round-robin."""
    used: dict[str, int] = {}
    out = []
    for j in jobs:
        row = []
        for dc in j.stage_dcs:
            hosts = hosts_by_dc.get(dc)
            if not hosts:
                raise InputError("dcs", f"no emulated host in DC {dc!r} for job {j.job}")
            k = used.get(dc, 0)
            row.append(hosts[k % len(hosts)])
            used[dc] = k + 1
        out.append(row)
    return out


def iterations_csv(records: Mapping[str, Sequence[Sequence[dict[str, Any]]]],
                   scale: Scale) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["job", "iteration", "warmup", "wall_time_s", "iteration_time_s",
                "bubble_ratio", "sent_bytes", "loss"])
    for job, stages in sorted(records.items()):
        for r in job_iterations(stages):
            w.writerow([job, r["iteration"], int(r["warmup"]), f"{r['time_s']:.6f}",
                        f"{scale.real_s(r['time_s']):.6f}", f"{r['bubble_ratio']:.4f}",
                        r["sent_bytes"], "" if "loss" not in r else f"{r['loss']:.5f}"])
    return buf.getvalue()


# On the reference machine (testbed.envprobe): a worker's collective/p2p time-out (also its
# wait for the job's rendezvous: every stage must have imported torch by then) and the
# deadline of all the jobs' workers together. A slower machine gets them x its slowness.
WORKER_TIMEOUT_S = 120.0
JOBS_DEADLINE_S = 600.0
METRICS_LINGER_S = 10.0  # longest wait for a scrape of a worker's final metrics (scaled)


def worker_time_limits_s(scale: float | None = None) -> tuple[float, float]:
    """(worker time-out, jobs deadline) in seconds: the reference figures x `scale`
    (default testbed.envprobe.machine_slowness(); under software emulation ~10)."""
    if scale is None:
        from testbed.envprobe import machine_slowness

        scale = machine_slowness()
    scale = max(1.0, scale)
    return WORKER_TIMEOUT_S * scale, JOBS_DEADLINE_S * scale


def run_jobs_on_hosts(jobs: Sequence[EmuJob], hosts_by_dc: Mapping[str, Sequence[Host]],
                      out_dir: Path, *, prometheus: Any = None, deadline_s: float | None = None,
                      timeout_s: float | None = None, metrics_netns_fd: int | None = None,
                      duty: float | None = None,
                      placement: Sequence[Sequence[Host]] | None = None,
                      on_started: Callable[[Launcher], None] | None = None,
                      remote: Any = None,
                      go_on_until: Path | None = None,
                      cpus: Sequence[int] | None = None,
                      fault_policy: FaultPolicy | None = None) -> dict[str, Any]:
    """Run every job's workers concurrently; write records; return the summary part.

    `placement`: the host of every stage of every job (e.g. the controller's); default
    round-robin over each DC's hosts (assign_hosts). `on_started(launcher)`: called once
    every worker is started (the fault injector kills workers through it). `remote`: the
    worker agents of a run across machines (testbed.cluster.agentlink.ClusterWorkers), for
    hosts with a `machine`. `go_on_until`: the jobs iterate beyond their plans until this
    file exists (Launcher). `cpus`: the cores of this machine's CPU workers (Launcher).
    `fault_policy`: the collectives' time-out and fail/retry (Launcher; wall seconds).
    `timeout_s` / `deadline_s`: default worker_time_limits_s() (scaled with the machine)."""
    out_dir = Path(out_dir)
    scaled_timeout_s, scaled_deadline_s = worker_time_limits_s()
    timeout_s = scaled_timeout_s if timeout_s is None else timeout_s
    deadline_s = scaled_deadline_s if deadline_s is None else deadline_s
    placement = [list(p) for p in placement] if placement is not None else assign_hosts(
        jobs, hosts_by_dc)
    scale = jobs[0].plan.scale if jobs else Scale()
    log.info("workers: time-out %.0f s, deadline %.0f s (scaled with the machine)",
             timeout_s, deadline_s)
    # With a monitor, each worker waits for one scrape of its final metrics before it
    # exits (a short job on a slow machine could otherwise end between two scrapes).
    linger_s = min(timeout_s, METRICS_LINGER_S * timeout_s / WORKER_TIMEOUT_S) \
        if prometheus is not None else 0.0
    with Launcher(out_dir, timeout_s=timeout_s, duty=duty,
                  metrics_netns_fd=metrics_netns_fd, metrics_linger_s=linger_s,
                  remote=remote, go_on_until=go_on_until, cpus=cpus,
                  fault_policy=fault_policy) as launcher:
        launcher.start([(j.plan, hosts) for j, hosts in zip(jobs, placement, strict=True)])
        if prometheus is not None:
            prometheus.set_targets("workers", launcher.metrics_targets())
            if hasattr(prometheus, "watch_workers"):  # their CPU, for the fidelity verdict
                prometheus.watch_workers(launcher)
        if on_started is not None:
            on_started(launcher)
        launcher.wait(deadline_s)
        records = launcher.records()
        outcome = launcher.outcome()
        host_load = launcher.host_load()
    atomic_write_text(out_dir / "iterations.csv", iterations_csv(records, scale))
    atomic_write_json(out_dir / "trace.json", chrome_trace(records))
    per_job = []
    emulated: dict[str, float | None] = {}
    for j, hosts in zip(jobs, placement, strict=True):
        s = summarize_job(j.job, records[j.job], j.plan.scale)
        s.update(outcome[j.job])
        s.update({"mode": j.plan.mode, "schedule": j.schedule.name, "stage_dcs": j.stage_dcs,
                  "simulated_iteration_time_s": j.simulated_iteration_time_s,
                  "simulated_bubble_ratio": j.simulated_bubble_ratio,
                  "lightpaths": j.lightpaths, "time_factor": j.plan.scale.time_factor,
                  "pipeline": pipeline_record(j.problem),
                  "transfers": transfer_excess(
                      records[j.job], j.problem, j.schedule.actions,
                      j.plan.scale.time_factor, j.stage_dcs, j.schedule.virtual_stages,
                      one_clock=len({h.machine for h in hosts}) == 1)})
        per_job.append(s)
        if j.plan.mode == "shadow":
            emulated[j.job] = s.get("emulated_iteration_time_s")
    result: dict[str, Any] = {"worker_jobs": per_job,
                              "failed_jobs": [s["job"] for s in per_job if not s["ok"]],
                              "worker_time_limits_s": {"timeout": round(timeout_s, 1),
                                                       "deadline": round(deadline_s, 1)},
                              "worker_fault_policy": (fault_policy or FaultPolicy()
                                                      ).as_record()}
    sims = {j.job: j.simulated_iteration_time_s for j in jobs if j.plan.mode == "shadow"}
    details = {s["job"]: s for s in per_job}
    result["agreement"] = agreement_rows(sims, emulated, details)
    result["host_load"] = host_load
    if sims:
        result["agreement_verdict"] = agreement_verdict(result["agreement"], host_load)
    measured = [s["emulated_iteration_time_s"] for s in per_job
                if s.get("emulated_iteration_time_s") is not None]
    if measured:
        result["mean_iteration_time_s"] = sum(measured) / len(measured)
    return result
