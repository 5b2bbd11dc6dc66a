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
from collections import Counter
from typing import Any

from testbed.emu.live import LiveNetwork
from testbed.emu.plan import EmuPlan
from testbed.emu.tcp_tuning import (
    TCP_GOODPUT,
    dilated_rto_min_ms,
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
    placed: list[tuple[Any, dict[str, Any]]] = []
    for job in resolve_jobs(wl, generate_jobs(wl)):
        if len(placed) >= em.max_jobs:
            break
        status, reply = client.request("POST", "/jobs", job_request(scenario, job, mode),
                                       timeout_s=post_timeout_s)
        if status != 201:
            reason = reply.get("reason") or reply.get("error") if isinstance(reply, dict) \
                else reply
            log.info("controller refused job %s: %s %s", job.req.job_id, status, reason)
            continue
        placed.append((job, reply))
    # Which lightpath each cross-DC boundary really takes: the controller's WAN routing
    # (policy.routing over every live lightpath between the two DCs) may put a job's flow
    # on another lightpath than the job's own, and the simulated side must time that one.
    taken = wan_assignment(client) if placed else {}
    for job, reply in placed:
        ids.append(int(reply["id"]))
        dcs = [index[d] for d in reply["dcs"]]
        stage_hosts = [hosts[p["host"]] for p in reply["stages_placement"]]
        hops: list[tuple[float, float]] = []
        lps: list[dict[str, Any] | None] = []
        for bnd in reply["boundaries"]:
            own = bnd.get("lightpath")
            if own is None:
                dc = cluster.dcs[dcs[bnd["boundary"]]]
                hops.append((dc.fabric_latency_ms, dc.fabric_gbps))
                lps.append(None)
                continue
            flow = (int(reply["id"]), str(bnd["src_host"]), str(bnd["dst_host"]))
            lp, sharing = taken.get(flow, (own, 1))
            if lp.get("id") != own.get("id"):
                log.info("job %s boundary %s: the controller's WAN routing put the flow "
                         "on lightpath %s (%s Gb/s), not the job's own %s (%s Gb/s)",
                         reply["id"], bnd["boundary"], lp.get("id"), lp.get("capacity_gbps"),
                         own.get("id"), own.get("capacity_gbps"))
            delay_ms = route_delay_ms(net.plan, lp["fibres"])
            hops.append((scale.real_ms(delay_ms), lp["capacity_gbps"] * TCP_GOODPUT))
            lps.append({"boundary": bnd["boundary"], "route": lp["nodes"],
                        "slots": lp["n_slots"], "capacity_gbps": lp["capacity_gbps"],
                        "latency_ms": lp.get("latency_ms", own.get("latency_ms")),
                        "vlan": lp["vid"], "lightpath_id": lp["id"],
                        "own_lightpath_id": own["id"], "flows_on_lightpath": sharing,
                        "src_host": bnd["src_host"], "dst_host": bnd["dst_host"],
                        "fibres": lp["fibres"], "emulated_delay_ms": delay_ms,
                        "emulated_rate_mbps": scale.rate_mbps(lp["capacity_gbps"])})
        ej = build_emu_job(scenario, planner, job, dcs, hops, mode, lps)
        ej.lightpaths = lps
        jobs.append(ej)
        placement.append(stage_hosts)
    return jobs, placement, ids


def assigned_lightpaths(routing: dict[str, Any], lightpaths: list[dict[str, Any]]
                        ) -> dict[tuple[int, str, str], tuple[dict[str, Any], int]]:
    """(pipeline job id, source host, destination host) -> (the lightpath the controller's
    WAN routing put that flow on, as GET /lightpaths shows it; how many job flows it
    carries), from GET /routing's `wan` view. Flows it left unassigned are absent."""
    by_id = {int(lp["id"]): lp for lp in lightpaths}
    flows = (routing.get("wan") or {}).get("flows") or []
    load = Counter(int(f["lightpath_id"]) for f in flows if f.get("lightpath_id") is not None)
    out: dict[tuple[int, str, str], tuple[dict[str, Any], int]] = {}
    for f in flows:
        lp_id = f.get("lightpath_id")
        if f.get("kind", "pipeline") != "pipeline" or lp_id is None or int(lp_id) not in by_id:
            continue
        out[(int(f["job"]), str(f["src"]), str(f["dst"]))] = (by_id[int(lp_id)],
                                                             load[int(lp_id)])
    return out


def wan_assignment(client: Any) -> dict[tuple[int, str, str], tuple[dict[str, Any], int]]:
    """assigned_lightpaths() from the live controller (GET /routing, GET /lightpaths)."""
    status, routing = client.request("GET", "/routing")
    status_lp, lps = client.request("GET", "/lightpaths")
    if status != 200 or status_lp != 200 or not isinstance(routing, dict):
        raise RuntimeFailure(f"controller GET /routing: {status}, GET /lightpaths: {status_lp}")
    return assigned_lightpaths(routing, lps if isinstance(lps, list) else lps.get("lightpaths", []))


def tune_job_paths(net: LiveNetwork, jobs: list[EmuJob], hosts: dict[str, Host]) -> dict[int, int]:
    """Per boundary lightpath: host routes with its window, its pacers' queue deepened."""
    fibre_of = {frozenset((f.u, f.v)): f for f in net.plan.fibres}
    rto_min_ms = dilated_rto_min_ms(net.plan.scale.time_factor)
    out: dict[int, int] = {}
    for j in jobs:
        for lp in j.lightpaths:
            if lp is None:
                continue
            rate, delay = lp["emulated_rate_mbps"], lp["emulated_delay_ms"]
            win = window_segments(rate, delay)
            a, b = hosts[lp["src_host"]], hosts[lp["dst_host"]]
            for h, peer in ((a, b), (b, a)):
                window_route(h, f"{peer.ip}/32", win, rto_min_ms)
            limit = lightpath_queue_bytes(rate, delay)
            for u, v in lp["fibres"]:
                emu = net.emulators.get(fibre_of[frozenset((str(u), str(v)))].middle)
                if emu is not None:
                    emu.set_queue(lp["vlan"], rate, limit)
            out[lp["vlan"]] = limit
    return out


def check_job_paths(net: LiveNetwork, jobs: list[EmuJob]) -> list[dict[str, Any]]:
    """Each lightpath the jobs' boundaries take that the start-up calibration never saw
    (a job's own lightpath, set up by POST /jobs after it): its RTT pinged between the
    boundary's two hosts (the flow's own path: the controller steers by host pair),
    its processing taken off that lightpath's frames on its own fibres, pinged again
    (testbed.emu.reroute.check_probe). A row per lightpath, with the job and boundary."""
    from testbed.emu.reroute import check_probe, route_probe

    calibrated = {lp.vlan for lp in net.plan.lightpaths}
    rows: list[dict[str, Any]] = []
    seen: set[int] = set()
    for j in jobs:
        for lp in j.lightpaths:
            if lp is None or lp["vlan"] in calibrated or lp["vlan"] in seen:
                continue
            seen.add(lp["vlan"])
            pair = f"{lp['src_host']}~{lp['dst_host']}"
            try:
                row = check_probe(net, route_probe(net, pair, lp["src_host"], lp["dst_host"],
                                                   lp["route"], lp["vlan"]),
                                  label="job lightpath")
            except (OSError, RuntimeError, ValueError, KeyError) as exc:
                row = {"pair": pair, "vlan": lp["vlan"], "ok": False, "error": str(exc)[:300]}
            rows.append({"job": j.job, "boundary": lp["boundary"],
                         "lightpath_id": lp["lightpath_id"], **row})
    return rows


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
