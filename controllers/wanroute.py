"""Which lightpath each cross-DC job flow takes when a DC pair has several (pure, no os-ken).

The live lightpaths between DCs become `testbed.routing.topology.wan_lightpaths`'s graph
(each lightpath a node between the two DC gateways, at its capacity), the cross-DC flows
of the running jobs (pipeline stage-to-stage transfers, host pairs) are routed on it by
the routing policy in force (`policy.routing`, PUT /routing) with the max-min metric,
and every flow gets per-flow rules at its DC edges that push its lightpath's VLAN
(priority above the lightpaths' own host-pair and DC-pair rules). Re-assigned whenever
the flows, the lightpaths (set up, lost, restored with another capacity) or the policy
change; flows that change lightpath are counted as moved.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import networkx as nx

from controllers.metrics import ControllerMetrics
from controllers.rules import (
    COOKIE_MASK,
    ETH_IPV4,
    ETH_VLAN,
    OFPVID_NONE,
    OFPVID_PRESENT,
    FlowRule,
    LayoutIndex,
)
from testbed.routing.paths import route_paths
from testbed.routing.topology import HOST, LEAF, SPINE

log = logging.getLogger("lightpipe.controller.wan")

P_WAN_FLOW = 320  # above the lightpaths' host-pair (310) and DC-pair (300) rules
COOKIE_WAN = 0x4C57 << 48  # "LW": WAN flow rules, | lightpath id
UNLIMITED_GBPS = 1e6  # host links: the lightpaths are what the flows share
ECMP = "ecmp"
# Flow keys per kind of job (job ids of POST /jobs and POST /routing/jobs overlap)
KIND_OFFSET = {"pipeline": 0, "allreduce": 1 << 20}
assert COOKIE_WAN & COOKIE_MASK == COOKIE_WAN


@dataclass(frozen=True, order=True)
class WanFlow:
    """One cross-DC flow of a job: source host -> destination host."""

    job: int
    src: str
    dst: str
    kind: str = "pipeline"


@dataclass(frozen=True)
class WanLightpath:
    """A live lightpath between two DCs as the assignment sees it."""

    id: int
    vid: int
    src_dc: str
    dst_dc: str
    capacity_gbps: float


def gw(dc: str) -> str:
    return f"gw-{dc}"


def lp_node(lp_id: int) -> str:
    return f"lp{lp_id}"


def wan_graph(host_dc: Mapping[str, str], lightpaths: Iterable[WanLightpath]) -> nx.DiGraph:
    """The routing graph: hosts (by their layout names) on their DC's gateway, each
    lightpath an `lp<id>` node between its two gateways at its capacity (both directions),
    as testbed.routing.topology.wan_lightpaths builds it."""
    g = nx.DiGraph(kind="wan")
    for h, dc in host_dc.items():
        g.add_node(gw(dc), role=LEAF, dc=dc)
        g.add_node(h, role=HOST, dc=dc)
        for u, v in ((h, gw(dc)), (gw(dc), h)):
            g.add_edge(u, v, capacity_gbps=UNLIMITED_GBPS)
    for lp in lightpaths:
        g.add_node(gw(lp.src_dc), role=LEAF, dc=lp.src_dc)
        g.add_node(gw(lp.dst_dc), role=LEAF, dc=lp.dst_dc)
        g.add_node(lp_node(lp.id), role=SPINE, dcs=(lp.src_dc, lp.dst_dc))
        for dc in (lp.src_dc, lp.dst_dc):
            g.add_edge(gw(dc), lp_node(lp.id), capacity_gbps=float(lp.capacity_gbps))
            g.add_edge(lp_node(lp.id), gw(dc), capacity_gbps=float(lp.capacity_gbps))
    return g


def assign(policy: str, flows: Iterable[WanFlow], lightpaths: Iterable[WanLightpath],
           host_dc: Mapping[str, str], *, seed: int,
           current: Mapping[WanFlow, int] | None = None
           ) -> tuple[dict[WanFlow, int], dict[WanFlow, float]]:
    """Lightpath id and max-min rate (Gb/s) per flow that has a lightpath between its DCs.

    `policy`: any of testbed.routing's (ecmp = its seeded 5-tuple hash over the
    lightpaths); `current`: the assignment in force (policies that limit churn keep it).
    Flows whose DCs have no live lightpath are left out."""
    lps = sorted(lightpaths, key=lambda lp: lp.id)
    pairs = {frozenset((lp.src_dc, lp.dst_dc)) for lp in lps}
    todo = sorted({f for f in flows if host_dc[f.src] != host_dc[f.dst]
                   and frozenset((host_dc[f.src], host_dc[f.dst])) in pairs})
    if not todo:
        return {}, {}
    ends = {h: host_dc[h] for f in todo for h in (f.src, f.dst)}
    graph = wan_graph(ends, lps)
    # Flow keys (job, src, dst): the ECMP hash sees the job's flow as switches would.
    by_key = {(f.job + KIND_OFFSET.get(f.kind, 0), f.src, f.dst): f for f in todo}
    live = {lp.id for lp in lps}
    cur = {}
    for k, f in by_key.items():
        was = (current or {}).get(f)
        if was in live:
            cur[k] = (f.src, gw(host_dc[f.src]), lp_node(was), gw(host_dc[f.dst]), f.dst)
    demand = {k[0]: 1.0 for k in by_key}
    paths, rates, _ = route_paths(policy, graph, list(by_key), demand, seed=seed, current=cur)
    if cur:
        # Incremental policies keep the flows in force where they are; also route from
        # scratch (new or freed capacity may allow better) and take that only if the
        # metric gains, so flows move only for a better metric.
        fresh, fresh_rates, _ = route_paths(policy, graph, list(by_key), demand, seed=seed)
        if _key(fresh_rates) > _key(rates):
            paths, rates = fresh, fresh_rates
    out = {by_key[k]: int(p[2][2:]) for k, p in paths.items()}
    return out, {by_key[k]: r for k, r in rates.items()}


def _key(rates: Mapping[tuple[int, str, str], float]) -> tuple[tuple[float, ...], ...]:
    """The two-layer max-min metric: per-job bottlenecks sorted, then flow rates sorted
    (larger is better, compared lexicographically)."""
    jobs: dict[int, float] = {}
    for (job, _, _), r in rates.items():
        jobs[job] = min(jobs.get(job, float("inf")), r)
    return (tuple(round(x, 9) for x in sorted(jobs.values())),
            tuple(round(x, 9) for x in sorted(rates.values())))


def wan_rules(ix: LayoutIndex, vids: Mapping[int, int],
              assignment: Mapping[WanFlow, int]) -> list[FlowRule]:
    """Per-flow rules at the DC edges: the flow's host pair (untagged IPv4) gets its
    lightpath's VLAN pushed and leaves by the edge's uplink; the reverse direction (acks,
    a pipeline's gradients) takes the same lightpath unless it is a flow of its own."""
    directed = {(f.src, f.dst): lp for f, lp in sorted(assignment.items())}
    for (s, d), lp in list(directed.items()):
        directed.setdefault((d, s), lp)
    rules: list[FlowRule] = []
    for (s, d), lp_id in sorted(directed.items()):
        a, b = ix.hosts[s], ix.hosts[d]
        edge_sw, port, _, _ = ix.edge[a.dc]
        rules.append(FlowRule(ix.dpid[edge_sw], 0, P_WAN_FLOW,
                              (("eth_type", ETH_IPV4), ("vlan_vid", OFPVID_NONE),
                               ("ipv4_src", a.ip), ("ipv4_dst", b.ip)),
                              (("push_vlan", ETH_VLAN),
                               ("set_vlan_vid", OFPVID_PRESENT | vids[lp_id]),
                               ("output", port)), COOKIE_WAN | lp_id))
    return rules


class WanRouting:
    """The assignment in force and what it was computed from; re-assigns on change."""

    def __init__(self, metrics: ControllerMetrics,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.metrics = metrics
        self.clock = clock
        self.assignment: dict[WanFlow, int] = {}
        self.rates_gbps: dict[WanFlow, float] = {}
        self.flows: list[WanFlow] = []
        self.lightpaths: dict[int, WanLightpath] = {}
        self.policy: str | None = None
        self.last: dict[str, Any] = {}
        self.reassignments = 0

    def update(self, policy: str, seed: int, flows: Iterable[WanFlow],
               lightpaths: Iterable[WanLightpath], host_dc: Mapping[str, str]) -> bool:
        """Re-assign if the policy, the flows or the lightpaths changed (True if so)."""
        flows = sorted(set(flows))
        lps = {lp.id: lp for lp in lightpaths}
        reasons = []
        if policy != self.policy:
            reasons.append("policy")
        old_f, new_f = set(self.flows), set(flows)
        if new_f - old_f:
            reasons.append("arrival")
        if old_f - new_f:
            reasons.append("departure")
        if set(self.lightpaths) - set(lps):
            reasons.append("lightpath_down")
        if set(lps) - set(self.lightpaths):
            reasons.append("lightpath_up")
        if any(self.lightpaths[i] != lp for i, lp in lps.items() if i in self.lightpaths):
            reasons.append("lightpath_changed")
        if not reasons:
            return False
        t0 = self.clock()
        current = {} if policy != self.policy else self.assignment
        new, rates = assign(policy, flows, lps.values(), host_dc,
                            seed=seed, current=current)
        dt = self.clock() - t0
        # Moves count within one policy (as in the fabrics: a policy change starts afresh).
        moved = 0 if policy != self.policy else sum(
            1 for f, lp in new.items() if f in self.assignment and self.assignment[f] != lp)
        reason = "+".join(reasons)
        self.assignment, self.rates_gbps = new, rates
        self.flows, self.lightpaths, self.policy = flows, lps, policy
        self.reassignments += 1
        self.last = {"reason": reason, "policy": policy, "moved": moved,
                     "flows": len(new), "computation_s": dt}
        m = self.metrics
        m.wan_moved.labels(policy=policy).inc(moved)
        m.wan_reassignments.labels(policy=policy, reason=reason).inc()
        log.info("WAN re-assignment (%s, %s): %d flows on %d lightpaths, %d moved", reason,
                 policy, len(new), len(lps), moved)
        return True

    def view(self) -> dict[str, Any]:
        pairs: dict[str, list[int]] = {}
        for lp in sorted(self.lightpaths.values(), key=lambda x: x.id):
            pairs.setdefault("|".join(sorted((lp.src_dc, lp.dst_dc))), []).append(lp.id)
        return {"policy": self.policy,
                "lightpaths": [{"id": lp.id, "vid": lp.vid, "dcs": [lp.src_dc, lp.dst_dc],
                                "capacity_gbps": lp.capacity_gbps}
                               for lp in sorted(self.lightpaths.values(), key=lambda x: x.id)],
                "dc_pairs": pairs,
                "flows": [{"job": f.job, "kind": f.kind, "src": f.src, "dst": f.dst,
                           "lightpath_id": self.assignment.get(f),
                           "rate_gbps": self.rates_gbps.get(f)} for f in self.flows],
                "reassignments": self.reassignments, "last": self.last}
