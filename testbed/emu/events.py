"""Fibre events in a live emulation: take a fibre's link down (a cut) or up (a repair).

A cut sets both veths of the fibre's middle node down (`ip link set ... down` inside its
namespace): the ROADM switch ports lose carrier and OVS sends OpenFlow PortStatus
(link down) to the controller, which restores the lightpaths. A repair sets them up.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable

from testbed.emu.live import LiveNetwork
from testbed.errors import RuntimeFailure


def set_fibre_link(net: LiveNetwork, u: str, v: str, up: bool) -> None:
    """Set fibre u-v's link state in the data plane (both ends)."""
    try:
        f = net.plan.fibre(u, v)
    except KeyError:
        raise RuntimeFailure(f"no emulated fibre {u}-{v}") from None
    emu = net.emulators[f.middle]
    state = "up" if up else "down"
    for intf in (emu.intf_u, emu.intf_v):
        r = subprocess.run(["mnexec", "-a", str(emu.ns_pid), "ip", "link", "set", intf, state],
                           capture_output=True, text=True, check=False, timeout=10)
        if r.returncode != 0:
            raise RuntimeFailure(f"fibre {u}-{v}: ip link set {intf} {state}: "
                                 f"{r.stderr.strip()[:200]}")


def link_switch(net: LiveNetwork) -> Callable[[str, str, bool], None]:
    """A `testbed.orchestrate.replay.LinkSwitch` for this network."""
    def switch(u: str, v: str, up: bool) -> None:
        set_fibre_link(net, u, v, up)
    return switch
