"""Measurements inside the emulated network: ICMP ping, scapy lightpath probes, iperf3 goodput.

Sockets are opened inside a node's namespace (setns on this thread) and used from this
process, so no helper process or `ping` binary is needed.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import random
import select
import socket
import statistics
import struct
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from testbed.emu.forwarder import (
    _AUX,
    PACKET_AUXDATA,
    SOL_PACKET,
    TP_STATUS_VLAN_VALID,
)
from testbed.emu.netns import in_netns

log = logging.getLogger(__name__)

ETH_P_ALL = 0x0003
SO_TIMESTAMPNS = 35
_TS = struct.Struct("=qq")
_TS_SPACE = socket.CMSG_SPACE(_TS.size)
_ANC_SPACE = socket.CMSG_SPACE(_AUX.size) + _TS_SPACE


def kernel_stamp(anc: list[tuple[int, int, bytes]]) -> float:
    """CLOCK_REALTIME receive time from SO_TIMESTAMPNS ancillary data (now if absent)."""
    for level, typ, data in anc:
        if level == socket.SOL_SOCKET and typ == SO_TIMESTAMPNS and len(data) >= _TS.size:
            sec, nsec = _TS.unpack_from(data)
            return sec + nsec * 1e-9
    return time.time()


def _checksum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    s = sum(struct.unpack(f"!{len(data) // 2}H", data))
    s = (s >> 16) + (s & 0xFFFF)
    s += s >> 16
    return ~s & 0xFFFF


_IDENTS = itertools.count(random.randrange(1 << 16))
_IDENT_LOCK = threading.Lock()


def _next_ident() -> int:
    """An ICMP echo id of its own per ping (pings may run side by side in one namespace)."""
    with _IDENT_LOCK:
        return next(_IDENTS) & 0xFFFF


def icmp_ping(ns_path: str, dst_ip: str, count: int = 10, interval_s: float = 0.05,
              timeout_s: float = 2.0, size: int = 56) -> list[float | None]:
    """RTTs in ms (None for a lost echo) from the namespace at ns_path to dst_ip."""
    with in_netns(ns_path):
        sock = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
    # Kernel receive stamps, as ping(8) uses: a busy machine's wake-up delay of this
    # process is not part of the network's RTT.
    sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    ident = _next_ident()
    sent: dict[int, float] = {}
    rtts: dict[int, float] = {}
    try:
        next_send = time.monotonic()
        seq = 0
        last_deadline = None
        while True:
            now = time.monotonic()
            if seq < count and now >= next_send:
                payload = bytes(max(0, size))
                hdr = struct.pack("!BBHHH", 8, 0, 0, ident, seq)
                pkt = struct.pack("!BBHHH", 8, 0, _checksum(hdr + payload), ident, seq) + payload
                sent[seq] = time.time()
                sock.sendto(pkt, (dst_ip, 0))
                seq += 1
                next_send = now + interval_s
                if seq == count:
                    last_deadline = now + timeout_s
            if last_deadline is not None and (now >= last_deadline or len(rtts) == count):
                break
            wait = min(max(0.0, next_send - now) if seq < count else timeout_s, 0.05)
            r, _, _ = select.select([sock], [], [], wait)
            if not r:
                continue
            data, anc, _f, addr = sock.recvmsg(65535, _TS_SPACE)
            stamp = kernel_stamp(anc)
            ihl = (data[0] & 0x0F) * 4
            typ, _code, _ck, rid, rseq = struct.unpack_from("!BBHHH", data, ihl)
            if (typ == 0 and rid == ident and addr[0] == dst_ip and rseq in sent
                    and rseq not in rtts):
                rtts[rseq] = (stamp - sent[rseq]) * 1000.0
    finally:
        sock.close()
    return [rtts.get(i) for i in range(count)]


@dataclass(frozen=True)
class PingStats:
    sent: int
    received: int
    median_ms: float | None
    p99_ms: float | None
    min_ms: float | None

    @classmethod
    def of(cls, rtts: Sequence[float | None]) -> PingStats:
        got = sorted(r for r in rtts if r is not None)
        if not got:
            return cls(len(rtts), 0, None, None, None)
        p99 = got[min(len(got) - 1, int(0.99 * len(got)))]
        return cls(len(rtts), len(got), statistics.median(got), p99, got[0])


def sniff_socket(ns_path: str, ifname: str) -> socket.socket:
    """A raw AF_PACKET socket on ifname inside a namespace (sees both directions)."""
    with in_netns(ns_path):
        s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
        s.bind((ifname, ETH_P_ALL))
    s.setsockopt(SOL_PACKET, PACKET_AUXDATA, 1)  # 802.1Q tags arrive as metadata
    s.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    s.setblocking(False)
    return s


def recv_with_vlan(s: socket.socket) -> tuple[bytes, int | None, float]:
    """One frame, its VLAN id (tag in the data or PACKET_AUXDATA) and kernel rx time."""
    data, anc, _flags, _addr = s.recvmsg(65535, _ANC_SPACE)
    vlan = None
    for level, typ, aux in anc:
        if level == SOL_PACKET and typ == PACKET_AUXDATA and len(aux) >= _AUX.size:
            status, _l, _s, _m, _n, tci, _tpid = _AUX.unpack_from(aux)
            if status & TP_STATUS_VLAN_VALID:
                vlan = tci & 0x0FFF
    if vlan is None and len(data) >= 16 and data[12:14] == b"\x81\x00":
        vlan = int.from_bytes(data[14:16], "big") & 0x0FFF
    return data, vlan, kernel_stamp(anc)


@dataclass
class ProbeResult:
    vlan: int
    src: str
    dst: str
    delivered: bool
    one_way_ms: float | None
    expected_ms: float
    hops_seen: list[str]          # fibres (middle nodes) where the tagged probe was seen
    hops_expected: list[str]
    tag_ok: bool
    hop_ms: list[float] | None = None        # time from sending to each fibre's entry
    fibre_delay_ms: dict[str, float] | None = None  # entry -> exit of each middle node

    @property
    def ok(self) -> bool:
        return self.delivered and self.tag_ok and self.hops_seen == self.hops_expected


PROBE_MARK = b"LPPROBE"   # a probe's UDP payload: the mark, then its token
PROBE_TOKEN_BYTES = 8


def probe_frame(src_mac: str, src_ip: str, dst_mac: str, dst_ip: str, vlan: int,
                token: bytes) -> bytes:
    """A lightpath probe's frame (untagged: the ROADMs tag it with the lightpath's VLAN):
    UDP to port 9 (discard) from a port named by the VLAN, the payload PROBE_MARK + token."""
    from scapy.layers.inet import IP, UDP
    from scapy.layers.l2 import Ether

    return bytes(Ether(src=src_mac, dst=dst_mac) / IP(src=src_ip, dst=dst_ip, ttl=64)
                 / UDP(sport=40000 + vlan % 20000, dport=9) / (PROBE_MARK + token))


def lightpath_probe(src_ns: str, src_if: str, src_mac: str, src_ip: str,
                    dst_ns: str, dst_if: str, dst_mac: str, dst_ip: str, vlan: int,
                    hops: Sequence[tuple[str, ...]], expected_ms: float,
                    timeout_s: float = 3.0) -> ProbeResult:
    """Send one scapy UDP probe and follow it: tagged with `vlan` on every expected fibre.

    hops: (name, middle namespace path, interface the probe enters by[, interface it
    leaves by]). With both interfaces, kernel timestamps give each fibre's own delay,
    free of the switches' latency.
    """
    token = os.urandom(PROBE_TOKEN_BYTES)
    watch_in = {h[0]: sniff_socket(h[1], h[2]) for h in hops}
    watch_out = {h[0]: sniff_socket(h[1], h[3]) for h in hops if len(h) > 3}
    dst_sock = sniff_socket(dst_ns, dst_if)
    with in_netns(src_ns):
        tx = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
        tx.bind((src_if, ETH_P_ALL))
    frame = probe_frame(src_mac, src_ip, dst_mac, dst_ip, vlan, token)
    seen: dict[str, float] = {}
    left: dict[str, float] = {}
    tag_ok = True
    arrived: float | None = None
    roles = {s.fileno(): (n, seen) for n, s in watch_in.items()}
    roles.update({s.fileno(): (n, left) for n, s in watch_out.items()})
    socks = [*watch_in.values(), *watch_out.values(), dst_sock]
    t_send = time.time()
    tx.send(frame)
    deadline = time.monotonic() + timeout_s
    try:
        while arrived is None and time.monotonic() < deadline:
            r, _, _ = select.select(socks, [], [], 0.02)
            for s in r:
                while True:
                    try:
                        data, tag, stamp = recv_with_vlan(s)
                    except BlockingIOError:
                        break
                    if token not in data:
                        continue
                    if s is dst_sock:
                        arrived = arrived or stamp
                        continue
                    name, book = roles[s.fileno()]
                    if name not in book:
                        book[name] = stamp
                        if tag != vlan:
                            tag_ok = False
    finally:
        for s in [tx, *socks]:
            s.close()
    order = [n for n, _ in sorted(seen.items(), key=lambda kv: kv[1])]
    one_way = None if arrived is None else (arrived - t_send) * 1000.0
    hop_ms = [round((seen[n] - t_send) * 1000.0, 3) for n in order]
    fibre_ms = {n: round((left[n] - seen[n]) * 1000.0, 3) for n in order if n in left}
    return ProbeResult(vlan, src_ip, dst_ip, arrived is not None, one_way, expected_ms, order,
                       [h[0] for h in hops], tag_ok, hop_ms, fibre_ms)


@dataclass(frozen=True)
class IperfResult:
    goodput_mbps: float
    retransmits: int
    seconds: float
    raw: dict[str, object]


def parse_iperf3(out: str, warmup_s: float) -> IperfResult:
    """Receiver-side goodput after the warm-up (from --get-server-output intervals)."""
    data = json.loads(out)
    if "error" in data:
        raise RuntimeError(f"iperf3: {data['error']}")
    retrans = int(data.get("end", {}).get("sum_sent", {}).get("retransmits", 0) or 0)
    total_bytes, total_s = 0.0, 0.0
    for s in _receiver_intervals(data):
        if s["start"] >= warmup_s - 1e-6:
            total_bytes += s["bytes"]
            total_s += s["seconds"]
    if total_s <= 0:
        recv = data["end"]["sum_received"]
        return IperfResult(recv["bits_per_second"] / 1e6, retrans, recv["seconds"], data)
    return IperfResult(total_bytes * 8 / total_s / 1e6, retrans, total_s, data)


def iperf3_argv(dst_ip: str, seconds: float, port: int, udp_mbps: float | None = None,
                reverse: bool = False) -> list[str]:
    argv = ["iperf3", "-c", dst_ip, "-p", str(port), "-t", f"{seconds:g}", "-J",
            "--get-server-output", "-i", "0.5"]
    if udp_mbps is not None:
        argv += ["-u", "-b", f"{udp_mbps:g}M", "-l", "1200"]
    if reverse:
        argv.append("-R")
    return argv


SERVER_WAIT_S = 15.0


def _refused(out: str) -> bool:
    """iperf3 -J output of a client that found no server listening (yet)."""
    try:
        data = json.loads(out)
    except ValueError:
        return "Connection refused" in out or "unable to connect" in out
    err = str(data.get("error", "")) if isinstance(data, dict) else ""
    return "Connection refused" in err or "unable to connect" in err


def run_iperf3(server: list[str], client: list[str], dst_ip: str, seconds: float,
               warmup_s: float = 1.0, port: int = 5201, udp_mbps: float | None = None,
               timeout_s: float | None = None) -> IperfResult:
    """server/client: argv prefixes that run a command in each host (e.g. mnexec -a PID)."""
    srv = subprocess.Popen([*server, "iperf3", "-s", "-1", "-J", "-p", str(port), "-i", "0.5"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        out = ""
        # The server needs a moment to listen: on a busy machine (a VM booting beside a
        # run, measured: over 2 s) more than a moment; up to SERVER_WAIT_S in all.
        deadline = time.monotonic() + SERVER_WAIT_S
        while True:
            time.sleep(0.1)
            r = subprocess.run([*client, *iperf3_argv(dst_ip, seconds, port, udp_mbps)],
                               capture_output=True, text=True,
                               timeout=timeout_s or seconds + 30, check=False)
            out = r.stdout
            # Not the exit code: iperf3 3.12 with -J exits 0 when it cannot connect (its
            # JSON carries "error"), so a server not listening yet shows only there.
            if not _refused(out) or time.monotonic() > deadline:
                break
        return parse_iperf3(out, warmup_s)
    finally:
        if srv.poll() is None:
            srv.kill()
        srv.wait(timeout=5)


def _receiver_intervals(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The `sum` of each of the receiver's report intervals (--get-server-output)."""
    server = data.get("server_output_json")
    intervals = server.get("intervals") if isinstance(server, dict) else None
    return [iv["sum"] for iv in intervals or [] if isinstance(iv, dict) and "sum" in iv]


def interval_rates_mbps(data: dict[str, Any]) -> list[float]:
    """The receiver's rate in each of its report intervals (Mbit/s), in order: where a
    short goodput comes from (one slow interval: a stall; all of them: the rate)."""
    return [float(s["bytes"]) * 8 / float(s["seconds"]) / 1e6
            for s in _receiver_intervals(data) if s.get("seconds")]


def udp_loss(data: dict[str, object]) -> tuple[int, int]:
    """(lost, total) datagrams of a UDP iperf3 run (receiver's view)."""
    end = data["end"]
    assert isinstance(end, dict)
    s = end.get("sum_received") or end.get("sum")
    assert isinstance(s, dict)
    return int(s["lost_packets"]), int(s["packets"])
