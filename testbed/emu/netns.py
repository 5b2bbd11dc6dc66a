"""Network namespace switching for the calling thread (setns), and named namespaces.

Finding a run's processes by namespace is testbed.emu.nsref's (by held references, never
by a bare inode number)."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import subprocess
import threading
from collections.abc import Callable, Iterator
from typing import Any

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def setns(fd: int) -> None:
    """Move the calling thread into the network namespace open at `fd` (OSError)."""
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


def netns_path_of_pid(pid: int) -> str:
    return f"/proc/{pid}/ns/net"


def netns_inode(path: str) -> int:
    return os.stat(path).st_ino


@contextlib.contextmanager
def in_netns(path: str) -> Iterator[None]:
    """Run the block with this thread in the network namespace at path, then go back.

    Sockets created inside keep that namespace after the block.
    """
    back = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        target = os.open(path, os.O_RDONLY)
        try:
            setns(target)
        finally:
            os.close(target)
        try:
            yield
        finally:
            setns(back)
    finally:
        os.close(back)


def iproute_in(path: str) -> Any:
    """A pyroute2 IPRoute whose netlink socket lives in the network namespace at path
    (/proc/PID/ns/net or /run/netns/NAME): this thread enters it only to create the
    socket (in_netns). pyroute2's own NetNS forks a child for that and gives up when it
    does not answer within 2 s: on a loaded machine (a software-emulated VM at load 38)
    every fibre cut's netem change failed so, and the controller held its lock through
    the retries while the cut waited for it. No child, no signal, no wait here."""
    import socket

    from pyroute2 import IPRoute
    from pyroute2.netlink import NETLINK_ROUTE

    with in_netns(path):
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_ROUTE)
    try:
        return IPRoute(fileno=sock.detach())
    except BaseException:
        sock.close()
        raise


def enter_netns(path: str) -> int:
    """Move this thread into a namespace for good; returns an fd to return with."""
    back = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    target = os.open(path, os.O_RDONLY)
    try:
        setns(target)
    finally:
        os.close(target)
    return back


def leave_netns(back_fd: int) -> None:
    setns(back_fd)
    os.close(back_fd)


def enter_new_named(name: str, hold: Callable[[str], object]) -> int:
    """Move this thread into a new network namespace, let `hold(path)` take the caller's
    reference to it, and only then name it /run/netns/<name>; returns an fd back home.

    The order leaves nothing a kill can make unprovable (testbed.emu.nsref): before the
    hold the namespace dies with this thread; between hold and name it is only held;
    once named it is held too. (`ip netns add` first left a name without a hold when a
    run was SIGKILLed right after it, and `clean` rightly would not delete it.)"""
    back = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    if _libc.unshare(CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        os.close(back)
        raise OSError(err, f"unshare: {os.strerror(err)}")
    try:
        hold("/proc/thread-self/ns/net")
        subprocess.run(["ip", "netns", "attach", name, str(threading.get_native_id())],
                       check=True, capture_output=True)
    except BaseException:
        setns(back)
        os.close(back)
        raise
    return back
