"""VXLAN tunnels for the fibres that cross machines: ids, device names, MTU, ip commands.

One point-to-point VXLAN device per crossing fibre on each of its two machines. On the
fibre's first machine the device replaces the veth between the fibre's middle namespace
and the second ROADM (it is created in the root namespace, where its UDP socket stays,
and moved into the middle namespace); on the second machine it becomes a port of that
ROADM's bridge in the run's switch namespace. The fibre emulator in the middle namespace
keeps enforcing the fibre's delay and rate, so the tunnel's own latency adds to it and is
taken off by the delay calibration like any processing time (docs/cluster.md).

Names and ids prove ownership for clean-up: device `<prefix>x<fibre>` (<= 15 bytes,
the run prefix first) and VNI `prefix_bits << 8 | ordinal` (24 bits: the run's 16 bits of
prefix, then the crossing fibre's ordinal 1..255): a device is the run's only when its
name, kind (vxlan) and VNI all match the plan (owned_devices).

MTU: hosts send 1500-byte IP packets; on a fibre they are Ethernet frames with the
lightpath's 802.1Q tag (1518 bytes). VXLAN adds outer IP + UDP + VXLAN headers (36 bytes
over IPv4, 56 over IPv6), so the encapsulated packet is 1554 (1574) bytes. The device keeps
MTU 1500 (the hosts' frames are never refused); where the underlay's MTU is smaller, the
kernel fragments the outer packet (`df unset`) and the far kernel reassembles it.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from testbed import names
from testbed.cluster.place import Placement
from testbed.cluster.spec import ClusterSpec
from testbed.emu.state import PREFIX_RE
from testbed.errors import InputError

HOST_IP_MTU = 1500           # what the emulated hosts send
ETH_HEADER_BYTES = 14
VLAN_TAG_BYTES = 4           # lightpaths are tagged on fibres
VXLAN_BYTES = 8
UDP_BYTES = 8
IP_HEADER_BYTES = {4: 20, 6: 40}
MAX_CROSSING = 255           # the VNI's low 8 bits
# A run's tunnel device: the run prefix, 'x', the fibre's index (1..9999, as device_name).
DEVICE_RE = re.compile(r"^(lp[0-9a-f]{4})x([1-9][0-9]{0,3})$")


def inner_frame_bytes() -> int:
    """The largest frame a fibre carries: a full host packet with its lightpath's tag."""
    return HOST_IP_MTU + ETH_HEADER_BYTES + VLAN_TAG_BYTES


def outer_packet_bytes(ip_version: int) -> int:
    """The encapsulated packet's IP size for the largest frame."""
    return inner_frame_bytes() + VXLAN_BYTES + UDP_BYTES + IP_HEADER_BYTES[ip_version]


def device_name(prefix: str, fibre_index: int) -> str:
    """The tunnel device of fibre `fibre_index` in run `prefix` (checked as an ifname)."""
    if not PREFIX_RE.fullmatch(prefix):
        raise InputError("prefix", f"bad run prefix {prefix!r}")
    return names.check_ifname(f"{prefix}x{fibre_index}")


def vni(prefix: str, ordinal: int) -> int:
    """The VXLAN network id of the run's `ordinal`-th crossing fibre (1..255)."""
    if not PREFIX_RE.fullmatch(prefix):
        raise InputError("prefix", f"bad run prefix {prefix!r}")
    if not 1 <= ordinal <= MAX_CROSSING:
        raise InputError("cluster", f"at most {MAX_CROSSING} fibres can cross machines "
                         f"(got crossing fibre {ordinal})")
    return int(prefix[2:], 16) << 8 | ordinal


@dataclass(frozen=True)
class TunnelEnd:
    machine: str
    device: str
    local_ip: str
    remote_ip: str
    attach: str        # "middle": into the fibre's middle namespace; "roadm": a bridge port
    attach_to: str     # the plan node it attaches to (middle or ROADM switch node)


@dataclass(frozen=True)
class TunnelPlan:
    fibre: int          # 1-based index in plan.fibres
    u: str
    v: str
    vni: int
    udp_port: int
    a: TunnelEnd        # on the fibre's first end's machine (with the middle node)
    b: TunnelEnd        # on the second end's machine (a port of the ROADM bridge)
    device_mtu: int
    outer_bytes: int    # IP size of the largest encapsulated frame
    underlay_mtu: int

    @property
    def fragments(self) -> bool:
        """Whether the largest frame is sent as two outer fragments."""
        return self.outer_bytes > self.underlay_mtu

    def ends(self) -> tuple[TunnelEnd, TunnelEnd]:
        return self.a, self.b


def plan_tunnels(prefix: str, placement: Placement, cluster: ClusterSpec,
                 roadm_node: dict[str, str]) -> tuple[TunnelPlan, ...]:
    """One tunnel per crossing fibre; roadm_node maps optical node id -> ROADM switch node."""
    version = cluster.underlay_version()
    out = []
    for ordinal, c in enumerate(placement.crossing, start=1):
        ip_u = cluster.machine(c.machine_u).underlay_ip
        ip_v = cluster.machine(c.machine_v).underlay_ip
        dev = device_name(prefix, c.index)
        out.append(TunnelPlan(
            c.index, c.u, c.v, vni(prefix, ordinal), cluster.tunnel.udp_port,
            TunnelEnd(c.machine_u, dev, ip_u, ip_v, "middle", c.middle),
            TunnelEnd(c.machine_v, dev, ip_v, ip_u, "roadm", roadm_node[c.v]),
            HOST_IP_MTU, outer_packet_bytes(version), cluster.tunnel.underlay_mtu))
    return tuple(out)


def create_commands(t: TunnelPlan, end: TunnelEnd, netns: str | int) -> list[list[str]]:
    """argv lists that make `end` on its machine, run as root in its root namespace: the
    device is born inside `netns` (the run's switch namespace by name, or a middle node's
    namespace by its shell's PID) while its UDP socket stays in the root namespace, on the
    underlay; then it is set up. It never exists in the root namespace, so it goes with the
    run's namespace, which the run holds and `lightpipe clean` removes (docs/cluster.md)."""
    names.check_ifname(end.device)
    target = _check_netns(netns)
    add = ["ip", "link", "add", end.device, "mtu", str(t.device_mtu), "netns", target,
           "type", "vxlan", "id", str(t.vni), "local", end.local_ip, "remote", end.remote_ip,
           "dstport", str(t.udp_port), "df", "unset", "nolearning"]
    up = ["ip", "link", "set", "dev", end.device, "up"]
    inside = ["ip", "-n", target] if isinstance(netns, str) else ["mnexec", "-a", target]
    return [add, [*inside, *up[1:]] if isinstance(netns, str) else [*inside, *up]]


def delete_command(device: str, netns: str | None = None) -> list[str]:
    """argv that deletes a device (in netns, or the root namespace)."""
    names.check_ifname(device)
    if netns is None:
        return ["ip", "link", "del", device]
    _check_netns(netns)
    return ["ip", "-n", netns, "link", "del", device]


def _check_netns(netns: str | int) -> str:
    """A namespace name (the same safe alphabet as devices) or a process id, as a word."""
    if isinstance(netns, int) and not isinstance(netns, bool):
        if not 1 < netns < 1 << 22:  # the kernel's PID_MAX_LIMIT
            raise ValueError(f"not a process id: {netns}")
        return str(netns)
    return names.check_ifname(netns)


def owned_devices(links: Iterable[dict[str, Any]], tunnels: Sequence[TunnelPlan],
                  machine: str) -> list[str]:
    """Names of the devices in `links` (parsed `ip -j -d link show`) that are this run's
    tunnels on `machine`: name, kind vxlan and VNI all as planned. Anything else with a
    similar name is not touched."""
    want = {e.device: t.vni for t in tunnels for e in t.ends() if e.machine == machine}
    out = []
    for link in links:
        name = link.get("ifname")
        info = link.get("linkinfo") or {}
        data = info.get("info_data") or {}
        if (name in want and info.get("info_kind") == "vxlan"
                and data.get("id") == want[name]):
            out.append(name)
    return out


@dataclass(frozen=True)
class RunDevice:
    """A tunnel device found in a machine's root namespace, and the run it is proved of."""

    name: str
    prefix: str
    vni: int


def run_devices(links: Iterable[dict[str, Any]], prefixes: Iterable[str], local_ip: str,
                udp_port: int) -> list[RunDevice]:
    """The devices in `links` (parsed `ip -j -d link show`, one machine's root namespace)
    that runs `prefixes` made there as tunnel ends, proved without their plan: the name is
    `<prefix>x<fibre>`, the kind vxlan, the VNI's upper 16 bits are the prefix's and its
    low 8 a crossing ordinal (1..255), the local address is this machine's tunnel address
    and the UDP port the cluster's. A device failing any of these is not touched."""
    runs = set(prefixes)
    local = str(ipaddress.ip_address(local_ip))
    out = []
    for link in links:
        m = DEVICE_RE.fullmatch(str(link.get("ifname", "")))
        if m is None or m.group(1) not in runs:
            continue
        info = link.get("linkinfo") or {}
        data = info.get("info_data") or {}
        vni_found = data.get("id")
        dev_local = data.get("local", data.get("local6"))
        if (info.get("info_kind") != "vxlan" or not isinstance(vni_found, int)
                or vni_found >> 8 != int(m.group(1)[2:], 16)
                or not 1 <= vni_found & 0xFF <= MAX_CROSSING
                or data.get("port") != udp_port or not _same_ip(dev_local, local)):
            continue
        out.append(RunDevice(m.group(0), m.group(1), vni_found))
    return out


def _same_ip(found: Any, want: str) -> bool:
    try:
        return str(ipaddress.ip_address(str(found))) == want
    except ValueError:
        return False
