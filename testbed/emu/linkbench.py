"""One emulated fibre between two hosts (host - middle node - host), for tests and benchmarks.

No switches: this measures the link emulator alone (rate, delay, loss accuracy and the
forwarder's CPU), with the same emulator classes, state file and cleanup as a full run.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any

from testbed.emu import calibrate as cal
from testbed.emu import links as linkemu
from testbed.emu.network import HOST_SYSCTLS, StartStop, choose_link_mode, close_nodes
from testbed.emu.plan import FibrePlan, new_prefix
from testbed.emu.probes import IperfResult, PingStats, icmp_ping, run_iperf3
from testbed.emu.state import (
    RunState,
    alive,
    kill_in_held,
    kill_procs,
    new_state,
    release_held,
    signal_if,
)

IP_A, IP_B = "10.0.0.1", "10.0.0.2"
MAC_A, MAC_B = "02:00:00:00:00:01", "02:00:00:00:00:02"


class LinkTestbed(StartStop):
    """with LinkTestbed(rate_mbps=100, delay_ms=20) as lt: lt.iperf(...), lt.ping(...)"""

    def __init__(self, rate_mbps: float, delay_ms: float, loss: float = 0.0,
                 link_mode: str = "userspace", seed: int = 1,
                 calibrate: bool = False) -> None:
        """calibrate: once up, take the path's own processing time off the fibre's
        emulated delay (testbed.emu.calibrate; the record in self.calibration)."""
        self.mode = choose_link_mode(link_mode)
        self.prefix = new_prefix()
        p = self.prefix
        self.fibre = FibrePlan("a", "b", f"{p}ha", f"{p}hb", f"{p}m", 0.0, delay_ms,
                               rate_mbps, rate_mbps / 1000, "bench", loss)
        self.seed = seed
        self.calibrate_on_start = calibrate
        self.calibration: dict[str, Any] | None = None
        self.state: RunState | None = None
        self.nodes: dict[str, Any] = {}
        self.emu: linkemu.LinkEmulator | None = None

    def start(self) -> None:
        from mininet.link import Link
        from mininet.node import Host, Node

        f = self.fibre
        self.state = new_state(self.prefix)
        for name, cls in ((f.roadm_u, Host), (f.roadm_v, Host), (f.middle, Node)):
            node = cls(name, inNamespace=True)
            self.nodes[name] = node
            self.state.add_proc(node.pid, "node-shell", name)
            self.state.hold_netns(name, f"/proc/{node.pid}/ns/net")
        a, b, m = self.nodes[f.roadm_u], self.nodes[f.roadm_v], self.nodes[f.middle]
        Link(a, m)
        Link(m, b)
        for node, ip, mac in ((a, IP_A, MAC_A), (b, IP_B, MAC_B)):
            node.setMAC(mac)
            node.setIP(ip, prefixLen=24)
            sysctls = " ".join(f"-w '{s}'" for s in HOST_SYSCTLS)
            node.cmd(f"sysctl -q {sysctls} >/dev/null")
        a.cmd(f"ip neigh replace {IP_B} lladdr {MAC_B} dev {a.defaultIntf()} nud permanent")
        b.cmd(f"ip neigh replace {IP_A} lladdr {MAC_A} dev {b.defaultIntf()} nud permanent")
        m.cmd("sysctl -q -w net.ipv6.conf.all.disable_ipv6=1 >/dev/null")
        intf_a = str(m.connectionsTo(a)[0][0])
        intf_b = str(m.connectionsTo(b)[0][0])
        for intf in (intf_a, intf_b):
            m.cmd(f"ip link set {intf} up")
        cls_ = linkemu.LINK_CLASSES[self.mode]
        self.emu = cls_(f, m.pid, intf_a, intf_b, {}, Path(self.state.state_dir), self.seed)
        self.emu.start()
        if self.emu.pid is not None:
            self.state.add_proc(self.emu.pid, "forwarder", f.middle)
        self.emu.wait_ready()
        if self.calibrate_on_start:
            self.calibrate()

    def calibrate(self, cfg: cal.CalibrationConfig | None = None) -> dict[str, Any]:
        """Take the path's processing time off the fibre's emulated delay (the one path
        a -> b: host stacks, veths, the middle node); the calibration record."""
        assert self.emu is not None, "start() first"
        f = self.fibre
        cfg = cfg or cal.CalibrationConfig.for_link_mode(self.mode)
        probe = cal.PathProbe("a~b", f"/proc/{self.pid('a')}/ns/net", IP_B, (f.middle,),
                              f.delay_ms)
        self.calibration = cal.calibrate({f.middle: self.emu},
                                         lambda: cal.measure([probe], cfg), cfg)
        self.calibration["link_mode"] = self.mode
        return self.calibration

    def stop(self) -> None:
        if self.emu is not None:
            with contextlib.suppress(Exception):
                self.emu.stop()
            self.emu = None
        st = self.state
        if st is not None:
            for r in st.procs:
                if r.role == "node-shell":
                    signal_if(r.pid, signal.SIGKILL, lambda _p, r=r: alive(r))
            kill_procs(list(reversed(st.procs)), grace_s=2.0)
            kill_in_held(Path(st.state_dir))  # by the namespaces the run still holds
        close_nodes(self.nodes)
        if st is not None:
            if release_held(Path(st.state_dir)):  # else `clean` finds them held
                shutil.rmtree(st.state_dir, ignore_errors=True)
            self.state = None

    # -- measurements -------------------------------------------------------------------
    def pid(self, side: str) -> int:
        f = self.fibre
        return int(self.nodes[f.roadm_u if side == "a" else f.roadm_v].pid)

    def ping(self, count: int = 50, interval_s: float = 0.02) -> PingStats:
        return PingStats.of(icmp_ping(f"/proc/{self.pid('a')}/ns/net", IP_B, count=count,
                                      interval_s=interval_s))

    def iperf(self, seconds: float, warmup_s: float, udp_mbps: float | None = None,
              port: int = 5201) -> IperfResult:
        return run_iperf3(["mnexec", "-a", str(self.pid("b"))],
                          ["mnexec", "-a", str(self.pid("a"))], IP_B, seconds=seconds,
                          warmup_s=warmup_s, udp_mbps=udp_mbps, port=port)

    def forwarder_cpu_s(self) -> float:
        """User + system CPU seconds the forwarder process has used so far."""
        if self.emu is None or self.emu.pid is None:
            return 0.0
        fields = Path(f"/proc/{self.emu.pid}/stat").read_text().rsplit(")", 1)[1].split()
        ticks = int(fields[11]) + int(fields[12])
        return ticks / os.sysconf("SC_CLK_TCK")


def host_cmd(pid: int, argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["mnexec", "-a", str(pid), *argv], capture_output=True, text=True,
                          check=False)
