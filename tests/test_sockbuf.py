"""testbed.emu.sockbuf: another process's packet sockets' buffers, by PID and start time."""

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
from testbed.emu.sockbuf import (
    GSO_TRUESIZE_BYTES,
    NETDEV_MAX_BURST,
    SWITCH_RCVBUF_BYTES,
    size_switch_buffers,
    switch_rcvbuf_bytes,
)
from testbed.emu.state import proc_start_ticks

# A child holding sockets as ovs-vswitchd does (an unbound AF_PACKET socket it sends
# through, one bound to a port it receives on) and a UDP socket; each line it reads makes
# it print the three sockets' send buffers, then their receive buffers, as the kernel
# keeps them.
CHILD = """
import socket, sys
send = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
port = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
port.bind(("lo", 0))
udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
print(send.fileno(), port.fileno(), flush=True)
for _ in sys.stdin:
    print(*(s.getsockopt(socket.SOL_SOCKET, o) for o in (socket.SO_SNDBUF, socket.SO_RCVBUF)
            for s in (send, port, udp)), flush=True)
"""

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="AF_PACKET needs root")


@pytest.fixture
def child() -> Iterator[tuple[subprocess.Popen[str], int, int]]:
    """The child and the fd numbers of its send socket and of its port socket."""
    proc = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    send_fd, port_fd = (int(x) for x in proc.stdout.readline().split())
    yield proc, send_fd, port_fd
    proc.kill()
    proc.wait()


def all_buffers(proc: subprocess.Popen[str]) -> list[int]:
    """[send socket, bound port socket, UDP socket] send buffers, then the same three's
    receive buffers."""
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write("\n")
    proc.stdin.flush()
    return [int(x) for x in proc.stdout.readline().split()]


def buffers(proc: subprocess.Popen[str]) -> list[int]:
    """[send socket, bound port socket, UDP socket] send buffers."""
    return all_buffers(proc)[:3]


@needs_root
def test_the_unbound_packet_socket_is_enlarged_and_nothing_else(
        child: tuple[subprocess.Popen[str], int, int]) -> None:
    proc, send_fd, _ = child
    before = all_buffers(proc)
    send0, port0, udp0 = before[:3]
    want = 8 * send0 + 12_345
    done = size_switch_buffers(proc.pid, proc_start_ticks(proc.pid) or 0, want)
    send, port, udp = buffers(proc)
    assert send >= want and done.sized == {send_fd: send} and not done.skipped
    assert (port, udp) == (port0, udp0)  # bound to a port (receives), or not a packet one
    assert all_buffers(proc)[3:] == before[3:] and done.received == {}  # recv_bytes 0
    # never lowered
    again = size_switch_buffers(proc.pid, proc_start_ticks(proc.pid) or 0, 1024)
    assert buffers(proc)[0] == send and again.sized == {send_fd: send}


@needs_root
def test_the_port_sockets_receive_buffer_is_enlarged_and_nothing_else(
        child: tuple[subprocess.Popen[str], int, int]) -> None:
    proc, _, port_fd = child
    before = all_buffers(proc)
    want = 16 * before[4] + 4_321
    done = size_switch_buffers(proc.pid, proc_start_ticks(proc.pid) or 0, 0, want)
    after = all_buffers(proc)
    assert after[4] >= want and done.received == {port_fd: after[4]} and not done.skipped
    # the send socket's and the UDP socket's receive buffers, and every send buffer, kept
    assert after[:4] + after[5:] == before[:4] + before[5:] and done.sized == {}
    again = size_switch_buffers(proc.pid, proc_start_ticks(proc.pid) or 0, 0, 1024)
    assert all_buffers(proc)[4] == after[4] and again.received == {port_fd: after[4]}


@needs_root
def test_a_process_that_is_not_the_one_started_is_refused(
        child: tuple[subprocess.Popen[str], int, int]) -> None:
    proc, _, _ = child
    before = all_buffers(proc)
    ticks = proc_start_ticks(proc.pid) or 0
    with pytest.raises(OSError, match="not the switch"):
        size_switch_buffers(proc.pid, ticks + 1, 64 * before[0], 64 * before[4])
    assert all_buffers(proc) == before


def test_a_gone_process_is_an_oserror() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    with pytest.raises(OSError):
        size_switch_buffers(proc.pid, 1, 1 << 20, 1 << 20)


def test_switch_send_buffer_outgrows_the_port_fifos() -> None:
    # 50 Mbit/s: 50 ms = 312,500 bytes per FIFO; 8 sources + the rest + small = 10 FIFOs
    assert switch_fifo_bytes(50.0) == 312_500
    assert switch_sndbuf_bytes(50.0, 8) == SOCKET_TRUESIZE_FACTOR * 10 * 312_500
    assert switch_sndbuf_bytes(50.0, 0) == SOCKET_TRUESIZE_FACTOR * 312_500
    # one socket for every port: the floor is on the sum, not on each port
    slow = switch_sndbuf_bytes(0.001, 3)
    assert slow == SOCKET_TRUESIZE_FACTOR * 5 * 65536 < MIN_SWITCH_SNDBUF_BYTES
    assert switch_socket_sndbuf_bytes([(0.001, 3)] * 2) == MIN_SWITCH_SNDBUF_BYTES
    many = [(50.0, 8)] * 3 + [(0.001, 3)]
    assert switch_socket_sndbuf_bytes(many) == 3 * SOCKET_TRUESIZE_FACTOR * 10 * 312_500 + slow
    assert switch_socket_sndbuf_bytes([]) == 0
    assert switch_fifo_bytes(0.001) == 65536  # one GSO frame at least


def test_a_ports_receive_buffer_holds_two_polls_of_the_ports_that_feed_it() -> None:
    # a DC switch with two hosts hands its ROADM port 2 x 32 GSO frames per poll, more
    # than the old flat 4 MiB by truesize: twice that, 9 MiB
    two_hosts = switch_rcvbuf_bytes(2)
    assert two_hosts == 2 * 2 * NETDEV_MAX_BURST * GSO_TRUESIZE_BYTES == 9 << 20
    assert two_hosts > 2 * NETDEV_MAX_BURST * 65536 + SWITCH_RCVBUF_BYTES // 2
    assert switch_rcvbuf_bytes(0) == SWITCH_RCVBUF_BYTES  # the floor: a CPU wait
    assert switch_rcvbuf_bytes(1) == two_hosts // 2
    assert switch_rcvbuf_bytes(3) == 3 * two_hosts // 2
    assert switch_rcvbuf_bytes(10**6) == 1 << 30  # the kernel keeps it an int
    with pytest.raises(ValueError, match="fan_in"):
        switch_rcvbuf_bytes(-1)
