"""Simulated ring all-reduce jobs in a leaf-spine DC: paths by a routing policy, times by
the max-min model of testbed.routing, in a fluid replay of one concurrent round.

A round starts every job at once; each job's flows carry 2(n-1)/n of its buffer, and a
ring moves in lock-step, so a job advances at its slowest flow's max-min rate. When a
job finishes, the rates of the rest are recomputed without its flows (fluid model).
Rates are TCP goodput: link capacity x GOODPUT_EFFICIENCY (1448 payload bytes per
1514-byte Ethernet frame with TCP timestamps), in both backends.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import networkx as nx

# The ring helpers and route_paths live in testbed.routing.paths (the controller routes
# with them too); named here as well for this module's callers.
from testbed.routing.paths import (
    FlowKey,
    flow_id,
    ring_flow_bytes,
    ring_keys,
    route_paths,
)
from testbed.spec.check import dc_host_count
from testbed.spec.models import Scenario

__all__ = ["GOODPUT_EFFICIENCY", "FlowKey", "flow_id", "leaf_spine_graph", "ring_flow_bytes",
           "ring_keys", "round_times", "route_paths", "simulate_allreduce"]

GOODPUT_EFFICIENCY = 1448 / 1514


def leaf_spine_graph(scenario: Scenario, dc: str) -> nx.DiGraph:
    """One DC's leaf-spine as the emulation builds it (testbed.routing.topology's
    from_scenario: real rates, hosts in blocks per leaf), nodes renamed <dc>-h<i>,
    <dc>-leaf<j>, <dc>-spine<k>."""
    from testbed.routing.topology import from_scenario

    g = from_scenario(scenario)
    return nx.relabel_nodes(g, {n: f"{dc}-{n}" for n in g})


def round_times(graph: nx.DiGraph, paths: Mapping[Hashable, Sequence[str]],
                job_of: Mapping[Hashable, int], flow_bytes: Mapping[int, float],
                scale: float = 1.0) -> dict[int, float]:
    """Seconds each job takes in one concurrent round (fluid max-min replay).

    paths: flow -> node path; job_of: flow -> job; flow_bytes: job -> bytes per flow;
    scale: emulated/real bandwidth divisor (1: real time).
    """
    from testbed.routing.maxmin import max_min_rates

    left = {job_of[f]: flow_bytes[job_of[f]] for f in paths}
    active = {f for f in paths}
    now = 0.0
    done: dict[int, float] = {}
    while active:
        rates = max_min_rates(graph, {f: list(paths[f]) for f in active})
        job_rate: dict[int, float] = {}
        for f in active:
            j = job_of[f]
            job_rate[j] = min(job_rate.get(j, float("inf")), rates[f])
        # bytes/s of goodput at the job's bottleneck (capacity_gbps is real Gb/s)
        bps = {j: r * 1e9 / 8 * GOODPUT_EFFICIENCY / scale for j, r in job_rate.items()}
        dt, first = min((left[j] / bps[j], j) for j in bps)
        now += dt
        for j in bps:
            left[j] -= bps[j] * dt
        finished = {j for j in bps if j == first or left[j] <= 1e-9 * flow_bytes[j]}
        for j in finished:
            done[j] = now
        active = {f for f in active if job_of[f] not in finished}
    return done


def simulate_allreduce(scenario: Scenario) -> dict[str, Any]:
    """Every policy of the workload on the scenario's leaf-spine: per job, the round time
    (real seconds), bottleneck and paths; summary rows per policy."""
    wl = scenario.workload
    dc_of = {f"{d.name}-h{i}": d.name for d in scenario.dcs
             for i in range(dc_host_count(scenario, d))}
    graph = nx.DiGraph()
    for d in sorted({dc_of[j.members[0]] for j in wl.jobs}):  # type: ignore[attr-defined]
        graph = nx.compose(graph, leaf_spine_graph(scenario, d))
    keys: list[FlowKey] = []
    job_of: dict[FlowKey, int] = {}
    flow_bytes: dict[int, float] = {}
    for j, job in enumerate(wl.jobs):  # type: ignore[attr-defined]
        for k in ring_keys(job.members, j):
            keys.append(k)
            job_of[k] = j
        flow_bytes[j] = ring_flow_bytes(job.members, job.buffer_bytes)
    out: dict[str, Any] = {"policies": {}}
    for policy in wl.policies:  # type: ignore[attr-defined]
        paths, rates, wall_s = route_paths(policy, graph, keys, flow_bytes,
                                           seed=wl.seed)  # type: ignore[attr-defined]
        times = round_times(graph, paths, job_of, flow_bytes)
        out["policies"][policy] = {
            "wall_s": wall_s,
            "jobs": [{"job": j, "allreduce_time_s": times[j],
                      "bottleneck_gbps": min(r for k, r in rates.items() if k[0] == j),
                      "paths": {f"{s}->{d}": list(paths[(jj, s, d)])
                                for (jj, s, d) in keys if jj == j}}
                     for j in sorted(times)],
            "mean_allreduce_time_s": sum(times.values()) / len(times),
            "max_allreduce_time_s": max(times.values())}
    return out
