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
import json
import logging
import math
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from testbed.errors import RuntimeFailure
from testbed.metrics.links import LINK_METRIC_NAMES, LinkExporter
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
            hops[b] = Hop(lp.delay_ms / tf, lp.real_gbps * TCP_GOODPUT)
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


# TCP as long-lived training connections see it. The simulator times a transfer as
# latency + size / bandwidth on a FIFO link; a default Linux TCP instead (1) restarts
# slow start after every idle gap longer than an RTO (RFC 2861; the stages idle between
# activations and the WAN RTT is stretched by time_factor), adding whole RTTs per
# activation, and (2) probes the window up until the lightpath pacer's queue overflows,
# then runs window-limited below the lightpath rate. Both were measured here (latency
# calibration 10-17 % slow; bandwidth calibration up to 2x per transfer). So each host
# keeps its window across idle gaps and gets, per destination DC, a route whose initial
# and clamped congestion window is the lightpath's bandwidth-delay product, and the
# lightpath's pacers queue up to 2 BDPs (deep-buffered WAN ingress; the emulator's
# default is 1 BDP, which a burst of one window plus whole 64 KB GSO frames overflows:
# measured tail drops and RTO stalls). So the pipe stays full and one flow never
# overflows its queue, which is how a tuned long-haul transport behaves. Hosts: per
# network namespace only.
MSS_BYTES = 1448              # 1500 MTU - 20 IP - 32 TCP (with timestamps)
WIRE_BYTES_PER_SEGMENT = 1518  # + 14 Ethernet + 4 802.1Q tag, as the pacer counts them
TCP_GOODPUT = MSS_BYTES / WIRE_BYTES_PER_SEGMENT  # 0.954 of a lightpath's rate
MIN_WINDOW_SEGMENTS = 64
WINDOW_MARGIN_SEGMENTS = 8
LIGHTPATH_QUEUE_BDPS = 2.0
HOST_TCP_SYSCTLS = ("net.ipv4.tcp_slow_start_after_idle=0",)


def lightpath_queue_bytes(rate_mbps: float, one_way_delay_ms: float) -> int:
    """Per-lightpath pacer queue for pp_jobs runs: LIGHTPATH_QUEUE_BDPS x the BDP."""
    from testbed.emu.forwarder import default_queue_bytes

    bdp = rate_mbps * 1e6 / 8 * 2 * one_way_delay_ms / 1e3
    return max(default_queue_bytes(rate_mbps, one_way_delay_ms),
               int(LIGHTPATH_QUEUE_BDPS * bdp))


def window_segments(rate_mbps: float, one_way_delay_ms: float) -> int:
    """Congestion window (segments) for a lightpath: its BDP plus a few segments.

    The window fills the pipe (window / RTT >= rate) and, sent as one burst after an
    idle gap (no slow-start restart), fits in the lightpath's pacer queue
    (lightpath_queue_bytes) with one BDP to spare for whole GSO frames and ACK timing.
    """
    bdp = rate_mbps * 1e6 / 8 * 2 * one_way_delay_ms / 1e3
    return max(MIN_WINDOW_SEGMENTS, math.ceil(bdp / WIRE_BYTES_PER_SEGMENT)
               + WINDOW_MARGIN_SEGMENTS)


def deepen_lightpath_queues(net: Any) -> dict[int, int]:
    """Give each DC-pair lightpath's pacers a queue of lightpath_queue_bytes (in place).

    Sets the limit of the lightpath's existing cap (same rate) on every fibre of its
    route over the forwarder's control channel; returns {vlan: limit_bytes}.
    """
    plan = net.plan
    fibre_of = {frozenset((f.u, f.v)): f for f in plan.fibres}
    out: dict[int, int] = {}
    for lp in plan.lightpaths:
        limit = lightpath_queue_bytes(lp.rate_mbps, lp.delay_ms)
        for u, v in zip(lp.path, lp.path[1:], strict=False):
            emu = getattr(net, "emulators", {}).get(fibre_of[frozenset((u, v))].middle)
            if emu is None or not hasattr(emu, "request"):
                continue  # netem links: no user-space pacer
            caps = {vid: c for d in emu.stats().get("directions", {}).values()
                    for vid, c in d.get("vlans", {}).items()}
            cap = caps.get(str(lp.vlan))
            if cap is None:
                continue
            emu.request({"vlan": lp.vlan, "rate_mbps": cap["rate_mbps"],
                         "limit_bytes": limit})
            out[lp.vlan] = limit
    return out


def host_routes(emu_plan: Any, dc: str) -> list[tuple[str, int]]:
    """(destination DC subnet, window segments) for every lightpath leaving `dc`."""
    out = []
    for lp in emu_plan.lightpaths:
        if dc not in (lp.dc_a, lp.dc_b):
            continue
        other = lp.dc_b if lp.dc_a == dc else lp.dc_a
        out.append((emu_plan.dc_subnets[other], window_segments(lp.rate_mbps, lp.delay_ms)))
    return out


def tune_host_tcp(emu_plan: Any, hosts_by_dc: dict[str, list[Host]]) -> None:
    """Apply HOST_TCP_SYSCTLS and per-destination-DC window routes in every host."""
    import subprocess

    for dc, hosts in hosts_by_dc.items():
        routes = host_routes(emu_plan, dc)
        for h in hosts:
            sysctls = [a for s in HOST_TCP_SYSCTLS for a in ("-w", s)]
            subprocess.run([*h.prefix, "sysctl", "-q", *sysctls], check=True,
                           stdout=subprocess.DEVNULL, timeout=10)
            for subnet, win in routes:
                assert h.iface is not None
                subprocess.run([*h.prefix, "ip", "route", "replace", subnet, "dev", h.iface,
                                "src", h.ip, "initcwnd", str(win), "initrwnd", str(win),
                                "cwnd", "lock", str(win)], check=True, timeout=10)


TCP_COUNTERS = ("TcpRetransSegs", "TcpExtTCPTimeouts", "TcpExtTCPLossProbes")


def tcp_counters(hosts: list[Host]) -> dict[str, dict[str, int]]:
    """Per host: TCP retransmitted segments, RTO time-outs and loss probes (nstat)."""
    import subprocess

    out: dict[str, dict[str, int]] = {}
    for h in hosts:
        try:
            res = subprocess.run([*h.prefix, "nstat", "-az", "--json", *TCP_COUNTERS],
                                 capture_output=True, text=True, timeout=10, check=True)
            kernel = json.loads(res.stdout).get("kernel", {})
            out[h.name] = {k: int(kernel.get(k, 0)) for k in TCP_COUNTERS}
        except (OSError, subprocess.SubprocessError, ValueError):
            continue
    return out


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
                mode: str | None = None,
                on_metrics: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Place, launch, supervise and record the scenario's jobs on the live network.

    `on_metrics(url)`, if given, is called once the jobs have ended, while Prometheus
    (and the link exporter) still run, from a thread in the run's home namespace.
    """
    home_fd = getattr(net, "_back_fd", None)
    mode = mode or scenario.emulation.workers
    by_dc = hosts_of(net)
    by_name = {h.name: h for hs in by_dc.values() for h in hs}
    client = getattr(net, "controller_client", None)
    placement: list[list[Host]] | None = None
    ctl_ids: list[int] = []
    if client is not None:  # placement and lightpaths from the controller (POST /jobs)
        from workloads.ctl_jobs import place_via_controller

        jobs, placement, ctl_ids = place_via_controller(scenario, net, by_name, mode)
        if not jobs:
            raise RuntimeFailure("the controller placed none of the scenario's jobs")
    else:
        jobs = [on_emulated_links(j, net.plan, scenario)
                for j in plan_emulated_jobs(scenario, mode=mode)]
    prom = PrometheusServer(out_dir, scrape_interval_s=1.0) if find_binary() else None
    links = LinkExporter(getattr(net, "emulators", {}).values())
    result: dict[str, Any] = {}
    try:
        _in_ns(home_fd, links.start)
        if prom is not None:
            _in_ns(home_fd, prom.start)
            prom.set_targets("links", [(links.target, {"component": "links"})])
            result["prometheus_url"] = prom.url
            if not quiet:
                log.warning("prometheus: %s (data in %s)", prom.url, prom.data_dir)
        tune_host_tcp(net.plan, by_dc)
        queues = deepen_lightpath_queues(net)
        if client is not None:
            from workloads.ctl_jobs import tune_job_paths

            queues.update(tune_job_paths(net, jobs, by_name))
        result["placement_from"] = "controller" if client is not None else "emulator"
        result["lightpath_queue_bytes"] = queues
        result.update(run_jobs_on_hosts(jobs, by_dc, Path(out_dir), prometheus=prom,
                                        metrics_netns_fd=home_fd, placement=placement))
        result["tcp_counters"] = tcp_counters(list(by_name.values()))
        if prom is not None:
            from testbed.metrics.query import query
            got = {}
            for name in (*METRIC_NAMES, *LINK_METRIC_NAMES):
                q = f"count(last_over_time({name}{'_count' if 'duration' in name else ''}[1h]))"
                res = _in_ns(home_fd, lambda q=q: query(prom.url, q))
                got[name] = int(float(res[0]["value"][1])) if res else 0
            result["prometheus_series"] = got
            if on_metrics is not None:
                url = prom.url
                _in_ns(home_fd, lambda: on_metrics(url))
        result["link_counters"] = links.snapshot()
    finally:
        if prom is not None:
            prom.stop()
        links.stop()
        if ctl_ids:
            from workloads.ctl_jobs import delete_jobs

            delete_jobs(net, ctl_ids)
    return result
