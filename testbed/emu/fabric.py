"""DC fabric links of the emulation: HTB shaping commands and the plan's fabric as a graph.

Pure (no Mininet): `htb_script` is a shell line run on a link end; `fabric_graph` turns a
plan's leaf-spine DC into the directed capacitated graph that testbed.routing routes on
(nodes: host names and switch nodes; capacity_gbps per direction, real units).
"""

from __future__ import annotations

import networkx as nx

from testbed.emu.plan import EmuPlan
from testbed.names import check_ifname

QUEUE_S = 0.02          # byte limit of each shaped link's FIFO: 20 ms at its rate ...
MIN_QUEUE_BYTES = 65536  # ... but at least one 64 kB GSO frame (TSO stays on)
UNLIMITED_GBPS = 1e6    # a link without a rate in the routing graph


def htb_burst_bytes(rate_mbps: float) -> int:
    """HTB burst: >= 15 kB, and 1 ms at the rate (keeps 1 Gb/s accurate on veths)."""
    return max(15000, int(rate_mbps * 1e6 / 8 * 0.001))


def htb_script(intf: str, rate_mbps: float) -> str:
    """Shell commands that make `intf` send at rate_mbps (HTB + bounded byte FIFO)."""
    check_ifname(intf)
    if not 0 < rate_mbps <= 100_000:
        raise ValueError(f"rate {rate_mbps} Mbit/s out of range")
    burst = htb_burst_bytes(rate_mbps)
    limit = max(MIN_QUEUE_BYTES, int(rate_mbps * 1e6 / 8 * QUEUE_S))
    rate = f"{rate_mbps:.6f}mbit"
    return (f"tc qdisc replace dev {intf} root handle 1: htb default 1 r2q 100 && "
            f"tc class add dev {intf} parent 1: classid 1:1 htb rate {rate} ceil {rate} "
            f"burst {burst} cburst {burst} quantum 1514 && "
            f"tc qdisc add dev {intf} parent 1:1 handle 10: bfifo limit {limit} "
            f"|| echo tc-error")


def fabric_graph(plan: EmuPlan, dc: str) -> nx.DiGraph:
    """The DC's leaf-spine (switch nodes) and hosts (user-facing names) as a DiGraph.

    Each link gives two edges with capacity_gbps = the real rate of its emulated rate
    (plan.scale); links without a rate get UNLIMITED_GBPS. Uplinks to ROADMs are
    left out (inter-DC traffic goes over lightpaths).
    """
    g = nx.DiGraph()
    kinds = {s.node: s.kind for s in plan.switches if s.label == dc and s.kind != "roadm"}
    hosts = {h.node: h.name for h in plan.hosts if h.dc == dc}
    for lk in plan.links:
        a = hosts.get(lk.a, lk.a if lk.a in kinds else None)
        b = hosts.get(lk.b, lk.b if lk.b in kinds else None)
        if a is None or b is None:
            continue
        gbps = (UNLIMITED_GBPS if lk.rate_mbps is None
                else plan.scale.real_gbps_of_mbps(lk.rate_mbps))
        g.add_edge(a, b, capacity_gbps=gbps)
        g.add_edge(b, a, capacity_gbps=gbps)
    for node, kind in kinds.items():
        if node in g:
            g.nodes[node]["kind"] = kind
    for name in hosts.values():
        if name in g:
            g.nodes[name]["kind"] = "host"
    return g
