"""One machine's share of an emulation: the network builder (testbed.emu.network) limited
to the hosts, switches, links and fibre emulators the placement put on this machine, with
the VXLAN tunnel ends of the fibres that cross machines (docs/cluster.md).

The plan stays whole (lightpaths, every host's address, rules computed for every switch)
and only this machine's part is built. A crossing fibre's middle node keeps its fibre
emulator between its veth to the first ROADM and the tunnel end (in place of the veth to
the far ROADM); on the far machine the other end is a port of that ROADM's bridge, under
the port map key (ROADM, middle node) that the forwarding rules use. Tunnel ends are born
inside the run's namespaces (testbed.cluster.tunnel.create_commands), so they go with
them: the machine's own `lightpipe clean` removes them with the run.
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from typing import Any

from testbed.cluster.share import MachineShare
from testbed.cluster.tunnel import create_commands
from testbed.emu.forwarding import Forwarding, PortMap
from testbed.emu.network import CONTROLLER_LATER, EmuNetwork, configure_hosts
from testbed.emu.plan import EmuPlan
from testbed.errors import RuntimeFailure

IP_TIMEOUT_S = 30


class LocalPorts(dict[tuple[str, str], int]):
    """A port map in which another machine's switches have every port (numbered 0), so
    that rules can be computed for the whole plan; this machine's must be real."""

    def __init__(self, ports: PortMap, local: set[str]) -> None:
        super().__init__(ports)
        self.local = local

    def __missing__(self, key: tuple[str, str]) -> int:
        if key[0] in self.local:
            raise KeyError(key)
        return 0

    def __contains__(self, key: object) -> bool:
        if isinstance(key, tuple) and key and key[0] not in self.local:
            return True
        return super().__contains__(key)


class ShareForwarding:
    """Another Forwarding's rules for the whole plan, kept for this machine's switches."""

    def __init__(self, inner: Forwarding, local: set[str]) -> None:
        self.inner = inner
        self.local = local

    def flows(self, plan: EmuPlan, ports: PortMap) -> dict[str, list[str]]:
        rules = self.inner.flows(plan, LocalPorts(ports, self.local))
        return {sw: lines for sw, lines in rules.items() if sw in self.local}


class ShareNetwork(EmuNetwork):
    """EmuNetwork for one machine's share of `plan` (the whole plan)."""

    def __init__(self, plan: EmuPlan, share: MachineShare, **kw: Any) -> None:
        super().__init__(plan, **kw)
        self.share = share
        self.local_switches = {s.node for s in share.switches}
        self.forwarding = ShareForwarding(self.forwarding, self.local_switches)
        self.tunnel_intf: dict[str, str] = {}  # middle node -> its tunnel end

    # -- building --------------------------------------------------------------------------
    def _build_nodes(self) -> None:
        sh = self.share
        here = {s.node for s in sh.switches}
        pairs: list[tuple[str, str]] = []
        for f in sh.fibres:
            if f.roadm_u not in here:
                raise RuntimeFailure(f"fibre {f.u}-{f.v}: its emulator {f.middle} is on "
                                     f"{sh.machine} but its first ROADM is not")
            pairs.append((f.roadm_u, f.middle))
            if f.roadm_v in here:
                pairs.append((f.middle, f.roadm_v))
        self._build_parts(sh.switches, sh.hosts, sh.fibres, sh.links, pairs)
        for t, end in sh.tunnel_ends:
            if end.attach == "middle":
                add, up = create_commands(t, end, int(self.nodes[end.attach_to].pid))
                self.tunnel_intf[end.attach_to] = end.device
            else:
                add, up = create_commands(t, end, self.plan.prefix)
            self._run(add, home=True)
            self._run(up)

    def _run(self, argv: Sequence[str], home: bool = False) -> None:
        """Run a command, in the machine's root namespace when `home` (this thread lives
        in the run's switch namespace while the network is up)."""
        full = ["nsenter", f"--net={self.home_netns_path}", *argv] if home else list(argv)
        res = subprocess.run(full, capture_output=True, text=True, timeout=IP_TIMEOUT_S,
                             check=False)
        if res.returncode != 0:
            raise RuntimeFailure(f"{' '.join(argv[:4])}: {res.stderr.strip()[:300]}")

    def _start_switches(self) -> None:
        from mininet.node import OVSSwitch

        assert self.ovs is not None
        switches = [self.nodes[s.node] for s in self.share.switches]
        for sw in switches:
            sw.start([])
        OVSSwitch.batchStartup(switches)
        self._wait_bridges([s.node for s in self.share.switches])
        for t, end in self.share.tunnel_ends:
            if end.attach != "roadm":
                continue
            sw = self.nodes[end.attach_to]
            port = max(sw.ports.values(), default=0) + 1
            taken = set(self.ports[k] for k in self.ports if k[0] == sw.name)
            while port in taken:
                port += 1
            self.ovs.vsctl("add-port", sw.name, end.device, "--", "set", "Interface",
                           end.device, f"ofport_request={port}")
            self.ports[(sw.name, t.a.attach_to)] = port  # the far middle node's port
        if self.controller:
            if self.controller != CONTROLLER_LATER:
                for s in self.share.switches:
                    self.ovs.vsctl("set-controller", s.node, self.controller)
            return
        self._add_flows(self.forwarding.flows(self.plan, self.ports))

    def _add_flows(self, rules: dict[str, list[str]]) -> None:
        import tempfile
        from pathlib import Path

        with tempfile.TemporaryDirectory(dir=self.state_dir) as tmp:
            for sw, lines in rules.items():
                path = Path(tmp) / f"{sw}.flows"
                path.write_text("\n".join(lines) + "\n")
                r = subprocess.run(["ovs-ofctl", "-O", "OpenFlow13", "add-flows", sw,
                                    str(path)], capture_output=True, text=True, check=False)
                if r.returncode != 0:
                    raise RuntimeFailure(f"ovs-ofctl add-flows {sw}: {r.stderr.strip()[:300]}")

    def _configure_hosts(self) -> None:
        """This machine's hosts, with static neighbour entries for every host of the plan
        (the others are reached through the tunnels)."""
        configure_hosts(self.nodes, self.share.hosts, self.share.fibres, self.plan.hosts,
                        self.state_dir)

    def _start_link_emulation(self, wait: bool = True) -> None:
        """Fibre emulators for this machine's fibres; caps from every lightpath of the plan,
        seeds by the fibre's index in the whole plan (as on one machine)."""
        p = self.plan
        assert self.state is not None
        caps: dict[str, dict[int, float]] = {f.middle: {} for f in p.fibres}
        for lp in p.lightpaths:
            for u, v in zip(lp.path, lp.path[1:], strict=False):
                caps[p.fibre(u, v).middle][lp.vlan] = lp.rate_mbps
        for k, f in enumerate(p.fibres):
            if f.middle not in self.nodes:
                continue
            node = self.nodes[f.middle]
            intf_u = str(node.connectionsTo(self.nodes[f.roadm_u])[0][0])
            intf_v = self.tunnel_intf.get(f.middle) or \
                str(node.connectionsTo(self.nodes[f.roadm_v])[0][0])
            emu = self.link_class(f, node.pid, intf_u, intf_v, caps[f.middle],
                                  self.state_dir, seed=self.seed + k)
            emu.start()
            self.emulators[f.middle] = emu
            if emu.pid is not None:
                self.state.add_proc(emu.pid, "forwarder", f.middle)
        if wait:
            for emu in self.emulators.values():
                emu.wait_ready(self.startup_timeout_s)
