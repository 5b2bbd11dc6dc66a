"""User-space fibre emulator: rate, FIFO, delay, loss and per-VLAN caps between two veths.

Runs as its own process inside a fibre's middle network namespace (see docs/emulation.md):

    python -m testbed.emu.forwarder --if-a A --if-b B --rate-mbps 100 --delay-ms 20 \
        [--loss 0.01] [--queue-bytes N] [--vlan 101=50] [--control SOCK] [--seed 1]

Per direction a frame goes through (1) its lightpath's pacer if its 802.1Q VLAN id has a
cap (rate, byte limit, tail drop; the frame is done when the lightpath's rate has sent its
last bit, store-and-forward), (2) the fibre's serialiser at the fibre rate (byte
limit, tail drop), (3) an optional random loss, (4) a constant propagation delay.
Frames are read and written with AF_PACKET + PACKET_VNET_HDR so GSO super-frames pass
whole (5x less CPU); their wire size counts every segment's headers.

Control channel (unix socket, JSON lines, one reply line per request):
    {"vlan": 101, "rate_mbps": 100}     add or change a lightpath cap
    {"vlan": 101, "remove": true}       remove it
    {"cmd": "set", "rate_mbps": .., "delay_ms": .., "loss": .., "down": false}
    {"cmd": "vlan_delay", "vlan": 101, "correction_ms": 0.4}   that lightpath's frames
                                        run at delay_ms - correction_ms (delay calibration)
    {"cmd": "stats"}                    counters per direction and per VLAN
    {"cmd": "ping"}
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import errno
import json
import logging
import math
import os
import random
import select
import signal
import socket
import struct
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from testbed.emu import priority
from testbed.emu.slack import SlackHistogram

log = logging.getLogger("lightpipe.forwarder")

ETH_P_ALL = 0x0003
SOL_PACKET = 263
PACKET_VNET_HDR = 15
PACKET_IGNORE_OUTGOING = 23
PACKET_AUXDATA = 8
PACKET_STATISTICS = 6
_PSTATS = struct.Struct("=II")  # tp_packets, tp_drops (reading resets them)
TP_STATUS_VLAN_VALID = 0x10
TP_STATUS_VLAN_TPID_VALID = 0x40
_AUX = struct.Struct("=IIIHHHH")  # status, len, snaplen, mac, net, vlan_tci, vlan_tpid
SO_TIMESTAMPNS = 35
_TS = struct.Struct("=qq")
_ANC_SPACE = socket.CMSG_SPACE(_AUX.size) + socket.CMSG_SPACE(_TS.size)
# Release timing (delay counts from each frame's kernel receive stamp; issue 28): the loop
# asks select() to wake this much before the next frame is due, learns how late its timed
# wake-ups really come (WakeLead) and polls the last stretch, so that a frame leaves at
# its stamp + delay whether the forwarder was asleep (sparse traffic) or busy (dense).
EARLY_S = 0.0001           # the wake lead to start with
MIN_LEAD_S = 0.00002       # bounds of the learnt lead (the poll costs at most this per wake)
MAX_LEAD_S = 0.0002
RELEASE_EARLY_S = 0.00001  # frames due within this are sent now (one loop pass)
VNET_HDR_LEN = 10
_VNET = struct.Struct("<BBHHHH")  # flags, gso_type, hdr_len, gso_size, csum_start, csum_off
GSO_NONE = 0
MIN_QUEUE_BYTES = 256 * 1024
MAX_BATCH = 256


MAX_RATE_MBPS = 1e9        # a control request's rate_mbps: finite, > 0 and at most this
MAX_DELAY_MS = 1e9         # delay_ms / correction_ms: finite, at most this (11.6 days)
MAX_QUEUE_BYTES = 1 << 30  # queue_bytes / limit_bytes


def bounded(name: str, value: object, low: float, high: float) -> float:
    """`value` as a finite float in [low, high]; ValueError naming the field otherwise
    (a control request's numbers reach the loop's timers and queues)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"{name} must be a number, got {value!r}"[:200])
    try:
        x = float(value)
    except ValueError:
        raise ValueError(f"{name} must be a number, got {value!r}"[:200]) from None
    if not (math.isfinite(x) and low <= x <= high):
        raise ValueError(f"{name} must be a finite number in [{low:g}, {high:g}], got {x!r}")
    return x


def default_queue_bytes(rate_mbps: float, delay_ms: float) -> int:
    """Bandwidth x round-trip delay (TCP keeps the link busy), at least 256 KiB."""
    bdp = rate_mbps * 1e6 / 8 * (2 * delay_ms / 1000.0)
    return max(MIN_QUEUE_BYTES, int(bdp))


def frame_vlan(frame: bytes) -> int | None:
    """802.1Q VLAN id of a frame read with a vnet header, or None if untagged."""
    off = VNET_HDR_LEN + 12
    if len(frame) >= off + 4 and frame[off] == 0x81 and frame[off + 1] == 0x00:
        return ((frame[off + 2] << 8) | frame[off + 3]) & 0x0FFF
    return None


def retag(frame: bytes, tci: int, tpid: int) -> bytes:
    """Put back the 802.1Q tag the kernel moved into metadata (offsets in the vnet header
    shift by 4 bytes)."""
    flags, gso_type, hdr_len, gso_size, csum_start, csum_off = _VNET.unpack_from(frame, 0)
    if flags & 1:
        csum_start += 4
    if gso_type != GSO_NONE:
        hdr_len += 4
    vnet = _VNET.pack(flags, gso_type, hdr_len, gso_size, csum_start, csum_off)
    e = VNET_HDR_LEN + 12
    return vnet + frame[VNET_HDR_LEN:e] + struct.pack("!HH", tpid, tci) + frame[e:]


def wire_bytes(frame: bytes) -> tuple[int, int]:
    """(bytes on the wire, segments) of a frame with its vnet header (GSO counted out)."""
    length = len(frame) - VNET_HDR_LEN
    if length <= 0:
        return 0, 0
    _flags, gso_type, hdr_len, gso_size, csum_start, _ = _VNET.unpack_from(frame, 0)
    if gso_type == GSO_NONE or gso_size == 0:
        return length, 1
    # csum_start points at the L4 header; add the TCP header length (data offset).
    hdr = hdr_len
    tcp_off = VNET_HDR_LEN + csum_start + 12
    if csum_start and tcp_off < len(frame):
        hdr = csum_start + (frame[tcp_off] >> 4) * 4
    payload = max(0, length - hdr)
    segs = max(1, -(-payload // gso_size))
    return length + (segs - 1) * hdr, segs


@dataclass
class VlanClass:
    """A lightpath's cap on one fibre direction: a pacer with a byte limit."""

    rate_bps: float
    limit_bytes: int
    next_s: float = 0.0
    correction_s: float = 0.0  # this lightpath runs at the fibre delay less this
    # Its own delay line when correction_s != 0 (a line stays sorted by due time only
    # while all its frames have the same delay).
    line: collections.deque[tuple[float, bytes]] | None = None
    queue: collections.deque[tuple[float, bytes, int, int]] = field(
        default_factory=collections.deque)
    queued_bytes: int = 0
    bytes: int = 0
    packets: int = 0
    drops: int = 0


@dataclass
class Direction:
    """One direction of the fibre: VLAN pacers, serialiser, loss, delay line."""

    name: str
    out: socket.socket
    fibre_next_s: float = 0.0
    delay_line: collections.deque[tuple[float, bytes]] = field(
        default_factory=collections.deque)
    vlans: dict[int, VlanClass] = field(default_factory=dict)
    rx_packets: int = 0
    rx_bytes: int = 0
    tx_packets: int = 0
    tx_bytes: int = 0
    tx_segments: int = 0
    queue_drops: int = 0
    loss_drops: int = 0
    down_drops: int = 0
    send_errors: int = 0
    socket_drops: int = 0  # frames the kernel dropped before this process read them
    # Counters of the lightpath caps removed (a job's lightpath released before the run
    # reads its counters): their drops are the model's and must still be counted.
    released_caps: int = 0
    released_drops: int = 0
    released_packets: int = 0
    released_bytes: int = 0
    released_max_rate_bps: float = 0.0


@dataclass
class WakeLead:
    """How long before a due frame the loop asks to wake: a running estimate of the ~90th
    percentile of timed wake-up lateness (mean + 1.5 x mean deviation), within bounds."""

    lead_s: float = EARLY_S
    mean_s: float = EARLY_S / 2
    dev_s: float = EARLY_S / 4
    gain: float = 0.05

    def learn(self, late_s: float) -> None:
        """A timed wake-up came late_s after it was asked for."""
        late_s = min(max(late_s, 0.0), 0.01)  # a rare long stall must not set the lead
        self.dev_s += self.gain * (abs(late_s - self.mean_s) - self.dev_s)
        self.mean_s += self.gain * (late_s - self.mean_s)
        self.lead_s = min(MAX_LEAD_S, max(MIN_LEAD_S, self.mean_s + 1.5 * self.dev_s))


class Forwarder:
    """The event loop: read both veths, shape, delay, write to the other side."""

    def __init__(self, if_a: str, if_b: str, rate_mbps: float, delay_ms: float,
                 loss: float = 0.0, queue_bytes: int | None = None, seed: int = 1,
                 control: str | None = None) -> None:
        self.rate_bps = rate_mbps * 1e6
        self.delay_s = delay_ms / 1000.0
        self.loss = loss
        self.queue_bytes = queue_bytes or default_queue_bytes(rate_mbps, delay_ms)
        self.down = False
        self.rng = random.Random(seed)
        self.sock_a = _packet_socket(if_a)
        self.sock_b = _packet_socket(if_b)
        self.dirs = {self.sock_a.fileno(): Direction("a_to_b", self.sock_b),
                     self.sock_b.fileno(): Direction("b_to_a", self.sock_a)}
        self.socks = {self.sock_a.fileno(): self.sock_a, self.sock_b.fileno(): self.sock_b}
        self.control_path = control
        self.control: socket.socket | None = None
        self.clients: dict[int, tuple[socket.socket, bytearray]] = {}
        if control:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(control)
            self.control = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.control.bind(control)
            self.control.listen(8)
            self.control.setblocking(False)
        self.running = True
        self.wake = WakeLead()
        self.slack = SlackHistogram()  # how late timed select() wake-ups came (s)

    # -- lightpath caps ------------------------------------------------------------
    def set_vlan(self, vlan: int, rate_mbps: float, limit_bytes: int | None = None) -> None:
        if not 1 <= vlan <= 4094 or not (math.isfinite(rate_mbps)
                                         and 0 < rate_mbps <= MAX_RATE_MBPS):
            raise ValueError(f"bad lightpath cap vlan={vlan} rate_mbps={rate_mbps}")
        if limit_bytes is not None:
            limit_bytes = int(bounded("limit_bytes", limit_bytes, 1500, MAX_QUEUE_BYTES))
        limit = limit_bytes or default_queue_bytes(rate_mbps, self.delay_s * 1000)
        for d in self.dirs.values():
            cls = d.vlans.get(vlan)
            if cls is None:
                d.vlans[vlan] = VlanClass(rate_mbps * 1e6, limit)
            else:
                cls.rate_bps, cls.limit_bytes = rate_mbps * 1e6, limit

    def remove_vlan(self, vlan: int) -> None:
        for d in self.dirs.values():
            cls = d.vlans.pop(vlan, None)
            if cls is not None:
                d.released_caps += 1
                d.released_drops += cls.drops
                d.released_packets += cls.packets
                d.released_bytes += cls.bytes
                d.released_max_rate_bps = max(d.released_max_rate_bps, cls.rate_bps)
                now = time.monotonic()  # frames already paced go on to the fibre
                for _, frame, wire, segs in cls.queue:
                    self._to_fibre(d, frame, wire, segs, now)
                if cls.line:  # frames already on the fibre keep their due times
                    d.delay_line.extend(cls.line)
                    d.delay_line = collections.deque(sorted(d.delay_line, key=lambda x: x[0]))

    # -- data path -------------------------------------------------------------------
    def set_vlan_correction(self, vlan: int, correction_ms: float) -> None:
        """Frames of this lightpath run at the fibre's delay less correction_ms."""
        classes = [d.vlans.get(vlan) for d in self.dirs.values()]
        if any(c is None for c in classes):
            raise ValueError(f"no lightpath cap for vlan {vlan} on this fibre")
        for c in classes:
            assert c is not None
            c.correction_s = float(correction_ms) / 1000.0
            if c.line is None:
                c.line = collections.deque()

    def _to_fibre(self, d: Direction, frame: bytes, wire: int, segs: int, at_s: float,
                  cls: VlanClass | None = None) -> None:
        if self.down:
            d.down_drops += segs
            return
        start = max(at_s, d.fibre_next_s)
        if (start - at_s) * self.rate_bps / 8 + wire > self.queue_bytes:
            d.queue_drops += segs
            return
        done = start + wire * 8 / self.rate_bps
        d.fibre_next_s = done
        # Loss acts on whole (GSO) frames with the per-segment probability: the mean
        # segment loss is `loss`; a lost super-frame costs all its segments at once.
        if self.loss and self.rng.random() < self.loss:
            d.loss_drops += segs
            return
        if cls is not None and cls.line is not None:
            cls.line.append((done + max(0.0, self.delay_s - cls.correction_s), frame))
        else:
            d.delay_line.append((done + self.delay_s, frame))
        d.tx_segments += segs

    def _arrive(self, d: Direction, frame: bytes, now: float) -> None:
        wire, segs = wire_bytes(frame)
        if wire == 0:
            return
        d.rx_packets += 1
        d.rx_bytes += wire
        vlan = frame_vlan(frame) if d.vlans else None
        cls = d.vlans.get(vlan) if vlan is not None else None
        if cls is None:
            self._to_fibre(d, frame, wire, segs, now)
            return
        start = max(now, cls.next_s)
        if (start - now) * cls.rate_bps / 8 + wire > cls.limit_bytes:
            cls.drops += segs
            return
        end = start + wire * 8 / cls.rate_bps
        cls.next_s = end
        cls.bytes += wire
        cls.packets += 1
        # The lightpath serialises the frame at its own rate: its last bit leaves at
        # `end`, the FIFO link's store-and-forward time that the simulator times. So it
        # goes to the fibre's serialiser when, at the fibre's rate, it would be done at
        # `end` (handed over at `start` instead, a frame faster than its lightpath
        # reached the far end early by its own serialisation: a 64 kB GSO frame at 25
        # Mbit/s, 20 ms).
        hand = max(start, end - wire * 8 / self.rate_bps)
        if hand <= now and not cls.queue:
            self._to_fibre(d, frame, wire, segs, now, cls)
        else:
            cls.queue.append((hand, frame, wire, segs))
            cls.queued_bytes += wire

    def _service(self, now: float) -> float:
        """Move due frames along; return the time of the next due event (or inf)."""
        nxt = float("inf")
        for d in self.dirs.values():
            for cls in d.vlans.values():
                q = cls.queue
                while q and q[0][0] <= now:
                    at, frame, wire, segs = q.popleft()
                    cls.queued_bytes -= wire
                    self._to_fibre(d, frame, wire, segs, at, cls)
                if q:
                    nxt = min(nxt, q[0][0])
                if cls.line:
                    nxt = min(nxt, self._send_due(d, cls.line, now))
            if d.delay_line:
                nxt = min(nxt, self._send_due(d, d.delay_line, now))
        return nxt

    def _send_due(self, d: Direction, line: collections.deque[tuple[float, bytes]],
                  now: float) -> float:
        """Send the line's frames due by now; the due time of its next one (or inf)."""
        send = d.out.send
        while line and line[0][0] <= now:
            _, frame = line.popleft()
            try:
                send(frame)
                d.tx_packets += 1
                d.tx_bytes += len(frame) - VNET_HDR_LEN
            except OSError:
                d.send_errors += 1
        return line[0][0] if line else float("inf")

    def _read(self, fd: int) -> None:
        sock = self.socks[fd]
        d = self.dirs[fd]
        now = time.monotonic()
        # Kernel receive stamps are CLOCK_REALTIME; the delay counts from them, so the
        # time a frame waits for this process to wake up is not added to the fibre delay.
        real_to_mono = now - time.time()
        for _ in range(MAX_BATCH):
            try:
                frame, anc, _flags, _addr = sock.recvmsg(65600, _ANC_SPACE,
                                                         socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # interface gone: the network is being torn down
                if exc.errno == errno.ENETDOWN:  # link down (a fibre cut): keep running
                    return
                log.warning("recv on %s failed: %s", d.name, exc)
                self.running = False
                return
            at = now
            for level, typ, data in anc:
                if level == socket.SOL_SOCKET and typ == SO_TIMESTAMPNS:
                    sec, nsec = _TS.unpack_from(data)
                    at = min(now, sec + nsec * 1e-9 + real_to_mono)
                elif level == SOL_PACKET and typ == PACKET_AUXDATA and len(data) >= _AUX.size:
                    status, _l, _s, _m, _n, tci, tpid = _AUX.unpack_from(data)
                    if status & TP_STATUS_VLAN_VALID:
                        if not status & TP_STATUS_VLAN_TPID_VALID:
                            tpid = 0x8100
                        frame = retag(frame, tci, tpid)
            self._arrive(d, frame, at)

    # -- control channel ---------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "rate_mbps": self.rate_bps / 1e6, "delay_ms": self.delay_s * 1000,
            "loss": self.loss, "queue_bytes": self.queue_bytes, "down": self.down,
            "directions": {}}
        now = time.monotonic()
        for fd, d in self.dirs.items():
            d.socket_drops += _socket_drops(self.socks[fd])
            out["directions"][d.name] = {
                "rx_packets": d.rx_packets, "rx_bytes": d.rx_bytes,
                "tx_packets": d.tx_packets, "tx_bytes": d.tx_bytes,
                "tx_segments": d.tx_segments, "queue_drops": d.queue_drops,
                "loss_drops": d.loss_drops, "down_drops": d.down_drops,
                "send_errors": d.send_errors, "socket_drops": d.socket_drops,
                "queue_depth_bytes": int(max(0.0, d.fibre_next_s - now) * self.rate_bps / 8),
                "in_flight_frames": len(d.delay_line) + sum(
                    len(c.line or ()) for c in d.vlans.values()),
                "vlans": {str(v): {"rate_mbps": c.rate_bps / 1e6, "bytes": c.bytes,
                                   "delay_correction_ms": c.correction_s * 1000,
                                   "packets": c.packets, "drops": c.drops,
                                   "queue_depth_bytes": c.queued_bytes}
                          for v, c in d.vlans.items()},
                "released_lightpaths": {
                    "caps": d.released_caps, "drops": d.released_drops,
                    "packets": d.released_packets, "bytes": d.released_bytes,
                    "max_rate_mbps": d.released_max_rate_bps / 1e6}}
        out["timer_slack"] = self.slack.as_record()
        return out

    def handle(self, req: dict[str, Any]) -> dict[str, Any]:
        cmd = req.get("cmd")
        if cmd == "ping":
            return {"ok": True, "pid": os.getpid()}
        if cmd == "stats":
            return {"ok": True, "stats": self.stats()}
        if cmd == "set":
            if "rate_mbps" in req:
                rate = bounded("rate_mbps", req["rate_mbps"], 0.0, MAX_RATE_MBPS)
                if not rate > 0:
                    raise ValueError("rate_mbps must be > 0")
                self.rate_bps = rate * 1e6
            if "delay_ms" in req:
                self.delay_s = bounded("delay_ms", req["delay_ms"], 0.0, MAX_DELAY_MS) / 1000.0
            if "loss" in req:
                self.loss = bounded("loss", req["loss"], 0.0, 1.0)
            if "queue_bytes" in req:
                self.queue_bytes = int(bounded("queue_bytes", req["queue_bytes"], 1500,
                                               MAX_QUEUE_BYTES))
            if "down" in req:
                self.down = bool(req["down"])
            return {"ok": True}
        if cmd == "vlan_delay":
            self.set_vlan_correction(int(req["vlan"]), bounded(
                "correction_ms", req["correction_ms"], -MAX_DELAY_MS, MAX_DELAY_MS))
            return {"ok": True}
        if "vlan" in req:
            vlan = int(req["vlan"])
            if req.get("remove"):
                self.remove_vlan(vlan)
            else:
                self.set_vlan(vlan, bounded("rate_mbps", req["rate_mbps"], 0.0, MAX_RATE_MBPS),
                              req.get("limit_bytes"))
            return {"ok": True}
        raise ValueError(f"unknown request {req!r}")

    def _control_accept(self) -> None:
        assert self.control is not None
        with contextlib.suppress(BlockingIOError):
            conn, _ = self.control.accept()
            conn.setblocking(False)
            self.clients[conn.fileno()] = (conn, bytearray())

    def _control_read(self, fd: int) -> None:
        conn, buf = self.clients[fd]
        try:
            data = conn.recv(65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            conn.close()
            del self.clients[fd]
            return
        buf += data
        while b"\n" in buf:
            line, _, rest = bytes(buf).partition(b"\n")
            buf[:] = rest
            try:
                reply = self.handle(json.loads(line))
            except (ValueError, KeyError, TypeError) as exc:
                reply = {"ok": False, "error": str(exc)}
            with contextlib.suppress(OSError):
                conn.setblocking(True)
                conn.sendall(json.dumps(reply).encode() + b"\n")
                conn.setblocking(False)

    # -- loop ------------------------------------------------------------------------
    def run(self) -> None:
        data_fds = list(self.socks)
        while self.running:
            now = time.monotonic()
            nxt = self._service(now + RELEASE_EARLY_S)
            # Wake the learnt lead before the next due frame, then poll (timeout 0) until
            # it is due. Bounded so a signal (running = False) is noticed even when idle.
            wake = nxt - self.wake.lead_s
            timeout = min(0.2, max(0.0, wake - time.monotonic()))
            fds = data_fds + ([self.control.fileno()] if self.control else []) + list(
                self.clients)
            try:
                readable, _, _ = select.select(fds, [], [], timeout)
            except InterruptedError:
                continue
            if not readable and 0.0 < timeout < 0.2:  # a timed wake-up: how late it came
                late = time.monotonic() - wake
                self.slack.observe(late)
                self.wake.learn(late)
            elif readable and 0.0 < timeout < 0.2:  # woken by a frame: late only if the
                late = time.monotonic() - wake    # deadline had passed (a starved loop)
                if late > 0:
                    self.slack.observe(late)
            for fd in readable:
                if fd in self.socks:
                    self._read(fd)
                elif self.control is not None and fd == self.control.fileno():
                    self._control_accept()
                elif fd in self.clients:
                    self._control_read(fd)
        self.close()

    def close(self) -> None:
        for s in self.socks.values():
            s.close()
        for conn, _ in self.clients.values():
            conn.close()
        if self.control is not None:
            self.control.close()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.control_path or "")


def _socket_drops(sock: socket.socket) -> int:
    """Frames the kernel dropped on this packet socket since the last call (its receive
    buffer was full: this process did not read in time); 0 where unreadable."""
    try:
        _packets, drops = _PSTATS.unpack(sock.getsockopt(SOL_PACKET, PACKET_STATISTICS,
                                                         _PSTATS.size))
    except OSError:
        return 0
    return int(drops)


def _packet_socket(ifname: str) -> socket.socket:
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    s.setsockopt(SOL_PACKET, PACKET_VNET_HDR, 1)
    s.setsockopt(SOL_PACKET, PACKET_IGNORE_OUTGOING, 1)
    s.setsockopt(SOL_PACKET, PACKET_AUXDATA, 1)  # the kernel strips 802.1Q tags into it
    s.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    for opt in (33, 32):  # SO_RCVBUFFORCE, SO_SNDBUFFORCE: need CAP_NET_ADMIN (root)
        try:
            s.setsockopt(socket.SOL_SOCKET, opt, 64 * 1024 * 1024)
        except PermissionError:
            s.setsockopt(socket.SOL_SOCKET, opt - 25, 8 * 1024 * 1024)
    s.bind((ifname, ETH_P_ALL))
    return s


def control_request(path: str, req: dict[str, Any], timeout_s: float = 5.0) -> dict[str, Any]:
    """Send one JSON request to a forwarder's control socket and return its reply."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout_s)
        s.connect(path)
        s.sendall(json.dumps(req).encode() + b"\n")
        return read_reply(s)


def read_reply(s: socket.socket) -> dict[str, Any]:
    """The JSON object a control socket answers with: one line, read until its newline
    (or until the server closes)."""
    buf = b""
    while not buf.endswith(b"\n"):
        chunk = s.recv(65536)
        if not chunk:
            break
        buf += chunk
    reply: dict[str, Any] = json.loads(buf)
    return reply


def _vlan_arg(text: str) -> tuple[int, float]:
    vlan, _, rate = text.partition("=")
    return int(vlan), float(rate)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="lightpipe-forwarder", description=__doc__.splitlines()[0])
    p.add_argument("--if-a", required=True)
    p.add_argument("--if-b", required=True)
    p.add_argument("--rate-mbps", type=float, required=True)
    p.add_argument("--delay-ms", type=float, default=0.0)
    p.add_argument("--loss", type=float, default=0.0, help="drop probability, 0..1")
    p.add_argument("--queue-bytes", type=int, default=None)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--vlan", type=_vlan_arg, action="append", default=[],
                   metavar="VID=MBPS", help="lightpath cap (repeatable)")
    p.add_argument("--control", default=None, help="unix socket for JSON-line control")
    p.add_argument("--metrics-port", type=int, default=None,
                   help="serve Prometheus metrics on this port (inside the namespace)")
    p.add_argument("--ready-file", default=None, help="touch this file once the loop runs")
    p.add_argument("--name", default="", help="fibre name for metric labels, e.g. 1-2")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s forwarder %(message)s")
    try:
        bounded("--rate-mbps", args.rate_mbps, 0.0, MAX_RATE_MBPS)
        bounded("--delay-ms", args.delay_ms, 0.0, MAX_DELAY_MS)
        bounded("--loss", args.loss, 0.0, 1.0)
    except ValueError as exc:
        p.error(str(exc))
    if not args.rate_mbps > 0:
        p.error("--rate-mbps must be > 0")
    fwd = Forwarder(args.if_a, args.if_b, args.rate_mbps, args.delay_ms, args.loss,
                    args.queue_bytes, args.seed, args.control)
    for vlan, rate in args.vlan:
        fwd.set_vlan(vlan, rate)
    if args.metrics_port:
        from testbed.emu.fwdmetrics import serve_metrics

        serve_metrics(fwd, args.metrics_port, args.name)

    def _stop(_sig: int, _frm: object) -> None:
        fwd.running = False

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    priority.raise_priority(0, 10)  # this thread: not the metrics thread started above
    if args.ready_file:
        with open(args.ready_file, "w", encoding="utf-8") as fh:
            fh.write(str(os.getpid()))
    fwd.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
