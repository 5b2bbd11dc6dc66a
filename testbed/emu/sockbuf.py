"""Send buffers of the user-space switch's port sockets, sized to the queues behind them.

ovs-vswitchd's userspace datapath sends each port's frames through one AF_PACKET socket.
A frame sent stays charged to that socket until the port's qdisc has sent it, so the
socket's send buffer (net.core.wmem_default, 208 kB) caps what a shaped port can queue:
a 50 Mbit/s switch port whose HTB FIFOs hold 50 ms (312 kB each) queued at most ~200 kB
of frames' truesize, and ovs-vswitchd dropped the rest when the send failed. Those drops
are counted nowhere (not by tc, not in OVS's interface statistics): two rings sharing a
spine link retransmitted 3.4 % of their TCP segments with no drop in any counter
(docs/routing-testbed.md, "The switch's send buffers").

`size_send_buffers` takes a duplicate of each of those sockets from the switch process
(pidfd_getfd, Linux >= 5.6; the process is named by PID and start time, and pinned by its
pidfd while it is touched) and sets SO_SNDBUFFORCE, so that the qdisc, not the socket,
is the port's queue. Nothing else of the process is read or changed.
"""

from __future__ import annotations

import ctypes
import logging
import os
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass

log = logging.getLogger(__name__)

SO_SNDBUFFORCE = 32       # asm-generic/socket.h (socket module lacks it on 3.11)
SYS_PIDFD_GETFD = {"x86_64": 438, "aarch64": 438}  # the same on the generic table
SNDBUF_MAX_BYTES = 1 << 30  # the kernel keeps sk_sndbuf an int; far beyond any FIFO here


@dataclass(frozen=True)
class SizedSockets:
    """What size_send_buffers did: sockets set per interface name, those left alone."""

    sized: dict[str, int]        # ifname -> send buffer now (bytes, as the kernel keeps it)
    skipped: dict[str, str]      # ifname or fd -> why


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


def size_send_buffers(pid: int, start_ticks: int, want_bytes: Mapping[str, int],
                      start_ticks_of: Callable[[int], int | None] | None = None
                      ) -> SizedSockets:
    """Set the send buffer of each AF_PACKET socket of process `pid` bound to an
    interface in want_bytes to at least that many bytes (never lowered).

    The process must still be the one that started at start_ticks (checked after its
    pidfd is open, so the PID cannot be reused while the sockets are touched); else
    OSError and nothing changed."""
    if start_ticks_of is None:
        from testbed.emu.state import proc_start_ticks as start_ticks_of
    pidfd = os.pidfd_open(pid)
    sized: dict[str, int] = {}
    skipped: dict[str, str] = {}
    try:
        if start_ticks_of(pid) != start_ticks:
            raise OSError(f"process {pid} is not the switch this run started")
        for fd in _socket_fds(pid):
            try:
                local = _pidfd_getfd(pidfd, fd)
            except OSError as exc:
                skipped[f"fd {fd}"] = str(exc)
                continue
            sock = socket.socket(fileno=local)
            try:
                if sock.getsockopt(socket.SOL_SOCKET, socket.SO_DOMAIN) != socket.AF_PACKET:
                    continue
                ifname = sock.getsockname()[0]  # resolved in the socket's own namespace
                want = want_bytes.get(ifname)
                if want is None:
                    continue
                want = min(int(want), SNDBUF_MAX_BYTES)
                have = sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
                if have < want:  # the kernel doubles what it is given
                    sock.setsockopt(socket.SOL_SOCKET, SO_SNDBUFFORCE, (want + 1) // 2)
                sized[ifname] = sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
            except OSError as exc:
                skipped[f"fd {fd}"] = str(exc)
            finally:
                sock.close()  # our duplicate only: the switch's own fd stays open
    finally:
        os.close(pidfd)
    for ifname in want_bytes:
        if ifname not in sized:
            skipped.setdefault(ifname, "no packet socket of the switch is bound to it")
    return SizedSockets(sized, skipped)
