"""DC fabric links of the emulation: HTB shaping commands and the plan's fabric as a graph.

Pure (no Mininet): `htb_script` is a shell line run on a link end; `fabric_graph` turns a
plan's leaf-spine DC into the directed capacitated graph that testbed.routing routes on
(nodes: host names and switch nodes; capacity_gbps per direction, real units).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence
from typing import Any

import networkx as nx

from testbed.emu.plan import EmuPlan
from testbed.names import check_ifname

QUEUE_S = 0.05            # byte limit of a switch port's FIFO: 50 ms at its rate ...
MIN_QUEUE_BYTES = 65536   # ... but at least one 64 kB GSO frame (TSO stays on)
SWITCH_BURST_BYTES = 70_000  # a switch port's bucket: one 64 kB GSO frame as HTB charges it
NIC_QUEUE_PACKETS = 1000  # a host NIC's queue: Linux's default txqueuelen
GSO_FRAME_S = 0.0025      # a host's GSO frames: at most 2.5 ms of its NIC's rate ...
MIN_GSO_BYTES = 9000      # ... but several segments (one-MSS frames cost the switch 44x)
MAX_GSO_BYTES = 65536     # the kernel's own limit
UNLIMITED_GBPS = 1e6      # a link without a rate in the routing graph
# The user-space switch's one send socket holds every frame its shaped ports' qdiscs hold
# (testbed.emu.sockbuf): its buffer must outgrow all their FIFOs, counted as the kernel
# charges frames (truesize: a 1514-byte frame takes a 4 kB page, ~3.3x), with room to spare.
SOCKET_TRUESIZE_FACTOR = 4
MIN_SWITCH_SNDBUF_BYTES = 4 << 20
SMALL_PACKET_BYTES = 128  # (a power of two: one u32 mask) pure ACKs with SACK blocks fit


def htb_burst_bytes(rate_mbps: float) -> int:
    """HTB burst: >= 15 kB, and 1 ms at the rate (keeps 1 Gb/s accurate on veths)."""
    return max(15000, int(rate_mbps * 1e6 / 8 * 0.001))


def switch_fifo_bytes(rate_mbps: float) -> int:
    """Byte limit of one FIFO of a switch port: QUEUE_S at its rate, >= one GSO frame."""
    return max(MIN_QUEUE_BYTES, int(rate_mbps * 1e6 / 8 * QUEUE_S))


def switch_sndbuf_bytes(rate_mbps: float, n_sources: int) -> int:
    """What one shaped switch port needs of the switch's send socket (testbed.emu.sockbuf):
    all of the port's FIFOs (one per source host, one for the rest and one for small
    packets, or one) x SOCKET_TRUESIZE_FACTOR."""
    fifos = n_sources + 2 if n_sources else 1
    return SOCKET_TRUESIZE_FACTOR * fifos * switch_fifo_bytes(rate_mbps)


def switch_socket_sndbuf_bytes(ports: Iterable[tuple[float, int]]) -> int:
    """The switch's one send socket for all its shaped ports ((rate_mbps, n_sources)
    each): their needs summed, at least MIN_SWITCH_SNDBUF_BYTES; 0 without a port."""
    total = sum(switch_sndbuf_bytes(rate, n) for rate, n in ports)
    return max(MIN_SWITCH_SNDBUF_BYTES, total) if total else 0


def nic_gso_bytes(rate_mbps: float) -> int:
    """A shaped host NIC's gso_max_size: GSO_FRAME_S of its rate, within the bounds."""
    return min(MAX_GSO_BYTES, max(MIN_GSO_BYTES, int(rate_mbps * 1e6 / 8 * GSO_FRAME_S)))


def port_classes(n_sources: int) -> dict[str, Any]:
    """HTB minor class ids of a shared switch port (`htb_script` with n_sources source
    hosts): "rest" (the default: ARP, tagged frames), "sources" (one per source host,
    in order) and "small" (small IPv4 packets, served first)."""
    return {"rest": 2, "sources": [3 + k for k in range(n_sources)],
            "small": 3 + n_sources}


def htb_script(intf: str, rate_mbps: float, nic: bool = False,
               sources: Sequence[str] = ()) -> str:
    """Shell commands that make `intf` send at rate_mbps (HTB + bounded FIFO).

    Set so that real all-reduce rounds match the fluid max-min model (docs/routing-
    testbed.md, "Why the fabric is shaped this way"; each point was measured there):
    - a host's NIC (`nic`) sets its flows' rate with the exact bucket, queues up to
      NIC_QUEUE_PACKETS so that TCP's small-queue limit, not drops, backs it off, and
      sends GSO frames of at most GSO_FRAME_S of its rate (`nic_gso_bytes`), so that a
      frame is not held back for long at each hop nor ACKs behind two big frames;
    - a switch port's bucket holds one GSO frame (a real switch forwards each packet at
      once; a 15 kB bucket delayed every frame at every same-rate hop by the jitter
      the user-space switch adds), and its FIFO holds QUEUE_S at its rate (where two
      flows share it, fewer tail drops, each of which may cost a retransmission
      time-out at the end of an all-reduce step);
    - with `sources` (the IPv4 addresses of the DC's hosts), a switch port shares its
      rate max-min fairly among them, as the routing model assumes: one HTB class and
      FIFO per source host (a guaranteed 1/n, borrowing up to the whole rate), and
      one for the rest. On one FIFO, TCP split a link 30/70 for seconds; two rings that
      shared two links each waited on the flow that got 30 % and left the other idle,
      which made whole rounds 20-50 % slower than the model;
    - and small IPv4 packets (under SMALL_PACKET_BYTES: pure ACKs, SYNs) go first, in a
      class of their own at a higher priority. In their source host's class they waited
      behind its data, up to QUEUE_S: a delay the divided rate makes thousands of times
      longer than a real switch's buffer would, and ECMP hashes a connection's ACKs
      apart from its data. One ring then took about 65 % of a link it shared with the
      other. With them first, ECMP's rounds' p90 error against the model went from 17 %
      to 3.6 % and the worst from 22 % to 15.5 % (docs/routing-testbed.md).
    """
    check_ifname(intf)
    if not 0 < rate_mbps <= 100_000:
        raise ValueError(f"rate {rate_mbps} Mbit/s out of range")
    addrs = [str(ipaddress.IPv4Address(a)) for a in sources]  # ValueError on a bad one
    burst = htb_burst_bytes(rate_mbps)
    gso = ""
    if nic:
        fifo = f"pfifo limit {NIC_QUEUE_PACKETS}"
        gso = f"ip link set dev {intf} gso_max_size {nic_gso_bytes(rate_mbps)} && "
    else:
        burst = max(burst, SWITCH_BURST_BYTES)
        fifo = f"bfifo limit {switch_fifo_bytes(rate_mbps)}"
    rate = f"{rate_mbps:.6f}mbit"
    cmds = [f"tc qdisc replace dev {intf} root handle 1: htb default 1 r2q 100",
            f"tc class add dev {intf} parent 1: classid 1:1 htb rate {rate} ceil {rate} "
            f"burst {burst} cburst {burst} quantum 1514"]
    if not addrs or nic:
        cmds.append(f"tc qdisc add dev {intf} parent 1:1 handle 10: {fifo}")
    else:
        share = f"{rate_mbps / (len(addrs) + 2):.6f}mbit"
        cmds[0] = f"tc qdisc replace dev {intf} root handle 1: htb default 2 r2q 100"
        classes = port_classes(len(addrs))
        for cls, addr in [(classes["rest"], None),
                          *zip(classes["sources"], addrs, strict=True),
                          (classes["small"], None)]:
            prio = 0 if cls == classes["small"] else 1
            cmds += [f"tc class add dev {intf} parent 1:1 classid 1:{cls:x} htb rate {share} "
                     f"ceil {rate} burst {burst} cburst {burst} quantum 1514 prio {prio}",
                     f"tc qdisc add dev {intf} parent 1:{cls:x} handle {cls + 16:x}: {fifo}"]
            if addr is not None:
                cmds.append(f"tc filter add dev {intf} parent 1: protocol ip prio 2 u32 "
                            f"match ip src {addr}/32 flowid 1:{cls:x}")
        # IPv4 packets shorter than SMALL_PACKET_BYTES (pure ACKs, SYNs), whatever their
        # source: the filter of lower prio is tried first
        cmds.append(f"tc filter add dev {intf} parent 1: protocol ip prio 1 u32 "
                    f"match u16 0x0000 {0x10000 - SMALL_PACKET_BYTES:#06x} at 2 "
                    f"flowid 1:{classes['small']:x}")
    return gso + " && ".join(cmds) + " || echo tc-error"


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
