"""Fast-failover protection with real Open vSwitch: traffic takes the backup while the
controller is paused, then the controller adopts it.

Root only. A 4-node ring A-B-C-D (dc-a on A, dc-c on C), user-space datapath and
forwarder fibres, the real controller process (protection on, its default). The
controller is stopped with SIGSTOP before each cut, so anything that flows afterwards
was switched by OVS alone; then it is continued and its book-keeping is checked.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest

from controllers.protection import FF_GROUP_BASE
from tests.ctl_ring import ring_env
from tests.test_controller_ovs import (
    _host,
    _ns,
    _ping_ok,
    _roadm,
    _vlan_packets,
)
from tests.waiting import wait_until

pytestmark = [pytest.mark.root, pytest.mark.slow]


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    yield from ring_env(tmp_path_factory, "ctl-ff")


def _ofctl(net: Any, *args: str) -> str:
    return subprocess.run(["ovs-ofctl", "-O", "OpenFlow13", *args], capture_output=True,
                          text=True, check=True, env={**os.environ, **net.ovs.env}).stdout


def _port(net: Any, node: str, toward: str) -> int:
    """The OpenFlow port of ROADM `node` on its fibre to `toward` (the controller's layout)."""
    from testbed.orchestrate.glue import layout_from_emu

    layout = layout_from_emu(net)
    by = {s.name: s for s in layout.switches}
    for link in layout.links:
        if link.kind != "fibre":
            continue
        a, b = by[link.a].node, by[link.b].node
        if (a, b) == (node, toward):
            return link.a_port
        if (b, a) == (node, toward):
            return link.b_port
    raise KeyError((node, toward))


def _set_link(net: Any, u: str, v: str, up: bool, ends: str = "both") -> None:
    f = net.plan.fibre(u, v)
    emu = net.emulators[f.middle]
    intfs = {"both": (emu.intf_u, emu.intf_v), "u": (emu.intf_u if u == f.u else emu.intf_v,)}
    for intf in intfs[ends]:
        subprocess.run(["mnexec", "-a", str(emu.ns_pid), "ip", "link", "set", intf,
                        "up" if up else "down"], check=True)


def _udp_one_way(net: Any, src: Any, dst: Any, count: int = 40) -> int:
    """Send `count` UDP datagrams src -> dst (2 ms apart); how many arrived."""
    from testbed.emu.netns import in_netns

    with in_netns(_ns(net, dst)):
        rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    with in_netns(_ns(net, src)):
        tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    ip = dst.ip.split("/")[0]
    try:
        rx.bind((ip, 47011))
        rx.settimeout(0.3)
        for i in range(count):
            tx.sendto(i.to_bytes(4, "big"), (ip, 47011))
            time.sleep(0.002)
        got = set()
        while True:
            try:
                got.add(int.from_bytes(rx.recv(16), "big"))
            except TimeoutError:
                return len(got)
    finally:
        rx.close()
        tx.close()


def _link_down(net: Any, node: str, port: int) -> bool:
    """Whether OVS shows the ROADM's port with state LINK_DOWN (ovs-ofctl dump-ports-desc)."""
    mine = False
    for line in _ofctl(net, "dump-ports-desc", _roadm(net, node)).splitlines():
        if re.match(r"^ \S+\(", line):  # a port's first line: " 3(name): addr:..."
            mine = line.startswith(f" {port}(")
        elif mine and line.strip().startswith("state:"):
            return "LINK_DOWN" in line
    return False


def _wait_link_down(net: Any, node: str, toward: str) -> None:
    port = _port(net, node, toward)
    wait_until(lambda: _link_down(net, node, port),
               f"OVS to see {node}'s port {port} toward {toward} down")


def _pause(ctl: Any) -> None:
    os.kill(ctl.proc.pid, signal.SIGSTOP)


def _resume(ctl: Any) -> None:
    os.kill(ctl.proc.pid, signal.SIGCONT)


def test_ff_groups_installed_with_the_backup(env: dict[str, Any]) -> None:
    net, ctl = env["net"], env["ctl"]
    status, lp = ctl.request("POST", "/lightpaths", {"src_dc": "dc-a", "dst_dc": "dc-c",
                                                     "slots": 2})
    assert status == 201, lp
    assert lp["nodes"] == ["A", "B", "C"] and lp["backup"] == ["A", "D", "C"]
    # the set-up installs the working route; its protection follows (protect delay)
    lp = wait_until(lambda: (x := ctl.request("GET", f"/lightpaths/{lp['id']}")[1])
                    ["protected"] and x, "the lightpath's protection to be installed")
    env["lp"] = lp
    groups = _ofctl(net, "dump-groups", _roadm(net, "A"))
    gid = FF_GROUP_BASE + 2 * lp["id"]
    line = next(x for x in groups.splitlines() if f"group_id={gid}," in x)
    assert "type=ff" in line, line
    ab, ad = _port(net, "A", "B"), _port(net, "A", "D")
    assert f"watch_port:{ab},actions=output:{ab}" in line, line
    assert f"watch_port:{ad},actions=output:{ad}" in line, line
    assert line.index(f"watch_port:{ab}") < line.index(f"watch_port:{ad}")
    # B, further on, sends frames back (crankback) when its out port is down
    line = next(x for x in _ofctl(net, "dump-groups", _roadm(net, "B")).splitlines()
                if f"group_id={gid}," in x)
    bc, ba = _port(net, "B", "C"), _port(net, "B", "A")
    assert "type=ff" in line and f"watch_port:{bc},actions=output:{bc}" in line, line
    assert f"watch_port:{ba},actions=set_field:1->vlan_pcp,IN_PORT" in line, line
    a, c = _host(net, "dc-a"), _host(net, "dc-c")
    assert _ping_ok(net, a, c, count=5) >= 4
    assert _vlan_packets(net, _roadm(net, "D"), lp["vid"]) == 0  # backup idle


def test_head_end_fails_over_while_the_controller_is_paused(env: dict[str, Any]) -> None:
    """Only A's end of A-B goes down: A's group takes the backup A-D-C by itself."""
    net, ctl = env["net"], env["ctl"]
    lp = env["lp"]
    a, c = _host(net, "dc-a"), _host(net, "dc-c")
    d_before = _vlan_packets(net, _roadm(net, "D"), lp["vid"])
    _pause(ctl)
    try:
        _set_link(net, "A", "B", up=False, ends="u")
        _wait_link_down(net, "A", "B")  # OVS has seen the carrier go
        got = _udp_one_way(net, a, c)
    finally:
        _resume(ctl)
    assert got >= 20, got  # a paused controller restored nothing: the switch did
    # they crossed D (OVS updates its flow counters a little later)
    wait_until(lambda: _vlan_packets(net, _roadm(net, "D"), lp["vid"]) - d_before >= got,
               "the backup's counters at D to count the datagrams")
    env["cut"] = ("A", "B")

    def restored() -> dict[str, Any] | None:
        status, now = ctl.request("GET", f"/lightpaths/{lp['id']}")
        return now if status == 200 and now["restored"] >= 1 else None

    now = wait_until(restored, "the controller to restore the cut lightpath", interval_s=0.02)
    # the controller adopts the route the switch already used
    assert now["nodes"] == lp["backup"] and now["vid"] == lp["vid"]
    metrics = ctl.request("GET", "/metrics")[1]
    assert "lightpipe_lightpaths_restored_on_backup_total 1.0" in metrics
    assert _ping_ok(net, a, c, count=5) >= 4
    _set_link(net, "A", "B", up=True, ends="u")

    def backup_again() -> dict[str, Any] | None:  # repaired: A-B-C is a backup again
        now = ctl.request("GET", f"/lightpaths/{lp['id']}")[1]
        return now if now.get("backup") == ["A", "B", "C"] else None

    env["lp"] = wait_until(backup_again, "fibre A-B repaired and a new backup")


def test_both_directions_fail_over_with_crankback(env: dict[str, Any]) -> None:
    """Both ends of D-C go down (the lightpath runs A-D-C now, backup A-B-C). A->C: D
    sees its port to C down and sends the frames back to A (crankback), which puts them
    on A-B-C; C->A: the head end C takes C-B-A. A ping needs both directions."""
    net, ctl = env["net"], env["ctl"]
    lp = env["lp"]
    assert lp["nodes"] == ["A", "D", "C"]
    a, c = _host(net, "dc-a"), _host(net, "dc-c")
    assert _ping_ok(net, a, c, count=3) >= 2
    _pause(ctl)
    try:
        _set_link(net, "D", "C", up=False)
        _wait_link_down(net, "D", "C")
        _wait_link_down(net, "C", "D")
        ok = _ping_ok(net, a, c, count=10)
    finally:
        _resume(ctl)
    assert ok >= 5, ok

    def restored() -> dict[str, Any] | None:
        now = ctl.request("GET", f"/lightpaths/{lp['id']}")[1]
        return now if now["nodes"] == ["A", "B", "C"] else None

    wait_until(restored, "the controller to adopt A-B-C")
    assert _ping_ok(net, a, c, count=5) >= 4
    _set_link(net, "D", "C", up=True)
