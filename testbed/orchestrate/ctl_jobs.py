"""Placement and lightpaths of emulated pipeline jobs from the SDN controller (POST /jobs).

With `emulation.forwarding: controller`, every job of the scenario (the first
`emulation.max_jobs` that the controller accepts) is submitted to the controller's
`POST /jobs`: the controller runs the scenario's placement policy on its own optical
state, picks a host per stage, and sets up one dedicated lightpath per cross-DC stage
boundary (VLAN, OpenFlow rules, emulator cap). The workers then run on exactly those
hosts, and the simulated side of the agreement times the same placement with what the
emulation really does on each boundary:

- latency = the emulated delay along the lightpath's fibres (fibre km x propagation
  + node delay, scaled as `testbed.emu.plan` emulates it) scaled back to real time;
- bandwidth = the lightpath's capacity x TCP goodput (`testbed.emu.tcp_tuning.TCP_GOODPUT`);
- a boundary inside one DC keeps the DC fabric figures.

The jobs are deleted (lightpaths torn down, GPUs released) at the end.
"""

from __future__ import annotations

import logging
import random
from typing import Any

from testbed.emu.live import LiveNetwork
from testbed.emu.plan import EmuPlan
from testbed.emu.tcp_tuning import (
    TCP_GOODPUT,
    lightpath_queue_bytes,
    window_route,
    window_segments,
)
from testbed.errors import RuntimeFailure
from testbed.orchestrate.jobs import EmuJob, build_emu_job
from testbed.orchestrate.launch import Host
from testbed.spec.models import PPJobsWorkload, Scenario

log = logging.getLogger(__name__)


def route_delay_ms(emu_plan: EmuPlan, fibres: list[list[str]]) -> float:
    """Emulated one-way delay (ms) along a lightpath's fibres [[u, v], ...]."""
    by_pair = {frozenset((f.u, f.v)): f for f in emu_plan.fibres}
    total = 0.0
    for u, v in fibres:
        f = by_pair.get(frozenset((str(u), str(v))))
        if f is None:
            raise RuntimeFailure(f"controller lightpath uses unknown fibre {u}-{v}")
        total += f.delay_ms
    return total


def job_request(scenario: Scenario, job: Any, mode: str) -> dict[str, Any]:
    from testbed.orchestrate.jobs import MODEL_MODE_SCHEDULES

    sched = scenario.policy.schedule
    if mode == "model" and sched not in MODEL_MODE_SCHEDULES:
        sched = "1f1b"
    r = job.req
    return {"model": r.model, "stages": r.stages, "gpus_per_stage": r.gpus_per_stage,
            "microbatches": r.microbatches, "iterations": r.iterations,
            "policy": scenario.policy.placement, "schedule": sched}


def place_timeout_s() -> float:
    """The controller's POST /jobs time limit as this environment sets it."""
    import os

    from controllers.placing import DEFAULT_TIMEOUT_S, PlaceLimits

    try:
        return PlaceLimits.from_env(os.environ).timeout_s
    except ValueError:  # the controller refuses to start with it anyway
        return DEFAULT_TIMEOUT_S


def place_via_controller(scenario: Scenario, net: LiveNetwork, hosts: dict[str, Host],
                         mode: str) -> tuple[list[EmuJob], list[list[Host]], list[int]]:
    """POST /jobs for the scenario's jobs; (jobs, stage hosts per job, controller ids)."""
    from testbed.jobs.cluster import Cluster
    from testbed.jobs.policies import Planner
    from testbed.jobs.sim import resolve_jobs
    from testbed.jobs.timing import Timer
    from testbed.traces import generate_jobs

    wl = scenario.workload
    assert isinstance(wl, PPJobsWorkload)
    em = scenario.emulation
    client = net.controller_client
    assert client is not None
    scale = net.plan.scale
    cluster = Cluster.from_scenario(scenario)
    planner = Planner(cluster, scenario.policy, Timer(), random.Random(wl.seed))
    index = {dc.name: i for i, dc in enumerate(cluster.dcs)}
    jobs: list[EmuJob] = []
    placement: list[list[Host]] = []
    ids: list[int] = []
    # The controller answers 503 once a placement passes its limit (the child inherits
    # this environment): wait a little longer than that for the answer.
    post_timeout_s = max(float(getattr(client, "request_timeout_s", 0.0)),
                         place_timeout_s() + 10.0)
    for job in resolve_jobs(wl, generate_jobs(wl)):
        if len(jobs) >= em.max_jobs:
            break
        status, reply = client.request("POST", "/jobs", job_request(scenario, job, mode),
                                       timeout_s=post_timeout_s)
        if status != 201:
            reason = reply.get("reason") or reply.get("error") if isinstance(reply, dict) \
                else reply
            log.info("controller refused job %s: %s %s", job.req.job_id, status, reason)
            continue
        ids.append(int(reply["id"]))
        dcs = [index[d] for d in reply["dcs"]]
        stage_hosts = [hosts[p["host"]] for p in reply["stages_placement"]]
        hops: list[tuple[float, float]] = []
        lps: list[dict[str, Any] | None] = []
        for bnd in reply["boundaries"]:
            lp = bnd.get("lightpath")
            if lp is None:
                dc = cluster.dcs[dcs[bnd["boundary"]]]
                hops.append((dc.fabric_latency_ms, dc.fabric_gbps))
                lps.append(None)
                continue
            delay_ms = route_delay_ms(net.plan, lp["fibres"])
            hops.append((scale.real_ms(delay_ms), lp["capacity_gbps"] * TCP_GOODPUT))
            lps.append({"boundary": bnd["boundary"], "route": lp["nodes"],
                        "slots": lp["n_slots"], "capacity_gbps": lp["capacity_gbps"],
                        "latency_ms": lp["latency_ms"], "vlan": lp["vid"],
                        "lightpath_id": lp["id"], "src_host": bnd["src_host"],
                        "dst_host": bnd["dst_host"], "fibres": lp["fibres"],
                        "emulated_delay_ms": delay_ms,
                        "emulated_rate_mbps": scale.rate_mbps(lp["capacity_gbps"])})
        ej = build_emu_job(scenario, planner, job, dcs, hops, mode, lps)
        ej.lightpaths = lps
        jobs.append(ej)
        placement.append(stage_hosts)
    return jobs, placement, ids


def tune_job_paths(net: LiveNetwork, jobs: list[EmuJob], hosts: dict[str, Host]) -> dict[int, int]:
    """Per boundary lightpath: host routes with its window, its pacers' queue deepened."""
    fibre_of = {frozenset((f.u, f.v)): f for f in net.plan.fibres}
    out: dict[int, int] = {}
    for j in jobs:
        for lp in j.lightpaths:
            if lp is None:
                continue
            rate, delay = lp["emulated_rate_mbps"], lp["emulated_delay_ms"]
            win = window_segments(rate, delay)
            a, b = hosts[lp["src_host"]], hosts[lp["dst_host"]]
            for h, peer in ((a, b), (b, a)):
                window_route(h, f"{peer.ip}/32", win)
            limit = lightpath_queue_bytes(rate, delay)
            for u, v in lp["fibres"]:
                emu = net.emulators.get(fibre_of[frozenset((str(u), str(v)))].middle)
                if emu is not None:
                    emu.set_queue(lp["vlan"], rate, limit)
            out[lp["vlan"]] = limit
    return out


def delete_jobs(net: LiveNetwork, ids: list[int]) -> None:
    """DELETE the controller's jobs (their lightpaths go, their GPUs are freed)."""
    assert net.controller_client is not None
    for i in ids:
        try:
            status, _ = net.controller_client.request("DELETE", f"/jobs/{i}")
            if status != 200:
                log.warning("controller DELETE /jobs/%d: %s", i, status)
        except Exception as exc:  # the network is torn down next anyway
            log.warning("controller DELETE /jobs/%d failed: %s", i, exc)
