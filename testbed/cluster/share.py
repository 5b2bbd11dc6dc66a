"""Each machine's share of an emulation plan: what that machine's LightPipe builds.

A share holds the plan's hosts, switches and links whose nodes the placement put on the
machine, the fibres whose emulator (middle node) runs there, and the tunnel ends it makes:
for a crossing fibre, the machine with the middle node makes the end that replaces the
veth from the middle node to the far ROADM; the far machine makes the end that becomes a
port of that ROADM's bridge. Every node, link and fibre of the plan is in exactly one
share (checked by `split`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from testbed.cluster.place import Placement
from testbed.cluster.tunnel import TunnelEnd, TunnelPlan
from testbed.emu.plan import EmuPlan, FibrePlan, HostPlan, LinkPlan, SwitchPlan


@dataclass(frozen=True)
class MachineShare:
    machine: str
    services: bool                                 # runs the controller and the monitor
    hosts: tuple[HostPlan, ...]
    switches: tuple[SwitchPlan, ...]
    links: tuple[LinkPlan, ...]                    # both ends here
    fibres: tuple[FibrePlan, ...]                  # middle node here
    tunnel_ends: tuple[tuple[TunnelPlan, TunnelEnd], ...]

    def node_names(self) -> set[str]:
        return ({h.node for h in self.hosts} | {s.node for s in self.switches}
                | {f.middle for f in self.fibres})


def split(plan: EmuPlan, placement: Placement, tunnels: Sequence[TunnelPlan]
          ) -> dict[str, MachineShare]:
    """The plan cut into one share per machine (in the placement's machine order)."""
    on = placement.node_machine
    out = {}
    for m in placement.machines:
        out[m] = MachineShare(
            m, m == placement.services,
            tuple(h for h in plan.hosts if on[h.node] == m),
            tuple(s for s in plan.switches if on[s.node] == m),
            tuple(lk for lk in plan.links if on[lk.a] == m),
            tuple(f for f in plan.fibres if on[f.middle] == m),
            tuple((t, e) for t in tunnels for e in t.ends() if e.machine == m))
    _check(plan, placement, tunnels, out)
    return out


def _check(plan: EmuPlan, placement: Placement, tunnels: Sequence[TunnelPlan],
           shares: dict[str, MachineShare]) -> None:
    """Every node in one share; a crossing fibre's ends where its middle and far ROADM are."""
    seen: dict[str, str] = {}
    for m, share in shares.items():
        for n in share.node_names():
            if n in seen:
                raise AssertionError(f"node {n} on {seen[n]} and {m}")
            seen[n] = m
    every = ({h.node for h in plan.hosts} | {s.node for s in plan.switches}
             | {f.middle for f in plan.fibres})
    if set(seen) != every:
        raise AssertionError(f"nodes in no share: {sorted(every - set(seen))}")
    crossing = {c.index for c in placement.crossing}
    if {t.fibre for t in tunnels} != crossing:
        raise AssertionError("tunnels do not match the crossing fibres")
    for t in tunnels:
        if seen[t.a.attach_to] != t.a.machine or seen[t.b.attach_to] != t.b.machine:
            raise AssertionError(f"tunnel of fibre {t.fibre} attached on the wrong machine")
