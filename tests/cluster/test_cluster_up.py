"""`lightpipe cluster up/down` over real SSH (root, opt-in; tests/cluster/run.sh).

Two stand-in machines, each a network namespace of its own (its root namespace) joined to
this host by a veth (the SSH network) and to the other by a veth (the data network that
carries the tunnels), with a Dropbear server inside (test_cluster_ssh's `servers`) whose
sessions get a state root of their own (LIGHTPIPE_STATE_DIR) and a private /run/netns, so
each machine's share, its held namespaces and its own `lightpipe clean` are that
machine's. A ring of 4 optical nodes with a DC of one host on each, two DCs per stand-in:
`up` brings both shares up, every DC pair answers, the results file has its shape, `down`
leaves nothing; with a machine that cannot be reached, `up` fails with one line and
leaves nothing on the other. Everything carries the harness's `lct` prefix or lives in
its namespaces and state roots; the test fails if anything is left.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.cluster.test_cluster_ssh import WHY as SSH_WHY
from tests.cluster.test_cluster_ssh import Server, _cluster_file, _free_port, servers
from tests.proclist import pids_with_cmdline
from tests.test_cluster import ring

pytestmark = [pytest.mark.root, pytest.mark.slow]
__all__ = ["servers"]  # the fixture, from test_cluster_ssh

TAG = f"lct{secrets.token_hex(2)}"
VENV = str(Path(sys.executable).parent.parent)
PLACE = ["a=m-a", "b=m-a", "c=m-b", "d=m-b"]


def _why_skip() -> str | None:
    if SSH_WHY is not None:
        return SSH_WHY
    if not Path("/sys/module/vxlan").exists():
        return "needs the vxlan kernel module loaded"
    for tool in ("mnexec", "ovs-vswitchd", "ovsdb-server", "ovs-vsctl", "ss"):
        if shutil.which(tool) is None:
            return f"needs {tool}"
    return None


WHY = _why_skip()
need = pytest.mark.skipif(WHY is not None, reason=WHY or "")


def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, check=check, timeout=60)


def _free_subnets(count: int) -> list[int]:
    routes = sh("ip", "-4", "route", "show", "table", "all").stdout
    free = [n for n in range(16, 250) if f"10.252.{n}." not in routes]
    assert len(free) >= count, "no free 10.252.N.0/24 here"
    return free[:count]


@dataclass
class StandIn:
    name: str
    netns: str
    address: str        # SSH
    tunnel: str         # the data network
    state: Path

    def udp_ports(self) -> set[int]:
        out = sh("ip", "netns", "exec", self.netns, "ss", "-Hlnu").stdout
        return {int(ln.split()[3].rsplit(":", 1)[1]) for ln in out.splitlines()
                if ln.strip()}

    def runs(self) -> list[str]:
        return sorted(p.name for p in self.state.glob("lp*")) if self.state.is_dir() else []

    def procs(self) -> list[int]:
        """Processes whose command line names this machine's state root (OVS, fibre
        emulators, the share holder)."""
        return pids_with_cmdline(str(self.state).encode())

    def left(self) -> list[str]:
        """What a run left on this machine: state, processes, a tunnel's UDP socket."""
        return ([f"state {r}" for r in self.runs()] + [f"pid {p}" for p in self.procs()]
                + (["udp 4789"] if 4789 in self.udp_ports() else []))


def _leftovers() -> list[str]:
    links = [ln for ln in sh("ip", "-o", "link", "show").stdout.splitlines() if TAG in ln]
    nss = [ln for ln in sh("ip", "netns", "list").stdout.splitlines() if TAG in ln]
    return links + nss


@pytest.fixture
def machines(tmp_path: Path, servers: Callable[..., Server]
             ) -> Iterator[tuple[list[StandIn], Path]]:
    """Two stand-in machines with Dropbear; the cluster file names them and a third,
    unreachable one (last). The scenario file is tmp/ring.yaml."""
    ssh_net, data_net = _free_subnets(2)
    made: list[StandIn] = []
    try:
        for i, name in enumerate(("a", "b")):
            ns, host_if, ns_if = f"{TAG}{name}", f"{TAG}h{name}", f"{TAG}m{name}"
            sh("ip", "netns", "add", ns)
            st = StandIn(name, ns, f"10.252.{ssh_net}.{4 * i + 2}",
                         f"10.252.{data_net}.{i + 1}", tmp_path / f"state-{name}")
            made.append(st)
            sh("ip", "link", "add", host_if, "type", "veth", "peer", "name", ns_if)
            sh("ip", "link", "set", ns_if, "netns", ns)
            sh("ip", "addr", "add", f"10.252.{ssh_net}.{4 * i + 1}/30", "dev", host_if)
            sh("ip", "link", "set", host_if, "up")
            sh("ip", "-n", ns, "addr", "add", f"{st.address}/30", "dev", ns_if)
            sh("ip", "-n", ns, "link", "set", ns_if, "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        a, b = made
        sh("ip", "-n", a.netns, "link", "add", f"{TAG}u", "type", "veth", "peer", "name",
           f"{TAG}v", "netns", b.netns)
        for m, dev in ((a, f"{TAG}u"), (b, f"{TAG}v")):
            sh("ip", "-n", m.netns, "addr", "add", f"{m.tunnel}/24", "dev", dev)
            sh("ip", "-n", m.netns, "link", "set", dev, "mtu", "1554", "up")
        started = [servers(m.address, netns=m.netns, private_netns=True,
                           env={"LIGHTPIPE_STATE_DIR": str(m.state)}) for m in made]
        (tmp_path / "known_hosts").write_text("".join(s.known_hosts_line() for s in started))
        f = _cluster_file(tmp_path, [
            *({"name": f"m-{m.name}", "address": m.address, "port": s.port,
               "tunnel_address": m.tunnel} for m, s in zip(made, started, strict=True)),
            {"name": "m-gone", "address": "127.0.0.1", "port": _free_port("127.0.0.1"),
             "tunnel_address": "10.252.255.3"}])
        sc = ring(4, [("a", "n1", 1), ("b", "n2", 1), ("c", "n3", 1), ("d", "n4", 1)])
        (tmp_path / "ring.yaml").write_text(yaml.safe_dump(sc.model_dump(mode="json")))
        yield made, f
    finally:
        for m in made:  # a run the test could not take down: that machine's own clean
            if m.runs():
                subprocess.run([f"{VENV}/bin/lightpipe", "clean", "--force"], timeout=120,
                               env={**os.environ, "LIGHTPIPE_STATE_DIR": str(m.state)},
                               capture_output=True, check=False)
        for m in made:
            sh("ip", "netns", "del", m.netns, check=False)
            sh("ip", "link", "del", f"{TAG}h{m.name}", check=False)
            shutil.rmtree(m.state, ignore_errors=True)
    assert _leftovers() == [], _leftovers()


def _cluster_subset(f: Path, names: list[str]) -> Path:
    data = yaml.safe_load(f.read_text())
    data["machines"] = [m for m in data["machines"] if m["name"] in names]
    out = f.with_name(f"cluster-{'-'.join(names)}.yaml")
    out.write_text(yaml.safe_dump(data))
    return out


def _lightpipe(*argv: str) -> tuple[int, str, str]:
    res = subprocess.run([f"{VENV}/bin/lightpipe", *argv], capture_output=True, text=True,
                         timeout=600, check=False)
    return res.returncode, res.stdout, res.stderr


@need
def test_up_checks_every_pair_and_down_leaves_nothing(
        machines: tuple[list[StandIn], Path], tmp_path: Path) -> None:
    (a, b), f = machines
    two = _cluster_subset(f, ["m-a", "m-b"])
    spec, out = tmp_path / "ring.yaml", tmp_path / "out"
    place = [w for p in PLACE for w in ("--place", p)]
    t0 = time.monotonic()
    code, so, se = _lightpipe("cluster", "up", str(spec), "--cluster", str(two), "--out",
                              str(out), *place, "--link-mode", "userspace",
                              "--datapath", "user")
    took_s = time.monotonic() - t0
    load = os.getloadavg()[0]
    print(f"\n{so}{se}cluster up, 2 stand-ins, 4 DCs: {took_s:.2f} s (load {load:.1f})")
    prefix = re.search(r"as run (lp[0-9a-f]{4})", so)
    assert prefix is not None, (so, se)
    run = prefix.group(1)
    try:
        assert code == 0, (so, se)
        assert a.runs() == [run] and b.runs() == [run]
        rec = json.loads((out / "cluster_run.json").read_text())
        assert rec["prefix"] == run and rec["dcs"] == {"a": "m-a", "b": "m-a", "c": "m-b",
                                                       "d": "m-b"}
        assert rec["crossing_fibres"] == 2
        for m in ("m-a", "m-b"):
            assert len(rec["machines"][m]["hosts"]) == 2
            assert len(rec["machines"][m]["tunnels"]) == 2
        # The delay calibration across the machines: every fibre's emulator on its own
        # machine, the tunnels' latency taken off with the rest of each path's processing.
        cal = json.loads((out / "cluster_calibration.json").read_text())
        assert cal["enabled"] and cal["mode"] == "per_lightpath"
        assert {f["machine"] for f in cal["fibres"]} == {"m-a", "m-b"}
        assert len(cal["fibres"]) == 4 and len(cal["after"]) == 6
        worst = [max(abs(r["error_ms"]) for r in rnd["paths"]) for rnd in cal["rounds"]]
        print(f"calibration: {cal['corrections_applied']} round(s) in {cal['wall_s']:.1f} s, "
              f"worst pair per round (ms) {worst}, settled {cal['settled']}")
        assert worst[cal["kept_round"]] < worst[0]
        assert "delay calibration (per_lightpath)" in so
        rtt = json.loads((out / "cluster_rtt.json").read_text())
        assert rtt["prefix"] == run and rtt["pairs_planned"] == 6
        assert rtt["pairs_answered"] == 6 and rtt["calibrated"] is True
        # After it, every DC pair (4 of them across the machines) is within the band.
        assert rtt["pairs_within_band"] == 6, rtt["pairs"]
        pairs = {r["pair"]: r for r in rtt["pairs"]}
        assert set(pairs) == {"a~b", "a~c", "a~d", "b~c", "b~d", "c~d"}
        assert sum(r["crosses"] for r in rtt["pairs"]) == 4
        for r in rtt["pairs"]:
            assert r["pings"] >= 8 and r["median_ms"] > r["expected_rtt_ms"] * 0.9, r
            assert set(r) >= {"src_machine", "dst_machine", "expected_rtt_ms", "median_ms",
                              "max_ms", "error_ms", "within_band", "fibres", "hops"}
        # The lightpath probes across the machines: both directions of every DC pair's
        # lightpath on its route, every fibre's own delay measured on its machine (the two
        # that cross included), the one-way time only where both hosts share a machine.
        lp = json.loads((out / "cluster_probes.json").read_text())
        assert lp["routes_ok"] and len(lp["probes"]) == 12, lp
        assert lp["one_way_checked"] == 4  # a~b and c~d, both ways
        crossing = {m for r in lp["probes"] for m, mm in r["fibre_machines"].items()
                    if r["src_machine"] != r["dst_machine"]}
        for r in lp["probes"]:
            assert r["hops_seen"] == r["hops_expected"] and r["tag_ok"], r
            assert set(r["fibre_delay_ms"]) == set(r["hops_expected"]), r
            assert (r["one_way_ms"] is None) == (r["src_machine"] != r["dst_machine"])
        assert len(crossing) >= 2
        print(f"lightpath probes: {sum(r['delay_ok'] for r in lp['probes'])}/12 within "
              f"their fibres' delays, {lp['rounds']} round(s), {lp['took_s']:.1f} s")
        assert "lightpath probes on their routes" in so
        for m in (a, b):  # the tunnels' ends live in the run's namespaces
            assert 4789 in m.udp_ports()
            root = json.loads(sh("ip", "-n", m.netns, "-j", "-d", "link", "show").stdout)
            assert not [x for x in root
                        if (x.get("linkinfo") or {}).get("info_kind") == "vxlan"]
        print("rtt per pair (median vs plan, ms): " + ", ".join(
            f"{p} {r['median_ms']:.2f}/{r['expected_rtt_ms']:.2f}" for p, r in pairs.items()))
    finally:
        t0 = time.monotonic()
        dcode, dso, dse = _lightpipe("cluster", "down", "--cluster", str(two), run)
        print(f"{dso}{dse}cluster down: {time.monotonic() - t0:.2f} s "
              f"(load {os.getloadavg()[0]:.1f})")
    assert dcode == 0, (dso, dse)
    assert "down m-a (" in dso and "down m-b (" in dso
    assert a.left() == [] and b.left() == []


@need
def test_unreachable_machine_fails_up_and_leaves_nothing(
        machines: tuple[list[StandIn], Path], tmp_path: Path) -> None:
    (a, b), f = machines
    gone = _cluster_subset(f, ["m-a", "m-gone"])
    spec, out = tmp_path / "ring.yaml", tmp_path / "out-gone"
    place = [w for p in ("a=m-a", "b=m-a", "c=m-gone", "d=m-gone") for w in ("--place", p)]
    t0 = time.monotonic()
    code, so, se = _lightpipe("cluster", "up", str(spec), "--cluster", str(gone), "--out",
                              str(out), *place, "--link-mode", "userspace",
                              "--datapath", "user")
    print(f"\n{so}{se}cluster up with an unreachable machine: {time.monotonic() - t0:.2f} s "
          f"(load {os.getloadavg()[0]:.1f})")
    assert code == 1, (so, se)
    assert se.count("\n") == 1
    assert se.startswith("lightpipe: error: machine m-gone (127.0.0.1): unreachable (")
    assert "down m-a (" in so  # the machine that came up was taken down
    assert a.left() == [] and b.left() == []
    assert not (out / "cluster_run.json").exists()


@need
def test_down_after_kill_9_of_a_share_holder(machines: tuple[list[StandIn], Path],
                                             tmp_path: Path) -> None:
    """kill -9 of one machine's share holder (no teardown at all): `down` finds it dead
    there, and that machine's own `lightpipe clean RUN` removes what it left."""
    (a, b), f = machines
    two = _cluster_subset(f, ["m-a", "m-b"])
    out = tmp_path / "out-kill"
    place = [w for p in PLACE for w in ("--place", p)]
    code, so, se = _lightpipe("cluster", "up", str(tmp_path / "ring.yaml"), "--cluster",
                              str(two), "--out", str(out), *place, "--link-mode",
                              "userspace", "--datapath", "user", "--no-calibrate")
    assert code == 0, (so, se)
    assert not (out / "cluster_calibration.json").exists()
    assert json.loads((out / "cluster_rtt.json").read_text())["calibrated"] is False
    rec = json.loads((out / "cluster_run.json").read_text())
    run, holder = rec["prefix"], rec["machines"]["m-a"]["pid"]
    scode, sso, sse = _lightpipe("cluster", "status", "--cluster", str(two), "--json")
    assert scode == 0, (sso, sse)
    held = json.loads(sso)
    assert held["runs"] == {run: ["m-a", "m-b"]}, held
    for m in ("m-a", "m-b"):
        (share,) = held["machines"][m]["shares"]
        assert share["prefix"] == run and share["holder_alive"] and share["machine"] == m
        assert len(share["hosts"]) == 2 and len(share["tunnels"]) == 2, share
        assert share["processes_alive"] == share["processes"] > 0, share
    os.kill(holder, 9)
    assert _gone(holder)
    assert a.runs() == [run] and a.procs()  # what the holder built outlives it
    scode, sso, sse = _lightpipe("cluster", "status", "--cluster", str(two))
    print(f"\n{sso}{sse}")
    assert scode == 0 and f"run {run} (" in sso, (sso, sse)
    assert re.search(rf"m-a \([^)]*\): run {run} \(\w+\): holder GONE", sso), sso
    assert re.search(rf"m-b \([^)]*\): run {run} \(\w+\): holder alive", sso), sso
    dcode, dso, dse = _lightpipe("cluster", "down", "--cluster", str(two), run)
    print(f"\n{dso}{dse}")
    assert dcode == 0, (dso, dse)
    scode, sso, sse = _lightpipe("cluster", "status", "--cluster", str(two))
    assert scode == 0 and sso.count("holds no share") == 2, (sso, sse)
    assert f"down m-a ({a.address}): ok (share {run}: its holder had already ended)" in dso
    assert f"m-a: clean: removed run {run} (" in dso
    assert re.search(rf"down m-b \({re.escape(b.address)}\): ok \(share {run} in ", dso)
    assert a.left() == [] and b.left() == []


def _gone(pid: int) -> bool:
    """Wait for a process that is not our child to end (its pidfd becomes readable)."""
    import select

    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        return bool(select.select([fd], [], [], 30)[0])
    finally:
        os.close(fd)


@need
def test_cost_grows_per_dc_fibre_and_machine(machines: tuple[list[StandIn], Path],
                                             tmp_path: Path) -> None:
    """How `cluster up`'s cost grows: rings of 4, 8 and 12 optical nodes with a DC of one
    host on each, the first half of the DCs on m-a and the rest on m-b (2 fibres cross),
    no delay calibration (its cost is the pair check's, per pair). Printed per size: each
    machine's share (switches, fibre emulators, hosts) and its holder's build time, the
    whole `up`, the pair check's time per DC pair; then a least-squares line of a
    machine's build time against its switches and fibre emulators. Every pair answers
    at every size and `down` leaves nothing."""
    (a, b), f = machines
    two = _cluster_subset(f, ["m-a", "m-b"])
    rows = []
    for n in (4, 8, 12):
        dcs = [(f"d{i + 1}", f"n{i + 1}", 1) for i in range(n)]
        spec, out = tmp_path / f"ring{n}.yaml", tmp_path / f"out{n}"
        spec.write_text(yaml.safe_dump(ring(n, dcs).model_dump(mode="json")))
        place = [w for i, (d, _, _) in enumerate(dcs)
                 for w in ("--place", f"{d}={'m-a' if i < n // 2 else 'm-b'}")]
        code, so, se = _lightpipe("cluster", "check", str(spec), "--cluster", str(two),
                                  *place, "--offline", "--json")
        assert code == 0, (so, se)
        load = json.loads(so)["load"]
        t0 = time.monotonic()
        code, so, se = _lightpipe("cluster", "up", str(spec), "--cluster", str(two),
                                  "--out", str(out), *place, "--link-mode", "userspace",
                                  "--datapath", "user", "--no-calibrate")
        wall_s = time.monotonic() - t0
        m = re.search(r"as run (lp[0-9a-f]{4})", so)
        assert m is not None, (so, se)
        try:
            assert code == 0, (so, se)
            rec = json.loads((out / "cluster_run.json").read_text())
            rtt = json.loads((out / "cluster_rtt.json").read_text())
            assert rtt["pairs_answered"] == rtt["pairs_planned"] == n * (n - 1) // 2
        finally:
            dcode, dso, dse = _lightpipe("cluster", "down", "--cluster", str(two),
                                         m.group(1))
        assert dcode == 0, (dso, dse)
        assert a.left() == [] and b.left() == []
        for mach in ("m-a", "m-b"):
            rows.append({"dcs": n, "machine": mach, **load[mach],
                         "build_s": rec["machines"][mach]["up_s"]})
        print(f"\nring of {n}: up {rec['up_s']:.2f} s (whole command {wall_s:.1f} s, load "
              f"{os.getloadavg()[0]:.1f}); pair check {rtt['took_s']:.1f} s for "
              f"{rtt['pairs_planned']} pairs ({rtt['took_s'] / rtt['pairs_planned']:.3f} s "
              "each); " + "; ".join(
                  f"{r['machine']}: {r['switches']} switches, {r['fibre_emulators']} fibre "
                  f"emulators, {r['hosts']} hosts, built in {r['build_s']:.2f} s"
                  for r in rows[-2:]))
    import numpy as np

    x = np.array([[r["switches"], r["fibre_emulators"], 1.0] for r in rows])
    y = np.array([r["build_s"] for r in rows])
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    print(f"a machine's build time ~ {coef[0]:.3f} s per switch + {coef[1]:.3f} s per fibre "
          f"emulator + {coef[2]:.2f} s (least squares over {len(rows)} shares)")
    (tmp_path / "cost.json").write_text(json.dumps({"rows": rows, "fit": list(coef)}))
