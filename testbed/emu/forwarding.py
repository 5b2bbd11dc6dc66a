"""Static OpenFlow 1.3 rules that make the emulated network forward before a controller exists.

A lightpath is a VLAN: the ROADM next to the source DC pushes the lightpath's VLAN id on
IPv4 traffic to the destination DC's subnet, transit ROADMs switch on (in_port, VLAN),
and the ROADM next to the destination DC pops it. DC switches forward by destination
IP. Hosts get static ARP entries, so no flooding is needed.

`Forwarding` is the small interface the SDN controller (controllers/) replaces: the
builder asks it for rules once the ports are known, and skips it when a remote
controller is configured.
"""

from __future__ import annotations

from typing import Protocol

from testbed.emu.plan import EmuPlan

# (switch node, neighbour node) -> OpenFlow port number on the switch
PortMap = dict[tuple[str, str], int]
VLAN_PRESENT = 0x1000


class Forwarding(Protocol):
    """Something that returns OpenFlow 1.3 flow lines (ovs-ofctl syntax) per switch."""

    def flows(self, plan: EmuPlan, ports: PortMap) -> dict[str, list[str]]: ...


class StaticForwarding:
    """Shortest-path lightpaths per DC pair (from the plan) as proactive VLAN rules."""

    def flows(self, plan: EmuPlan, ports: PortMap) -> dict[str, list[str]]:
        rules: dict[str, list[str]] = {s.node: [] for s in plan.switches}
        dc_index = {dc: i for i, dc in enumerate(plan.dc_subnets)}
        # DC-facing switches on each ROADM, per DC.
        dc_ports: dict[str, list[int]] = {}
        for dc, roadm in plan.dc_roadm.items():
            dc_ports[dc] = [ports[(roadm, s.node)] for s in plan.switches
                            if s.label == dc and s.kind in ("dc", "spine")
                            and (roadm, s.node) in ports]
        # Inside DCs: hosts by /32, everything else up towards the ROADM (or spines).
        for h in plan.hosts:
            ip = h.ip.split("/")[0]
            rules[h.switch].append(
                f"priority=100,ip,nw_dst={ip},actions=output:{ports[(h.switch, h.node)]}")
            for s in plan.switches:
                if s.label != h.dc or s.node == h.switch:
                    continue
                if s.kind == "spine":
                    rules[s.node].append(f"priority=100,ip,nw_dst={ip},"
                                         f"actions=output:{ports[(s.node, h.switch)]}")
                elif s.kind == "leaf":
                    spines = self._spines(plan, h.dc)
                    sp = spines[int(h.node[len(plan.prefix) + 1:]) % len(spines)]
                    rules[s.node].append(f"priority=100,ip,nw_dst={ip},"
                                         f"actions=output:{ports[(s.node, sp)]}")
        for dc, roadm in plan.dc_roadm.items():
            for s in plan.switches:
                if s.label != dc:
                    continue
                if s.kind in ("dc", "spine"):
                    rules[s.node].append(f"priority=10,ip,actions=output:{ports[(s.node, roadm)]}")
                elif s.kind == "leaf":
                    for other, j in dc_index.items():
                        if other == dc:
                            continue
                        spines = self._spines(plan, dc)
                        sp = spines[j % len(spines)]
                        rules[s.node].append(f"priority=10,ip,nw_dst={plan.dc_subnets[other]},"
                                             f"actions=output:{ports[(s.node, sp)]}")
        # DCs on the same optical node: turn around in the ROADM.
        for a, ra in plan.dc_roadm.items():
            for b, rb in plan.dc_roadm.items():
                if a != b and ra == rb:
                    for pa in dc_ports[a]:
                        rules[ra].append(f"priority=150,ip,in_port={pa},"
                                         f"nw_dst={plan.dc_subnets[b]},"
                                         f"actions=output:{dc_ports[b][0]}")
        for lp in plan.lightpaths:
            for src, dst, path in ((lp.dc_a, lp.dc_b, lp.path),
                                   (lp.dc_b, lp.dc_a, tuple(reversed(lp.path)))):
                roadm_of = {n: self._roadm(plan, n) for n in path}
                hops = [roadm_of[n] for n in path]
                first, last = hops[0], hops[-1]
                out0 = ports[(first, self._middle(plan, path[0], path[1]))]
                for p in dc_ports[src]:
                    rules[first].append(
                        f"priority=200,ip,in_port={p},nw_dst={plan.dc_subnets[dst]},"
                        f"actions=push_vlan:0x8100,set_field:{lp.vlan | VLAN_PRESENT}->vlan_vid,"
                        f"output:{out0}")
                for i in range(1, len(path)):
                    sw = hops[i]
                    in_port = ports[(sw, self._middle(plan, path[i - 1], path[i]))]
                    match = f"priority=200,in_port={in_port},dl_vlan={lp.vlan}"
                    if sw == last:
                        down = dc_ports[dst][lp.vlan % len(dc_ports[dst])]
                        rules[sw].append(f"{match},actions=pop_vlan,output:{down}")
                    else:
                        out = ports[(sw, self._middle(plan, path[i], path[i + 1]))]
                        rules[sw].append(f"{match},actions=output:{out}")
        return rules

    @staticmethod
    def _spines(plan: EmuPlan, dc: str) -> list[str]:
        return [s.node for s in plan.switches if s.label == dc and s.kind == "spine"]

    @staticmethod
    def _roadm(plan: EmuPlan, optical_node: str) -> str:
        for s in plan.switches:
            if s.kind == "roadm" and s.label == optical_node:
                return s.node
        raise KeyError(optical_node)

    @staticmethod
    def _middle(plan: EmuPlan, u: str, v: str) -> str:
        return plan.fibre(u, v).middle
