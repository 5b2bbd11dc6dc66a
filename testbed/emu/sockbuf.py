"""The user-space switch's packet sockets, sized so that the qdiscs, not the sockets, are
the ports' queues.

ovs-vswitchd's userspace datapath receives through one AF_PACKET socket per port but
sends every port's frames through a single unbound AF_PACKET socket. A frame sent stays
charged to that socket until the port's qdisc has sent it, so the socket's send buffer
(net.core.wmem_default, 208 kB) caps what ALL the shaped ports together can queue: at
50 Mbit/s, about 30 ms of one port's rate, where the HTB FIFOs behind it hold 50 ms per
class. When it is full, the send fails and ovs-vswitchd drops the frame, counted nowhere
(not by tc, not in OVS's interface statistics, no kernel drop reason): two all-reduce
rings sharing a spine link retransmitted 3.4 % of their TCP segments with no drop in any
counter (docs/routing-testbed.md, "The switch's send socket"). A port's receive socket
(net.core.rmem_default, 208 kB, which a network namespace cannot raise on these kernels)
overflows likewise when bursts of 64 kB GSO frames arrive while ovs-vswitchd's main
thread waits for a CPU: the kernel counts those drops only on the socket (up to 733 per
port in one WAN run, docs/workers.md).

`size_switch_buffers` takes a duplicate of each packet socket from the switch process
(pidfd_getfd, Linux >= 5.6; the process is named by PID and start time, and pinned by its
pidfd while it is touched) and sets SO_SNDBUFFORCE on the send socket and
SO_RCVBUFFORCE on the ports' receive sockets. Nothing else of the process is read or
changed; a buffer is never lowered.
"""

from __future__ import annotations

import ctypes
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass, field

SO_SNDBUFFORCE = 32       # asm-generic/socket.h (socket module lacks them on 3.11)
SO_RCVBUFFORCE = 33
SYS_PIDFD_GETFD = {"x86_64": 438, "aarch64": 438}  # the same on the generic table
BUF_MAX_BYTES = 1 << 30   # the kernel keeps sk_sndbuf/sk_rcvbuf an int; far beyond any need
# A port's receive buffer, at least: 64 GSO frames of 64 kB (their truesize), i.e. 670 ms
# of a 50 Mbit/s port or 34 ms at 1 Gbit/s, for the switch's main thread to get a CPU
# back. A limit, not memory taken: only frames waiting to be read are charged to it.
SWITCH_RCVBUF_BYTES = 4 << 20
# What one poll of the switch can hand to a port's peer before it reads that peer's socket:
# ovs-vswitchd reads up to NETDEV_MAX_BURST frames from each port per poll and sends them
# on at once; between two bridges of the one process (a DC switch and its ROADM), a veth
# delivers them straight into the other bridge's receive socket.
NETDEV_MAX_BURST = 32
GSO_TRUESIZE_BYTES = 72 << 10  # a 64 kB GSO frame as the socket is charged for it (<= 72 kB)


def switch_rcvbuf_bytes(fan_in: int) -> int:
    """A port's receive buffer when up to `fan_in` other ports of a bridge forward into it:
    two of the switch's polls of them (one left unread while the next is sent), each
    NETDEV_MAX_BURST GSO frames per port; never below SWITCH_RCVBUF_BYTES.

    4 MiB was one poll of two ports (2 x 32 x 64 kB, by truesize a little more): a DC
    switch with two hosts overflowed its ROADM port's socket with 130-2434 frames per run
    (calib-bandwidth-gpipe, 2026-12-03), only there."""
    if fan_in < 0:
        raise ValueError(f"fan_in {fan_in} < 0")
    return min(BUF_MAX_BYTES,
               max(SWITCH_RCVBUF_BYTES, 2 * fan_in * NETDEV_MAX_BURST * GSO_TRUESIZE_BYTES))


@dataclass(frozen=True)
class SizedSockets:
    """What size_switch_buffers did: the send sockets' send buffers now and the port
    sockets' receive buffers now (bytes, as the kernel keeps them, by the switch's fd
    number), and the sockets it could not touch (why)."""

    sized: dict[int, int]
    skipped: dict[int, str]
    received: dict[int, int] = field(default_factory=dict)


def _pidfd_getfd(pidfd: int, fd: int) -> int:
    nr = SYS_PIDFD_GETFD.get(os.uname().machine)
    if nr is None:
        raise OSError(f"pidfd_getfd: no syscall number for {os.uname().machine}")
    libc = ctypes.CDLL(None, use_errno=True)
    got = libc.syscall(ctypes.c_long(nr), ctypes.c_int(pidfd), ctypes.c_int(fd),
                       ctypes.c_uint(0))
    if got < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"pidfd_getfd: {os.strerror(err)}")
    return int(got)


def _socket_fds(pid: int) -> list[int]:
    """The process's file descriptors that are sockets (from /proc, links not followed
    beyond reading their target's name)."""
    out = []
    base = f"/proc/{pid}/fd"
    for name in os.listdir(base):
        try:
            if os.readlink(f"{base}/{name}").startswith("socket:"):
                out.append(int(name))
        except (OSError, ValueError):
            continue  # closed meanwhile
    return sorted(out)


def _grow(sock: socket.socket, get: int, force: int, want: int) -> int:
    """The buffer `get` of sock, raised to at least want through `force` (never lowered;
    the kernel doubles what it is given)."""
    if sock.getsockopt(socket.SOL_SOCKET, get) < want:
        sock.setsockopt(socket.SOL_SOCKET, force, (want + 1) // 2)
    return int(sock.getsockopt(socket.SOL_SOCKET, get))


def size_switch_buffers(pid: int, start_ticks: int, send_bytes: int, recv_bytes: int = 0,
                        start_ticks_of: Callable[[int], int | None] | None = None
                        ) -> SizedSockets:
    """Raise the buffers of process `pid`'s AF_PACKET sockets: the send buffer of those
    bound to no interface (ovs-vswitchd sends every port's frames through one such
    socket) to at least send_bytes, and the receive buffer of those bound to a port (one
    per port, which it receives on) to at least recv_bytes; 0 leaves that kind alone.

    The process must still be the one that started at start_ticks (checked after its
    pidfd is open, so the PID cannot be reused while its sockets are touched); else
    OSError and nothing changed. No send socket yet (nothing sent so far): empty `sized`."""
    if start_ticks_of is None:
        from testbed.emu.state import proc_start_ticks as start_ticks_of
    send_want = min(int(send_bytes), BUF_MAX_BYTES)
    recv_want = min(int(recv_bytes), BUF_MAX_BYTES)
    pidfd = os.pidfd_open(pid)
    sized: dict[int, int] = {}
    received: dict[int, int] = {}
    skipped: dict[int, str] = {}
    try:
        if start_ticks_of(pid) != start_ticks:
            raise OSError(f"process {pid} is not the switch this run started")
        for fd in _socket_fds(pid):
            try:
                local = _pidfd_getfd(pidfd, fd)
            except OSError as exc:
                skipped[fd] = str(exc)
                continue
            try:
                sock = socket.socket(fileno=local)
            except OSError as exc:  # a family Python cannot wrap: not ours to touch
                os.close(local)
                skipped[fd] = str(exc)
                continue
            try:
                if sock.getsockopt(socket.SOL_SOCKET, socket.SO_DOMAIN) != socket.AF_PACKET:
                    continue
                if sock.getsockname()[0]:  # bound to a port: receives only
                    if recv_want:
                        received[fd] = _grow(sock, socket.SO_RCVBUF, SO_RCVBUFFORCE,
                                             recv_want)
                elif send_want:
                    sized[fd] = _grow(sock, socket.SO_SNDBUF, SO_SNDBUFFORCE, send_want)
            except OSError as exc:
                skipped[fd] = str(exc)
            finally:
                sock.close()  # our duplicate only: the switch's own fd stays open
    finally:
        os.close(pidfd)
    return SizedSockets(sized, skipped, received)
