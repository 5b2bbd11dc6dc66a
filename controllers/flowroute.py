"""Pure per-flow routing rules for DC fabrics: one path per flow, or ECMP select groups.

No os-ken import. The controller routes the flows of registered all-reduce jobs (host
pairs) with a policy of `testbed.routing`; this module turns the layout into the graph
the policy routes on and the chosen paths into OpenFlow 1.3 rules:

  table 1  prio 250  IPv4 src=a dst=b   -> out port toward the next node (per flow, every
                                           switch on the flow's path)
           prio 220  IPv4 dst=b         -> group g (ECMP: on a leaf, b behind leaf g-1)
  group g (select) on each leaf: one bucket per spine with live links to this leaf and
  to leaf g-1; OVS picks a bucket by a hash of the packet's 5-tuple, so one TCP
  connection stays on one spine.

A leaf is a DC switch with hosts; a spine is one without. Failed fabric links are left
out of the graph, the groups and the intra-DC base rules.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from itertools import pairwise

import networkx as nx

from controllers.rules import ETH_IPV4, FlowRule, LayoutIndex

P_FLOW = 250
P_ECMP = 220
COOKIE_FLOW = 0x4C52 << 48  # "LR": per-flow routing rules
ECMP_GROUP = 1
UNLIMITED_GBPS = 1e6  # a link without a rate in the routing graph


@dataclass(frozen=True)
class GroupRule:
    """An OpenFlow 1.3 select group: equal-weight buckets, each output to one port."""

    dpid: int
    group_id: int
    ports: tuple[int, ...]

    @property
    def key(self) -> tuple[int, str, int]:
        return (self.dpid, "group", self.group_id)


def link_key(a: str, b: str) -> frozenset[str]:
    return frozenset((a, b))


def without_failed(ix: LayoutIndex, failed: Iterable[frozenset[str]]) -> LayoutIndex:
    """A copy of the index whose DC fabrics lack the failed switch-switch links."""
    failed = set(failed)
    if not failed:
        return ix
    fabric = {}
    for dc, g in ix.fabric.items():
        h = g.copy()
        h.remove_edges_from([(a, b) for a, b in g.edges if link_key(a, b) in failed])
        fabric[dc] = h
    return replace(ix, fabric=fabric)


def leaves_and_spines(ix: LayoutIndex, dc: str) -> tuple[list[str], list[str]]:
    """A DC's switches with hosts (leaves) and without (spines), sorted by name."""
    with_hosts = {h.switch for h in ix.hosts_by_dc.get(dc, [])}
    sw = sorted(ix.fabric.get(dc, nx.Graph()).nodes)
    return [s for s in sw if s in with_hosts], [s for s in sw if s not in with_hosts]


def routing_graph(ix: LayoutIndex, failed: Iterable[frozenset[str]] = ()) -> nx.DiGraph:
    """All DC fabrics as one DiGraph: switch names and host names, capacity_gbps per
    direction in real units (emulated rate / mbps_per_gbps; unlimited links 1e6); node
    attribute `role` host/leaf/spine as in testbed.routing.topology."""
    failed = set(failed)
    per_gbps = ix.layout.mbps_per_gbps
    g = nx.DiGraph()
    kinds = {s.name: s.kind for s in ix.layout.switches}
    for lk in ix.layout.links:
        if lk.kind != "fabric" or link_key(lk.a, lk.b) in failed:
            continue
        cap = UNLIMITED_GBPS if lk.rate_mbps is None else lk.rate_mbps / per_gbps
        g.add_edge(lk.a, lk.b, capacity_gbps=cap)
        g.add_edge(lk.b, lk.a, capacity_gbps=cap)
    for h in ix.layout.hosts:
        cap = UNLIMITED_GBPS if h.rate_mbps is None else h.rate_mbps / per_gbps
        g.add_edge(h.name, h.switch, capacity_gbps=cap)
        g.add_edge(h.switch, h.name, capacity_gbps=cap)
        g.nodes[h.name].update(kind="host", role="host")
    for dc in ix.fabric:
        leaves, spines = leaves_and_spines(ix, dc)
        for s in leaves:
            g.add_node(s, kind="leaf", role="leaf", dc=dc)
        for s in spines:
            g.add_node(s, kind="spine", role="spine", dc=dc)
    assert all(kinds.get(n) in (None, "dc") for n in g)
    return g


def _port_toward(ix: LayoutIndex, sw: str, nxt: str) -> int:
    """OpenFlow port of switch `sw` that leads to node `nxt` (a switch or a host)."""
    h = ix.hosts.get(nxt)
    if h is not None:
        if h.switch != sw:
            raise ValueError(f"host {nxt} does not hang off {sw}")
        return h.port
    for dc_graph in ix.fabric.values():
        if dc_graph.has_edge(sw, nxt):
            return int(dc_graph[sw][nxt]["ports"][sw])
    raise ValueError(f"no link {sw}-{nxt} in the layout")


def path_rules(ix: LayoutIndex, flows: Iterable[tuple[str, str, Sequence[str]]]) -> list[FlowRule]:
    """Per-flow rules for (src host, dst host, path host..switches..host) triples."""
    rules: list[FlowRule] = []
    for src, dst, path in flows:
        if (len(path) < 3 or path[0] != src or path[-1] != dst
                or path[1] != ix.hosts[src].switch):
            raise ValueError(f"path {path} does not join {src} and {dst}")
        match = (("eth_type", ETH_IPV4), ("ipv4_src", ix.hosts[src].ip),
                 ("ipv4_dst", ix.hosts[dst].ip))
        for sw, nxt in pairwise(path[1:]):
            rules.append(FlowRule(ix.dpid[sw], 1, P_FLOW, match,
                                  (("output", _port_toward(ix, sw, nxt)),), COOKIE_FLOW))
    return rules


def ecmp_rules(ix: LayoutIndex) -> tuple[list[FlowRule], list[GroupRule]]:
    """ECMP baseline: on every leaf, per other leaf, a select group over the spines that
    still reach both (group id = that leaf's index + 1), and each host behind that leaf
    sent to it. `ix` already lacks failed links, so no bucket leads into a dead link."""
    rules: list[FlowRule] = []
    groups: list[GroupRule] = []
    for dc, fabric in ix.fabric.items():
        leaves, spines = leaves_and_spines(ix, dc)
        for leaf in leaves:
            dpid = ix.dpid[leaf]
            for gid, other in enumerate(leaves, start=ECMP_GROUP):
                if other == leaf:
                    continue
                ups = sorted(int(fabric[leaf][s]["ports"][leaf]) for s in spines
                             if fabric.has_edge(leaf, s) and fabric.has_edge(s, other))
                if not ups:
                    continue  # no two-hop path left: the base rules do what they can
                groups.append(GroupRule(dpid, gid, tuple(ups)))
                for h in ix.hosts_by_dc.get(dc, []):
                    if h.switch == other:
                        rules.append(FlowRule(dpid, 1, P_ECMP, (("eth_type", ETH_IPV4),
                                                                ("ipv4_dst", h.ip)),
                                              (("group", gid),), COOKIE_FLOW))
    return rules, groups


def counting_rules(ix: LayoutIndex, pairs: Iterable[tuple[str, str]]) -> list[FlowRule]:
    """Under ECMP: per host-pair rules on the spines with the same output as the
    destination rule, so the spines' flow counters show which spine each flow took."""
    rules: list[FlowRule] = []
    for src, dst in pairs:
        a, b = ix.hosts[src], ix.hosts[dst]
        if a.dc != b.dc or a.switch == b.switch:
            continue
        _, spines = leaves_and_spines(ix, a.dc)
        fabric = ix.fabric[a.dc]
        for sp in spines:
            if fabric.has_edge(sp, b.switch):
                rules.append(FlowRule(ix.dpid[sp], 1, P_FLOW,
                                      (("eth_type", ETH_IPV4), ("ipv4_src", a.ip),
                                       ("ipv4_dst", b.ip)),
                                      (("output", _port_toward(ix, sp, b.switch)),),
                                      COOKIE_FLOW))
    return rules


def fabric_link_of_port(ix: LayoutIndex) -> dict[tuple[int, int], tuple[str, str]]:
    """(dpid, port) -> the fabric link (switch names, sorted) behind that port."""
    out: dict[tuple[int, int], tuple[str, str]] = {}
    for lk in ix.layout.links:
        if lk.kind == "fabric":
            pair = tuple(sorted((lk.a, lk.b)))
            out[(ix.dpid[lk.a], lk.a_port)] = pair  # type: ignore[assignment]
            out[(ix.dpid[lk.b], lk.b_port)] = pair  # type: ignore[assignment]
    return out
