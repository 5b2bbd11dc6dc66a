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
import threading
from pathlib import Path
from typing import Any

from testbed.metrics.prometheus import PrometheusServer, find_binary
from testbed.schedule import Hop, build_schedule, time_schedule
from testbed.spec.models import Scenario
from workloads.jobs import EmuJob, plan_emulated_jobs, run_jobs_on_hosts
from workloads.launch import Host, _setns
from workloads.metrics import METRIC_NAMES
from workloads.plan import shadow_plan

log = logging.getLogger(__name__)


def on_emulated_links(job: EmuJob, emu_plan: Any, scenario: Scenario) -> EmuJob:
    """The job re-timed (and re-planned) with the emulated network's lightpaths."""
    tf = emu_plan.time_factor
    by_pair = {frozenset((lp.dc_a, lp.dc_b)): lp for lp in emu_plan.lightpaths}
    hops = list(job.problem.hops)
    for b in range(len(hops)):
        a, c = job.stage_dcs[b], job.stage_dcs[b + 1]
        if a != c and frozenset((a, c)) in by_pair:
            lp = by_pair[frozenset((a, c))]
            hops[b] = Hop(lp.delay_ms / tf, lp.real_gbps)
    problem = dataclasses.replace(job.problem, hops=tuple(hops))
    schedule = build_schedule(job.schedule.name, problem)
    timing = time_schedule(problem, schedule, check_memory_cap=False, record=False)
    plan = job.plan
    if plan.mode == "shadow":
        em = scenario.emulation
        plan = shadow_plan(job.job, problem, schedule, iterations=plan.iterations,
                           warmup_iterations=plan.warmup_iterations,
                           bandwidth_divisor=em.bandwidth_divisor, time_factor=em.time_factor,
                           info=plan.info)
    return dataclasses.replace(job, problem=problem, schedule=schedule, plan=plan,
                               simulated_iteration_time_s=timing.iteration_time_ms / 1e3,
                               simulated_bubble_ratio=timing.bubble_ratio)


def hosts_of(net: Any) -> dict[str, list[Host]]:
    out: dict[str, list[Host]] = {}
    for h in net.plan.hosts:
        pid = net.host_pid(h.name)
        iface = str(net.nodes[h.node].defaultIntf())
        out.setdefault(h.dc, []).append(Host(h.name, h.ip.split("/")[0], iface,
                                             ("mnexec", "-a", str(pid))))
    return out


# TCP as long-lived training connections see it: a pipeline stage's connection idles
# between transfers for longer than an RTO (the WAN RTT is stretched by time_factor), and
# Linux would then restart slow start for every activation (RFC 2861), adding whole RTTs
# that neither real gloo/NCCL links with warm connections nor the simulator's
# latency + size / bandwidth model have. Keep the congestion window across idle periods
# and start it large enough for one activation. Per host network namespace only.
TCP_INIT_WINDOW_SEGMENTS = 256
HOST_TCP_SYSCTLS = ("net.ipv4.tcp_slow_start_after_idle=0",)


def tune_host_tcp(hosts: list[Host], init_window: int = TCP_INIT_WINDOW_SEGMENTS) -> None:
    """Apply HOST_TCP_SYSCTLS and initcwnd/initrwnd on every on-link route of each host."""
    import subprocess

    for h in hosts:
        run = [*h.prefix]
        sysctls = [a for s in HOST_TCP_SYSCTLS for a in ("-w", s)]
        subprocess.run([*run, "sysctl", "-q", *sysctls], check=True,
                       stdout=subprocess.DEVNULL, timeout=10)
        if not h.iface:
            continue
        routes = subprocess.run([*run, "ip", "-o", "-4", "route", "show", "dev", h.iface],
                                check=True, capture_output=True, text=True, timeout=10)
        for line in routes.stdout.splitlines():
            words = line.split()
            for key in ("initcwnd", "initrwnd"):  # drop old values, keep the route key
                while key in words:
                    i = words.index(key)
                    del words[i:i + 2]
            subprocess.run([*run, "ip", "route", "change", *words, "dev", h.iface,
                            "initcwnd", str(init_window), "initrwnd", str(init_window)],
                           check=True, timeout=10)


def _in_ns(fd: int | None, fn: Any) -> Any:
    """Run fn() in a thread that first joins netns `fd` (setns is per thread)."""
    if fd is None:
        return fn()
    box: dict[str, Any] = {}

    def body() -> None:
        try:
            _setns(fd)
            box["v"] = fn()
        except BaseException as exc:  # re-raised in the caller
            box["e"] = exc

    t = threading.Thread(target=body)
    t.start()
    t.join()
    if "e" in box:
        raise box["e"]
    return box.get("v")


def run_pp_jobs(scenario: Scenario, net: Any, out_dir: Path, quiet: bool = False,
                mode: str | None = None) -> dict[str, Any]:
    """Place, launch, supervise and record the scenario's jobs on the live network."""
    home_fd = getattr(net, "_back_fd", None)
    jobs = [on_emulated_links(j, net.plan, scenario)
            for j in plan_emulated_jobs(scenario, mode=mode)]
    prom = PrometheusServer(out_dir, scrape_interval_s=1.0) if find_binary() else None
    result: dict[str, Any] = {}
    try:
        if prom is not None:
            _in_ns(home_fd, prom.start)
            result["prometheus_url"] = prom.url
            if not quiet:
                log.warning("prometheus: %s (data in %s)", prom.url, prom.data_dir)
        by_dc = hosts_of(net)
        tune_host_tcp([h for hs in by_dc.values() for h in hs])
        result.update(run_jobs_on_hosts(jobs, by_dc, Path(out_dir), prometheus=prom,
                                        metrics_netns_fd=home_fd))
        if prom is not None:
            from testbed.metrics.query import query
            got = {}
            for name in METRIC_NAMES:
                q = f"count(last_over_time({name}{'_count' if 'duration' in name else ''}[1h]))"
                res = _in_ns(home_fd, lambda q=q: query(prom.url, q))
                got[name] = int(float(res[0]["value"][1])) if res else 0
            result["prometheus_series"] = got
    finally:
        if prom is not None:
            prom.stop()
    return result
