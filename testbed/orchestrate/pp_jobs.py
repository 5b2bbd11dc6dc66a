"""Hook for the emulation backend: run a pp_jobs scenario's workers on a live EmuNetwork.

The simulated side of the agreement uses the emulated network's own lightpaths: a
stage boundary between two DCs gets the DC pair's lightpath (real latency = its
emulated delay / time_factor, bandwidth = its real capacity); a boundary inside a DC
keeps the DC fabric figures. Prometheus and the workers' /metrics listeners live in
the namespace the run started in (the backend may have entered its own), so the
printed URL works from the user's shell.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from testbed.emu.live import LiveNetwork
from testbed.emu.plan import EmuPlan
from testbed.emu.tcp_tuning import (
    LIGHTPATH_CONGESTION_CONTROL,
    deepen_lightpath_queues,
    tcp_counters,
    tune_host_tcp,
)
from testbed.errors import RuntimeFailure
from testbed.metrics.links import LINK_METRIC_NAMES
from testbed.monitor.run import RunMonitor, in_netns
from testbed.orchestrate.ctl_jobs import (
    check_job_paths,
    delete_jobs,
    place_via_controller,
    tune_job_paths,
)
from testbed.orchestrate.jobs import EmuJob, emulated_hops, plan_emulated_jobs, run_jobs_on_hosts
from testbed.orchestrate.launch import FaultPolicy, Host
from testbed.schedule import Hop, build_schedule, time_schedule
from testbed.spec.models import Scenario
from workloads.metrics import METRIC_NAMES
from workloads.plan import scaled_plan

log = logging.getLogger(__name__)
# emulation.iterate_through_events: the fault injector writes it (in the run's workers/) once
# every event has run; the workers, started with --go-on-until, then stop iterating.
EVENTS_DONE_FILE = "events-done"


def on_emulated_links(job: EmuJob, emu_plan: EmuPlan, scenario: Scenario) -> EmuJob:
    """A job planned without a network re-timed (and re-planned) on the emulated
    network's lightpaths (the run path plans on them directly: plan_emulated_jobs)."""
    hops = emulated_hops([(h.latency_ms, h.bandwidth_gbps) for h in job.problem.hops],
                         job.stage_dcs, emu_plan)
    problem = dataclasses.replace(job.problem, hops=tuple(Hop(*h) for h in hops))
    schedule = build_schedule(job.schedule.name, problem)
    timing = time_schedule(problem, schedule, check_memory_cap=False, record=False)
    plan = job.plan
    if plan.mode == "shadow":
        plan = scaled_plan(job.job, problem, schedule, emu_plan.scale,
                           iterations=plan.iterations,
                           warmup_iterations=plan.warmup_iterations, info=plan.info)
    return dataclasses.replace(job, problem=problem, schedule=schedule, plan=plan,
                               simulated_iteration_time_s=timing.iteration_time_ms / 1e3,
                               simulated_bubble_ratio=timing.bubble_ratio)


def hosts_of(net: LiveNetwork) -> dict[str, list[Host]]:
    """The network's hosts per DC, as the worker launcher runs commands in them."""
    out: dict[str, list[Host]] = {}
    for h in net.plan.hosts:
        pid = net.host_pid(h.name)
        iface = net.host_iface(h.name)
        out.setdefault(h.dc, []).append(Host(h.name, h.ip.split("/")[0], iface,
                                             ("mnexec", "-a", str(pid))))
    return out


_in_ns = in_netns  # fn() in a thread that joined netns fd (setns is per thread)


def prometheus_series(url: str, home_fd: int | None) -> dict[str, int]:
    """How many series of each worker and link metric Prometheus holds (from home)."""
    from testbed.metrics.query import query

    got = {}
    for name in (*METRIC_NAMES, *LINK_METRIC_NAMES):
        q = f"count(last_over_time({name}{'_count' if 'duration' in name else ''}[1h]))"
        res = _in_ns(home_fd, lambda q=q: query(url, q))
        got[name] = int(float(res[0]["value"][1])) if res else 0
    return got


def run_pp_jobs(scenario: Scenario, net: LiveNetwork, out_dir: Path, quiet: bool = False,
                mode: str | None = None,
                on_metrics: Callable[[str], None] | None = None,
                monitor: RunMonitor | None = None, faults: Any = None) -> dict[str, Any]:
    """Place, launch, supervise and record the scenario's jobs on the live network.

    `monitor` is the run's RunMonitor (started here, and stopped, when not given).
    `faults`: the run's FaultInjector (testbed.orchestrate.faults): it learns the worker
    launcher once the workers start, and restarts a killed Prometheus before the last
    scrape once the jobs have ended.
    `on_metrics(url)`, if given, is called once the jobs have ended, while Prometheus
    (and the link exporter) still run, from a thread in the run's home namespace.
    """
    home_fd = net.home_netns_fd
    mode = mode or scenario.emulation.workers
    by_dc = hosts_of(net)
    by_name = {h.name: h for hs in by_dc.values() for h in hs}
    client = net.controller_client
    placement: list[list[Host]] | None = None
    ctl_ids: list[int] = []
    if client is not None:  # placement and lightpaths from the controller (POST /jobs)
        jobs, placement, ctl_ids = place_via_controller(scenario, net, by_name, mode)
        if not jobs:
            raise RuntimeFailure("the controller placed none of the scenario's jobs")
    else:
        jobs = plan_emulated_jobs(scenario, mode=mode, emu_plan=net.plan)
    own_mon = monitor is None
    mon = monitor or RunMonitor(scenario, out_dir, out_dir, home_fd=home_fd).start(net, client)
    prom = mon.prom
    result: dict[str, Any] = {}
    try:
        if prom is not None:
            result["prometheus_url"] = prom.url
        tune_host_tcp(net.plan, by_dc)
        queues = deepen_lightpath_queues(net)
        if client is not None:
            queues.update(tune_job_paths(net, jobs, by_name))
            # The jobs' own lightpaths came after the start-up calibration: each is
            # pinged and corrected on its own fibres before the workers start.
            result["job_lightpath_rtt"] = check_job_paths(net, jobs)
        result["placement_from"] = "controller" if client is not None else "emulator"
        result["lightpath_queue_bytes"] = queues
        result["lightpath_congestion_control"] = LIGHTPATH_CONGESTION_CONTROL
        go_on_until = None
        if faults is not None and scenario.emulation.iterate_through_events:
            go_on_until = Path(out_dir) / "workers" / EVENTS_DONE_FILE
            go_on_until.unlink(missing_ok=True)
            faults.set_done_file(go_on_until)
        split = getattr(net, "cpu_split", None)  # testbed.orchestrate.run.isolate_cpus
        result["cpu_isolation"] = getattr(net, "cpu_isolation", None) or {"split": False}
        result.update(run_jobs_on_hosts(
            jobs, by_dc, Path(out_dir), prometheus=mon, metrics_netns_fd=home_fd,
            placement=placement, on_started=None if faults is None else faults.attach_launcher,
            go_on_until=go_on_until, cpus=None if split is None else split.workers,
            fault_policy=FaultPolicy.of(getattr(scenario.policy, "workers", None),
                                        net.plan.scale.time_factor)))
        if faults is not None:
            faults.drain()  # a Prometheus still down comes back for the last scrape
        mon.record_jobs(result)  # per-job gauges of the run exporter
        result["tcp_counters"] = tcp_counters(list(by_name.values()))
        if prom is not None:
            mon.flush()
            result["prometheus_series"] = prometheus_series(prom.url, home_fd)
            if on_metrics is not None:
                url = prom.url
                _in_ns(home_fd, lambda: on_metrics(url))
        result["link_counters"] = mon.links.snapshot() if mon.links is not None else {}
    finally:
        if own_mon:
            mon.stop()
        if ctl_ids:
            delete_jobs(net, ctl_ids)
    return result
