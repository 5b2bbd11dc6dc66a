"""Per-flow routing in a live leaf-spine emulation (root): real OVS, os-ken, iperf3.

The controller's rules must carry real packets: ECMP select groups spread TCP
connections over both spines, a policy's per-flow rules send every flow through the
spine it chose (flow counters on the spine switches), and a fabric link taken down in
the data plane (a real port-down seen through OpenFlow PortStatus) moves the flows off it.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import SCENARIOS
from tests.ctl_ring import why_skip as _why_skip
from tests.waiting import scaled, wait_until

pytestmark = [pytest.mark.root, pytest.mark.slow]


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    why = _why_skip()
    if why:
        pytest.skip(why)
    from testbed.emu.network import EmuNetwork
    from testbed.emu.plan import build_plan
    from testbed.orchestrate.allreduce import layout_with_rates
    from testbed.orchestrate.controller import start_run_controller
    from testbed.orchestrate.glue import controller_address
    from testbed.spec import parse_scenario

    data = yaml.safe_load((SCENARIOS / "routing-leafspine.yaml").read_text())
    data["emulation"].update({"link_mode": "userspace", "datapath": "user"})
    sc = parse_scenario(data)
    tmp = tmp_path_factory.mktemp("route")
    with EmuNetwork(build_plan(sc), controller=controller_address()) as net:
        ctl = start_run_controller(net, sc, tmp / "ctl")
        try:
            status, body = ctl.request("PUT", "/layout", layout_with_rates(net).model_dump())
            assert status == 200, body
            yield {"net": net, "ctl": ctl, "scenario": sc}
        finally:
            ctl.stop()


def spines(net: Any) -> list[str]:
    return [s.node for s in net.plan.switches if s.kind == "spine"]


def iperf(net: Any, src: str, dst: str, port: int, parallel: int = 1,
          seconds: float = 1.0) -> float:
    """TCP goodput (Mbit/s) from src to dst over `parallel` connections."""
    ip = net.plan.host(dst).ip.split("/")[0]
    srv = net.host_popen(dst, ["iperf3", "-s", "-1", "-p", str(port)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        # Ready when its socket listens in dst's namespace (a fixed port is safe there:
        # the namespace is the emulated host's own), not after a guessed sleep.
        wait_until(lambda: net.host_cmd(dst, ["ss", "-Hltn", f"sport = :{port}"],
                                        check=False).stdout.strip(),
                   f"iperf3 -s to listen on {dst}:{port}",
                   alive=lambda: None if srv.poll() is None else f"iperf3 -s exited "
                   f"({srv.returncode})")
        r = net.host_cmd(src, ["iperf3", "-c", ip, "-p", str(port), "-t", str(seconds),
                               "-P", str(parallel), "-J"], timeout_s=scaled(60), check=False)
        return float(json.loads(r.stdout)["end"]["sum_received"]["bits_per_second"]) / 1e6
    finally:
        srv.wait(scaled(30))


def pair_bytes(net: Any, src: str, dst: str) -> dict[str, int]:
    """Per-spine bytes of the src->dst rule, once OVS has pushed its datapath flow stats
    to the OpenFlow rules (its revalidators do so about every 0.5 s)."""
    from testbed.orchestrate.allreduce import STATS_SETTLE_S, spine_bytes

    time.sleep(STATS_SETTLE_S)
    a, b = net.plan.host(src).ip.split("/")[0], net.plan.host(dst).ip.split("/")[0]
    got = spine_bytes(net)
    return {sp: got.get((sp, a, b), 0) for sp in spines(net)}


def delta(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: after[k] - before.get(k, 0) for k in after}


def set_link(net: Any, a: str, b: str, up: bool) -> None:
    intf, _ = net.nodes[a].connectionsTo(net.nodes[b])[0]
    subprocess.run(["ip", "link", "set", str(intf), "up" if up else "down"], check=True)


def wait_routing(ctl: Any, pred: Any, timeout_s: float = 60.0) -> dict[str, Any]:
    def view() -> dict[str, Any] | None:
        status, got = ctl.request("GET", "/routing")
        return dict(got) if status == 200 and pred(got) else None

    return wait_until(view, "the controller's routing view", timeout_s=timeout_s)


def leaf_groups(net: Any, leaf: str) -> tuple[int, int]:
    """(select groups, buckets) installed on a leaf switch."""
    out = subprocess.run(["ovs-ofctl", "-O", "OpenFlow13", "dump-groups", leaf],
                         capture_output=True, text=True, check=True).stdout
    return out.count("type=select"), out.count("bucket=")


def wait_spine_rules(net: Any, flows: list[dict[str, Any]]) -> None:
    """Until every flow's per-flow rule is on the spine its path names (rules are pushed
    after the REST view changes: readiness by the switches' tables, not a sleep)."""
    from testbed.orchestrate.allreduce import spine_bytes

    def ip(h: str) -> str:
        return str(net.plan.host(h).ip.split("/")[0])

    want = {(f["path"][2], ip(f["src"]), ip(f["dst"])) for f in flows}
    wait_until(lambda: want <= set(spine_bytes(net)), "the per-flow rules on their spines",
               interval_s=0.2)


def class_packets(node: Any, intf: str) -> dict[int, int]:
    """HTB minor class id -> packets sent, from `tc -s class show` on a shaped port."""
    out = node.cmd(f"tc -s class show dev {intf}")
    return {int(m.group(1), 16): int(m.group(2)) for m in re.finditer(
        r"class htb 1:([0-9a-f]+) .*?\n\s*Sent \d+ bytes (\d+) pkt", out)}


def test_small_packets_go_first_in_a_class_of_their_own(env: dict[str, Any]) -> None:
    """A shared switch port (testbed.emu.fabric.htb_script with its DC's sources) puts a
    host's full-size packets in that host's class and its small ones (pure ACKs, here
    small pings) in the class served first, whatever their source: real packets, the
    port's own counters."""
    from testbed.emu.fabric import port_classes

    net = env["net"]
    src, dst = "dc-a-h0", "dc-a-h2"
    dst_node = net.nodes[net.plan.host(dst).node]
    ports = [(node, intf, sources) for node, intf, _, nic, sources in net.shaped
             if not nic and node.connectionsTo(dst_node)
             and str(intf) == str(node.connectionsTo(dst_node)[0][0])]
    assert len(ports) == 1, ports  # dst's leaf, its port towards dst
    node, intf, sources = ports[0]
    classes = port_classes(len(sources))
    own = classes["sources"][sources.index(net.plan.host(src).ip.split("/")[0])]
    before = class_packets(node, intf)
    ip = net.plan.host(dst).ip.split("/")[0]
    for size in (56, 1400):  # 84-byte and 1428-byte IPv4 packets
        net.host_cmd(src, ["ping", "-c", "5", "-i", "0.2", "-s", str(size), "-W", "5", ip],
                     timeout_s=scaled(60))
    after = class_packets(node, intf)
    got = {cls: after[cls] - before.get(cls, 0) for cls in after}
    assert got[classes["small"]] >= 5, got  # the 5 small requests (and any pure ACKs)
    assert got[own] == 5, got               # the 5 large ones, and nothing small of src's


def test_ecmp_select_groups_spread_connections(env: dict[str, Any]) -> None:
    net, ctl = env["net"], env["ctl"]
    assert ctl.request("PUT", "/routing", {"policy": "ecmp"})[0] == 200
    status, job = ctl.request("POST", "/routing/jobs", {"members": ["dc-a-h0", "dc-a-h2"],
                                                        "buffer_bytes": 1 << 20})
    assert status == 201, job
    try:
        for s in net.plan.switches:  # installed after the POST answered: wait for them
            if s.kind == "leaf":
                wait_until(lambda node=s.node: leaf_groups(net, node) == (3, 6),
                           f"3 select groups of 2 buckets on {s.node}", interval_s=0.2)
        before = pair_bytes(net, "dc-a-h0", "dc-a-h2")
        mbps = iperf(net, "dc-a-h0", "dc-a-h2", 5301, parallel=16)
        grew = delta(pair_bytes(net, "dc-a-h0", "dc-a-h2"), before)
        # 16 connections hashed onto 2 spines: all on one has probability 2^-15.
        assert all(v > 100_000 for v in grew.values()), grew
        # Two spines: more than one 50 Mbit/s uplink's worth (host link is the limit).
        assert mbps > 40, mbps
    finally:
        ctl.request("DELETE", f"/routing/jobs/{job['id']}")


def test_ecmp_reroutes_around_a_failed_uplink(env: dict[str, Any]) -> None:
    net, ctl = env["net"], env["ctl"]
    assert ctl.request("PUT", "/routing", {"policy": "ecmp"})[0] == 200
    status, job = ctl.request("POST", "/routing/jobs", {"members": ["dc-a-h1", "dc-a-h3"],
                                                        "buffer_bytes": 1 << 20})
    assert status == 201, job
    leaf = net.plan.host("dc-a-h1").switch
    dead, alive = spines(net)
    try:
        set_link(net, leaf, dead, up=False)
        wait_routing(ctl, lambda v: v["failed_links"] == [sorted([leaf, dead])])
        # the leaf's groups lose their bucket towards the dead spine (not a sleep)
        wait_until(lambda: leaf_groups(net, leaf) == (3, 3),
                   f"{leaf}'s select groups without the bucket to {dead}", interval_s=0.2)
        before = pair_bytes(net, "dc-a-h1", "dc-a-h3")
        iperf(net, "dc-a-h1", "dc-a-h3", 5302, parallel=8)
        grew = delta(pair_bytes(net, "dc-a-h1", "dc-a-h3"), before)
        assert grew[dead] == 0 and grew[alive] > 1_000_000, grew
    finally:
        set_link(net, leaf, dead, up=True)
        ctl.request("DELETE", f"/routing/jobs/{job['id']}")
    wait_routing(ctl, lambda v: v["failed_links"] == [])


def ping_flow(net: Any, src: str, dst: str, count: int = 5, size: int = 1000) -> None:
    ip = net.plan.host(dst).ip.split("/")[0]
    r = net.host_cmd(src, ["ping", "-c", str(count), "-i", "0.05", "-s", str(size), "-W", "2",
                           ip], timeout_s=30, check=False)
    assert f"{count} received" in r.stdout, r.stdout[-300:]


def test_policy_rules_carry_packets_and_reroute_on_failure(env: dict[str, Any]) -> None:
    pytest.importorskip("testbed.routing")
    net, ctl, sc = env["net"], env["ctl"], env["scenario"]
    status, _ = ctl.request("PUT", "/routing", {"policy": "greedy"})
    assert status == 200
    ids = []
    for job in sc.workload.jobs:
        status, body = ctl.request("POST", "/routing/jobs", {"members": job.members,
                                                             "buffer_bytes": job.buffer_bytes})
        assert status == 201, body
        ids.append(body["id"])
    try:
        view = wait_routing(ctl, lambda v: len(v["jobs"]) == 2)
        # Greedy separates the two rings on every uplink: both jobs at the full 100 Gb/s.
        assert [j["bottleneck_gbps"] for j in view["jobs"]] == [pytest.approx(100.0)] * 2
        flows = [f for j in view["jobs"] for f in j["flows"]]
        wait_spine_rules(net, flows)

        def check_paths(flows: list[dict[str, Any]]) -> None:
            for f in flows:
                chosen = f["path"][2]
                before = pair_bytes(net, f["src"], f["dst"])
                ping_flow(net, f["src"], f["dst"])
                grew = delta(pair_bytes(net, f["src"], f["dst"]), before)
                assert grew[chosen] >= 5 * 1000, (f, grew)
                assert all(v == 0 for sp, v in grew.items() if sp != chosen), (f, grew)

        check_paths(flows)
        # Take down the uplink of the first flow: every flow on it moves, packets follow.
        f0 = flows[0]
        leaf, spine = f0["path"][1], f0["path"][2]
        hit = [f for f in flows if any({a, b} == {leaf, spine}
                                       for a, b in zip(f["path"], f["path"][1:], strict=False))]
        set_link(net, leaf, spine, up=False)
        try:
            view = wait_routing(ctl, lambda v: v["failed_links"] == [sorted([leaf, spine])])
            assert view["last"]["moved"] >= len(hit)
            after = {(f["src"], f["dst"]): f for j in view["jobs"] for f in j["flows"]}
            for f in hit:
                p = after[(f["src"], f["dst"])]["path"]
                assert not any({a, b} == {leaf, spine} for a, b in pairwise(p))
            wait_spine_rules(net, list(after.values()))
            check_paths(list(after.values()))
        finally:
            set_link(net, leaf, spine, up=True)
        wait_routing(ctl, lambda v: v["failed_links"] == [])
    finally:
        for i in ids:
            ctl.request("DELETE", f"/routing/jobs/{i}")


# Behaviour with a margin for a busy machine, not the fidelity figure (bench/
# bench_routing_emu.py measures that over 50 rounds per policy; docs/routing-testbed.md).
# Since small packets go first at the switch ports (2026-12-06, testbed/emu/fabric.py),
# emulated rounds came within a median of 1.2 % (ECMP) and 2.1 % (greedy) of the model,
# p90 3.6 % and 6.3 %, the worst of 150 rounds per policy 15.5 %, on an idle 2-core
# machine (15 runs); with one core kept busy (10 runs) medians 1.4 % and 4.5 % (5.5 %
# in one batch of 5), worst 13.6 %, and greedy's ratio to ECMP 2-7 % off the model's. So
# a faithful run is held to a median of MEDIAN_TOLERANCE (about 3x the busy median) and
# every round to STALL_TOLERANCE (2.5x the worst): a wrong path or rate model is a 2x
# error (100 %) in every round, and a stalled round (a retransmission time-out chain:
# 2.6x once in CI before the fabric's fix) is past it. What a uniform slow-down cannot
# hide is checked relatively: greedy's emulated round time over ECMP's matches the
# model's ratio within RATIO_TOLERANCE (emulation with no gain from greedy routing, a
# ratio of 1 against 0.5, is 100 % off).
# TCP retransmits nothing the model's queues did not drop: until the switch's send socket
# was sized to its ports' queues (testbed/emu/sockbuf.py), ovs-vswitchd dropped, counted
# nowhere, what ECMP's shared links queued past 208 kB (retransmits 1.5-4.1 % of the
# segments, and CI reds on this test when ECMP's rounds ran 47-54 % over the model);
# since, 0-24 retransmitted of ~390,000 per run (every run measured; 25 on 2026-12-06).
# A run whose own fidelity verdict says it was not faithful for another reason (a CPU
# share on a loaded machine) has said so, with its reasons; it is held to
# UNFAITHFUL_MEDIAN_TOLERANCE, every round to UNFAITHFUL_STALL_TOLERANCE and the ratio to
# UNFAITHFUL_RATIO_TOLERANCE (the bounds before 2026-11-29), which a wrong model (2x,
# 100 %) still fails.
MEDIAN_TOLERANCE = 0.15
UNFAITHFUL_MEDIAN_TOLERANCE = 0.8
STALL_TOLERANCE = 0.4
UNFAITHFUL_STALL_TOLERANCE = 1.0
RATIO_TOLERANCE = 0.2
UNFAITHFUL_RATIO_TOLERANCE = 0.5


def test_scenario_both_backends_agree_and_greedy_beats_ecmp(tmp_path: Path) -> None:
    why = _why_skip()
    if why:
        pytest.skip(why)
    import sys

    out = tmp_path / "run"
    lightpipe = str(Path(sys.executable).parent / "lightpipe")
    r = subprocess.run([lightpipe, "run", str(SCENARIOS / "routing-leafspine.yaml"),
                        "--backend", "both", "--out", str(out), "-q"],
                       capture_output=True, text=True, timeout=600,
                       cwd=SCENARIOS.parent)
    assert r.returncode == 0, r.stderr[-2000:]
    sim = json.loads((out / "sim" / "summary.json").read_text())["allreduce"]["policies"]
    emu = json.loads((out / "emu" / "summary.json").read_text())["allreduce"]
    # Simulation: with seed 1 ECMP hashes two flows onto one spine link; greedy does not.
    assert sim["greedy"]["max_allreduce_time_s"] < sim["ecmp"]["max_allreduce_time_s"]
    assert [j["bottleneck_gbps"] for j in sim["greedy"]["jobs"]] == [100.0, 100.0]
    fidelity = json.loads((out / "emu" / "summary.json").read_text())["fidelity"]
    if not fidelity["faithful"]:  # the run says why, from invariants it measured
        measured = {i["name"] for i in fidelity["invariants"] if i["measured"]}
        failed = {i["name"] for i in fidelity["invariants"] if not i["ok"]}
        assert fidelity["reasons"] and failed and failed <= measured, fidelity
    # the switch's send socket holds what its shaped ports queue: nothing lost uncounted
    sndbuf = fidelity["switch_send_buffers"]
    assert sndbuf.get("sockets") == 1 and sndbuf["bytes"] >= sndbuf["wanted_bytes"], sndbuf
    rcvbuf = fidelity["switch_receive_buffers"]  # and every port's receive socket
    assert rcvbuf["sockets"] >= 8 and rcvbuf["bytes"] >= rcvbuf["wanted_bytes"], rcvbuf
    tcp = next(i for i in fidelity["invariants"] if i["name"] == "tcp_retransmits")
    assert tcp["measured"] and tcp["ok"], tcp
    tolerance, stall, ratio_tolerance = (
        (MEDIAN_TOLERANCE, STALL_TOLERANCE, RATIO_TOLERANCE) if fidelity["faithful"] else
        (UNFAITHFUL_MEDIAN_TOLERANCE, UNFAITHFUL_STALL_TOLERANCE, UNFAITHFUL_RATIO_TOLERANCE))
    for policy in ("ecmp", "greedy"):
        e = emu[policy]
        assert e["samples"] == 10
        assert e["abs_rel_error_median"] <= tolerance, (e, fidelity["reasons"])
        assert e["abs_rel_error_max"] <= stall, (e, fidelity["reasons"])
    rounds = json.loads((out / "emu" / "allreduce.json").read_text())["rounds"]
    assert emu["greedy"]["collision"] is False
    if emu["ecmp"]["collision"]:  # OVS's hash put two flows on one link (nearly always)
        assert emu["greedy"]["mean_emu_s"] < emu["ecmp"]["mean_emu_s"]
    ratio_emu = emu["greedy"]["mean_emu_s"] / emu["ecmp"]["mean_emu_s"]
    ratio_sim = emu["greedy"]["mean_sim_s"] / emu["ecmp"]["mean_sim_s"]
    assert abs(ratio_emu / ratio_sim - 1.0) <= ratio_tolerance, (
        ratio_emu, ratio_sim, fidelity["reasons"],
        [(r["policy"], r["job"], r["rel_error"]) for r in rounds])
    assert len(rounds) == 20 and all(r["emu_s"] > 0 for r in rounds)
