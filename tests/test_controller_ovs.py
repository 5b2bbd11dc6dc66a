"""The controller with real Open vSwitch: lightpaths carry traffic, cuts restore, restarts keep.

Root only (CI is root). Builds a 4-node ring (A-B-C-D) with a DC on A and on C through
the emulation backend (private OVS, userspace datapath, forwarder fibres), starts the
real controller process and drives it through its REST API.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.ctl_ring import ring_env
from tests.waiting import wait_until

pytestmark = [pytest.mark.root, pytest.mark.slow]

@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    yield from ring_env(tmp_path_factory, "ctl-ring")


def _clean_slate(ctl: Any) -> None:
    """No lightpath left and every fibre repaired (what the tests before may have left)."""
    for lp in ctl.request("GET", "/lightpaths")[1]["lightpaths"]:
        ctl.request("DELETE", f"/lightpaths/{lp['id']}")
    for f in ctl.request("GET", "/topology")[1]["fibres"]:
        if f["failed"]:
            ctl.request("POST", "/repairs", {"link": [f["u"], f["v"]]})


def _host(net: Any, dc: str, i: int = 0) -> Any:
    return next(h for h in net.plan.hosts if h.dc == dc and h.name.endswith(f"-h{i}"))


def _ns(net: Any, host: Any) -> str:
    return f"/proc/{net.host_pid(host.name)}/ns/net"


def _ping_ok(net: Any, a: Any, b: Any, count: int = 3) -> int:
    from testbed.emu.probes import icmp_ping

    rtts = icmp_ping(_ns(net, a), b.ip.split("/")[0], count=count, interval_s=0.02)
    return sum(r is not None for r in rtts)


def _traffic_stops(net: Any, a: Any, b: Any) -> None:
    """After rules are removed, a's pings to b stop getting through, and stay stopped.

    An OpenFlow barrier reply covers the switch's flow tables; the flows its datapath
    cached from them (OVS's megaflows) go at the revalidators' next pass, just after
    (`ovs-appctl revalidator/wait`): a ping sent in between may still cross (one of two
    did in a CI run, right after DELETE /jobs returned). So: stopped within a deadline
    (against a hang only), then not one reply."""
    wait_until(lambda: _ping_ok(net, a, b, count=1) == 0,
               f"{a.name}'s pings to {b.name} to stop getting through", timeout_s=10,
               interval_s=0.1)
    assert _ping_ok(net, a, b, count=3) == 0


def _flows(net: Any, node: str) -> list[str]:
    r = subprocess.run(["ovs-ofctl", "-O", "OpenFlow13", "dump-flows", node],
                       capture_output=True, text=True, check=True,
                       env={**os.environ, **net.ovs.env})
    return r.stdout.splitlines()


def _vlan_packets(net: Any, node: str, vid: int) -> int:
    total = 0
    for line in _flows(net, node):
        if f"dl_vlan={vid}," in line or f"dl_vlan={vid} " in line \
                or f"vlan_vid=0x{0x1000 | vid:x}" in line:
            total += int(line.split("n_packets=")[1].split(",")[0])
    return total


def _roadm(net: Any, node: str) -> str:
    return next(s.node for s in net.plan.switches if s.kind == "roadm" and s.label == node)


def _probe(net: Any, lp: dict[str, Any], src: Any, dst: Any) -> Any:
    from testbed.emu.probes import lightpath_probe

    p = net.plan
    hops = []
    for u, v in zip(lp["nodes"], lp["nodes"][1:], strict=False):
        f = p.fibre(u, v)
        emu = net.emulators[f.middle]
        hops.append((f.middle, f"/proc/{emu.ns_pid}/ns/net",
                     emu.intf_u if u == f.u else emu.intf_v))
    return lightpath_probe(_ns(net, src), str(net.nodes[src.node].defaultIntf()), src.mac,
                           src.ip.split("/")[0], _ns(net, dst),
                           str(net.nodes[dst.node].defaultIntf()), dst.mac,
                           dst.ip.split("/")[0], lp["vid"], hops, lp["latency_ms"])


def test_no_lightpath_no_traffic(env: dict[str, Any]) -> None:
    net = env["net"]
    assert _ping_ok(net, _host(net, "dc-a"), _host(net, "dc-c"), count=2) == 0
    # intra-DC routing works without lightpaths
    assert _ping_ok(net, _host(net, "dc-a", 0), _host(net, "dc-a", 1), count=2) == 2


def test_lightpath_carries_traffic_on_route(env: dict[str, Any]) -> None:
    net, ctl = env["net"], env["ctl"]
    status, lp = ctl.request("POST", "/lightpaths", {"src_dc": "dc-a", "dst_dc": "dc-c",
                                                     "slots": 2})
    assert status == 201, lp
    assert lp["nodes"] == ["A", "B", "C"]
    env["lp1"] = lp
    a, c = _host(net, "dc-a"), _host(net, "dc-c")
    assert _ping_ok(net, a, c, count=5) >= 4
    # flow counters: the VLAN rules on the route's ROADMs matched, D's has none
    for node in ("A", "B", "C"):
        assert _vlan_packets(net, _roadm(net, node), lp["vid"]) > 0, node
    assert _vlan_packets(net, _roadm(net, "D"), lp["vid"]) == 0
    # scapy probe: tagged with the lightpath's VLAN on every fibre of the route, in order
    res = _probe(net, lp, a, c)
    assert res.delivered and res.tag_ok and res.hops_seen == res.hops_expected, res


def test_second_lightpath_disjoint_slots(env: dict[str, Any]) -> None:
    net, ctl = env["net"], env["ctl"]
    a1, c1 = _host(net, "dc-a", 1), _host(net, "dc-c", 1)
    status, lp = ctl.request("POST", "/lightpaths", {
        "src_dc": "dc-a", "dst_dc": "dc-c", "slots": 3, "src_host": a1.name,
        "dst_host": c1.name})
    assert status == 201, lp
    lp1 = env["lp1"]
    assert lp["nodes"] == lp1["nodes"]
    assert not set(lp["slots"]) & set(lp1["slots"])
    status, spec = ctl.request("GET", "/spectrum")
    ab = next(f for f in spec["fibres"] if {f["u"], f["v"]} == {"A", "B"})
    assert sorted(ab["used"]) == sorted(lp["slots"] + lp1["slots"])
    before = _vlan_packets(net, _roadm(net, "B"), lp["vid"])
    assert _ping_ok(net, a1, c1, count=3) >= 2
    assert _vlan_packets(net, _roadm(net, "B"), lp["vid"]) > before
    env["lp2"] = lp


def _sync_rounds(metrics: str) -> dict[str, float]:
    """lightpipe_controller_sync_round_seconds_count per round, from /metrics."""
    return {x.split('round="')[1].split('"')[0]: float(x.split()[-1])
            for x in metrics.splitlines()
            if x.startswith("lightpipe_controller_sync_round_seconds_count{")}


def test_fibre_cut_restores_on_other_route(env: dict[str, Any]) -> None:
    net, ctl = env["net"], env["ctl"]
    lp1 = env["lp1"]
    f = net.plan.fibre("A", "B")
    emu = net.emulators[f.middle]
    rounds_before = _sync_rounds(ctl.request("GET", "/metrics")[1])
    # Cut: the fibre's middle node drops its interfaces -> OVS reports port down.
    t_cut = time.monotonic()
    subprocess.run(["mnexec", "-a", str(emu.ns_pid), "ip", "link", "set", emu.intf_u, "down"],
                   check=True)

    def restored() -> dict[str, Any] | None:
        status, got = ctl.request("GET", f"/lightpaths/{lp1['id']}")
        return got if status == 200 and got["restored"] >= 1 else None

    lp = wait_until(restored, "the controller to restore the cut lightpath", interval_s=0.01)
    t_seen = time.monotonic() - t_cut
    assert lp["nodes"] == ["A", "D", "C"], lp
    assert lp["vid"] == lp1["vid"]
    a, c = _host(net, "dc-a"), _host(net, "dc-c")
    assert _ping_ok(net, a, c, count=5) >= 4
    assert _vlan_packets(net, _roadm(net, "D"), lp["vid"]) > 0
    res = _probe(net, lp, a, c)
    assert res.delivered and res.hops_seen == res.hops_expected, res
    _status, metrics = ctl.request("GET", "/metrics")
    line = next(x for x in metrics.splitlines()
                if x.startswith("lightpipe_restoration_seconds_sum"))
    restoration_s = float(line.split()[-1])
    print(f"cut-to-restored (controller): {restoration_s * 1e3:.1f} ms; "
          f"seen via REST after {t_seen * 1e3:.0f} ms")
    assert restoration_s > 0
    # its make-before-break rounds are timed apart: since the cut, the head ends moved
    # onto the detour (whose entries the protection had already put in: no `new` round
    # needed) and then the old route's entries were deleted
    rounds = _sync_rounds(metrics)
    grew = {k: rounds.get(k, 0) - rounds_before.get(k, 0) for k in ("new", "changed",
                                                                   "deleted")}
    assert grew["deleted"] >= 1 and sum(grew.values()) >= 2, (rounds_before, rounds)
    env["restored"] = lp
    subprocess.run(["mnexec", "-a", str(emu.ns_pid), "ip", "link", "set", emu.intf_u, "up"],
                   check=True)

    def repaired() -> bool:  # port up = repair (no re-route back)
        fibres = ctl.request("GET", "/topology")[1]["fibres"]
        return not next(x for x in fibres if {x["u"], x["v"]} == {"A", "B"})["failed"]

    wait_until(repaired, "fibre A-B repaired after its port came back up")


def test_rest_injected_failure(env: dict[str, Any]) -> None:
    ctl = env["ctl"]
    status, res = ctl.request("POST", "/failures", {"link": ["C", "D"]})
    assert status == 200, res
    lp = env["restored"]
    # A-D-C is cut at D-C; A-B-C is back up (port up = repair), so it goes there
    assert lp["id"] in res["restored"] and res["restoration_s"] > 0, res
    status, now = ctl.request("GET", f"/lightpaths/{lp['id']}")
    assert status == 200 and now["nodes"] == ["A", "B", "C"]
    net = env["net"]
    assert _ping_ok(net, _host(net, "dc-a"), _host(net, "dc-c"), count=5) >= 4
    assert ctl.request("POST", "/repairs", {"link": ["C", "D"]})[0] == 200


def test_malformed_rest_input_gets_4xx(env: dict[str, Any]) -> None:
    ctl = env["ctl"]
    bad: list[tuple[str, str, Any]] = [
        ("POST", "/lightpaths", b"{not json"),
        ("POST", "/lightpaths", b"[1, 2]"),
        ("POST", "/lightpaths", {"src_dc": "dc-a"}),
        ("POST", "/lightpaths", {"src_dc": "dc-a", "dst_dc": "dc-c", "slots": -1}),
        ("POST", "/lightpaths", {"src_dc": "dc-a", "dst_dc": "dc-c", "slots": "x"}),
        ("POST", "/lightpaths", {"src_dc": "zz", "dst_dc": "dc-c", "slots": 1}),
        ("POST", "/lightpaths", {"src_dc": "dc-a", "dst_dc": "dc-c", "slots": 1, "x": 1}),
        ("POST", "/lightpaths", {"src_dc": "dc-a", "dst_dc": "dc-c", "bitrate_gbps": 1e9}),
        ("POST", "/lightpaths", b"\xff\xfe"),
        ("DELETE", "/lightpaths/999999", None),
        ("GET", "/lightpaths/abc", None),
        ("POST", "/failures", {"link": ["A"]}),
        ("POST", "/failures", {"link": ["A", "Z"]}),
        ("PUT", "/layout", {"switches": "nope"}),
        ("PATCH", "/lightpaths", None),
        ("GET", "/nope", None),
    ]
    for method, path, body in bad:
        try:
            status, reply = ctl.request(method, path, body)
        except Exception as exc:  # PATCH is not even routed: 501 from http.server
            pytest.fail(f"{method} {path}: {exc}")
        assert 400 <= status < 500 or (method == "PATCH" and status == 501), \
            (method, path, status, reply)
    saved, ctl.token = ctl.token, "wrong"
    assert ctl.request("GET", "/lightpaths")[0] == 401
    ctl.token = saved
    status, doc = ctl.request("GET", "/openapi.json")
    assert status == 200 and "/lightpaths" in doc["paths"]
    assert ctl.request("GET", "/health")[0] == 200  # still alive


def test_controller_restart_keeps_lightpaths(env: dict[str, Any]) -> None:
    from testbed.orchestrate.glue import attach_controller

    net, ctl = env["net"], env["ctl"]
    _, before = ctl.request("GET", "/lightpaths")
    ctl.stop(kill=True)  # no clean shutdown: state must come from SQLite alone
    env.pop("ctl")
    # Wipe the switches' tables: the rules must come back from the new controller.
    for s in net.plan.switches:
        subprocess.run(["ovs-ofctl", "-O", "OpenFlow13", "del-flows", s.node], check=True,
                       env={**os.environ, **net.ovs.env})
    a, c = _host(net, "dc-a"), _host(net, "dc-c")
    _traffic_stops(net, a, c)
    ctl2 = attach_controller(net, env["spec"], env["dir"], token="t0ken")
    env["ctl"] = ctl2
    _, after = ctl2.request("GET", "/lightpaths")
    strip = [{k: v for k, v in d.items() if k != "setup_s"} for d in before["lightpaths"]]
    assert after["lightpaths"] == strip
    if after["lightpaths"]:
        assert _ping_ok(net, a, c, count=5) >= 4


def test_delete_lightpath_stops_traffic(env: dict[str, Any]) -> None:
    net, ctl = env["net"], env["ctl"]
    _, lps = ctl.request("GET", "/lightpaths")
    for lp in lps["lightpaths"]:
        assert ctl.request("DELETE", f"/lightpaths/{lp['id']}")[0] == 200
    _traffic_stops(net, _host(net, "dc-a"), _host(net, "dc-c"))
    _, spec = ctl.request("GET", "/spectrum")
    assert all(not f["used"] for f in spec["fibres"])


def test_layout_matches(env: dict[str, Any]) -> None:
    status, lay = env["ctl"].request("GET", "/layout")
    assert status == 200
    assert len(lay["switches"]) == len(env["net"].plan.switches)
    fibres = [link for link in lay["links"] if link["kind"] == "fibre"]
    assert len(fibres) == len(env["net"].plan.fibres)  # not vacuous: every fibre is there
    assert all(Path(link["control"]).exists() for link in fibres)


def test_job_lightpaths_carry_traffic(env: dict[str, Any]) -> None:
    """POST /jobs: the boundary's lightpath carries the stage hosts' traffic, on its route."""
    net, ctl = env["net"], env["ctl"]
    _clean_slate(ctl)
    status, job = ctl.request("POST", "/jobs", {"model": "llama2-7b", "stages": 2,
                                                "gpus_per_stage": 8, "policy": "sp-ff"})
    assert status == 201, job
    assert sorted(job["dcs"]) == ["dc-a", "dc-c"]
    (b,) = job["boundaries"]
    lp = b["lightpath"]
    assert lp["src_host"] == b["src_host"] and lp["dst_host"] == b["dst_host"]
    hosts = {h.name: h for h in net.plan.hosts}
    src, dst = hosts[b["src_host"]], hosts[b["dst_host"]]
    before = {n: _vlan_packets(net, _roadm(net, n), lp["vid"]) for n in lp["nodes"]}
    assert _ping_ok(net, src, dst, count=5) >= 4

    def grew() -> bool:  # OVS's revalidators refresh flow stats lazily
        return all(_vlan_packets(net, _roadm(net, n), lp["vid"]) > before[n]
                   for n in lp["nodes"])

    wait_until(grew, f"VLAN {lp['vid']} packet counts to grow on every ROADM of "
               f"{lp['nodes']}", interval_s=0.2)
    res = _probe(net, lp, src, dst)
    assert res.delivered and res.tag_ok and res.hops_seen == res.hops_expected, res
    # Only that host pair rides it: the DCs' other hosts have no lightpath.
    other_a = next(h for h in net.plan.hosts if h.dc == src.dc and h.name != src.name)
    other_c = next(h for h in net.plan.hosts if h.dc == dst.dc and h.name != dst.name)
    assert _ping_ok(net, other_a, other_c, count=2) == 0
    # a second job does not fit (16 GPUs in all): 409 no_gpus
    status, body = ctl.request("POST", "/jobs", {"model": "llama2-7b", "stages": 1,
                                                 "gpus_per_stage": 8})
    assert status == 409 and body["reason"] == "no_gpus"
    assert ctl.request("DELETE", f"/jobs/{job['id']}")[0] == 200
    _traffic_stops(net, src, dst)
    assert ctl.request("GET", "/lightpaths")[1]["lightpaths"] == []


def test_wan_flows_take_the_lightpaths_the_policy_assigned(env: dict[str, Any]) -> None:
    """Two lightpaths between dc-a and dc-c and two jobs across them: under greedy each
    job's host pair gets its own lightpath, and real packets of each pair carry that
    lightpath's VLAN through the ROADM (flow counters), not the other's."""
    net, ctl = env["net"], env["ctl"]
    _clean_slate(ctl)
    assert ctl.request("PUT", "/routing", {"policy": "greedy"})[0] == 200
    lps = []
    for _ in range(2):
        status, lp = ctl.request("POST", "/lightpaths", {"src_dc": "dc-a", "dst_dc": "dc-c",
                                                         "slots": 2})
        assert status == 201, lp
        lps.append(lp)
    pairs = [(_host(net, "dc-a", i), _host(net, "dc-c", i)) for i in range(2)]
    jobs = []
    try:
        for a, c in pairs:
            status, job = ctl.request("POST", "/routing/jobs",
                                      {"members": [a.name, c.name], "buffer_bytes": 1 << 20})
            assert status == 201, job
            jobs.append(job["id"])
        wan = ctl.request("GET", "/routing")[1]["wan"]
        on = {(f["src"], f["dst"]): f["lightpath_id"] for f in wan["flows"]}
        assigned = [on[(a.name, c.name)] for a, c in pairs]
        assert sorted(assigned) == sorted(lp["id"] for lp in lps), wan  # one each
        vid = {lp["id"]: lp["vid"] for lp in lps}
        roadm_b = _roadm(net, "B")  # both lightpaths run A-B-C (disjoint slots)
        for (a, c), lp_id in zip(pairs, assigned, strict=True):
            other = next(i for i in vid if i != lp_id)
            before = {i: _vlan_packets(net, roadm_b, vid[i]) for i in vid}
            assert _ping_ok(net, a, c, count=5) >= 4
            # OVS refreshes flow stats lazily: wait for the assigned lightpath's count
            wait_until(lambda lp_id=lp_id, before=before:
                       _vlan_packets(net, roadm_b, vid[lp_id]) >= before[lp_id] + 8,
                       f"8 packets counted on lightpath {lp_id} at ROADM B", interval_s=0.2)
            got = {i: _vlan_packets(net, roadm_b, vid[i]) - before[i] for i in vid}
            # 4+ echo requests and their replies, both ways on the assigned lightpath
            assert got[lp_id] >= 8 and got[other] == 0, (got, _flows(net, roadm_b))
    finally:
        for j in jobs:
            ctl.request("DELETE", f"/routing/jobs/{j}")
        for lp in lps:
            ctl.request("DELETE", f"/lightpaths/{lp['id']}")
        ctl.request("PUT", "/routing", {"policy": "ecmp"})


def test_resync_keeps_what_it_wants_and_deletes_only_stale_entries() -> None:
    """After a reconnect the app reads the switch's tables (flow stats, group descs):
    entries it wants are written over in place, whatever order the switch lists match
    fields in; only unwanted flows and groups are deleted (no wipe, no gap)."""
    pytest.importorskip("os_ken")
    from os_ken.ofproto import ofproto_v1_3
    from os_ken.ofproto import ofproto_v1_3_parser as parser

    from controllers.flowroute import GroupRule
    from controllers.lightpath_app import _stale_entries
    from controllers.rules import FlowRule

    class _Dp:  # what _stale_entries reads of a datapath: its id and parser
        id = 7
        ofproto = ofproto_v1_3
        ofproto_parser = parser

    keep = FlowRule(7, 0, 100, (("in_port", 1), ("eth_type", 0x800),
                                ("ipv4_dst", "10.0.0.2")), (("output", 2),), 0x11)
    group = GroupRule(7, 3, (1, 2))
    desired = {keep.key: keep, group.key: group}
    # The switch lists the wanted flow's fields in another order, plus one stale flow.
    listed = [parser.OFPFlowStats(table_id=0, priority=100, cookie=0x11, match=parser.OFPMatch(
                  ipv4_dst="10.0.0.2", eth_type=0x800, in_port=1)),
              parser.OFPFlowStats(table_id=1, priority=7, cookie=0x5e1f,
                                  match=parser.OFPMatch(in_port=4))]
    current, stale = _stale_entries(_Dp(), (listed, [3, 9]), desired)
    assert [(type(x).__name__, getattr(x, "cookie", None) or getattr(x, "group_id", None))
            for x in stale] == [("FlowRule", 0x5e1f), ("GroupRule", 9)]
    assert group.key in current  # an existing group is modified, not added again
