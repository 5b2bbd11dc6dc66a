"""The lightpath routes' TCP settings reach real connections (root): a connection to a
peer behind `window_route` runs the route's congestion control (Reno, whatever the
namespace's default) on both ends, starts with the route's initial window and, with
the route's dilated rto_min, retransmits no sooner than it."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
from dataclasses import dataclass

import pytest

from testbed.emu.tcp_tuning import (
    LIGHTPATH_CONGESTION_CONTROL,
    dilated_rto_min_ms,
    window_route,
)

pytestmark = [pytest.mark.root, pytest.mark.timeout(120)]

# Inside a namespace: accept one connection on PORT and print the accepted socket's
# congestion control.
SERVER = """
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(1); print("ready", flush=True)
c, _ = s.accept()
print(c.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16).split(b"\\0")[0].decode())
"""
# Connect, print the congestion control, the initial snd_cwnd and the retransmission
# time-out in us (struct tcp_info: 8 one-byte fields, then tcpi_rto is the first 32-bit
# field and tcpi_snd_cwnd the 19th).
CLIENT = """
import socket, struct, sys
c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10)
cc = c.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16).split(b"\\0")[0].decode()
info = c.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
print(cc, struct.unpack_from("I", info, 8 + 18 * 4)[0], struct.unpack_from("I", info, 8)[0])
"""


@dataclass
class NsHost:
    """A host commands run in (testbed.emu.tcp_tuning.ExecHost) inside a test namespace."""

    name: str
    ip: str
    iface: str | None
    prefix: tuple[str, ...]


def _ns(*cmd: str, name: str) -> None:
    subprocess.run(["ip", "netns", "exec", name, *cmd], check=True, timeout=10)


def test_window_route_sets_reno_and_the_initial_window_on_both_ends() -> None:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2 (network namespaces)")
    tag = secrets.token_hex(3)
    a, b = f"lpcc{tag}a", f"lpcc{tag}b"
    va, vb = f"lpcc{tag}0", f"lpcc{tag}1"
    subprocess.run(["ip", "netns", "add", a], check=True)
    try:
        subprocess.run(["ip", "netns", "add", b], check=True)
        subprocess.run(["ip", "link", "add", va, "netns", a, "type", "veth",
                        "peer", "name", vb, "netns", b], check=True)
        for ns, dev, ip in ((a, va, "10.77.0.1"), (b, vb, "10.77.0.2")):
            _ns("ip", "addr", "add", f"{ip}/24", "dev", dev, name=ns)
            _ns("ip", "link", "set", dev, "up", name=ns)
            _ns("ip", "link", "set", "lo", "up", name=ns)
            # A default other than the route's, so that the route is what sets it.
            other = "cubic" if LIGHTPATH_CONGESTION_CONTROL != "cubic" else "reno"
            subprocess.run(["ip", "netns", "exec", ns, "sysctl", "-q", "-w",
                            f"net.ipv4.tcp_congestion_control={other}"], timeout=10)
        ha = NsHost("a", "10.77.0.1", va, ("ip", "netns", "exec", a))
        hb = NsHost("b", "10.77.0.2", vb, ("ip", "netns", "exec", b))
        # the client's route dilates the retransmission time-out (time_factor 10)
        window_route(ha, "10.77.0.2/32", 100, dilated_rto_min_ms(10.0))
        window_route(hb, "10.77.0.1/32", 100)
        server = subprocess.Popen(["ip", "netns", "exec", b, sys.executable, "-c", SERVER,
                                   "10.77.0.2", "5201"], stdout=subprocess.PIPE, text=True)
        try:
            assert server.stdout is not None
            assert server.stdout.readline().strip() == "ready"
            client = subprocess.run(["ip", "netns", "exec", a, sys.executable, "-c", CLIENT,
                                     "10.77.0.2", "5201"], capture_output=True, text=True,
                                    timeout=30, check=True)
            accepted = server.stdout.readline().strip()
        finally:
            server.kill()
            server.wait(timeout=10)
        cc, cwnd, rto_us = client.stdout.split()
        assert cc == LIGHTPATH_CONGESTION_CONTROL, client.stdout
        assert accepted == LIGHTPATH_CONGESTION_CONTROL
        assert int(cwnd) == 100
        # RTO = srtt + max(4 mdev, rto_min): at least the route's 2 s (Linux's own: 200 ms)
        assert 2_000_000 <= int(rto_us) < 3_000_000, rto_us
    finally:
        for ns in (a, b):
            subprocess.run(["ip", "netns", "del", ns], stderr=subprocess.DEVNULL)
