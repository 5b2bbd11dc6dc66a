"""Pure fast-failover protection: fibre-disjoint backup routes and OpenFlow 1.3 FF groups.

No os-ken import. Each protected lightpath has a backup route, fibre-disjoint from its
working route, between the same two ROADMs. Per direction, every ROADM of the working
route but the last forwards the lightpath's VLAN through a fast-failover group:
  bucket 1 (watch the working out port): out on the working route;
  bucket 2, at the head end (watch the backup's first port): out on the backup route;
  bucket 2, further on (watch the in port): mark the frame (VLAN PCP 1) and send it back
  where it came from (crankback), so that it returns to the head end and takes the backup.
The switch picks the bucket itself when the port goes down, before the controller hears
of it. Backup hops are plain (in_port, VLAN) -> out rules, exactly those the lightpath
would get on that route, so restoration onto the backup changes only the head-end groups.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from itertools import pairwise

import networkx as nx

FF_GROUP_BASE = 0x100000  # failover group ids: base + 2 x lightpath id + direction
PCP_CRANKBACK = 1  # VLAN PCP of frames sent back toward the head end
OFPP_IN_PORT = 0xFFFFFFF8  # OpenFlow 1.3: output to the port the frame came in on

Action = tuple[str, int]


@dataclass(frozen=True)
class FailoverGroup:
    """An OpenFlow 1.3 fast-failover group: buckets of (watch port, actions), in order;
    the switch uses the first bucket whose watched port is live."""

    dpid: int
    group_id: int
    buckets: tuple[tuple[int, tuple[Action, ...]], ...]

    @property
    def key(self) -> tuple[int, str, int]:
        return (self.dpid, "group", self.group_id)


def failover_group_id(lp_id: int, direction: int) -> int:
    """Group id of a lightpath's failover groups in one direction (0: src -> dst)."""
    return FF_GROUP_BASE + 2 * lp_id + direction


def backup_route(graph: nx.Graph, nodes: tuple[str, ...],
                 usable: Callable[[str, str], bool]) -> tuple[str, ...] | None:
    """Shortest route by length between the route's ends sharing no fibre with it, over
    usable fibres only (e.g. in the layout and not cut); None if there is none."""
    if len(nodes) < 2:
        return None
    used = {frozenset(e) for e in pairwise(nodes)}

    def length(u: str, v: str, data: dict[str, float]) -> float | None:
        """The fibre's length, None (hidden) if on the route or not usable: the same
        search as over a subgraph view without those fibres (networkx skips a hidden
        edge before it counts or pushes anything), without the view's per-edge cost."""
        if frozenset((u, v)) in used or not usable(u, v):
            return None
        return data.get("length_km", 1)

    try:
        got = nx.dijkstra_path(graph, nodes[0], nodes[-1], weight=length)
    except (nx.NetworkXNoPath, nx.NodeNotFound):
        return None
    return tuple(got)


def fibres_of(nodes: Iterable[str]) -> set[frozenset[str]]:
    """The fibres (unordered node pairs) a route crosses."""
    return {frozenset(e) for e in pairwise(nodes)}
