"""Cross-DC job flows assigned to lightpaths by the routing policy (no root)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from controllers.core import ControllerCore
from controllers.jobs import JobService
from controllers.layout import default_layout
from controllers.rules import LayoutIndex
from controllers.store import Store
from controllers.wanroute import COOKIE_WAN, P_WAN_FLOW, WanFlow, WanLightpath, assign, wan_rules
from testbed.spec import parse_scenario
from tests.test_controller_core import Recorder

TWO_LPS = [WanLightpath(1, 11, "dc-a", "dc-b", 100.0), WanLightpath(2, 12, "dc-a", "dc-b", 100.0)]
HOST_DC = {"a0": "dc-a", "a1": "dc-a", "b0": "dc-b", "b1": "dc-b"}


def two_jobs(k: int) -> list[WanFlow]:
    """Two jobs, one cross-DC flow each (host pairs vary with k so ECMP hashes vary)."""
    return [WanFlow(2 * k + 1, "a0", "b0"), WanFlow(2 * k + 2, "a1", "b1")]


def test_greedy_separates_two_jobs_where_ecmp_hashes_them_together() -> None:
    collisions = 0
    for k in range(20):
        flows = two_jobs(k)
        greedy, rates = assign("greedy", flows, TWO_LPS, HOST_DC, seed=1)
        assert sorted(greedy.values()) == [1, 2]  # one lightpath each
        assert all(r == pytest.approx(100.0) for r in rates.values())
        ecmp, e_rates = assign("ecmp", flows, TWO_LPS, HOST_DC, seed=1)
        assert set(ecmp.values()) <= {1, 2}
        assert ecmp == assign("ecmp", flows, TWO_LPS, HOST_DC, seed=1)[0]  # deterministic
        if len(set(ecmp.values())) == 1:
            collisions += 1
            assert all(r == pytest.approx(50.0) for r in e_rates.values())  # share one
    assert collisions > 0  # the hash put both jobs on one lightpath at least once


def test_capacity_weights_the_choice() -> None:
    """Three flows, a 200 and a 100 Gb/s lightpath: two go on the big one."""
    lps = [WanLightpath(1, 11, "dc-a", "dc-b", 200.0), WanLightpath(2, 12, "dc-a", "dc-b", 100.0)]
    flows = [WanFlow(1, "a0", "b0"), WanFlow(2, "a1", "b1"), WanFlow(3, "a0", "b1")]
    got, rates = assign("greedy", flows, lps, HOST_DC, seed=1)
    assert sorted(got.values()) == [1, 1, 2]
    assert min(rates.values()) == pytest.approx(100.0)


def test_flows_without_a_lightpath_between_their_dcs_are_left_out() -> None:
    host_dc = {**HOST_DC, "c0": "dc-c"}
    got, _ = assign("greedy", [WanFlow(1, "a0", "c0"), WanFlow(2, "a0", "a1")], TWO_LPS,
                    host_dc, seed=1)
    assert got == {}


# ---- in the controller ----------------------------------------------------------------------

def scenario() -> Any:
    # dc-a and dc-b joined directly (A-B) and around (A-D-B); 8 slots per fibre, so two
    # 8-slot lightpaths take one route each and a cut of A-B cannot restore the first.
    return parse_scenario({
        "name": "wan-lps",
        "topology": {"links": [
            {"u": "A", "v": "B", "length_km": 300}, {"u": "A", "v": "D", "length_km": 300},
            {"u": "D", "v": "B", "length_km": 300}]},
        "dcs": [{"name": "dc-a", "node": "A", "gpus": 16},
                {"name": "dc-b", "node": "B", "gpus": 16}],
        "optical": {"slots": 8, "k_paths": 2},
        "workload": {"kind": "lightpath_requests"},
        "policy": {"placement": "sp-ff", "fixed_slots": 4, "routing": "greedy"},
        "emulation": {"hosts_per_dc": 4, "bandwidth_divisor": 1000},
    })


def wan_core(db: Path) -> tuple[ControllerCore, Recorder, LayoutIndex]:
    """A controller core on `scenario()` with its default layout, the recorder of what it
    sends the switches, and the layout's index."""
    sc = scenario()
    rec = Recorder()
    core = ControllerCore(sc, Store(db), layout=default_layout(sc), southbound=rec)
    assert core.layout is not None
    return core, rec, core.layout


def wan_rules_by_flow(desired: dict[int, dict[tuple, Any]]) -> dict[tuple[str, str], int]:
    """(src ip, dst ip) -> VLAN id pushed by the per-flow WAN rules."""
    out = {}
    for rules in desired.values():
        for r in rules.values():
            if r.priority == P_WAN_FLOW and r.cookie & (0xFFFF << 48) == COOKIE_WAN:
                m = dict(r.match)
                out[(m["ipv4_src"], m["ipv4_dst"])] = dict(r.actions)["set_vlan_vid"] & 0xFFF
    return out


def test_controller_assigns_fails_over_and_rules_follow(tmp_path: Path) -> None:
    core, rec, ix = wan_core(tmp_path / "s.db")
    hosts = {dc: sorted(h.name for h in ix.hosts_by_dc[dc]) for dc in ("dc-a", "dc-b")}
    flows = [WanFlow(1, hosts["dc-a"][0], hosts["dc-b"][0]),
             WanFlow(2, hosts["dc-a"][1], hosts["dc-b"][1])]
    core.traffic.wan_sources.append(lambda: list(flows))
    lp1 = core.request("dc-a", "dc-b", slots=8)
    lp2 = core.request("dc-a", "dc-b", slots=8)
    assert lp1["nodes"] != lp2["nodes"]
    view = core.routing_view()["wan"]
    on = {(f["src"], f["dst"]): f["lightpath_id"] for f in view["flows"]}
    assert sorted(on.values()) == [lp1["id"], lp2["id"]]  # greedy: one lightpath each
    assert view["dc_pairs"] == {"dc-a|dc-b": [lp1["id"], lp2["id"]]}
    vid = {lp1["id"]: lp1["vid"], lp2["id"]: lp2["vid"]}

    def check_rules() -> None:
        got = wan_rules_by_flow(rec.syncs[-1])
        want = {}
        for f in core.routing_view()["wan"]["flows"]:
            a, b = ix.hosts[f["src"]].ip, ix.hosts[f["dst"]].ip
            want[(a, b)] = want[(b, a)] = vid[f["lightpath_id"]]
        assert got == want

    check_rules()
    # A cut of A-B loses lightpath 1 (the detour's spectrum is full): its flow moves.
    res = core.fail_fibre("A", "B")
    assert res.lost == [lp1["id"]]
    view = core.routing_view()["wan"]
    assert {f["lightpath_id"] for f in view["flows"]} == {lp2["id"]}
    assert view["last"]["moved"] == 1 and "lightpath_down" in view["last"]["reason"]
    check_rules()
    text = core.metrics.exposition().decode()
    # one flow moved when lightpath 2 came (spread), one when lightpath 1 was lost
    assert 'lightpipe_wan_flows_moved_total{policy="greedy"} 2.0' in text
    assert 'lightpipe_wan_reassignments_total{policy="greedy",reason="lightpath_down"}' in text
    # Repaired and a new lightpath set up: the flows spread again.
    core.repair_fibre("A", "B")
    lp3 = core.request("dc-a", "dc-b", slots=8)
    vid[lp3["id"]] = lp3["vid"]
    view = core.routing_view()["wan"]
    assert sorted(f["lightpath_id"] for f in view["flows"]) == sorted([lp2["id"], lp3["id"]])
    check_rules()
    # A policy change re-assigns at once (moves are not counted across policies).
    assert core.routing_call("set_policy", "shortest")["wan"]["policy"] == "shortest"
    view = core.routing_view()["wan"]
    assert {f["lightpath_id"] for f in view["flows"]} == {lp2["id"]}  # the first candidate
    assert view["last"]["reason"] == "policy" and view["last"]["moved"] == 0
    check_rules()
    core.routing_call("set_policy", "greedy")
    # A job leaving: its flow leaves the assignment and its rules go.
    flows.pop()
    core.program()
    assert len(core.routing_view()["wan"]["flows"]) == 1
    assert len(wan_rules_by_flow(rec.syncs[-1])) == 2


def test_pipeline_jobs_get_lightpaths_by_policy(tmp_path: Path) -> None:
    """POST /jobs (JobService): two jobs across dc-a/dc-b, each with its own lightpath;
    the assignment puts their boundary flows on different lightpaths, and a job's
    departure takes its flow out."""
    core, _, _ = wan_core(tmp_path / "s.db")
    svc = JobService(core)

    class Req:
        model, stages, gpus_per_stage, microbatches, iterations = "llama2-7b", 4, 4, 8, 10
        policy, schedule, max_stages_per_dc = "sp-ff", None, 2

    j1, j2 = svc.place(Req()), svc.place(Req())
    view = core.routing_view()["wan"]
    assert {f["job"] for f in view["flows"]} == {j1["id"], j2["id"]}
    assert len({f["lightpath_id"] for f in view["flows"]}) == 2
    svc.remove(j1["id"])
    view = core.routing_view()["wan"]
    assert [f["job"] for f in view["flows"]] == [j2["id"]]


def test_wan_rules_push_the_assigned_vlan() -> None:
    sc = scenario()
    ix = LayoutIndex.build(default_layout(sc))
    a = sorted(h.name for h in ix.hosts_by_dc["dc-a"])[0]
    b = sorted(h.name for h in ix.hosts_by_dc["dc-b"])[0]
    rules = wan_rules(ix, {7: 70}, {WanFlow(1, a, b): 7})
    assert len(rules) == 2  # both directions
    edge_a = ix.dpid[ix.edge["dc-a"][0]]
    fwd = next(r for r in rules if r.dpid == edge_a)
    assert dict(fwd.match)["ipv4_src"] == ix.hosts[a].ip
    assert ("set_vlan_vid", 0x1000 | 70) in fwd.actions
    assert ("output", ix.edge["dc-a"][1]) in fwd.actions


def test_allreduce_ring_spanning_dcs(tmp_path: Path) -> None:
    """POST /routing/jobs with members in two DCs: the two ring flows that cross are
    assigned to lightpaths (rules at the edges), the others routed in the fabric."""
    core, rec, ix = wan_core(tmp_path / "s.db")
    a = sorted(h.name for h in ix.hosts_by_dc["dc-a"])
    b = sorted(h.name for h in ix.hosts_by_dc["dc-b"])
    lp1 = core.request("dc-a", "dc-b", slots=8)
    lp2 = core.request("dc-a", "dc-b", slots=8)
    job = core.routing_call("register", [a[0], a[1], b[0], b[1]], 1 << 20)
    by_pair = {(f["src"], f["dst"]): f for f in job["flows"]}
    assert by_pair[(a[0], a[1])]["path"] is not None  # inside dc-a: the fabric's
    assert by_pair[(a[1], b[0])]["path"] is None  # across: the WAN assignment's
    wan = core.routing_view()["wan"]
    crossing = {(f["src"], f["dst"]): f["lightpath_id"] for f in wan["flows"]
                if f["kind"] == "allreduce"}
    assert set(crossing) == {(a[1], b[0]), (b[1], a[0])}
    assert set(crossing.values()) <= {lp1["id"], lp2["id"]}
    got = wan_rules_by_flow(rec.syncs[-1])
    vid = {lp1["id"]: lp1["vid"], lp2["id"]: lp2["vid"]}
    for (s, d), lp in crossing.items():
        assert got[(ix.hosts[s].ip, ix.hosts[d].ip)] == vid[lp]
    core.routing_call("unregister", job["id"])
    assert core.routing_view()["wan"]["flows"] == []
    assert wan_rules_by_flow(rec.syncs[-1]) == {}


def test_emulated_jobs_time_the_lightpath_their_flow_takes(tmp_path: Path) -> None:
    """ctl_jobs.assigned_lightpaths: each pipeline flow maps to the lightpath GET /routing
    says it takes (its capacity, VLAN and fibres as GET /lightpaths shows them), with the
    number of job flows on it; under ECMP that is not always the job's own lightpath
    (a DC pair's default lightpath is a candidate too), and the emulated run must time
    the one taken."""
    from testbed.orchestrate.ctl_jobs import assigned_lightpaths

    sc = scenario()
    sc = sc.model_copy(update={"policy": sc.policy.model_copy(update={"routing": "ecmp"})})

    class Req:
        model, stages, gpus_per_stage, microbatches, iterations = "llama2-7b", 4, 4, 8, 10
        policy, schedule, max_stages_per_dc = "sp-ff", None, 2

    moved = 0
    for seed in range(8):
        core = ControllerCore(sc, Store(tmp_path / f"s{seed}.db"), layout=default_layout(sc),
                              southbound=Recorder())
        core.traffic.flows.seed = seed
        svc = JobService(core)
        base = core.request("dc-a", "dc-b", slots=2)  # the DC pair's default, smaller
        job = svc.place(Req())
        view, lps = core.routing_view(), core.lightpaths()
        got = assigned_lightpaths(view, lps)
        flows = view["wan"]["flows"]
        own = {(job["id"], b["src_host"], b["dst_host"]): b["lightpath_id"]
               for b in job["boundaries"] if b["lightpath_id"] is not None}
        assert flows and set(got) == set(own)
        by_id = {lp["id"]: lp for lp in lps}
        for f in flows:
            lp, sharing = got[(f["job"], f["src"], f["dst"])]
            assert lp == by_id[f["lightpath_id"]]
            assert {"vid", "fibres", "capacity_gbps", "n_slots", "nodes"} <= set(lp)
            assert sharing == sum(g["lightpath_id"] == f["lightpath_id"] for g in flows)
        moved += sum(got[k][0]["id"] != own[k] for k in own)
        # Routing jobs' flows and unassigned flows are no pipeline boundary's.
        extra = {"wan": {"flows": [*flows,
                                   {"job": 9, "kind": "allreduce", "src": "x", "dst": "y",
                                    "lightpath_id": base["id"]},
                                   {"job": 8, "kind": "pipeline", "src": "x", "dst": "y",
                                    "lightpath_id": None}]}}
        assert set(assigned_lightpaths(extra, lps)) == set(own)
    # ECMP over {own, default} put a boundary on another lightpath than its own for some
    # seed: the case the emulated side must follow.
    assert moved > 0
