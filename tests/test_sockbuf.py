"""testbed.emu.sockbuf: another process's packet sockets' send buffers, by PID and start."""

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
)
from testbed.emu.sockbuf import size_send_buffers
from testbed.emu.state import proc_start_ticks

# A child holding one AF_PACKET socket bound to lo and one UDP socket; each line it reads
# makes it print both sockets' send buffers as the kernel keeps them.
CHILD = """
import socket, sys
p = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
p.bind(("lo", 0))
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
print("ready", flush=True)
for _ in sys.stdin:
    print(p.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF),
          u.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF), flush=True)
"""

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="AF_PACKET needs root")


@pytest.fixture
def child() -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    yield proc
    proc.kill()
    proc.wait()


def buffers(proc: subprocess.Popen[str]) -> tuple[int, int]:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write("\n")
    proc.stdin.flush()
    packet, udp = proc.stdout.readline().split()
    return int(packet), int(udp)


@needs_root
def test_the_packet_socket_bound_to_the_interface_is_enlarged_and_nothing_else(
        child: subprocess.Popen[str]) -> None:
    packet0, udp0 = buffers(child)
    want = 8 * packet0 + 12_345
    done = size_send_buffers(child.pid, proc_start_ticks(child.pid) or 0,
                             {"lo": want, "nosuch0": want})
    packet, udp = buffers(child)
    assert packet >= want and done.sized == {"lo": packet}
    assert udp == udp0  # not a packet socket: untouched
    assert "nosuch0" in done.skipped and "lo" not in done.skipped
    # never lowered
    again = size_send_buffers(child.pid, proc_start_ticks(child.pid) or 0, {"lo": 1024})
    assert buffers(child)[0] == packet and again.sized == {"lo": packet}


@needs_root
def test_a_process_that_is_not_the_one_started_is_refused(
        child: subprocess.Popen[str]) -> None:
    packet0, _ = buffers(child)
    ticks = proc_start_ticks(child.pid) or 0
    with pytest.raises(OSError, match="not the switch"):
        size_send_buffers(child.pid, ticks + 1, {"lo": 64 * packet0})
    assert buffers(child)[0] == packet0


def test_a_gone_process_is_an_oserror() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    with pytest.raises(OSError):
        size_send_buffers(proc.pid, 1, {"lo": 1 << 20})


def test_switch_send_buffer_outgrows_the_port_fifos() -> None:
    # 50 Mbit/s: 50 ms = 312,500 bytes per FIFO; 8 sources + the rest = 9 FIFOs
    assert switch_fifo_bytes(50.0) == 312_500
    assert switch_sndbuf_bytes(50.0, 8) == SOCKET_TRUESIZE_FACTOR * 9 * 312_500
    assert switch_sndbuf_bytes(50.0, 0) == max(MIN_SWITCH_SNDBUF_BYTES,
                                               SOCKET_TRUESIZE_FACTOR * 312_500)
    assert switch_sndbuf_bytes(0.001, 3) == MIN_SWITCH_SNDBUF_BYTES
    assert switch_fifo_bytes(0.001) == 65536  # one GSO frame at least
