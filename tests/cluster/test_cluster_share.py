"""Each machine builds its share of one emulation (testbed.cluster.sharenet), joined by the
VXLAN tunnels of the fibres that cross (root, opt-in; tests/cluster/run.sh).

Two stand-in machines, each a network namespace of its own (its root namespace, holding
the underlay address) with a private /run/netns (a tmpfs in its own mount namespace, so
the run's named namespace, the same name on both, is the machine's own) and a state root
of its own; a veth is the network between them. Each runs tests/cluster/share_node.py:
a ring of 4 optical nodes, one DC of one host on each machine, every lightpath crossing.
Checked: a host on one machine pings the host on the other through its DC switch, ROADMs,
fibre emulators and tunnels; no tunnel end is in either machine's root namespace; after
the runs end nothing of theirs is left (processes, namespaces, state). Everything carries
the harness's prefix (`lct` + 4 hex) or lives inside its namespaces.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from testbed.emu.state import proc_start_ticks
from tests.waiting import wait_until

pytestmark = [pytest.mark.root, pytest.mark.slow]

NODE = str(Path(__file__).with_name("share_node.py"))
TAG = f"lct{secrets.token_hex(2)}"


def _why_skip() -> str | None:
    if os.geteuid() != 0:
        return "needs root (namespaces, Open vSwitch, VXLAN devices)"
    for tool in ("ip", "mnexec", "ovs-vswitchd", "ovsdb-server", "ovs-vsctl", "nsenter"):
        if shutil.which(tool) is None:
            return f"needs {tool}"
    if not Path("/sys/module/vxlan").exists():
        return "needs the vxlan kernel module loaded"
    return None


WHY = _why_skip()
need = pytest.mark.skipif(WHY is not None, reason=WHY or "")


def sh(*argv: str, check: bool = True) -> str:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=60,
                          check=check).stdout


def _leftovers() -> list[str]:
    return [ln for ln in sh("ip", "-o", "link", "show").splitlines() + sh(
        "ip", "netns", "list").splitlines() if TAG in ln]


@pytest.fixture
def two(tmp_path: Path) -> Iterator[dict[str, Any]]:
    ns = {"ma": f"{TAG}a", "mb": f"{TAG}b"}
    addr = {"ma": "10.252.250.1", "mb": "10.252.250.2"}
    made: list[str] = []
    try:
        for m in ("ma", "mb"):
            sh("ip", "netns", "add", ns[m])
            made.append(ns[m])
            sh("ip", "-n", ns[m], "link", "set", "lo", "up")
        sh("ip", "-n", ns["ma"], "link", "add", f"{TAG}u", "type", "veth", "peer", "name",
           f"{TAG}v", "netns", ns["mb"])
        for m, dev in (("ma", f"{TAG}u"), ("mb", f"{TAG}v")):
            sh("ip", "-n", ns[m], "addr", "add", f"{addr[m]}/24", "dev", dev)
            sh("ip", "-n", ns[m], "link", "set", dev, "mtu", "1554", "up")
        cfg = tmp_path / "share.json"
        cfg.write_text(json.dumps({"prefix": f"lp{secrets.token_hex(2)}", "cluster": {
            "machines": [{"name": m, "address": addr[m]} for m in ("ma", "mb")]}}))
        yield {"ns": ns, "cfg": cfg, "tmp": tmp_path}
    finally:
        for n in reversed(made):
            subprocess.run(["ip", "netns", "del", n], capture_output=True, check=False)
    assert _leftovers() == [], _leftovers()


def _start(two: dict[str, Any], m: str, where: str | None = None
           ) -> subprocess.Popen[str]:
    """share_node.py for share `m` (or `all`) in stand-in `where` (default: m)."""
    state = two["tmp"] / f"state-{m}"
    script = (f"mount -t tmpfs {TAG} /run/netns && exec {sys.executable} {NODE} "
              f"{two['cfg']} {m}")
    return subprocess.Popen(["ip", "netns", "exec", two["ns"][where or m], "sh", "-c",
                             script],
                            env={**os.environ, "LIGHTPIPE_STATE_DIR": str(state)},
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=open(two["tmp"] / f"log-{m}", "w"), text=True)


def _line(proc: subprocess.Popen[str], two: dict[str, Any], m: str) -> dict[str, Any]:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        raise AssertionError((two["tmp"] / f"log-{m}").read_text()[-3000:])
    return dict(json.loads(line))


def _ping(pid: int, ip: str, count: int = 20) -> list[float]:
    out = sh("mnexec", "-a", str(pid), "ping", "-n", "-c", str(count), "-i", "0.2", "-W", "2",
             ip, check=False)
    return sorted(float(x) for x in re.findall(r"time=([\d.]+) ms", out))


def _fig(xs: list[float]) -> str:
    if not xs:
        return "no replies"
    return (f"{len(xs)} replies, rtt median {xs[len(xs) // 2]:.2f} ms, p90 "
            f"{xs[int(0.9 * len(xs))]:.2f} ms, worst {xs[-1]:.2f} ms (load "
            f"{os.getloadavg()[0]:.1f})")


@need
def test_whole_plan_on_one_stand_in(two: dict[str, Any]) -> None:
    """The same plan on one machine (EmuNetwork), as the baseline of the figures."""
    p = _start(two, "all", "ma")
    try:
        up = _line(p, two, "all")
        (pid_a, _), (_, ip_b) = up["hosts"].values()
        rtts = _ping(pid_a, ip_b)
        print(f"\nwhole plan on one machine: up {up['up_s']:.1f} s; ping {_fig(rtts)}")
        assert len(rtts) >= 18
    finally:
        if p.poll() is None and p.stdin is not None:
            p.stdin.write("stop\n")
            p.stdin.flush()
        p.wait(timeout=120)
    assert p.returncode == 0


@need
def test_two_shares_joined_by_tunnels(two: dict[str, Any]) -> None:
    procs = {m: _start(two, m) for m in ("ma", "mb")}
    up: dict[str, dict[str, Any]] = {}
    try:
        for m, p in procs.items():
            up[m] = _line(p, two, m)
        print(f"\nshares up: ma {up['ma']['up_s']:.1f} s, mb {up['mb']['up_s']:.1f} s "
              f"(load {os.getloadavg()[0]:.1f}); tunnels ma {up['ma']['tunnels']}, "
              f"mb {up['mb']['tunnels']}")
        assert up["ma"]["tunnels"] and sorted(up["ma"]["tunnels"]) == \
            sorted(up["mb"]["tunnels"])
        for m in ("ma", "mb"):  # ends live in the run's namespaces, never the root one
            root = json.loads(sh("ip", "-n", two["ns"][m], "-j", "-d", "link", "show"))
            assert not [ln["ifname"] for ln in root
                        if (ln.get("linkinfo") or {}).get("info_kind") == "vxlan"]
        (pid_a, _), = up["ma"]["hosts"].values()
        (_, ip_b), = up["mb"]["hosts"].values()
        rtts = _ping(pid_a, ip_b)
        print(f"ping across the two machines: {_fig(rtts)} (the lightpath's fibres: "
              f"{up['ma']['lightpath_rtt_ms']:.2f} ms; no delay calibration here)")
        assert len(rtts) >= 18
    finally:
        for p in procs.values():
            if p.poll() is None and p.stdin is not None:
                p.stdin.write("stop\n")
                p.stdin.flush()
        for p in procs.values():
            try:
                p.wait(timeout=120)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=30)
                raise
    for m in ("ma", "mb"):
        assert procs[m].returncode == 0, (two["tmp"] / f"log-{m}").read_text()[-3000:]
        gone = [pid for pid in up[m]["procs"] if proc_start_ticks(pid) is not None]
        assert gone == [], f"{m}: recorded processes still alive: {gone}"
        assert not Path(up[m]["state_dir"]).exists()


def _udp_ports(ns: str) -> set[int]:
    out = sh("ip", "netns", "exec", ns, "ss", "-Hlnu")
    return {int(ln.split()[3].rsplit(":", 1)[1]) for ln in out.splitlines() if ln.strip()}


@need
def test_share_killed_then_local_clean_removes_it_and_its_tunnel_ends(
        two: dict[str, Any]) -> None:
    """kill -9 of one machine's builder, then that machine's own `lightpipe clean`: its
    processes, namespaces and state go, and with them its tunnel ends (the UDP socket in
    its root namespace closes); the other machine's share is untouched until it stops."""
    procs = {m: _start(two, m) for m in ("ma", "mb")}
    try:
        up = {m: _line(p, two, m) for m, p in procs.items()}
        prefix = json.loads(two["cfg"].read_text())["prefix"]
        assert 4789 in _udp_ports(two["ns"]["ma"])
        procs["ma"].kill()  # SIGKILL: no teardown at all
        procs["ma"].wait(timeout=30)
        assert 4789 in _udp_ports(two["ns"]["ma"])  # the ends outlive the builder
        # That machine's own clean, as a user there runs it: its root network namespace,
        # its /run/netns (the builder's mount namespace, kept by the run's processes that
        # outlive it: OVS, the fibre emulators).
        left = [p for p in up["ma"]["procs"] if proc_start_ticks(p) is not None]
        assert left, "no process of the killed run is left to clean"
        res = subprocess.run(
            ["nsenter", f"--mount=/proc/{left[0]}/ns/mnt",
             f"--net=/run/netns/{two['ns']['ma']}", f"{Path(sys.executable).parent}/lightpipe",
             "clean", prefix], capture_output=True, text=True, timeout=120, check=False,
            env={**os.environ, "LIGHTPIPE_STATE_DIR": str(two["tmp"] / "state-ma")})
        print(f"\nclean after kill -9:\n{res.stdout}{res.stderr}")
        assert res.returncode == 0 and f"clean: removed run {prefix}" in res.stdout
        assert [p for p in up["ma"]["procs"] if proc_start_ticks(p) is not None] == []
        assert not Path(up["ma"]["state_dir"]).exists()
        # Every tunnel end on ma goes: the kernel closes a deleted namespace's VXLAN
        # sockets in its own time (namespace clean-up is deferred work), so wait for it.
        wait_until(lambda: 4789 not in _udp_ports(two["ns"]["ma"]),
                   "the tunnel ends' UDP socket on ma to close", timeout_s=30, interval_s=0.1)
        assert procs["mb"].poll() is None and 4789 in _udp_ports(two["ns"]["mb"])
    finally:
        for p in procs.values():
            if p.poll() is None and p.stdin is not None:
                p.stdin.write("stop\n")
                p.stdin.flush()
        for p in procs.values():
            p.wait(timeout=120)
    assert procs["mb"].returncode == 0
    wait_until(lambda: 4789 not in _udp_ports(two["ns"]["mb"]),
               "the tunnel ends' UDP socket on mb to close", timeout_s=30, interval_s=0.1)
