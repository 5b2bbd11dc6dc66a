"""Crossing fibres over VXLAN, with two stand-in machines on this host (root, opt-in).

Each stand-in machine is a network namespace (its "root": the underlay address and the
tunnel's UDP socket) with an inner namespace (the fibre's middle namespace on the first
machine, the run's switch namespace on the second); a veth pair is the network between
the machines. The tunnels are made by testbed.cluster.tunnel's own commands for the
fibres testbed.cluster.place says cross. Frames are sent raw (AF_PACKET), as the fibre
emulator and the userspace Open vSwitch send them. Everything made here carries the
harness's own prefix and is removed by name; nothing else is touched.
Figures (tunnel round trip against the bare underlay) are printed: run with -s.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import statistics
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from testbed.cluster.place import place
from testbed.cluster.spec import parse_cluster
from testbed.cluster.tunnel import (
    TunnelPlan,
    create_commands,
    delete_command,
    owned_devices,
    plan_tunnels,
)
from testbed.emu.plan import build_plan
from tests.test_cluster import ring
from tests.waiting import wait_until

pytestmark = [pytest.mark.root, pytest.mark.slow]

RAW = str(Path(__file__).with_name("rawframes.py"))
UNDERLAY = ("10.250.0.1", "10.250.0.2")
INNER = ("192.168.77.1", "192.168.77.2")
VLAN = 101
FRAMES = 20


def _why_skip() -> str | None:
    if os.geteuid() != 0:
        return "needs root (network namespaces, VXLAN devices)"
    if shutil.which("ip") is None:
        return "needs iproute2"
    if not Path("/sys/module/vxlan").exists():
        return "needs the vxlan kernel module loaded"
    return None


WHY = _why_skip()
need_root = pytest.mark.skipif(WHY is not None, reason=WHY or "")


def sh(*argv: str, check: bool = True) -> str:
    return subprocess.run(argv, capture_output=True, text=True, timeout=30,
                          check=check).stdout


@dataclass
class Pair:
    tag: str
    outer: dict[str, str]      # machine -> its "root" namespace
    inner: dict[str, str]      # machine -> the namespace its tunnel ends go into
    veth: dict[str, str]       # machine -> its underlay veth
    tunnels: tuple[TunnelPlan, ...]

    def end_device(self, t: TunnelPlan, machine: str) -> str:
        return next(e.device for e in t.ends() if e.machine == machine)


def frag_creates(ns: str) -> int:
    """Outer IPv4 fragments this namespace made (/proc/net/snmp, Ip: FragCreates)."""
    lines = [ln.split() for ln in sh("ip", "netns", "exec", ns, "cat", "/proc/net/snmp")
             .splitlines() if ln.startswith("Ip:")]
    return int(lines[1][lines[0].index("FragCreates")])


def set_underlay_mtu(pair: Pair, mtu: int) -> None:
    for m, ns in pair.outer.items():
        sh("ip", "-n", ns, "link", "set", pair.veth[m], "mtu", str(mtu))


def mac_of(ns: str, dev: str) -> str:
    return json.loads(sh("ip", "-n", ns, "-j", "link", "show", dev))[0]["address"]


def send_frames(pair: Pair, t: TunnelPlan, src: str, dst: str, payload_bytes: int
                ) -> list[dict[str, int]]:
    """FRAMES tagged frames from src's end of tunnel t to dst's; what dst received."""
    d_src, d_dst = pair.end_device(t, src), pair.end_device(t, dst)
    rx = subprocess.Popen(["ip", "netns", "exec", pair.inner[dst], sys.executable, RAW,
                           "recv", d_dst, str(FRAMES), "10"],
                          stdout=subprocess.PIPE, text=True)
    try:
        assert rx.stdout is not None
        assert rx.stdout.readline().strip() == "ready"
        sh("ip", "netns", "exec", pair.inner[src], sys.executable, RAW, "send", d_src,
           mac_of(pair.inner[dst], d_dst), str(VLAN), str(FRAMES), str(payload_bytes))
        got = json.loads(rx.stdout.readline())
    finally:
        rx.wait(timeout=20)
    return got


@pytest.fixture
def pair() -> Iterator[Pair]:
    tag = "lct" + secrets.token_hex(2)          # never a run prefix (lp + 4 hex)
    machines = ("ma", "mb")
    outer = {"ma": f"{tag}a", "mb": f"{tag}b"}
    inner = {"ma": f"{tag}m", "mb": f"{tag}s"}
    veth = {"ma": f"{tag}u", "mb": f"{tag}v"}
    made: list[str] = []
    try:
        for ns in (*outer.values(), *inner.values()):
            sh("ip", "netns", "add", ns)
            made.append(ns)
        sh("ip", "-n", outer["ma"], "link", "add", veth["ma"], "type", "veth", "peer", "name",
           veth["mb"], "netns", outer["mb"])
        for m, addr in zip(machines, UNDERLAY, strict=True):
            sh("ip", "-n", outer[m], "addr", "add", f"{addr}/24", "dev", veth[m])
            sh("ip", "-n", outer[m], "link", "set", veth[m], "up")
        cluster = parse_cluster({"machines": [
            {"name": m, "address": a} for m, a in zip(machines, UNDERLAY, strict=True)]})
        sc = ring(4, [("a", "n1", 1), ("b", "n3", 1)])
        plan = build_plan(sc)
        placement = place(sc, plan, machines, {"a": "ma", "b": "mb"})
        roadm = {s.label: s.node for s in plan.switches if s.kind == "roadm"}
        tunnels = plan_tunnels(plan.prefix, placement, cluster, roadm)
        assert len(tunnels) == 2  # a ring split in two halves
        for t in tunnels:
            for end in t.ends():
                for argv in create_commands(t, end, inner[end.machine]):
                    sh("ip", "netns", "exec", outer[end.machine], *argv)
        yield Pair(tag, outer, inner, veth, tunnels)
    finally:
        for ns in reversed(made):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)
        left_ns = [n for n in os.listdir("/run/netns") if n.startswith(tag)]
        left_links = [ln for ln in sh("ip", "-o", "link", "show").splitlines()
                      if f": {tag}" in ln]
        assert not left_ns and not left_links, (left_ns, left_links)


def _udp_ports(ns: str) -> set[int]:
    out = sh("ip", "netns", "exec", ns, "ss", "-Hlnu")
    return {int(ln.split()[3].rsplit(":", 1)[1]) for ln in out.splitlines() if ln.strip()}


@need_root
def test_ends_born_in_their_namespace_and_go_with_it(pair: Pair) -> None:
    """create_commands makes each end inside its namespace with the UDP socket left in
    the machine's root namespace: no tunnel device is ever in the root namespace (not even
    between its two commands), and removing the run's namespace removes the ends and
    closes the socket."""
    t = pair.tunnels[0]
    end = t.a if t.a.machine == "ma" else t.b
    sh(*delete_command(end.device, pair.inner["ma"]))
    add, up = create_commands(t, end, pair.inner["ma"])
    sh("ip", "netns", "exec", pair.outer["ma"], *add)
    assert end.device not in sh("ip", "-n", pair.outer["ma"], "-o", "link", "show")
    assert end.device in sh("ip", "-n", pair.inner["ma"], "-o", "link", "show")
    sh("ip", "netns", "exec", pair.outer["ma"], *up)
    for m in ("ma", "mb"):
        root = json.loads(sh("ip", "-n", pair.outer[m], "-j", "-d", "link", "show"))
        assert [ln["ifname"] for ln in root if (ln.get("linkinfo") or {})
                .get("info_kind") == "vxlan"] == []
        inner = json.loads(sh("ip", "-n", pair.inner[m], "-j", "-d", "link", "show"))
        mine = owned_devices(inner, pair.tunnels, m)
        assert sorted(mine) == sorted(pair.end_device(t, m) for t in pair.tunnels)
        assert all(ln.get("link_netnsid") is not None for ln in inner if ln["ifname"] in mine)
        assert 4789 in _udp_ports(pair.outer[m]) and 4789 not in _udp_ports(pair.inner[m])
    sh("ip", "netns", "del", pair.inner["ma"])

    def vxlan_in_root() -> list[str]:
        root = json.loads(sh("ip", "-n", pair.outer["ma"], "-j", "-d", "link", "show"))
        return [ln["ifname"] for ln in root
                if (ln.get("linkinfo") or {}).get("info_kind") == "vxlan"]

    # The kernel removes a deleted namespace's devices and closes their sockets in its own
    # time (namespace clean-up is deferred work): wait for it rather than race it.
    assert not vxlan_in_root()
    wait_until(lambda: 4789 not in _udp_ports(pair.outer["ma"]),
               "the tunnel ends' UDP socket to close", timeout_s=30, interval_s=0.1)


@need_root
def test_frames_cross_at_the_planned_mtu(pair: Pair) -> None:
    """Full tagged frames (1518 bytes) cross both ways whatever the underlay MTU; the outer
    packet is fragmented exactly below the planned size (1554 over IPv4), not at it."""
    t = pair.tunnels[0]
    assert t.outer_bytes == 1554
    payload = 1500  # + 14 header + 4 tag = 1518 bytes on the fibre
    for mtu, src, dst in ((1500, "ma", "mb"), (t.outer_bytes - 1, "ma", "mb"),
                          (t.outer_bytes, "ma", "mb"), (t.outer_bytes, "mb", "ma"),
                          (1500, "mb", "ma")):
        set_underlay_mtu(pair, mtu)
        before = frag_creates(pair.outer[src])
        got = send_frames(pair, t, src, dst, payload)
        made = frag_creates(pair.outer[src]) - before
        print(f"underlay mtu {mtu}, {src} -> {dst}: {len(got)}/{FRAMES} frames of "
              f"{sorted({g['frame_bytes'] for g in got})} bytes, {made} outer fragments")
        assert [g["seq"] for g in got] == list(range(FRAMES))
        assert {(g["frame_bytes"], g["vlan"]) for g in got} == {(1518, VLAN)}
        assert made == (2 * FRAMES if mtu < t.outer_bytes else 0)


@need_root
def test_each_fibre_its_own_tunnel(pair: Pair) -> None:
    """Two crossing fibres between the same two machines stay apart (their VNIs)."""
    set_underlay_mtu(pair, 1554)
    a, b = pair.tunnels
    assert a.vni != b.vni
    got_a = send_frames(pair, a, "ma", "mb", 200)
    got_b = send_frames(pair, b, "mb", "ma", 300)
    assert len(got_a) == len(got_b) == FRAMES
    assert {g["frame_bytes"] for g in got_a} == {218} and {g["frame_bytes"] for g in got_b} \
        == {318}


@need_root
def test_ownership_is_name_kind_and_vni(pair: Pair) -> None:
    """`ip -j -d link show` as clean-up reads it: the run's tunnels and nothing else."""
    ns = pair.inner["ma"]
    decoy = f"{pair.tag}x9"
    sh("ip", "netns", "exec", pair.outer["ma"], "ip", "link", "add", decoy, "type", "vxlan",
       "id", str(pair.tunnels[0].vni), "local", UNDERLAY[0], "remote", UNDERLAY[1],
       "dstport", "4790")
    sh("ip", "netns", "exec", pair.outer["ma"], "ip", "link", "set", decoy, "netns", ns)
    links = json.loads(sh("ip", "-n", ns, "-j", "-d", "link", "show"))
    mine = owned_devices(links, pair.tunnels, "ma")
    assert sorted(mine) == sorted(pair.end_device(t, "ma") for t in pair.tunnels)
    assert decoy not in mine
    for dev in mine:
        sh(*delete_command(dev, ns))
    left = [ln["ifname"] for ln in json.loads(sh("ip", "-n", ns, "-j", "link", "show"))]
    assert not set(mine) & set(left) and decoy in left


def _rtts_ms(ns: str, addr: str, count: int) -> list[float]:
    out = sh("ip", "netns", "exec", ns, "ping", "-n", "-c", str(count), "-i", "0.05", addr)
    return [float(x) for x in re.findall(r"time=([\d.]+) ms", out)]


@need_root
def test_tunnel_round_trip_figures(pair: Pair) -> None:
    """Round trips through one tunnel against the bare underlay (printed, not asserted:
    the delay calibration takes the tunnel's share off the fibre's delay)."""
    set_underlay_mtu(pair, 1554)
    t = pair.tunnels[0]
    for m, addr in zip(("ma", "mb"), INNER, strict=True):
        sh("ip", "-n", pair.inner[m], "addr", "add", f"{addr}/24", "dev", pair.end_device(t, m))
    n = 40
    tunnel = _rtts_ms(pair.inner["ma"], INNER[1], n)
    bare = _rtts_ms(pair.outer["ma"], UNDERLAY[1], n)
    assert len(tunnel) == len(bare) == n

    def fig(xs: list[float]) -> str:
        xs = sorted(xs)
        return (f"median {statistics.median(xs):.3f} ms, p90 {xs[int(0.9 * len(xs))]:.3f} ms, "
                f"worst {xs[-1]:.3f} ms")

    load = Path("/proc/loadavg").read_text().split()[:3]
    print(f"\nRTT over {n} pings (load {' '.join(load)}): vxlan {fig(tunnel)}; "
          f"bare veth {fig(bare)}")
