"""Ring flows routed by a routing policy: flow keys, ring helpers, route_paths (sim and controller).

A ring all-reduce job of n members gives one flow per member (member i -> member i+1),
keyed (job, src host, dst host); each carries 2(n-1)/n of the job's buffer.
`route_paths` routes such flows with a policy of `testbed.routing.policies` on a graph
(a DC fabric, or the WAN lightpath graph of controllers.wanroute) and gives their
max-min rates. The simulator (testbed.sim.allreduce) and the SDN controller
(controllers.flowjobs, controllers.wanroute) both call it, so they route alike.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import networkx as nx

FlowKey = tuple[int, str, str]  # (job index, src host, dst host)


def ring_keys(members: Sequence[str], job: int) -> list[FlowKey]:
    """The ring's flows, member i -> member i+1 (the last back to the first)."""
    n = len(members)
    return [(job, members[i], members[(i + 1) % n]) for i in range(n)]


def ring_flow_bytes(members: Sequence[str], buffer_bytes: int) -> float:
    """Bytes each ring flow carries per all-reduce: 2 (n-1)/n of the buffer."""
    n = len(members)
    return 2.0 * (n - 1) / n * buffer_bytes


def flow_id(key: FlowKey) -> str:
    """The flow's name as the routing policies see it: job/src->dst."""
    return f"{key[0]}/{key[1]}->{key[2]}"


def route_paths(policy: str, graph: nx.DiGraph, keys: Sequence[FlowKey],
                flow_bytes: Mapping[int, float], *, seed: int,
                current: Mapping[FlowKey, Sequence[str]] | None = None
                ) -> tuple[dict[FlowKey, tuple[str, ...]], dict[FlowKey, float], float]:
    """Route ring flows (job, src, dst) with a testbed.routing policy: (paths, max-min
    rates in Gb/s, the policy's wall time in s). `current`: the paths in force."""
    from testbed.routing.flows import Flow
    from testbed.routing.maxmin import max_min_rates
    from testbed.routing.policies import route

    flows = [Flow(flow_id(k), str(k[0]), k[1], k[2], float(flow_bytes[k[0]])) for k in keys]
    cur = {flow_id(k): list(p) for k, p in (current or {}).items() if k in set(keys)}
    got = route(policy, graph, flows, cur or None, seed=seed)
    by_id = {flow_id(k): k for k in keys}
    paths = {by_id[i]: tuple(p) for i, p in got.paths.items()}
    rates = max_min_rates(graph, {flow_id(k): paths[k] for k in keys})
    return paths, {by_id[i]: r for i, r in rates.items()}, got.wall_s
