"""Pure tests of routing in the testbed: leaf-spine plans, fabric graphs, spec checks."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from testbed.emu.fabric import fabric_graph, htb_script
from testbed.emu.plan import build_plan
from testbed.errors import InputError, SpecError
from testbed.spec import check_scenario, parse_scenario
from tests.conftest import SCENARIOS
from tests.waiting import scaled


def bundled() -> dict[str, Any]:
    return dict(yaml.safe_load((SCENARIOS / "routing-leafspine.yaml").read_text()))


def test_leaf_spine_plan_shape_and_rates() -> None:
    sc = parse_scenario(bundled())
    plan = build_plan(sc, prefix="lpab12")
    kinds = [s.kind for s in plan.switches if s.label == "dc-a"]
    assert kinds.count("spine") == 2 and kinds.count("leaf") == 4
    leaf_of = {h.name: h.switch for h in plan.hosts}
    assert len(leaf_of) == 8
    assert leaf_of["dc-a-h0"] == leaf_of["dc-a-h1"] != leaf_of["dc-a-h2"]  # blocks of 2
    rated = [lk for lk in plan.links if lk.rate_mbps is not None]
    assert len(rated) == 2 * 4 + 8 and all(lk.rate_mbps == 50.0 for lk in rated)
    g = fabric_graph(plan, "dc-a")
    assert g.number_of_nodes() == 14 and g.number_of_edges() == 2 * (8 + 8)
    assert all(d["capacity_gbps"] == pytest.approx(100.0) for _, _, d in g.edges(data=True))
    assert {g.nodes[n]["kind"] for n in g} == {"host", "leaf", "spine"}


def test_leaf_spine_too_fast_and_bad_members() -> None:
    d = bundled()
    d["emulation"]["leaf_spine"]["spine_link_gbps"] = 4000
    with pytest.raises(InputError, match="leaf-spine link"):
        build_plan(parse_scenario(d), prefix="lpab12")
    d = bundled()
    d["workload"]["jobs"][0]["members"][1] = "dc-a-h9"
    with pytest.raises(SpecError, match="unknown host 'dc-a-h9'"):
        check_scenario(parse_scenario(d))
    d = bundled()
    d["workload"]["policies"] = ["ecmp", "nope"]
    with pytest.raises(SpecError, match=r"policies\[1\].*'nope'"):
        check_scenario(parse_scenario(d))
    d = bundled()
    d["emulation"]["dc_fabric"] = "single"
    with pytest.raises(SpecError, match="dc_fabric"):
        check_scenario(parse_scenario(d))


@pytest.mark.parametrize("change,field", [
    ({"emulation": {"leaf_spine": {"spines": 0}}}, "emulation.leaf_spine.spines"),
    ({"workload": {"jobs": [{"members": ["dc-a-h0", "dc-a-h0"]}]}},
     "workload.allreduce_jobs.jobs[0]"),
    ({"workload": {"jobs": [{"members": ["dc-a-h0", "dc-a-h1"]},
                            {"members": ["dc-a-h1", "dc-a-h2"]}]}}, "workload.allreduce_jobs"),
])
def test_bad_fabric_or_jobs_rejected(change: dict[str, Any], field: str) -> None:
    d = bundled()
    for key, value in change.items():
        if key == "emulation":
            d["emulation"]["leaf_spine"].update(value["leaf_spine"])
        else:
            d["workload"].update(value)
    # refused as input (a SpecError naming the field), not by any exception at all: a
    # crash inside the checks passed the old `pytest.raises(Exception)`
    with pytest.raises(SpecError) as exc:
        parse_scenario(d)
    line = exc.value.line()
    assert "\n" not in line and field in line, line


def test_htb_script_validates() -> None:
    text = htb_script("lpab12s5-eth1", 50.0)
    # a switch port: its bucket passes one 64 kB GSO frame, its FIFO holds 50 ms
    assert "htb rate 50.000000mbit" in text and "bfifo limit 312500" in text
    assert "burst 70000 " in text and "gso_max_size" not in text
    # a host's NIC: the exact bucket, a NIC's packet queue, frames of 2.5 ms at its rate
    nic = htb_script("dc-a-h0-eth0", 50.0, nic=True)
    assert "burst 15000 " in nic and "pfifo limit 1000" in nic
    assert "gso_max_size 15625 " in nic
    assert "gso_max_size 65536 " in htb_script("dc-a-h0-eth0", 10_000.0, nic=True)
    assert "gso_max_size 9000 " in htb_script("dc-a-h0-eth0", 1.0, nic=True)
    # with its DC's hosts, a switch port shares its rate among them: a class, a FIFO
    # and a filter per source host, the rest (ARP, tagged frames) in the default class,
    # and small packets (pure ACKs) in a class of their own served first
    fair = htb_script("lpab12s5-eth1", 50.0, sources=["10.0.0.1", "10.0.0.2"])
    assert "htb default 2 " in fair and fair.count("bfifo limit 312500") == 4
    assert "prio 2 u32 match ip src 10.0.0.1/32 flowid 1:3" in fair
    assert "prio 2 u32 match ip src 10.0.0.2/32 flowid 1:4" in fair
    assert "prio 1 u32 match u16 0x0000 0xff80 at 2 flowid 1:5" in fair
    assert fair.count("rate 12.500000mbit ceil 50.000000mbit") == 4
    assert fair.count(" prio 1 ||") + fair.count(" prio 1 &&") == 3
    assert "quantum 1514 prio 0 " in fair
    with pytest.raises(ValueError):
        htb_script("lpab12s5-eth1", 50.0, sources=["10.0.0.1; reboot"])
    with pytest.raises(ValueError):
        htb_script("bad;name", 50.0)
    with pytest.raises(ValueError):
        htb_script("eth0", 0.0)


# ---- controller: per-flow rules, ECMP groups, the job registry, REST -------------------

def leafspine_layout() -> tuple[Any, Any]:
    """The bundled scenario's layout as the emulation would report it (ports numbered
    in link order, as OVS does), with the plan's link rates."""
    from types import SimpleNamespace

    from testbed.orchestrate.allreduce import layout_with_rates

    sc = parse_scenario(bundled())
    plan = build_plan(sc, prefix="lpab12")
    ports: dict[tuple[str, str], int] = {}
    count: dict[str, int] = {}
    switches = {s.node for s in plan.switches}
    for lk in plan.links:
        for x, y in ((lk.a, lk.b), (lk.b, lk.a)):
            if x in switches:
                count[x] = count.get(x, 0) + 1
                ports[(x, y)] = count[x]
    for f in plan.fibres:
        for x in (f.roadm_u, f.roadm_v):
            count[x] = count.get(x, 0) + 1
            ports[(x, f.middle)] = count[x]
    net = SimpleNamespace(plan=plan, ports=ports, emulators={})
    return sc, layout_with_rates(net)


def test_routing_graph_and_ecmp_groups() -> None:
    from controllers.flowroute import (
        COOKIE_FLOW,
        ecmp_rules,
        leaves_and_spines,
        routing_graph,
        without_failed,
    )
    from controllers.rules import LayoutIndex

    _, layout = leafspine_layout()
    ix = LayoutIndex.build(layout)
    leaves, spines = leaves_and_spines(ix, "dc-a")
    assert len(leaves) == 4 and len(spines) == 2
    g = routing_graph(ix)
    assert g.number_of_nodes() == 14
    assert all(d["capacity_gbps"] == pytest.approx(100.0) for _, _, d in g.edges(data=True))
    rules, groups = ecmp_rules(ix)
    assert len(groups) == 4 * 3 and all(len(gr.ports) == 2 for gr in groups)
    assert len(rules) == 4 * 6 and all(r.cookie == COOKIE_FLOW for r in rules)
    # A failed uplink: to and from that leaf only the other spine is left; the graph
    # loses the link.
    cut = frozenset((leaves[0], spines[0]))
    ix2 = without_failed(ix, [cut])
    _, groups2 = ecmp_rules(ix2)
    single = [gr for gr in groups2 if len(gr.ports) == 1]
    assert len(groups2) == 12 and len(single) == 3 + 3 and ix2.layout is ix.layout
    assert not routing_graph(ix, [cut]).has_edge(leaves[0], spines[0])


def test_path_rules_follow_the_path() -> None:
    from controllers.flowroute import P_FLOW, path_rules
    from controllers.rules import LayoutIndex

    _, layout = leafspine_layout()
    ix = LayoutIndex.build(layout)
    h0, h2 = ix.hosts["dc-a-h0"], ix.hosts["dc-a-h2"]
    spine = "lpab12s4"
    path = ["dc-a-h0", h0.switch, spine, h2.switch, "dc-a-h2"]
    rules = path_rules(ix, [("dc-a-h0", "dc-a-h2", path)])
    assert [r.dpid for r in rules] == [ix.dpid[h0.switch], ix.dpid[spine], ix.dpid[h2.switch]]
    fab = ix.fabric["dc-a"]
    assert rules[0].actions == (("output", fab[h0.switch][spine]["ports"][h0.switch]),)
    assert rules[1].actions == (("output", fab[spine][h2.switch]["ports"][spine]),)
    assert rules[2].actions == (("output", h2.port),)
    assert all(r.priority == P_FLOW and ("ipv4_src", h0.ip) in r.match for r in rules)
    with pytest.raises(ValueError):
        path_rules(ix, [("dc-a-h0", "dc-a-h2", ["dc-a-h0", h2.switch, "dc-a-h2"])])


def test_core_routing_jobs_and_fabric_failure(tmp_path: Any) -> None:
    from controllers.core import ControllerCore, RequestError
    from controllers.flowroute import GroupRule
    from controllers.store import Store

    sc, layout = leafspine_layout()
    core = ControllerCore(sc, Store(tmp_path / "s.db"), layout=layout)
    core.routing_call("set_policy", "ecmp")
    job = core.routing_call("register", ["dc-a-h0", "dc-a-h2", "dc-a-h4", "dc-a-h6"], 1 << 20)
    assert job["id"] == 1 and job["flow_bytes"] == pytest.approx(1.5 * (1 << 20))
    for bad, status in ((["dc-a-h0", "dc-a-h1"], 422), (["dc-a-h1", "dc-a-h9"], 422)):
        with pytest.raises(RequestError) as exc:
            core.routing_call("register", bad, 1000)
        assert exc.value.status == status
    with pytest.raises(RequestError) as exc:
        core.routing_call("set_policy", "no-such")
    assert exc.value.status == 400
    desired = core.desired()
    groups = [x for rules in desired.values() for x in rules.values() if isinstance(x, GroupRule)]
    assert len(groups) == 12
    spine_dpids = {ix_dpid for name, ix_dpid in core.layout.dpid.items()
                   if name in ("lpab12s3", "lpab12s4")}
    counting = [r for d in spine_dpids for r in desired[d].values()
                if getattr(r, "priority", 0) == 250]
    assert len(counting) == 2 * 8  # every cross-leaf ring pair, both ways, on both spines
    assert core.set_fabric_link("lpab12s5", "lpab12s3", up=False)
    assert not core.set_fabric_link("lpab12s3", "lpab12s5", up=False)  # the other end
    groups = [x for rules in core.desired().values() for x in rules.values()
              if isinstance(x, GroupRule) and len(x.ports) == 1]
    assert len(groups) == 6
    view = core.routing_view()
    assert view["failed_links"] == [["lpab12s3", "lpab12s5"]]
    assert view["last"]["reason"] == "failure"
    assert core.fabric_link_of_port(core.layout.dpid["lpab12s5"], 1) is not None
    core.routing_call("unregister", 1)
    with pytest.raises(RequestError) as exc:
        core.routing_call("unregister", 1)
    assert exc.value.status == 404
    text = core.metrics.exposition().decode()
    assert 'lightpipe_routing_reroutes_total{policy="ecmp",reason="failure"} 1.0' in text


def test_rest_routing_endpoints(tmp_path: Any) -> None:
    from controllers.api import RestApi
    from controllers.core import ControllerCore
    from controllers.store import Store
    from testbed.orchestrate.ctl_process import rest_call

    sc, layout = leafspine_layout()
    core = ControllerCore(sc, Store(tmp_path / "s.db"), layout=layout)
    api = RestApi(core, port=0, token="tok")
    api.serve()
    try:
        def call(method: str, path: str, body: Any = None) -> tuple[int, Any]:
            return rest_call(api.url, method, path, body, "tok", timeout_s=scaled(60))

        assert call("PUT", "/routing", {"policy": "ecmp"})[0] == 200
        status, job = call("POST", "/routing/jobs", {"members": ["dc-a-h1", "dc-a-h3"],
                                                     "buffer_bytes": 4096})
        assert status == 201 and [f["src"] for f in job["flows"]] == ["dc-a-h1", "dc-a-h3"]
        assert call("POST", "/routing/jobs", {"members": ["dc-a-h1"]})[0] == 422
        assert call("POST", "/routing/jobs", {"members": ["dc-a-h5", "x"]})[0] == 422
        assert call("PUT", "/routing", {"policy": "nope"})[0] == 400
        status, view = call("GET", "/routing")
        assert status == 200 and view["policy"] == "ecmp" and len(view["jobs"]) == 1
        assert call("DELETE", f"/routing/jobs/{job['id']}")[0] == 200
        assert call("DELETE", f"/routing/jobs/{job['id']}")[0] == 404
        assert "/routing/jobs" in call("GET", "/openapi.json")[1]["paths"]
    finally:
        api.close()


def test_fabric_link_is_down_while_either_end_is(tmp_path: Any) -> None:
    from controllers.core import ControllerCore
    from controllers.store import Store

    sc, layout = leafspine_layout()
    core = ControllerCore(sc, Store(tmp_path / "s.db"), layout=layout)
    ix = core.layout
    link = next(lk for lk in layout.links if lk.kind == "fabric")
    a, b = (ix.dpid[link.a], link.a_port), (ix.dpid[link.b], link.b_port)
    assert core.fabric_port_status(*a, up=False)
    assert not core.fabric_port_status(*b, up=False)
    assert not core.fabric_port_status(*a, up=True)  # b still down
    assert core.routing_view()["failed_links"] == [sorted([link.a, link.b])]
    assert core.fabric_port_status(*b, up=True)
    assert core.routing_view()["failed_links"] == []
    assert not core.fabric_port_status(ix.dpid[link.a], 999, up=False)  # not a fabric port


# ---- simulator side: fluid max-min round times, the sim backend ---------------------

def test_round_times_fluid_model() -> None:
    import networkx as nx

    from testbed.sim.allreduce import GOODPUT_EFFICIENCY, round_times

    g = nx.DiGraph()
    for u, v in (("a", "s"), ("b", "s"), ("s", "c"), ("s", "d")):
        g.add_edge(u, v, capacity_gbps=8.0)
    # Two single-flow jobs, a->s->c and b->s->c, share the link s->c.
    paths = {"f0": ["a", "s", "c"], "f1": ["b", "s", "c"]}
    job_of = {"f0": 0, "f1": 1}
    bps = 8e9 / 8 * GOODPUT_EFFICIENCY
    # Job 0 has half the bytes: both at 4 Gb/s until it ends, then job 1 alone at 8.
    times = round_times(g, paths, job_of, {0: 0.5e9, 1: 1e9})
    assert times[0] == pytest.approx(0.5e9 / (bps / 2))
    assert times[1] == pytest.approx(times[0] + 0.5e9 / bps)
    # scale = bandwidth divisor: emulated time
    assert round_times(g, paths, job_of, {0: 1e9, 1: 1e9}, scale=1000)[0] == \
        pytest.approx(1e9 / (bps / 2) * 1000)
    # Disjoint paths: each at full rate.
    assert round_times(g, {"f0": ["a", "s", "c"], "f1": ["b", "s", "d"]}, job_of,
                       {0: 1e9, 1: 1e9})[1] == pytest.approx(1e9 / bps)


def test_sim_backend_allreduce_greedy_beats_colliding_ecmp(tmp_path: Any) -> None:
    from testbed.backends.sim import SimBackend

    summary = SimBackend().run(parse_scenario(bundled()), tmp_path / "sim", quiet=True)
    pol = summary["allreduce"]["policies"]
    assert set(pol) == {"ecmp", "greedy"}
    assert [j["bottleneck_gbps"] for j in pol["ecmp"]["jobs"]] == [50.0, 50.0]  # seed 1
    assert [j["bottleneck_gbps"] for j in pol["greedy"]["jobs"]] == [100.0, 100.0]
    assert pol["greedy"]["max_allreduce_time_s"] == pytest.approx(
        pol["ecmp"]["max_allreduce_time_s"] / 2)
    paths = pol["greedy"]["jobs"][0]["paths"]
    assert paths["dc-a-h0->dc-a-h2"][0] == "dc-a-h0" and len(paths) == 4
    assert (tmp_path / "sim" / "summary.json").exists()


def test_summarize_agreement_rows() -> None:
    from testbed.orchestrate.allreduce import summarize

    rows = [{"policy": "ecmp", "emu_s": 2.0 + 0.1 * k, "sim_s": 2.0,
             "rel_error": 0.05 * k} for k in range(10)]
    s = summarize(rows)["ecmp"]
    assert s["samples"] == 10 and s["abs_rel_error_max"] == pytest.approx(0.45)
    assert s["abs_rel_error_median"] == pytest.approx(0.25)
    assert s["mean_sim_s"] == 2.0


def test_new_layout_reroutes_registered_flows(tmp_path: Any) -> None:
    from controllers.core import ControllerCore
    from controllers.store import Store

    sc, layout = leafspine_layout()
    core = ControllerCore(sc, Store(tmp_path / "s.db"), layout=layout)
    core.routing_call("set_policy", "greedy")
    core.routing_call("register", ["dc-a-h0", "dc-a-h2", "dc-a-h4"], 1 << 20)
    before = core.routing_view()["jobs"][0]["flows"]
    assert all(f["path"] is not None and f["rate_gbps"] == pytest.approx(100.0) for f in before)
    core.set_layout(layout)
    assert core.routing_view()["last"]["reason"] == "layout"
    assert core.routing_view()["jobs"][0]["flows"] == before
    fewer = layout.model_copy(update={"hosts": [h for h in layout.hosts if h.name != "dc-a-h4"]})
    with pytest.raises(ValueError, match="dc-a-h4"):
        core.set_layout(fewer)
