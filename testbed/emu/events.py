"""Fibre events in a live emulation: take a fibre's link down (a cut) or up (a repair).

A cut sets both veths of the fibre's middle node down (over netlink inside its namespace,
as `ip link set ... down` would): the ROADM switch ports lose carrier and OVS sends
OpenFlow PortStatus (link down) to the controller, which restores the lightpaths. A
repair sets them up.
"""

from __future__ import annotations

from collections.abc import Callable

from testbed.emu.live import LiveNetwork
from testbed.emu.netns import iproute_in
from testbed.errors import RuntimeFailure


def set_fibre_link(net: LiveNetwork, u: str, v: str, up: bool) -> None:
    """Set fibre u-v's link state in the data plane (both ends). In-process netlink, no
    child process: `mnexec ... ip link set` timed out after 10 s in the user path's
    guest (software emulation, load 44-48), and the monitor-demo's cut never happened."""
    try:
        f = net.plan.fibre(u, v)
    except KeyError:
        raise RuntimeFailure(f"no emulated fibre {u}-{v}") from None
    emu = net.emulators[f.middle]
    state = "up" if up else "down"
    try:
        with iproute_in(f"/proc/{emu.ns_pid}/ns/net") as ipr:
            for intf in (emu.intf_u, emu.intf_v):
                idx = ipr.link_lookup(ifname=intf)
                if not idx:
                    raise RuntimeFailure(f"fibre {u}-{v}: no interface {intf} in its "
                                         "middle node")
                ipr.link("set", index=idx[0], state=state)
    except OSError as exc:  # pyroute2's NetlinkError is an OSError
        raise RuntimeFailure(f"fibre {u}-{v}: set {state}: {exc}") from exc


def link_switch(net: LiveNetwork) -> Callable[[str, str, bool], None]:
    """A `testbed.orchestrate.replay.LinkSwitch` for this network."""
    def switch(u: str, v: str, up: bool) -> None:
        set_fibre_link(net, u, v, up)
    return switch
