"""`lightpipe clean --cluster` over real SSH (root, opt-in; tests/cluster/run.sh).

Two stand-in machines, each a network namespace of its own (its "root namespace") joined
to this host by a veth, with a Dropbear server inside (test_cluster_ssh's `servers`: a
mount namespace whose /root holds only the test's key) whose sessions see a state root of
their own (LIGHTPIPE_STATE_DIR, passed on by `dropbear -e`), so that each machine's own
`lightpipe clean` sees only that machine's runs. A third machine is unreachable. Tunnel
devices a run left in a machine's root namespace are made by testbed.cluster.tunnel's own
command; decoys differ from them in one thing each (name, kind, VNI, local address, UDP
port, or a live run's). Everything carries the harness's own prefix (`lct` + 4 hex) or
lives inside its namespaces, and is removed; the test fails if anything is left.
"""

from __future__ import annotations

import os
import secrets
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from testbed.cluster.place import place
from testbed.cluster.spec import ClusterSpec, load_cluster
from testbed.cluster.tunnel import TunnelPlan, create_commands, plan_tunnels, vni
from testbed.emu.plan import build_plan
from tests.cluster.test_cluster_ssh import WHY as SSH_WHY
from tests.cluster.test_cluster_ssh import Server, _cluster_file, _free_port, servers
from tests.test_cluster import ring

pytestmark = [pytest.mark.root, pytest.mark.slow]
__all__ = ["servers"]  # the fixture, from test_cluster_ssh

TAG = f"lct{secrets.token_hex(2)}"
VENV = str(Path(sys.executable).parent.parent)


def _why_skip() -> str | None:
    if SSH_WHY is not None:
        return SSH_WHY
    if not Path("/sys/module/vxlan").exists():
        return "needs the vxlan kernel module loaded"
    if not Path(VENV, "bin", "lightpipe").exists():
        return "needs the venv's lightpipe entry point"
    return None


WHY = _why_skip()
need = pytest.mark.skipif(WHY is not None, reason=WHY or "")


def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, check=check, timeout=30)


def _free_subnet() -> int:
    """A 10.252.N.0/24 that no route here covers yet."""
    routes = sh("ip", "-4", "route", "show", "table", "all").stdout
    for n in range(16, 250):
        if f"10.252.{n}." not in routes:
            return n
    raise AssertionError("no free 10.252.N.0/24 here")


@dataclass
class StandIn:
    """A stand-in machine: its netns, its address, its state root."""

    name: str
    netns: str
    address: str
    state: Path

    def ip(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return sh("ip", "-n", self.netns, *argv, check=check)

    def links(self) -> dict[str, str]:
        """Device name -> kind in the machine's root namespace."""
        import json

        out = {}
        for link in json.loads(self.ip("-j", "-d", "link", "show").stdout):
            out[link["ifname"]] = (link.get("linkinfo") or {}).get("info_kind", "")
        return out


def _leftovers() -> list[str]:
    links = [ln for ln in sh("ip", "-o", "link", "show").stdout.splitlines() if TAG in ln]
    nss = [ln for ln in sh("ip", "netns", "list").stdout.splitlines() if TAG in ln]
    return links + nss


@pytest.fixture
def machines(tmp_path: Path, servers: Callable[..., Server]
             ) -> Iterator[tuple[list[StandIn], Path]]:
    """Two stand-in machines with Dropbear, and a cluster file naming them and a third,
    unreachable one (last)."""
    n = _free_subnet()
    made: list[StandIn] = []
    try:
        for i, name in enumerate(("a", "b")):
            ns, host_if, ns_if = f"{TAG}{name}", f"{TAG}h{name}", f"{TAG}m{name}"
            sh("ip", "netns", "add", ns)
            st = StandIn(name, ns, f"10.252.{n}.{4 * i + 2}", tmp_path / f"state-{name}")
            made.append(st)
            sh("ip", "link", "add", host_if, "type", "veth", "peer", "name", ns_if)
            sh("ip", "link", "set", ns_if, "netns", ns)
            sh("ip", "addr", "add", f"10.252.{n}.{4 * i + 1}/30", "dev", host_if)
            sh("ip", "link", "set", host_if, "up")
            st.ip("addr", "add", f"{st.address}/30", "dev", ns_if)
            st.ip("link", "set", ns_if, "up")
            st.ip("link", "set", "lo", "up")
        started = [servers(m.address, netns=m.netns,
                           env={"LIGHTPIPE_STATE_DIR": str(m.state)}) for m in made]
        (tmp_path / "known_hosts").write_text("".join(s.known_hosts_line() for s in started))
        f = _cluster_file(tmp_path, [
            *({"name": f"m-{m.name}", "address": m.address, "port": s.port}
              for m, s in zip(made, started, strict=True)),
            {"name": "m-gone", "address": "127.0.0.1", "port": _free_port("127.0.0.1")}])
        yield made, f
    finally:
        for m in made:
            sh("ip", "netns", "del", m.netns, check=False)  # its devices go with it
            sh("ip", "link", "del", f"{TAG}h{m.name}", check=False)
            shutil.rmtree(m.state, ignore_errors=True)
    assert _leftovers() == [], _leftovers()


def _tunnel(cluster: ClusterSpec, prefix: str) -> TunnelPlan:
    """The run's one crossing fibre between m-a and m-b (a ring of 4 with 2 DCs)."""
    sc = ring(4, [("x", "n1", 1), ("y", "n3", 1)])
    plan = build_plan(sc, prefix)
    two = cluster.model_copy(update={"machines": cluster.machines[:2]})
    p = place(sc, plan, two.machine_names, {"x": "m-a", "y": "m-b"})
    roadm = {s.label: s.node for s in plan.switches if s.kind == "roadm"}
    return plan_tunnels(prefix, p, two, roadm)[0]


def _leave_end(m: StandIn, t: TunnelPlan, machine: str) -> str:
    """Leave the tunnel end in the machine's root namespace: a run's own `ip link add`
    without its `netns` (ends are born in the run's namespaces now; phase 1 made them in
    the root namespace and moved them, and a run killed between the two left this)."""
    end = t.a if t.a.machine == machine else t.b
    add = create_commands(t, end, f"{TAG}zz")[0]
    at = add.index("netns")
    m.ip(*add[1:at], *add[at + 2:])
    return end.device


def _vxlan(m: StandIn, name: str, vni_id: int, local: str, port: int = 4789) -> None:
    m.ip("link", "add", name, "type", "vxlan", "id", str(vni_id), "local", local,
         "remote", "10.252.255.1", "dstport", str(port), "nolearning")


def _clean(*argv: str) -> tuple[int, str, str]:
    res = subprocess.run([f"{VENV}/bin/lightpipe", "clean", *argv], capture_output=True,
                         text=True, timeout=120, check=False)
    return res.returncode, res.stdout, res.stderr


@need
def test_clean_cluster_removes_only_the_runs_tunnels(
        machines: tuple[list[StandIn], Path]) -> None:
    (a, b), f = machines
    cluster = load_cluster(f)
    prefix, other = f"lp{secrets.token_hex(2)}", "lp0e0e"
    t = _tunnel(cluster, prefix)
    assert (t.a.local_ip, t.b.local_ip) == (a.address, b.address)
    ours_a, ours_b = _leave_end(a, t, "m-a"), _leave_end(b, t, "m-b")
    decoys = {  # each differs from the run's devices in one thing
        f"{TAG}d": lambda: _vxlan(a, f"{TAG}d", vni(prefix, 200), a.address),  # name
        f"{prefix}x99": lambda: _vxlan(a, f"{prefix}x99", vni(other, 1), a.address),  # VNI
        f"{prefix}x97": lambda: _vxlan(a, f"{prefix}x97", vni(prefix, 201),
                                       b.address),  # local address
        f"{prefix}x96": lambda: _vxlan(a, f"{prefix}x96", vni(prefix, 202), a.address,
                                       port=4790),  # UDP port
        f"{prefix}x98": lambda: a.ip("link", "add", f"{prefix}x98", "type", "veth", "peer",
                                     "name", f"{TAG}p"),  # kind
    }
    for make in decoys.values():
        make()
    before = a.links()
    assert before[ours_a] == "vxlan" and ours_b in b.links()

    t0 = time.monotonic()
    code, out, err = _clean("--cluster", str(f), prefix)
    took_s = time.monotonic() - t0
    print(f"\nclean --cluster, 2 machines + 1 unreachable: {took_s:.2f} s "
          f"(load {os.getloadavg()[0]:.1f})")
    after_a, after_b = a.links(), b.links()
    assert ours_a not in after_a and ours_b not in after_b, out
    assert set(before) - set(after_a) == {ours_a}, out  # every decoy stays
    assert f"m-a: tunnel: removed {ours_a} (vxlan vni {t.vni}, run {prefix})" in out
    assert f"m-b: tunnel: removed {ours_b} (vxlan vni {t.vni}, run {prefix})" in out
    assert "m-a: clean: nothing to clean" in out
    assert f"clean m-a ({a.address}): ok, removed 1 tunnel device(s) and 0 run(s)" in out
    assert f"clean m-b ({b.address}): ok, removed 1 tunnel device(s) and 0 run(s)" in out
    assert "clean m-gone (127.0.0.1): unreachable (" in out
    assert code == 1 and err.count("\n") == 1
    assert err.startswith("lightpipe: error: machine m-gone (127.0.0.1): unreachable (")


def _run_state(m: StandIn, prefix: str, live: bool) -> subprocess.Popen[bytes]:
    """A run's state on machine m, made by a process that then exits (a dead run, as
    after kill -9) or stays (a live run)."""
    code = ("import sys, time; from testbed.emu.state import new_state; "
            f"new_state({prefix!r}); print('ok', flush=True); "
            f"time.sleep(300 if {live} else 0)")
    env = {**os.environ, "LIGHTPIPE_STATE_DIR": str(m.state)}
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"ok\n"
    if not live:
        proc.wait(timeout=30)
    return proc


@need
def test_clean_cluster_finds_dead_runs_and_keeps_live_ones(
        machines: tuple[list[StandIn], Path]) -> None:
    (a, _), f = machines
    cluster = load_cluster(f)
    two = f.with_name("two.yaml")
    import yaml

    data = yaml.safe_load(f.read_text())
    data["machines"] = data["machines"][:2]
    two.write_text(yaml.safe_dump(data))
    dead, live = f"lp{secrets.token_hex(2)}", f"lp{secrets.token_hex(2)}"
    while live == dead:
        live = f"lp{secrets.token_hex(2)}"
    _run_state(a, dead, live=False)
    keeper = _run_state(a, live, live=True)
    try:
        dead_dev = _leave_end(a, _tunnel(cluster, dead), "m-a")
        live_dev = _leave_end(a, _tunnel(cluster, live), "m-a")
        samples = []
        code, out, err = _clean("--cluster", str(two))
        assert code == 0, (out, err)
        assert dead_dev not in a.links() and live_dev in a.links()
        assert f"m-a: tunnel: removed {dead_dev} (" in out
        assert f"run {live})" not in out  # a live run's devices are not even listed
        assert f"m-a: clean: removed run {dead} (0 processes)" in out
        assert f"m-a: clean: kept {live}: run is live (pid {keeper.pid})" in out
        assert not (a.state / dead).exists() and (a.state / live).is_dir()
        assert f"clean m-a ({a.address}): ok, removed 1 tunnel device(s) and 1 run(s)" in out
        assert "m-b: tunnel: no tunnel device left in the root namespace (no dead run " \
            "here)" in out
        # Time for two machines with nothing left to remove (the ssh sessions, the venv's
        # start-up and both tools on each), side by side.
        for _ in range(10):
            t0 = time.monotonic()
            code, out, err = _clean("--cluster", str(two))
            samples.append(time.monotonic() - t0)
            assert code == 0, (out, err)
        samples.sort()
        print(f"\nclean --cluster, 2 machines, nothing to remove, 10 runs: median "
              f"{statistics.median(samples):.2f} s, p90 {samples[8]:.2f} s, worst "
              f"{samples[-1]:.2f} s (load {os.getloadavg()[0]:.1f})")
    finally:
        keeper.kill()
        keeper.wait(timeout=30)
