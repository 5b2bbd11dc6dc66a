"""Pure flow-rule computation: lightpaths + layout -> OpenFlow 1.3 rules per switch.

No os-ken import: rules are plain `FlowRule` values that the app turns into FlowMods.

Pipeline on a DC switch:
  table 0  prio 400  in_port=uplink, vlan=VID          -> pop VLAN, goto 1 (egress)
           prio 310  untagged IPv4 src=a dst=b          -> push VID, out uplink (host pair)
           prio 300  untagged IPv4 dst=b                -> push VID, out uplink (DC pair)
           prio 100  ARP                                -> controller (proxy ARP)
           prio  10  IPv4                               -> goto 1
  table 1  prio 200  IPv4 dst=local host                -> next hop (RoutingPolicy)
           prio 100  IPv4 dst=remote host (non-edge)    -> next hop toward the edge
On a ROADM: table 0 prio 400 in_port=p, vlan=VID -> out q, one rule per hop and
direction (a lightpath is bidirectional; both directions share its slots). Anything
else is dropped (OpenFlow 1.3 table-miss). A lightpath with a backup route forwards
through fast-failover groups instead, and its backup's hops hold rules too
(controllers/protection.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Protocol

import networkx as nx

from controllers.layout import HostSpec, Layout
from controllers.protection import (
    OFPP_IN_PORT,
    PCP_CRANKBACK,
    FailoverGroup,
    failover_group_id,
)

OFPVID_PRESENT = 0x1000
OFPVID_NONE = 0x0000
ETH_IPV4 = 0x0800
ETH_ARP = 0x0806
ETH_VLAN = 0x8100

COOKIE_BASE = 0x4C50 << 48  # "LP": base rules (ARP, intra-DC routing)
COOKIE_LP = 0x4C51 << 48  # lightpath rules: COOKIE_LP | lightpath id
COOKIE_MASK = 0xFFFF << 48

P_VLAN = 400
P_CRANKBACK = 410  # a protected lightpath's frames sent back to its head end (PCP 1)
P_HOST_PAIR = 310
P_DC_PAIR = 300
P_ARP = 100
P_IP_DEFAULT = 10
P_LOCAL = 200
P_REMOTE = 100

Match = tuple[tuple[str, int | str], ...]
Action = tuple[str, int]


@dataclass(frozen=True)
class FlowRule:
    """One flow entry: where, match (os-ken OFPMatch field names), actions, cookie.

    Actions: ("output", port), ("push_vlan", ethertype), ("set_vlan_vid", vid|0x1000),
    ("pop_vlan", 0), ("controller", max_len); ("goto_table", t) is an instruction.
    """

    dpid: int
    table: int
    priority: int
    match: Match
    actions: tuple[Action, ...]
    cookie: int = COOKIE_BASE

    @property
    def key(self) -> tuple[int, int, int, Match]:
        """What identifies the entry in the switch (strict match)."""
        return (self.dpid, self.table, self.priority, self.match)


@dataclass(frozen=True)
class LightpathRoute:
    """What rules need to know of a lightpath: VLAN id, DC ends, route, traffic it carries."""

    id: int
    vid: int
    src_dc: str
    dst_dc: str
    nodes: tuple[str, ...]
    src_host: str | None = None  # both set: carries only this host pair's traffic
    dst_host: str | None = None
    backup: tuple[str, ...] | None = None  # fibre-disjoint backup route (FF protection)


class RoutingPolicy(Protocol):
    """Intra-DC routing: for a destination switch, the next hop from every other switch."""

    name: str

    def next_hops(self, fabric: nx.Graph, dst: str) -> dict[str, str]:
        """Map switch -> neighbour to forward to, for every switch that reaches dst."""
        ...


class ShortestPathRouting:
    """Hop-count shortest paths (ties broken by switch name, so rules are deterministic)."""

    name = "shortest-path"

    def next_hops(self, fabric: nx.Graph, dst: str) -> dict[str, str]:
        out: dict[str, str] = {}
        # BFS from dst over sorted neighbours: the parent of each switch is its next hop.
        seen = {dst}
        frontier = [dst]
        while frontier:
            nxt = []
            for u in frontier:
                for w in sorted(fabric.neighbors(u)):
                    if w not in seen:
                        seen.add(w)
                        out[w] = u
                        nxt.append(w)
            frontier = nxt
        return out


ROUTING_POLICIES: dict[str, type] = {"shortest-path": ShortestPathRouting}


def routing_policy(name: str) -> RoutingPolicy:
    """Instantiate an intra-DC routing policy by name (ValueError lists the known ones)."""
    try:
        return ROUTING_POLICIES[name]()  # type: ignore[no-any-return]
    except KeyError:
        raise ValueError(f"unknown routing policy {name!r} "
                         f"(known: {', '.join(ROUTING_POLICIES)})") from None


@dataclass
class LayoutIndex:
    """Lookups derived once from a Layout."""

    layout: Layout
    dpid: dict[str, int] = field(default_factory=dict)
    roadm: dict[str, str] = field(default_factory=dict)  # node -> switch name
    fibre_port: dict[tuple[str, str], int] = field(default_factory=dict)  # (u, v) node -> port
    fibre_of_port: dict[tuple[int, int], tuple[str, str]] = field(default_factory=dict)
    fibre_control: dict[frozenset[str], str] = field(default_factory=dict)
    edge: dict[str, tuple[str, int, str, int]] = field(default_factory=dict)
    # dc -> (edge switch, its uplink port, roadm switch, roadm port)
    dc_node: dict[str, str] = field(default_factory=dict)
    fabric: dict[str, nx.Graph] = field(default_factory=dict)  # dc -> graph of its switches
    hosts: dict[str, HostSpec] = field(default_factory=dict)
    hosts_by_dc: dict[str, list[HostSpec]] = field(default_factory=dict)
    host_by_ip: dict[str, HostSpec] = field(default_factory=dict)
    # (lightpath route, carries the DC pair) -> its rules. They read the edges, ports,
    # ROADMs and hosts, never the DC fabrics, so a copy with other fabrics
    # (flowroute.without_failed) may share this cache.
    lp_rules: dict[tuple[LightpathRoute, bool], tuple[FlowRule | FailoverGroup, ...]] = field(
        default_factory=dict, repr=False, compare=False)

    @classmethod
    def build(cls, layout: Layout) -> LayoutIndex:
        ix = cls(layout)
        by = {s.name: s for s in layout.switches}
        for s in layout.switches:
            ix.dpid[s.name] = s.dpid
            if s.kind == "roadm":
                assert s.node is not None
                if s.node in ix.roadm:
                    raise ValueError(f"two ROADMs for node {s.node}")
                ix.roadm[s.node] = s.name
            else:
                assert s.dc is not None
                ix.fabric.setdefault(s.dc, nx.Graph()).add_node(s.name)
        for link in layout.links:
            a, b = by[link.a], by[link.b]
            if link.kind == "fibre":
                assert a.node is not None and b.node is not None
                ix.fibre_port[(a.node, b.node)] = link.a_port
                ix.fibre_port[(b.node, a.node)] = link.b_port
                ix.fibre_of_port[(a.dpid, link.a_port)] = (a.node, b.node)
                ix.fibre_of_port[(b.dpid, link.b_port)] = (a.node, b.node)
                if link.control:
                    ix.fibre_control[frozenset((a.node, b.node))] = link.control
            elif link.kind == "uplink":
                dc_sw, dc_port, r_sw, r_port = ((a, link.a_port, b, link.b_port)
                                                if a.kind == "dc"
                                                else (b, link.b_port, a, link.a_port))
                assert dc_sw.dc is not None and r_sw.node is not None
                # Several uplinks (leaf-spine: every spine): the lowest-named switch is
                # the DC's edge for lightpaths; the others carry nothing.
                prev = ix.edge.get(dc_sw.dc)
                if prev is not None and ix.dc_node[dc_sw.dc] != r_sw.node:
                    raise ValueError(f"DC {dc_sw.dc} is uplinked to two optical nodes")
                if prev is None or dc_sw.name < prev[0]:
                    ix.edge[dc_sw.dc] = (dc_sw.name, dc_port, r_sw.name, r_port)
                ix.dc_node[dc_sw.dc] = r_sw.node
            else:
                assert a.dc is not None
                if a.dc != b.dc:
                    raise ValueError(f"fabric link {a.name}-{b.name} joins two DCs")
                ix.fabric[a.dc].add_edge(a.name, b.name,
                                         ports={a.name: link.a_port, b.name: link.b_port})
        for h in layout.hosts:
            ix.hosts[h.name] = h
            ix.hosts_by_dc.setdefault(h.dc, []).append(h)
            ix.host_by_ip[h.ip] = h
        return ix


def base_rules(ix: LayoutIndex, routing: RoutingPolicy) -> list[FlowRule]:
    """Rules that do not depend on lightpaths: ARP to the controller, intra-DC routing."""
    rules: list[FlowRule] = []
    for dc, fabric in ix.fabric.items():
        edge = ix.edge.get(dc)
        local = ix.hosts_by_dc.get(dc, [])
        remote = [h for h in ix.layout.hosts if h.dc != dc]
        toward_edge = routing.next_hops(fabric, edge[0]) if edge else {}
        for sw in sorted(fabric.nodes):
            dpid = ix.dpid[sw]
            rules.append(FlowRule(dpid, 0, P_ARP, (("eth_type", ETH_ARP),),
                                  (("controller", 0xFFFF),)))
            rules.append(FlowRule(dpid, 0, P_IP_DEFAULT, (("eth_type", ETH_IPV4),),
                                  (("goto_table", 1),)))
            if sw in toward_edge:
                port = fabric[sw][toward_edge[sw]]["ports"][sw]
                for h in remote:
                    rules.append(FlowRule(dpid, 1, P_REMOTE,
                                          (("eth_type", ETH_IPV4), ("ipv4_dst", h.ip)),
                                          (("output", port),)))
        by_switch: dict[str, list[HostSpec]] = {}
        for h in local:
            by_switch.setdefault(h.switch, []).append(h)
        for host_sw, hs in by_switch.items():
            hops = routing.next_hops(fabric, host_sw)
            for sw in sorted(fabric.nodes):
                for h in hs:
                    if sw == host_sw:
                        port = h.port
                    elif sw in hops:
                        port = fabric[sw][hops[sw]]["ports"][sw]
                    else:
                        continue
                    rules.append(FlowRule(ix.dpid[sw], 1, P_LOCAL,
                                          (("eth_type", ETH_IPV4), ("ipv4_dst", h.ip)),
                                          (("output", port),)))
    return rules


NODE_END = "node:"  # an end that is an optical node without a DC: "node:<id>"


def end_node(ix: LayoutIndex, end: str) -> str | None:
    """Optical node of a lightpath end (a DC name or "node:<id>"), None if unknown."""
    if end.startswith(NODE_END):
        node = end[len(NODE_END):]
        return node if node in ix.roadm else None
    return ix.dc_node.get(end) if end in ix.edge else None


def check_route(ix: LayoutIndex, lp: LightpathRoute) -> None:
    """ValueError if the layout cannot carry the lightpath (unknown DC, node, port, host)."""
    for dc in (lp.src_dc, lp.dst_dc):
        if end_node(ix, dc) is None:
            raise ValueError(f"DC {dc!r} has no uplink in the layout")
    if end_node(ix, lp.src_dc) != lp.nodes[0] or end_node(ix, lp.dst_dc) != lp.nodes[-1]:
        raise ValueError(f"route {'-'.join(lp.nodes)} does not join {lp.src_dc} and {lp.dst_dc}")
    for u, v in pairwise(lp.nodes):
        if (u, v) not in ix.fibre_port:
            raise ValueError(f"fibre {u}-{v} is not in the layout")
    for host, dc in ((lp.src_host, lp.src_dc), (lp.dst_host, lp.dst_dc)):
        if host is not None and (host not in ix.hosts or ix.hosts[host].dc != dc):
            raise ValueError(f"host {host!r} is not in DC {dc}")


def lightpath_rules(ix: LayoutIndex, lp: LightpathRoute,
                    carries_dc_pair: bool) -> list[FlowRule | FailoverGroup]:
    """Rules of one lightpath: push at both DC edges, one per ROADM hop and direction, pop.

    carries_dc_pair: whether this lightpath carries the DC pair's default traffic (one
    lightpath per DC pair does; others carry only their host pair).
    """
    check_route(ix, lp)
    cookie = COOKIE_LP | lp.id
    tag = OFPVID_PRESENT | lp.vid
    rules: list[FlowRule | FailoverGroup] = []
    ends = ((lp.src_dc, lp.dst_dc, lp.src_host, lp.dst_host, lp.nodes),
            (lp.dst_dc, lp.src_dc, lp.dst_host, lp.src_host, tuple(reversed(lp.nodes))))
    for direction, (a_dc, b_dc, a_host, b_host, nodes) in enumerate(ends):
        if a_dc.startswith(NODE_END) or b_dc.startswith(NODE_END):
            # An end without a DC (a request between optical nodes): only the ROADM
            # cross-connects of the hops, from the end nodes' fibres on.
            rules.extend(_roadm_rules(ix, lp, tag, cookie, nodes,
                                      None if a_dc.startswith(NODE_END) else ix.edge[a_dc][3],
                                      None if b_dc.startswith(NODE_END) else ix.edge[b_dc][3]))
            if not b_dc.startswith(NODE_END):
                b_edge, b_port, _, _ = ix.edge[b_dc]
                rules.append(FlowRule(ix.dpid[b_edge], 0, P_VLAN,
                                      (("in_port", b_port), ("vlan_vid", tag)),
                                      (("pop_vlan", 0), ("goto_table", 1)), cookie))
            continue
        edge_sw, edge_port, _, a_roadm_port = ix.edge[a_dc]
        dpid = ix.dpid[edge_sw]
        push: tuple[Action, ...] = (("push_vlan", ETH_VLAN), ("set_vlan_vid", tag),
                                    ("output", edge_port))
        if a_host is not None and b_host is not None:
            rules.append(FlowRule(dpid, 0, P_HOST_PAIR,
                                  (("eth_type", ETH_IPV4), ("vlan_vid", OFPVID_NONE),
                                   ("ipv4_src", ix.hosts[a_host].ip),
                                   ("ipv4_dst", ix.hosts[b_host].ip)), push, cookie))
        elif carries_dc_pair:
            for h in ix.hosts_by_dc.get(b_dc, []):
                rules.append(FlowRule(dpid, 0, P_DC_PAIR,
                                      (("eth_type", ETH_IPV4), ("vlan_vid", OFPVID_NONE),
                                       ("ipv4_dst", h.ip)), push, cookie))
        # The far edge pops what arrives from its uplink with this tag.
        b_edge, b_port, _, _ = ix.edge[b_dc]
        rules.append(FlowRule(ix.dpid[b_edge], 0, P_VLAN,
                              (("in_port", b_port), ("vlan_vid", tag)),
                              (("pop_vlan", 0), ("goto_table", 1)), cookie))
        # ROADMs: in from the previous element, out to the next.
        b_roadm_port = ix.edge[b_dc][3]
        if lp.backup is not None and all((u, v) in ix.fibre_port
                                         for u, v in pairwise(lp.backup)):
            backup = lp.backup if direction == 0 else tuple(reversed(lp.backup))
            rules.extend(_protected_roadm_rules(ix, lp, tag, cookie, nodes, backup,
                                                a_roadm_port, b_roadm_port, direction))
            continue
        for i, node in enumerate(nodes):
            in_port = a_roadm_port if i == 0 else ix.fibre_port[(node, nodes[i - 1])]
            out_port = b_roadm_port if i == len(nodes) - 1 else ix.fibre_port[(node, nodes[i + 1])]
            rules.append(FlowRule(ix.dpid[ix.roadm[node]], 0, P_VLAN,
                                  (("in_port", in_port), ("vlan_vid", tag)),
                                  (("output", out_port),), cookie))
    return rules


def _protected_roadm_rules(ix: LayoutIndex, lp: LightpathRoute, tag: int, cookie: int,
                           nodes: tuple[str, ...], backup: tuple[str, ...], a_port: int,
                           b_port: int, direction: int) -> list[FlowRule | FailoverGroup]:
    """One direction's ROADM entries of a protected lightpath: failover groups on the
    working route (all but its last ROADM), crankback rules, the backup's hop rules."""
    port = ix.fibre_port
    k = len(nodes) - 1
    ins = [a_port] + [port[(nodes[i], nodes[i - 1])] for i in range(1, k + 1)]
    outs = [port[(nodes[i], nodes[i + 1])] for i in range(k)] + [b_port]
    backup_first = port[(backup[0], backup[1])]
    gid = failover_group_id(lp.id, direction)
    out: list[FlowRule | FailoverGroup] = []
    for i, node in enumerate(nodes):
        dpid = ix.dpid[ix.roadm[node]]
        match = (("in_port", ins[i]), ("vlan_vid", tag))
        if i == k:  # the tail ROADM: out to its DC
            out.append(FlowRule(dpid, 0, P_VLAN, match, (("output", outs[i]),), cookie))
            continue
        second: tuple[int, tuple[Action, ...]] = (
            (backup_first, (("output", backup_first),)) if i == 0
            else (ins[i], (("set_vlan_pcp", PCP_CRANKBACK), ("output", OFPP_IN_PORT))))
        out.append(FailoverGroup(dpid, gid, ((outs[i], (("output", outs[i]),)), second)))
        out.append(FlowRule(dpid, 0, P_VLAN, match, (("group", gid),), cookie))
        if i < k - 1:  # frames sent back by a ROADM further on: on toward the head end
            out.append(FlowRule(dpid, 0, P_CRANKBACK,
                                (("in_port", outs[i]), ("vlan_vid", tag),
                                 ("vlan_pcp", PCP_CRANKBACK)),
                                (("output", backup_first if i == 0 else ins[i]),), cookie))
    m = len(backup) - 1
    for j in range(1, m + 1):
        node = backup[j]
        out.append(FlowRule(ix.dpid[ix.roadm[node]], 0, P_VLAN,
                            (("in_port", port[(node, backup[j - 1])]), ("vlan_vid", tag)),
                            (("output", port[(node, backup[j + 1])] if j < m else b_port),),
                            cookie))
    return out


def _roadm_rules(ix: LayoutIndex, lp: LightpathRoute, tag: int, cookie: int,
                 nodes: tuple[str, ...], a_port: int | None,
                 b_port: int | None) -> list[FlowRule]:
    """Per-ROADM (in_port, VLAN) -> out rules along nodes; ends without a port skipped."""
    out = []
    for i, node in enumerate(nodes):
        in_port = a_port if i == 0 else ix.fibre_port[(node, nodes[i - 1])]
        out_port = b_port if i == len(nodes) - 1 else ix.fibre_port[(node, nodes[i + 1])]
        if in_port is None or out_port is None:
            continue
        out.append(FlowRule(ix.dpid[ix.roadm[node]], 0, P_VLAN,
                            (("in_port", in_port), ("vlan_vid", tag)),
                            (("output", out_port),), cookie))
    return out


def desired_rules(ix: LayoutIndex, routing: RoutingPolicy,
                  lightpaths: Iterable[LightpathRoute]) -> dict[int, dict[tuple, FlowRule]]:
    """Every rule the network should hold, by dpid and rule key."""
    out: dict[int, dict[tuple, FlowRule]] = {s.dpid: {} for s in ix.layout.switches}
    for r in base_rules(ix, routing):
        out[r.dpid][r.key] = r
    owners: dict[frozenset[str], int] = {}
    lps = sorted(lightpaths, key=lambda lp: lp.id)
    for lp in lps:
        if lp.src_host is None and not (lp.src_dc.startswith(NODE_END)
                                        or lp.dst_dc.startswith(NODE_END)):
            owners.setdefault(frozenset((lp.src_dc, lp.dst_dc)), lp.id)
    cache = ix.lp_rules
    for lp in lps:
        own = owners.get(frozenset((lp.src_dc, lp.dst_dc))) == lp.id
        rules = cache.get((lp, own))
        if rules is None:
            if len(cache) > 4 * len(lps) + 1024:  # routes gone (deleted, restored)
                cache.clear()
            rules = cache[(lp, own)] = tuple(lightpath_rules(ix, lp, own))
        for r in rules:
            out[r.dpid][r.key] = r
    return out


@dataclass(frozen=True)
class RuleDiff:
    """What to change on one switch: entries to add or modify, entries to delete."""

    dpid: int
    add: tuple[FlowRule, ...]
    delete: tuple[FlowRule, ...]


def diff_rules(installed: dict[tuple, FlowRule], desired: dict[tuple, FlowRule],
               dpid: int) -> RuleDiff:
    """Changes that turn `installed` into `desired` on one switch."""
    # identity first: unchanged rules are mostly the very objects installed (lp_rules)
    add = tuple(r for k, r in desired.items()
                if (old := installed.get(k)) is not r and old != r)
    delete = tuple(r for k, r in installed.items() if k not in desired)
    return RuleDiff(dpid, add, delete)
