"""Build, run and tear down the emulated multi-DC network of a plan (a context manager).

    with EmuNetwork(plan, link_mode="auto") as net:
        net.verify()
        net.host_cmd("dc-a-h0", ["iperf3", "-c", "10.2.0.1"])

Layout: a named network namespace per run (`lpXXXX`) holds the private OVS daemons, the
switches and every switch-side veth; hosts and per-fibre middle nodes are Mininet nodes
in their own namespaces. Each fibre is ROADM switch - veth - middle node - veth - ROADM
switch, and the middle node runs the link emulator (forwarder process or netem qdiscs).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from testbed.emu import links as linkemu
from testbed.emu.fabric import htb_script, switch_socket_sndbuf_bytes
from testbed.emu.forwarding import Forwarding, PortMap, StaticForwarding
from testbed.emu.live import RestClient
from testbed.emu.netns import enter_new_named, leave_netns
from testbed.emu.ovs import PrivateOVS
from testbed.emu.plan import EmuPlan, FibrePlan, HostPlan, LightpathPlan
from testbed.emu.state import (
    RunState,
    alive,
    delete_netns,
    kill_in_held,
    kill_procs,
    named_is_held,
    new_state,
    release_held,
    signal_if,
)
from testbed.errors import RuntimeFailure

log = logging.getLogger(__name__)

# EmuNetwork(controller=CONTROLLER_LATER): forwarding by an SDN controller started after
# the network is up; the switches (fail-mode secure) wait without one until it is
# attached (testbed.orchestrate.glue.attach_controller points them at its port).
CONTROLLER_LATER = "later"

HOST_SYSCTLS = ("net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1",
                "net.ipv4.tcp_rmem=4096 131072 67108864",
                "net.ipv4.tcp_wmem=4096 65536 67108864",
                "net.ipv4.tcp_no_metrics_save=1")


def close_nodes(nodes: dict[str, Any]) -> None:
    """Close the shells of Mininet nodes (after their processes were killed) and forget them."""
    for node in nodes.values():
        # The pty master belongs to node.stdin: close it through the file object
        # (closing the raw fd too would later close a reused fd of another node).
        with contextlib.suppress(Exception):
            node.stdin.close()
        with contextlib.suppress(Exception):
            os.close(node.slave)
        with contextlib.suppress(Exception):
            node.shell.wait(timeout=2)
    nodes.clear()


def choose_link_mode(requested: str) -> str:
    """'netem' where the kernel has it, else 'userspace' (requested 'auto')."""
    from testbed.envprobe import netem_available

    if requested == "auto":
        return "netem" if netem_available() else "userspace"
    if requested == "netem" and not netem_available():
        raise RuntimeFailure("link mode netem asked for, but this kernel has no netem qdisc")
    return requested


def choose_datapath(requested: str) -> str:
    """'kernel' where the openvswitch module is loaded or loadable (it is loaded here),
    else 'user' (requested 'auto')."""
    from testbed.envprobe import ensure_ovs_kernel_datapath, module_state

    if requested == "auto":
        return "kernel" if ensure_ovs_kernel_datapath() else "user"
    if requested == "kernel" and not ensure_ovs_kernel_datapath():
        state = module_state("openvswitch")
        raise RuntimeFailure("datapath kernel asked for, but the openvswitch module is "
                             + ("absent from this kernel" if state == "absent"
                                else f"{state} and could not be loaded (modprobe openvswitch; "
                                "needs root)"))
    return requested


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Turn SIGTERM into KeyboardInterrupt so context managers tear down on `kill`."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be set from the main thread
        return

    owner = os.getpid()

    def _raise(sig: int, _frm: object) -> None:
        # A child forked from here inherits the handler: pyroute2's NetNS forks one to
        # open a netlink socket in a namespace (netem delays, calibration) and SIGTERMs
        # it. Raising there would run this run's teardown in the child (killing the run
        # by its PIDs, the parent included): a forked child just exits.
        if os.getpid() != owner:
            os._exit(128 + sig)
        raise KeyboardInterrupt("SIGTERM")

    old = signal.signal(signal.SIGTERM, _raise)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def _listening(path: Path) -> bool:
    """True once a Unix socket at `path` accepts connections: ovs-vswitchd binds its
    management socket (the file appears) before it listens, so the file alone is not
    readiness."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        try:
            s.connect(str(path))
        except OSError:
            return False
    return True


def configure_hosts(nodes: Mapping[str, Any], hosts: Sequence[HostPlan],
                    fibres: Sequence[FibrePlan], every_host: Sequence[HostPlan],
                    state_dir: Path) -> None:
    """The hosts built here (`nodes` by plan name): each its MAC and address, loopback up,
    HOST_SYSCTLS, and a static neighbour entry for every other host of `every_host` (on
    one machine the plan's hosts; across machines also those reached through the
    tunnels); and the middle nodes of `fibres` with IPv6 off and every interface up."""
    for h in hosts:
        node = nodes[h.node]
        intf = node.defaultIntf()
        node.setMAC(h.mac, intf)
        node.setIP(h.ip, intf=intf)
    neigh = [(h.ip.split("/")[0], h.mac) for h in every_host]
    sysctls = " ".join(f"-w '{s}'" for s in HOST_SYSCTLS)
    for h in hosts:
        node = nodes[h.node]
        intf = node.defaultIntf()
        batch = "".join(f"neigh replace {ip} lladdr {mac} dev {intf} nud permanent\n"
                        for ip, mac in neigh if ip != h.ip.split("/")[0])
        path = state_dir / f"{h.node}.neigh"
        path.write_text(batch)
        node.cmd(f"ip link set lo up; sysctl -q {sysctls} >/dev/null; ip -batch {path}; "
                 f"rm -f {path}")
    for f in fibres:
        node = nodes[f.middle]
        node.cmd("sysctl -q -w net.ipv6.conf.all.disable_ipv6=1 "
                 "-w net.ipv6.conf.default.disable_ipv6=1 >/dev/null")
        for intf in node.intfList():
            node.cmd(f"ip link set {intf} up")


class StartStop:
    """`with X(...) as x:` over start() and stop(), for what builds real network state:
    stop() also runs when start() fails half way (it removes whatever start() made)."""

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


class EmuNetwork(StartStop):
    """The live network: start() brings it up, stop() removes everything it created."""

    def __init__(self, plan: EmuPlan, link_mode: str = "auto", datapath: str = "auto",
                 controller: str | None = None, forwarding: Forwarding | None = None,
                 seed: int = 1, link: type[linkemu.LinkEmulator] | None = None,
                 startup_timeout_s: float | None = None) -> None:
        """link: the link emulator class (default: the one of link_mode, chosen by
        choose_link_mode), as Mininet takes a `link=` class. startup_timeout_s: how long
        OVS, each link emulator (and the caller's controller) may take to come up: the
        scenario's emulation.startup_timeout_s, else scaled with the machine."""
        from testbed.envprobe import startup_timeout_s as scaled_timeout

        self.plan = plan
        self.startup_timeout_s = scaled_timeout(startup_timeout_s)
        self.link_mode = link.mode if link is not None else choose_link_mode(link_mode)
        self.link_class = link or linkemu.LINK_CLASSES[self.link_mode]
        self.datapath = choose_datapath(datapath)
        self.controller = controller
        self.forwarding = forwarding or StaticForwarding()
        self.seed = seed
        self.state: RunState | None = None
        self.ovs: PrivateOVS | None = None
        self.nodes: dict[str, Any] = {}
        self.ports: PortMap = {}
        self.emulators: dict[str, linkemu.LinkEmulator] = {}
        self.controller_client: RestClient | None = None  # attach_controller_client
        # (node, interface, rate_mbps, is a host's NIC, its DC's host IPs): HTB
        self.shaped: list[tuple[Any, str, float, bool, tuple[str, ...]]] = []
        self.switch_sndbuf: dict[str, Any] = {}  # _size_switch_sockets' outcome
        self.switch_rcvbuf: dict[str, Any] = {}  # ... and the ports' receive sockets'
        self._back_fd: int | None = None
        self._saved_env: dict[str, str | None] = {}
        self.timings_s: dict[str, float] = {}

    # -- lifecycle -------------------------------------------------------------------
    @property
    def home_netns_fd(self) -> int | None:
        """fd of the network namespace the run started in (this thread lives in the
        switches' namespace while the network is up), None when down."""
        return self._back_fd

    @property
    def home_netns_path(self) -> str:
        """A path to the run's home network namespace (for setns from other processes)."""
        if self._back_fd is None:
            return "/proc/1/ns/net"
        return f"/proc/{os.getpid()}/fd/{self._back_fd}"

    def attach_controller_client(self, client: RestClient) -> None:
        """The REST client of the run's SDN controller (workload steps call its API)."""
        self.controller_client = client

    def adopt_lightpaths(self, lightpaths: Sequence[LightpathPlan]) -> None:
        """Replace the plan's DC-pair lightpaths (e.g. by what the controller set up)."""
        self.plan = dataclasses.replace(self.plan, lightpaths=tuple(lightpaths))

    @property
    def state_dir(self) -> Path:
        assert self.state is not None
        return Path(self.state.state_dir)

    def start(self) -> None:
        t0 = time.monotonic()
        p = self.plan
        self.state = new_state(p.prefix)
        self.state.netns = p.prefix
        self.state.save()
        # Held by a bind mount under the state dir (before it is named) until teardown:
        # the proof `clean` needs that /run/netns/<prefix> is this run's (testbed.emu.nsref).
        state = self.state
        self._back_fd = enter_new_named(p.prefix, lambda path: state.hold_netns("netns", path))
        subprocess.run(["ip", "link", "set", "lo", "up"], check=False)
        self.ovs = PrivateOVS(self.state_dir, userspace_tso=self.datapath == "user",
                              timeout_s=self.startup_timeout_s)
        for key, value in self.ovs.env.items():
            self._saved_env[key] = os.environ.get(key)
            os.environ[key] = value
        try:
            self.ovs.start()
        finally:
            for role, pid in self.ovs.pids.items():
                self.state.add_proc(pid, role)
        self._build_nodes()
        self.timings_s["build"] = time.monotonic() - t0
        # Forwarders (Python processes) start while the switches come up: overlap.
        self._start_link_emulation(wait=False)
        self._start_switches()
        self._configure_hosts()
        self._shape_links()
        self._size_switch_sockets()
        for emu in self.emulators.values():
            emu.wait_ready(self.startup_timeout_s)
        self.state.phase = "up"
        self.state.save()
        self.timings_s["up"] = time.monotonic() - t0
        log.info("network %s up in %.2f s (%d hosts, %d switches, %d fibres, %s links)",
                 p.prefix, self.timings_s["up"], len(p.hosts), len(p.switches), len(p.fibres),
                 self.link_mode)

    def _record_node(self, node: Any, role: str) -> None:
        assert self.state is not None
        self.state.add_proc(node.pid, role, node.name)
        if node.inNamespace:  # (node.pid is our unreaped child: it is still that node)
            self.state.hold_netns(node.name, f"/proc/{node.pid}/ns/net")

    def _build_nodes(self) -> None:
        p = self.plan
        pairs = [pair for f in p.fibres for pair in ((f.roadm_u, f.middle),
                                                     (f.middle, f.roadm_v))]
        self._build_parts(p.switches, p.hosts, p.fibres, p.links, pairs)

    def _build_parts(self, switches: Sequence[Any], hosts: Sequence[Any],
                     fibres: Sequence[Any], links: Sequence[Any],
                     fibre_pairs: Sequence[tuple[str, str]]) -> None:
        """Make these switches, hosts and fibre emulators' nodes, then the links (shaped
        where they have a rate) and the fibres' veths (fibre_pairs, in order): the whole
        plan, or one machine's share of it (testbed.cluster.sharenet)."""
        from functools import partial

        from mininet.link import Link
        from mininet.node import Host, Node, OVSSwitch

        p = self.plan
        # Mininet's class set-up is order dependent (Node.isSetup shadows it once a Host
        # exists): run OVSSwitch's own check explicitly, against our private OVS.
        OVSSwitch.setup()
        OVSSwitch.isSetup = True
        dp = "user" if self.datapath == "user" else "kernel"
        switch_cls = partial(OVSSwitch, datapath=dp, protocols="OpenFlow13",
                             failMode="secure", inNamespace=False, listenPort=None, batch=True)
        for s in switches:
            node = switch_cls(s.node, dpid=s.dpid)
            self.nodes[s.node] = node
            self._record_node(node, "switch-shell")
        for h in hosts:
            node = Host(h.node, inNamespace=True)
            self.nodes[h.node] = node
            self._record_node(node, "host-shell")
        for f in fibres:
            node = Node(f.middle, inNamespace=True)
            self.nodes[f.middle] = node
            self._record_node(node, "middle-shell")

        # a fabric switch's port shares its rate fairly among its DC's hosts (fabric.py)
        dc_ips: dict[str, list[str]] = {}
        for h in p.hosts:
            dc_ips.setdefault(h.dc, []).append(h.ip.split("/")[0])
        dc_sources = {s.node: tuple(dc_ips.get(s.label, ())) for s in switches
                      if s.kind != "roadm"}

        def link(a: str, b: str, rate_mbps: float | None = None) -> None:
            na, nb = self.nodes[a], self.nodes[b]
            lk = Link(na, nb)
            for n, intf, other in ((na, lk.intf1, b), (nb, lk.intf2, a)):
                if isinstance(n, OVSSwitch):
                    self.ports[(n.name, other)] = n.ports[intf]
                if rate_mbps is not None:
                    is_switch = isinstance(n, OVSSwitch)
                    self.shaped.append((n, str(intf), rate_mbps, not is_switch,
                                        dc_sources.get(n.name, ()) if is_switch else ()))

        for lk in links:
            link(lk.a, lk.b, lk.rate_mbps)
        for a, b in fibre_pairs:
            link(a, b)

    def _start_switches(self) -> None:
        p = self.plan
        controllers: list[Any] = []
        from mininet.node import OVSSwitch

        switches = [self.nodes[s.node] for s in p.switches]
        for sw in switches:  # batch=True: start() queues its ovs-vsctl commands
            sw.start(controllers)
        OVSSwitch.batchStartup(switches)  # one ovs-vsctl transaction for all bridges
        assert self.ovs is not None
        self._wait_bridges([s.node for s in p.switches])
        if self.controller:
            if self.controller != CONTROLLER_LATER:
                for s in p.switches:
                    self.ovs.vsctl("set-controller", s.node, self.controller)
            return
        rules = self.forwarding.flows(p, self.ports)
        with tempfile.TemporaryDirectory(dir=self.state_dir) as tmp:
            for sw, lines in rules.items():
                path = Path(tmp) / f"{sw}.flows"
                path.write_text("\n".join(lines) + "\n")
                r = subprocess.run(["ovs-ofctl", "-O", "OpenFlow13", "add-flows", sw,
                                    str(path)], capture_output=True, text=True, check=False)
                if r.returncode != 0:
                    raise RuntimeFailure(f"ovs-ofctl add-flows {sw}: {r.stderr.strip()[:300]}")

    def _wait_bridges(self, names: list[str]) -> None:
        """Wait until ovs-vswitchd has made every bridge (its OpenFlow management socket
        accepts a connection): on a slow machine it lags behind the database, and
        ovs-ofctl would say "... is not a bridge or a socket"."""
        assert self.ovs is not None
        deadline = time.monotonic() + self.startup_timeout_s
        missing = list(names)
        while missing and time.monotonic() < deadline:
            missing = [n for n in missing if not _listening(self.ovs.dir / f"{n}.mgmt")]
            if missing:
                time.sleep(0.05)
        if missing:
            tail = ""
            with contextlib.suppress(OSError):
                tail = (self.ovs.dir / "ovs-vswitchd.log").read_text()[-600:].strip()
            raise RuntimeFailure(f"Open vSwitch did not come up: bridge(s) {', '.join(missing)}"
                                 f" not made within {self.startup_timeout_s:.0f} s "
                                 f"({self.datapath} datapath); ovs-vswitchd.log: {tail}")

    def _configure_hosts(self) -> None:
        p = self.plan
        configure_hosts(self.nodes, p.hosts, p.fibres, p.hosts, self.state_dir)

    def _shape_links(self) -> None:
        """HTB at the plan's rate on both ends of every rate-limited DC fabric link."""
        for node, intf, rate_mbps, nic, sources in self.shaped:
            out = node.cmd(htb_script(intf, rate_mbps, nic=nic, sources=sources))
            if "tc-error" in out:
                raise RuntimeFailure(f"tc htb on {intf}: {out.strip()[:200]}")

    def _size_switch_sockets(self) -> None:
        """The user-space switch's packet sockets (testbed.emu.sockbuf): its send socket
        sized to hold what all the shaped switch ports' FIFOs hold (else ovs-vswitchd
        drops, uncounted, what the default 208 kB cannot take), and each port's receive
        socket to what two polls of the busiest bridge's other ports can hand it
        (sockbuf.switch_rcvbuf_bytes; else a burst that arrives while it waits for a CPU,
        or one poll's frames from two hosts bound for the WAN, is dropped).
        `switch_sndbuf` and `switch_rcvbuf` record the outcome."""
        if self.datapath != "user" or self.ovs is None or self.state is None:
            return
        from testbed.emu.sockbuf import size_switch_buffers, switch_rcvbuf_bytes

        ports_of = collections.Counter(sw for sw, _ in self.ports)
        rcvbuf = switch_rcvbuf_bytes(max(ports_of.values(), default=1) - 1)

        want = switch_socket_sndbuf_bytes((rate_mbps, len(sources))
                                          for _, _, rate_mbps, nic, sources in self.shaped
                                          if not nic)
        rec = next((r for r in self.state.procs if r.role == "ovs-vswitchd"), None)
        try:
            if rec is None:
                raise OSError("ovs-vswitchd is not in the run's state")
            done = size_switch_buffers(rec.pid, rec.start_ticks, want, rcvbuf)
        except OSError as exc:
            log.warning("the switch's packet sockets stay at the kernel's default buffers "
                        "(%s): bursts past them are dropped uncounted", exc)
            self.switch_rcvbuf = {"wanted_bytes": rcvbuf, "error": str(exc)[:200]}
            if want:
                self.switch_sndbuf = {"wanted_bytes": want, "error": str(exc)[:200]}
            return
        if done.received:
            self.switch_rcvbuf = {"wanted_bytes": rcvbuf,
                                  "bytes": min(done.received.values()),
                                  "sockets": len(done.received)}
        if not want:
            return
        try:
            if not done.sized:  # it opens its send socket with its first frame sent
                self._send_one_frame()
                done = size_switch_buffers(rec.pid, rec.start_ticks, want)
            if not done.sized:
                raise OSError("no send socket found" + "".join(
                    f"; fd {fd}: {why}" for fd, why in list(done.skipped.items())[:2]))
        except OSError as exc:
            log.warning("the switch's send socket stays at the kernel's default buffer (%s): "
                        "frames that shaped fabric ports queue past it are dropped uncounted",
                        exc)
            self.switch_sndbuf = {"wanted_bytes": want, "error": str(exc)[:200]}
            return
        self.switch_sndbuf = {"wanted_bytes": want, "bytes": min(done.sized.values()),
                              "sockets": len(done.sized)}
        log.debug("switch sockets sized: send %s, receive %s", self.switch_sndbuf,
                  self.switch_rcvbuf)

    def _send_one_frame(self) -> None:
        """Make the user-space switch send one frame (a broadcast of the local
        experimental EtherType 0x88b5, which a host's kernel discards) out of a port that
        faces a host, so that it opens its send socket."""
        hosts = {h.node for h in self.plan.hosts}
        port = next(((sw, no) for (sw, other), no in self.ports.items() if other in hosts),
                    None)
        if port is None:
            return
        frame = "ff" * 6 + "020000000000" + "88b5" + "00" * 46
        r = subprocess.run(["ovs-ofctl", "-O", "OpenFlow13", "packet-out", port[0],
                            "CONTROLLER", f"output:{int(port[1])}", frame],
                           capture_output=True, text=True, timeout=self.startup_timeout_s,
                           check=False)
        if r.returncode != 0:
            log.debug("ovs-ofctl packet-out %s: %s", port[0], r.stderr.strip()[:200])

    def _start_link_emulation(self, wait: bool = True) -> None:
        p = self.plan
        assert self.state is not None
        caps: dict[str, dict[int, float]] = {f.middle: {} for f in p.fibres}
        for lp in p.lightpaths:
            for u, v in zip(lp.path, lp.path[1:], strict=False):
                caps[p.fibre(u, v).middle][lp.vlan] = lp.rate_mbps
        for k, f in enumerate(p.fibres):
            node = self.nodes[f.middle]
            intf_u = str(node.connectionsTo(self.nodes[f.roadm_u])[0][0])
            intf_v = str(node.connectionsTo(self.nodes[f.roadm_v])[0][0])
            cls = self.link_class
            emu = cls(f, node.pid, intf_u, intf_v, caps[f.middle], self.state_dir,
                      seed=self.seed + k)
            emu.start()
            self.emulators[f.middle] = emu
            if emu.pid is not None:
                self.state.add_proc(emu.pid, "forwarder", f.middle)
        if wait:
            for emu in self.emulators.values():
                emu.wait_ready(self.startup_timeout_s)

    def stop(self) -> None:
        """Tear everything down by recorded PIDs and namespace names (idempotent)."""
        t0 = time.monotonic()
        for emu in self.emulators.values():  # SIGTERM all forwarders first, then wait
            with contextlib.suppress(Exception):
                emu.terminate()
        for emu in self.emulators.values():
            with contextlib.suppress(Exception):
                emu.stop()
        self.emulators.clear()
        if self.ovs is not None:
            self.ovs.stop()
        st = self.state
        if st is not None:
            # Node shells are interactive bash (they ignore SIGTERM): SIGKILL them.
            shells = [r for r in st.procs if r.role.endswith("-shell")]
            for r in shells:
                signal_if(r.pid, signal.SIGKILL, lambda _p, r=r: alive(r))
            kill_procs([r for r in reversed(st.procs) if not r.role.endswith("-shell")],
                       grace_s=2.0)
            kill_in_held(Path(st.state_dir))  # by the namespaces the run still holds
        close_nodes(self.nodes)
        if self._back_fd is not None:
            leave_netns(self._back_fd)
            self._back_fd = None
        for key, value in self._saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        self._saved_env.clear()
        if st is not None:
            if st.netns and named_is_held(Path(st.state_dir), st.netns):
                delete_netns(st.netns)  # never a same-named namespace this run did not make
            import shutil

            if release_held(Path(st.state_dir)):  # else `clean` finds them held
                shutil.rmtree(st.state_dir, ignore_errors=True)
            self.state = None
        self.timings_s["down"] = time.monotonic() - t0

    # -- using the network -----------------------------------------------------------------
    def host_iface(self, name: str) -> str:
        """The default interface of a host (user name or node name)."""
        return str(self.nodes[self.plan.host(name).node].defaultIntf())

    def host_pid(self, name: str) -> int:
        return int(self.nodes[self.plan.host(name).node].pid)

    def host_cmd(self, name: str, argv: Sequence[str], timeout_s: float = 60.0,
                 check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run argv inside a host's namespace (mnexec -a PID) and wait for it."""
        r = subprocess.run(["mnexec", "-a", str(self.host_pid(name)), *argv],
                           capture_output=True, text=True, timeout=timeout_s, check=False)
        if check and r.returncode != 0:
            raise RuntimeFailure(f"{name}: {' '.join(argv[:2])} failed: {r.stderr[-300:]}")
        return r

    def host_popen(self, name: str, argv: Sequence[str], **kw: Any) -> subprocess.Popen[str]:
        proc = subprocess.Popen(["mnexec", "-a", str(self.host_pid(name)), *argv],
                                text=True, **kw)
        return proc

    def python_argv(self, module: str, *args: str) -> list[str]:
        return [sys.executable, "-m", module, *args]
