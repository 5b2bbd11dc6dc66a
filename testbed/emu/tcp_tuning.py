"""TCP and pacer tuning for long-lived pipeline transfers over emulated lightpaths.

Per host: no slow-start restart after idle, and per destination a route whose initial
and clamped congestion window is the lightpath's bandwidth-delay product; per lightpath:
its pacers' queue deepened to LIGHTPATH_QUEUE_BDPS x the BDP (see the comment below).
"""

from __future__ import annotations

import json
import logging
import math
import re
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from testbed.emu.forwarder import default_queue_bytes
from testbed.emu.live import LiveNetwork
from testbed.emu.plan import EmuPlan

log = logging.getLogger(__name__)


class ExecHost(Protocol):
    """A host commands run in: its argv prefix, address and interface."""

    name: str
    ip: str
    iface: str | None
    prefix: tuple[str, ...]


# TCP as long-lived training connections see it. The simulator times a transfer as
# latency + size / bandwidth on a FIFO link; a default Linux TCP instead (1) restarts
# slow start after every idle gap longer than an RTO (RFC 2861; the stages idle between
# activations and the WAN RTT is stretched by time_factor), adding whole RTTs per
# activation, and (2) probes the window up until the lightpath pacer's queue overflows,
# then runs window-limited below the lightpath rate. Both were measured here (latency
# calibration 10-17 % slow; bandwidth calibration up to 2x per transfer). So each host
# keeps its window across idle gaps and gets, per destination DC, a route whose initial
# and clamped congestion window is the lightpath's bandwidth-delay product, and the
# lightpath's pacers queue up to 2 BDPs (deep-buffered WAN ingress; the emulator's
# default is 1 BDP, which a burst of one window plus whole 64 KB GSO frames overflows:
# measured tail drops and RTO stalls). So the pipe stays full and one flow never
# overflows its queue, which is how a tuned long-haul transport behaves. Hosts: per
# network namespace only.
MSS_BYTES = 1448              # 1500 MTU - 20 IP - 32 TCP (with timestamps)
WIRE_BYTES_PER_SEGMENT = 1518  # + 14 Ethernet + 4 802.1Q tag, as the pacer counts them
TCP_GOODPUT = MSS_BYTES / WIRE_BYTES_PER_SEGMENT  # 0.954 of a lightpath's rate
MIN_WINDOW_SEGMENTS = 64
WINDOW_MARGIN_SEGMENTS = 8
LIGHTPATH_QUEUE_BDPS = 2.0
HOST_TCP_SYSCTLS = ("net.ipv4.tcp_slow_start_after_idle=0",)


def lightpath_queue_bytes(rate_mbps: float, one_way_delay_ms: float) -> int:
    """Per-lightpath pacer queue for pp_jobs runs: LIGHTPATH_QUEUE_BDPS x the BDP."""
    bdp = rate_mbps * 1e6 / 8 * 2 * one_way_delay_ms / 1e3
    return max(default_queue_bytes(rate_mbps, one_way_delay_ms),
               int(LIGHTPATH_QUEUE_BDPS * bdp))


def window_segments(rate_mbps: float, one_way_delay_ms: float) -> int:
    """Congestion window (segments) for a lightpath: its BDP plus a few segments.

    The window fills the pipe (window / RTT >= rate) and, sent as one burst after an
    idle gap (no slow-start restart), fits in the lightpath's pacer queue
    (lightpath_queue_bytes) with one BDP to spare for whole GSO frames and ACK timing.
    """
    bdp = rate_mbps * 1e6 / 8 * 2 * one_way_delay_ms / 1e3
    return max(MIN_WINDOW_SEGMENTS, math.ceil(bdp / WIRE_BYTES_PER_SEGMENT)
               + WINDOW_MARGIN_SEGMENTS)


def deepen_lightpath_queues(net: LiveNetwork) -> dict[int, int]:
    """Give each DC-pair lightpath's pacers a queue of lightpath_queue_bytes (in place).

    Sets the limit of the lightpath's existing cap (same rate) on every fibre of its
    route over the forwarder's control channel; returns {vlan: limit_bytes}.
    """
    plan = net.plan
    fibre_of = {frozenset((f.u, f.v)): f for f in plan.fibres}
    out: dict[int, int] = {}
    for lp in plan.lightpaths:
        limit = lightpath_queue_bytes(lp.rate_mbps, lp.delay_ms)
        for u, v in zip(lp.path, lp.path[1:], strict=False):
            emu = net.emulators.get(fibre_of[frozenset((u, v))].middle)
            if emu is None or not emu.counters:
                continue  # netem links: no user-space pacer
            caps = {vid: c for d in emu.stats().get("directions", {}).values()  # type: ignore[attr-defined]
                    for vid, c in d.get("vlans", {}).items()}
            cap = caps.get(str(lp.vlan))
            if cap is None:
                continue
            emu.set_queue(lp.vlan, cap["rate_mbps"], limit)
            out[lp.vlan] = limit
    return out


def host_routes(emu_plan: EmuPlan, dc: str) -> list[tuple[str, int]]:
    """(destination DC subnet, window segments) for every lightpath leaving `dc`."""
    out = []
    for lp in emu_plan.lightpaths:
        if dc not in (lp.dc_a, lp.dc_b):
            continue
        other = lp.dc_b if lp.dc_a == dc else lp.dc_a
        out.append((emu_plan.dc_subnets[other], window_segments(lp.rate_mbps, lp.delay_ms)))
    return out


def tune_host_tcp(emu_plan: EmuPlan, hosts_by_dc: Mapping[str, Sequence[ExecHost]]) -> None:
    """Apply HOST_TCP_SYSCTLS and per-destination-DC window routes in every host."""
    for dc, hosts in hosts_by_dc.items():
        routes = host_routes(emu_plan, dc)
        for h in hosts:
            sysctls = [a for s in HOST_TCP_SYSCTLS for a in ("-w", s)]
            subprocess.run([*h.prefix, "sysctl", "-q", *sysctls], check=True,
                           stdout=subprocess.DEVNULL, timeout=10)
            for subnet, win in routes:
                window_route(h, subnet, win)


def window_route(h: ExecHost, dest: str, window: int) -> None:
    """In host h: a route to dest whose initial and clamped window is `window` segments."""
    assert h.iface is not None
    win = str(window)
    subprocess.run([*h.prefix, "ip", "route", "replace", dest, "dev", h.iface, "src", h.ip,
                    "initcwnd", win, "initrwnd", win, "cwnd", "lock", win],
                   check=True, timeout=10)


# The locked `cwnd` of a route clamps a sender only through the kernel's TCP metrics
# cache: tcp_init_metrics reads the clamp from the cache entry for the destination, and
# an entry is made (copying the route's locked metrics) when a connection to it closes.
# So the first connections to a peer, the training's own, ran unclamped: BBR grew one to
# 2,972 segments on a route locked at 1,182 (2026-12-04), and its start-up overflowed
# the 2-BDP pacer queue in the first iterations (296 segments tail-dropped in a run). A
# route's `window` (the advertised window) does not hold either: receive-buffer
# autotuning raises the window clamp with the buffer (measured: 10.9 Gbit/s through a
# 14,480-byte `window`). prime_window_clamps makes one short connection per host pair
# before the workers start, so the cache holds every lightpath peer's clamp. The hosts
# keep net.ipv4.tcp_no_metrics_save=1 (testbed.emu.network.HOST_SYSCTLS: one
# connection's RTT and ssthresh must not seed the next), under which the kernel saves no
# entry at all, so the priming lifts it for its own connections and puts it back:
# entries already made still seed new connections (tcp_init_metrics does not ask).
NO_METRICS_SAVE = "net.ipv4.tcp_no_metrics_save"
PRIME_TIMEOUT_S = 20.0
_PRIME_SERVER = (
    "import socket,sys\n"
    "s=socket.socket();s.bind((sys.argv[1],0));s.listen(256);s.settimeout(float(sys.argv[3]))\n"
    "print(s.getsockname()[1],flush=True)\n"
    "for _ in range(int(sys.argv[2])):\n"
    " c,_=s.accept();c.settimeout(float(sys.argv[3]))\n"
    " b=c.recv(1);c.sendall(b)\n"
    " while c.recv(4096):pass\n"
    " c.close()\n")
_PRIME_CLIENT = (  # each server at once (a thread each): a WAN round trip can be 1 s
    "import socket,sys,threading\n"
    "def one(a):\n"
    " ip,port=a.rsplit(':',1)\n"
    " c=socket.create_connection((ip,int(port)),timeout=float(sys.argv[1]))\n"
    " c.sendall(b'p');c.recv(1);c.shutdown(socket.SHUT_WR)\n"
    " while c.recv(4096):pass\n"
    " c.close()\n"
    "ts=[threading.Thread(target=one,args=(a,)) for a in sys.argv[2:]]\n"
    "[t.start() for t in ts];[t.join() for t in ts]\n")
_METRIC_CWND = re.compile(r"^(\S+) .*\bcwnd (\d+)")


def cached_cwnd_clamps(h: ExecHost) -> dict[str, int]:
    """{peer IP: cwnd} of the TCP metrics cache entries in host h (`ip tcp_metrics`)."""
    res = subprocess.run([*h.prefix, "ip", "tcp_metrics", "show"], capture_output=True,
                         text=True, timeout=10, check=False)
    out = {}
    for line in res.stdout.splitlines():
        m = _METRIC_CWND.match(line)
        if m:
            out[m.group(1)] = int(m.group(2))
    return out


def prime_window_clamps(pairs: Iterable[tuple[ExecHost, ExecHost]]) -> dict[str, int]:
    """One short TCP connection per host pair (client, server), closed gracefully, so
    that both hosts' TCP metrics caches hold the peer's route clamp before any training
    connection opens; the servers listen on ports the kernel picks. Returns, per host,
    how many peers its cache now holds a cwnd for. A pair that cannot be primed is
    logged and left: its flows run unclamped, as before."""
    by_server: dict[str, tuple[ExecHost, list[ExecHost]]] = {}
    for client, server in pairs:
        by_server.setdefault(server.name, (server, []))[1].append(client)
    hosts = {h.name: h for pair in by_server.values() for h in (pair[0], *pair[1])}
    procs: list[subprocess.Popen[Any]] = []  # every primer started, servers first
    to_reach: dict[str, tuple[ExecHost, list[str]]] = {}
    saved = {name: _sysctl(h, NO_METRICS_SAVE) for name, h in hosts.items()}
    try:
        for name, h in hosts.items():
            if saved[name] != "0":
                _sysctl(h, NO_METRICS_SAVE, "0")
        for server, clients in by_server.values():
            proc = subprocess.Popen([*server.prefix, sys.executable, "-c", _PRIME_SERVER,
                                     server.ip, str(len(clients)), str(PRIME_TIMEOUT_S)],
                                    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                    text=True)
            procs.append(proc)
            assert proc.stdout is not None
            port = proc.stdout.readline().strip()
            if not port.isdigit():
                log.warning("TCP clamp priming: no listener in %s", server.name)
                continue
            for client in clients:
                to_reach.setdefault(client.name, (client, []))[1].append(f"{server.ip}:{port}")
        for client, addrs in to_reach.values():
            procs.append(subprocess.Popen([*client.prefix, sys.executable, "-c", _PRIME_CLIENT,
                                           str(PRIME_TIMEOUT_S), *addrs],
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        for proc in reversed(procs):  # the clients, then the servers they closed on
            proc.wait(timeout=PRIME_TIMEOUT_S + 5)
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("TCP clamp priming stopped: %s", exc)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=5)
        for name, h in hosts.items():
            if saved[name] not in (None, "0"):
                _sysctl(h, NO_METRICS_SAVE, saved[name])
    return {name: len(cached_cwnd_clamps(h)) for name, h in sorted(hosts.items())}


def _sysctl(h: ExecHost, key: str, value: str | None = None) -> str | None:
    """Read (value None) or set a sysctl in host h's namespace; the value read, or None
    where it could not be read."""
    argv = ["sysctl", "-n", key] if value is None else ["sysctl", "-q", "-w", f"{key}={value}"]
    res = subprocess.run([*h.prefix, *argv], capture_output=True, text=True, timeout=10,
                         check=False)
    return res.stdout.strip() if value is None and res.returncode == 0 else value


def cross_dc_pairs(hosts_by_dc: Mapping[str, Sequence[ExecHost]]
                   ) -> list[tuple[ExecHost, ExecHost]]:
    """Every (client, server) pair of hosts in different DCs, each unordered pair once."""
    flat = [(dc, h) for dc, hs in sorted(hosts_by_dc.items()) for h in hs]
    return [(a, b) for i, (da, a) in enumerate(flat) for db, b in flat[i + 1:] if da != db]


TCP_COUNTERS = ("TcpRetransSegs", "TcpExtTCPTimeouts", "TcpExtTCPLossProbes")


def tcp_counters(hosts: Iterable[ExecHost]) -> dict[str, dict[str, int]]:
    """Per host: TCP retransmitted segments, RTO time-outs and loss probes (nstat)."""
    out: dict[str, dict[str, int]] = {}
    for h in hosts:
        try:
            res = subprocess.run([*h.prefix, "nstat", "-az", "--json", *TCP_COUNTERS],
                                 capture_output=True, text=True, timeout=10, check=True)
            kernel = json.loads(res.stdout).get("kernel", {})
            out[h.name] = {k: int(kernel.get(k, 0)) for k in TCP_COUNTERS}
        except (OSError, subprocess.SubprocessError, ValueError):
            continue
    return out


