"""testbed.emu.sockbuf: another process's send socket's buffer, by PID and start time."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from testbed.emu.fabric import (
    MIN_SWITCH_SNDBUF_BYTES,
    SOCKET_TRUESIZE_FACTOR,
    switch_fifo_bytes,
    switch_sndbuf_bytes,
    switch_socket_sndbuf_bytes,
)
from testbed.emu.sockbuf import size_send_buffers
from testbed.emu.state import proc_start_ticks

# A child holding sockets as ovs-vswitchd does (an unbound AF_PACKET socket it sends
# through, one bound to a port it receives on) and a UDP socket; each line it reads makes
# it print the three sockets' send buffers as the kernel keeps them.
CHILD = """
import socket, sys
send = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
port = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
port.bind(("lo", 0))
udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
print(send.fileno(), flush=True)
for _ in sys.stdin:
    print(*(s.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) for s in (send, port, udp)),
          flush=True)
"""

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="AF_PACKET needs root")


@pytest.fixture
def child() -> Iterator[tuple[subprocess.Popen[str], int]]:
    """The child and the fd number of its send socket."""
    proc = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    send_fd = int(proc.stdout.readline())
    yield proc, send_fd
    proc.kill()
    proc.wait()


def buffers(proc: subprocess.Popen[str]) -> list[int]:
    """[send socket, bound port socket, UDP socket] send buffers."""
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write("\n")
    proc.stdin.flush()
    return [int(x) for x in proc.stdout.readline().split()]


@needs_root
def test_the_unbound_packet_socket_is_enlarged_and_nothing_else(
        child: tuple[subprocess.Popen[str], int]) -> None:
    proc, send_fd = child
    send0, port0, udp0 = buffers(proc)
    want = 8 * send0 + 12_345
    done = size_send_buffers(proc.pid, proc_start_ticks(proc.pid) or 0, want)
    send, port, udp = buffers(proc)
    assert send >= want and done.sized == {send_fd: send} and not done.skipped
    assert (port, udp) == (port0, udp0)  # bound to a port (receives), or not a packet one
    # never lowered
    again = size_send_buffers(proc.pid, proc_start_ticks(proc.pid) or 0, 1024)
    assert buffers(proc)[0] == send and again.sized == {send_fd: send}


@needs_root
def test_a_process_that_is_not_the_one_started_is_refused(
        child: tuple[subprocess.Popen[str], int]) -> None:
    proc, _ = child
    before = buffers(proc)
    ticks = proc_start_ticks(proc.pid) or 0
    with pytest.raises(OSError, match="not the switch"):
        size_send_buffers(proc.pid, ticks + 1, 64 * before[0])
    assert buffers(proc) == before


def test_a_gone_process_is_an_oserror() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    with pytest.raises(OSError):
        size_send_buffers(proc.pid, 1, 1 << 20)


def test_switch_send_buffer_outgrows_the_port_fifos() -> None:
    # 50 Mbit/s: 50 ms = 312,500 bytes per FIFO; 8 sources + the rest = 9 FIFOs
    assert switch_fifo_bytes(50.0) == 312_500
    assert switch_sndbuf_bytes(50.0, 8) == SOCKET_TRUESIZE_FACTOR * 9 * 312_500
    assert switch_sndbuf_bytes(50.0, 0) == SOCKET_TRUESIZE_FACTOR * 312_500
    # one socket for every port: the floor is on the sum, not on each port
    slow = switch_sndbuf_bytes(0.001, 3)
    assert slow == SOCKET_TRUESIZE_FACTOR * 4 * 65536 < MIN_SWITCH_SNDBUF_BYTES
    assert switch_socket_sndbuf_bytes([(0.001, 3)] * 2) == MIN_SWITCH_SNDBUF_BYTES
    many = [(50.0, 8)] * 3 + [(0.001, 3)]
    assert switch_socket_sndbuf_bytes(many) == 3 * SOCKET_TRUESIZE_FACTOR * 9 * 312_500 + slow
    assert switch_socket_sndbuf_bytes([]) == 0
    assert switch_fifo_bytes(0.001) == 65536  # one GSO frame at least
