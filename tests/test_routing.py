"""Routing for ML traffic (pure): max-min filling, metric, policies, ILP, re-routing."""

from __future__ import annotations

import itertools
import random

import networkx as nx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from testbed.errors import InputError
from testbed.routing.coloring import bipartite_edge_coloring
from testbed.routing.flows import (
    Flow,
    Job,
    all_to_all_flows,
    flows_of,
    jobs_on_clos,
    pipeline_flows,
    ring_allreduce_flows,
)
from testbed.routing.greedy import greedy
from testbed.routing.instance import Instance, candidate_paths
from testbed.routing.maxmin import max_min_rates
from testbed.routing.metric import evaluate, metric_key
from testbed.routing.policies import policy_names, route
from testbed.routing.reroute import Rerouter
from testbed.routing.topology import clos, fat_tree, remove_links
from testbed.spec.models import ROUTING_POLICIES


def _line(caps: list[float]) -> nx.DiGraph:
    g = nx.DiGraph()
    for i, c in enumerate(caps):
        g.add_edge(f"n{i}", f"n{i + 1}", capacity_gbps=c)
    return g


# --- progressive filling on textbook cases -------------------------------------------

def test_shared_bottleneck_splits_equally() -> None:
    g = _line([30.0])
    rates = max_min_rates(g, {f: ["n0", "n1"] for f in "abc"})
    assert rates == pytest.approx({"a": 10.0, "b": 10.0, "c": 10.0})


def test_parking_lot() -> None:
    # a long flow over 3 links of 10 Gb/s, one short flow on each link: all get 5
    g = _line([10.0, 10.0, 10.0])
    paths = {"long": ["n0", "n1", "n2", "n3"], "s0": ["n0", "n1"], "s1": ["n1", "n2"],
             "s2": ["n2", "n3"]}
    assert max_min_rates(g, paths) == pytest.approx({k: 5.0 for k in paths})


def test_parking_lot_unequal_links_second_level() -> None:
    # link n0-n1 10 Gb/s, n1-n2 4 Gb/s: flows crossing the small link get 2, the other
    # flow on the big link takes the rest (8)
    g = _line([10.0, 4.0])
    paths = {"1": ["n0", "n1", "n2"], "2": ["n0", "n1"], "3": ["n1", "n2"]}
    assert max_min_rates(g, paths) == pytest.approx({"1": 2.0, "2": 8.0, "3": 2.0})


def test_three_levels() -> None:
    # A: 3 flows on a 3 Gb/s link -> 1 each; B: one of them plus one more on 10 -> 9
    g = nx.DiGraph()
    g.add_edge("a", "b", capacity_gbps=3.0)
    g.add_edge("b", "c", capacity_gbps=10.0)
    g.add_edge("c", "d", capacity_gbps=20.0)
    paths = {"x": ["a", "b", "c"], "y": ["a", "b"], "z": ["a", "b"], "w": ["b", "c", "d"],
             "v": ["c", "d"]}
    rates = max_min_rates(g, paths)
    assert rates == pytest.approx({"x": 1.0, "y": 1.0, "z": 1.0, "w": 9.0, "v": 11.0})


def test_rates_feasible_and_every_flow_bottlenecked() -> None:
    rng = random.Random(3)
    g = clos(3, 4, 3, spine_rate_gbps=40.0)
    hs = [f"h{i}" for i in range(12)]
    for _ in range(20):
        paths = {}
        for k in range(15):
            a, b = rng.sample(hs, 2)
            paths[str(k)] = list(rng.choice(candidate_paths(g, a, b)))
        rates = max_min_rates(g, paths)
        load: dict[tuple[str, str], float] = {}
        for f, p in paths.items():
            for e in itertools.pairwise(p):
                load[e] = load.get(e, 0.0) + rates[f]
        for e, x in load.items():
            assert x <= g.edges[e]["capacity_gbps"] + 1e-6
        # max-min: each flow crosses a saturated link where it has the largest rate
        for f, p in paths.items():
            assert any(load[e] >= g.edges[e]["capacity_gbps"] - 1e-6
                       and all(rates[o] <= rates[f] + 1e-6 for o, q in paths.items()
                               if e in itertools.pairwise(q))
                       for e in itertools.pairwise(p))


def test_bad_path_is_input_error() -> None:
    with pytest.raises(InputError, match="not a link"):
        max_min_rates(_line([1.0]), {"a": ["n1", "n0"]})


# --- topologies and flows ------------------------------------------------------------

def test_clos_shape_and_oversubscription() -> None:
    g = clos(4, 6, 3)
    assert g.number_of_edges() == 2 * (4 * 6 + 6 * 3)
    roles = nx.get_node_attributes(g, "role")
    assert sum(r == "spine" for r in roles.values()) == 4
    assert sum(r == "host" for r in roles.values()) == 18
    assert g.edges["leaf0", "spine3"]["capacity_gbps"] == 100.0
    o = clos(4, 2, 8, host_rate_gbps=100.0, oversubscription=2.0)
    assert o.edges["leaf1", "spine0"]["capacity_gbps"] == pytest.approx(100.0)  # 800/(4*2)
    with pytest.raises(InputError, match="spines"):
        clos(0, 2, 2)


def test_fat_tree_shape() -> None:
    g = fat_tree(4)
    roles = list(nx.get_node_attributes(g, "role").values())
    assert roles.count("host") == 16 and roles.count("core") == 4
    assert roles.count("agg") == 8 and roles.count("leaf") == 8
    assert g.number_of_edges() == 2 * 48
    # hosts in different pods: (k/2)^2 = 4 shortest paths
    assert len(candidate_paths(g, "h0", "h15")) == 4
    with pytest.raises(InputError):
        fat_tree(3)


def test_ring_flows_carry_two_n_minus_one_over_n() -> None:
    fl = ring_allreduce_flows("j", ["a", "b", "c", "d"], 1000.0)
    assert [(f.src, f.dst) for f in fl] == [("a", "b"), ("b", "c"), ("c", "d"), ("d", "a")]
    assert all(f.demand_bytes == pytest.approx(1500.0) for f in fl)
    assert len(pipeline_flows("p", ["a", "b", "c"], 10.0)) == 4
    assert len(all_to_all_flows("m", ["a", "b", "c"], 1.0)) == 6


def test_jobs_on_clos_seeded_and_size_checked() -> None:
    g = clos(2, 4, 4)
    a = jobs_on_clos(g, 3, 5, seed=7)
    assert a == jobs_on_clos(g, 3, 5, seed=7)
    members = [m for j in a for m in j.members]
    assert len(set(members)) == 15
    with pytest.raises(InputError, match="need 20 hosts"):
        jobs_on_clos(g, 4, 5, seed=1)


# --- metric ---------------------------------------------------------------------------

def test_metric_bottleneck_first_then_flows() -> None:
    assert metric_key([10, 20], [10, 20, 30]) > metric_key([10, 15], [10, 50, 50])
    assert metric_key([10, 20], [10, 20, 30]) > metric_key([10, 20], [10, 20, 25])
    assert metric_key([11, 11], [11, 11]) > metric_key([10, 90], [10, 90])


def test_evaluate_times_and_utilisation() -> None:
    g = clos(2, 2, 2)
    job = Job("j", ("h0", "h2"), buffer_bytes=1e9, compute_s=0.3)
    fl = flows_of([job])
    paths = {f.id: candidate_paths(g, f.src, f.dst)[0] for f in fl}
    ev = evaluate(g, fl, paths, [job], hop_latency_us=1.0)
    # 2 flows of 1 GB (2(n-1)/n = 1) over 100 Gb/s each (different directions): 0.08 s
    (r,) = ev.jobs
    assert r.bottleneck_gbps == pytest.approx(100.0)
    assert r.allreduce_time_s == pytest.approx(0.08 + 2 * 4 * 1e-6)
    assert ev.effective_gpu_utilization == pytest.approx(0.3 / (0.3 + r.allreduce_time_s))


# --- policies ---------------------------------------------------------------------------

def _instance(seed: int, fail: bool) -> tuple[nx.DiGraph, list[Flow]]:
    rng = random.Random(seed)
    s, leaves, hosts = rng.randint(2, 4), rng.randint(2, 6), rng.randint(1, 4)
    g = clos(s, leaves, hosts, spine_rate_gbps=rng.choice([50.0, 100.0]))
    n = leaves * hosts
    ring = rng.randint(2, min(6, n))
    jobs = jobs_on_clos(g, rng.randint(1, max(1, n // ring)), ring, seed=seed)
    if fail:
        g = remove_links(g, [(f"spine{rng.randrange(s)}", f"leaf{rng.randrange(leaves)}")])
    return g, flows_of(jobs)


def _keys(g: nx.DiGraph, fl: list[Flow], pols: list[str], seed: int) -> dict[str, tuple]:
    inst = Instance(g, fl)
    return {p: inst.full_key(inst.choice_of(route(
        p, g, fl, seed=seed, instance=inst,
        time_budget_s=0.05 if p == "greedy-ls" else None).paths)) for p in pols}


def test_registry_matches_spec_and_lists_names() -> None:
    assert tuple(policy_names()) == ROUTING_POLICIES
    with pytest.raises(InputError, match="valid: ecmp, shortest"):
        route("nope", clos(2, 2, 1), [])


def test_ecmp_deterministic_per_seed() -> None:
    g = clos(8, 8, 4)
    fl = flows_of(jobs_on_clos(g, 4, 8, seed=1))
    a = route("ecmp", g, fl, seed=5).paths
    assert a == route("ecmp", g, fl, seed=5).paths
    assert any(route("ecmp", g, fl, seed=s).paths != a for s in (6, 7, 8))
    spines = {p[2] for p in a.values() if len(p) == 5}
    assert len(spines) > 1  # hashing spreads flows


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 10_000), st.booleans())
def test_greedy_never_below_ecmp_on_clos(seed: int, fail: bool) -> None:
    g, fl = _instance(seed, fail)
    k = _keys(g, fl, ["ecmp", "greedy"], seed)
    assert k["greedy"] >= k["ecmp"]


def test_papers_greedy_alone_rarely_below_ecmp_and_ahead_on_average() -> None:
    # without the guard, the paper's greedy is a heuristic: seed 2266 (2 spines, 2:1
    # oversubscribed) is one where it ends below ECMP; over many instances it is rare
    g, fl = _instance(2266, fail=False)
    inst = Instance(g, fl)
    ecmp = inst.full_key(inst.choice_of(route("ecmp", g, fl, seed=2266, instance=inst).paths))
    assert inst.full_key(greedy(inst)) < ecmp
    assert inst.full_key(inst.choice_of(route("greedy", g, fl, seed=2266,
                                              instance=inst).paths)) == ecmp  # guarded
    below, gsum, esum = 0, 0.0, 0.0
    for seed in range(300):
        g, fl = _instance(seed, fail=seed % 2 == 1)
        inst = Instance(g, fl)
        kg = inst.full_key(greedy(inst))
        ke = inst.full_key(inst.choice_of(route("ecmp", g, fl, seed=seed, instance=inst).paths))
        below += kg < ke
        gsum += kg[0][0]
        esum += ke[0][0]
    assert below <= 6  # <= 2 %
    assert gsum > 1.1 * esum  # mean slowest-job bottleneck over the instances


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 10_000), st.booleans())
def test_greedy_within_factor_two_of_ilp_and_ls_never_below(seed: int, fail: bool) -> None:
    g, fl = _instance(seed, fail)
    k = _keys(g, fl, ["ecmp", "greedy", "greedy-ls", "ilp"], seed)
    assert 2 * k["greedy"][0][0] >= k["ilp"][0][0] - 1e-6  # the paper's bound
    # the ILP's first component is the optimum: nothing beats it
    assert k["ilp"][0][0] >= max(v[0][0] for v in k.values()) - 1e-6
    assert k["greedy-ls"] >= k["greedy"] and k["greedy-ls"] >= k["ecmp"]


def test_ilp_matches_brute_force() -> None:
    for seed in range(6):
        g = clos(2, 3, 2)
        fl = flows_of(jobs_on_clos(g, 2, 3, seed=seed))
        inst = Instance(g, fl)
        best = max(inst.full_key(list(c))[0][0] for c in
                   itertools.product(*[range(len(cs)) for cs in inst.cands]))
        r = route("ilp", g, fl)
        assert r.info["gap"] == 0.0
        assert inst.full_key(inst.choice_of(r.paths))[0][0] == pytest.approx(best)
        assert r.info["bottleneck_opt_gbps"] == pytest.approx(best)


def test_edge_coloring_proper_and_full_rate_when_spines_suffice() -> None:
    rng = random.Random(1)
    edges = [(f"a{rng.randrange(5)}", f"b{rng.randrange(5)}") for _ in range(40)]
    col = bipartite_edge_coloring(edges)
    deg = max(max(sum(e[0] == u for e in edges) for u, _ in edges),
              max(sum(e[1] == v for e in edges) for _, v in edges))
    assert max(col) + 1 == deg
    for i, j in itertools.combinations(range(len(edges)), 2):
        if edges[i][0] == edges[j][0] or edges[i][1] == edges[j][1]:
            assert col[i] != col[j]
    g = clos(4, 8, 4)
    fl = flows_of(jobs_on_clos(g, 4, 8, seed=3))
    assert _keys(g, fl, ["edge-coloring"], 0)["edge-coloring"][0][0] == pytest.approx(100.0)


def test_sa_seeded_and_bounded() -> None:
    g = clos(4, 8, 4)
    fl = flows_of(jobs_on_clos(g, 4, 6, seed=2))
    a = route("sa", g, fl, seed=3, max_moves=300, time_budget_s=30)
    b = route("sa", g, fl, seed=3, max_moves=300, time_budget_s=30)
    assert a.paths == b.paths and a.info["moves"] <= 300
    k = _keys(g, fl, ["ecmp"], 3)["ecmp"]
    inst = Instance(g, fl)
    assert inst.full_key(inst.choice_of(a.paths)) >= k  # best seen, from the ECMP start


def test_paths_are_host_to_host_candidates() -> None:
    g = fat_tree(4)
    fl = flows_of([Job("j", ("h0", "h5", "h10", "h15"))])
    for pol in policy_names():
        r = route(pol, g, fl, seed=1, time_budget_s=5)
        for f in fl:
            assert r.paths[f.id][0] == f.src and r.paths[f.id][-1] == f.dst
            assert r.paths[f.id] in candidate_paths(g, f.src, f.dst)


# --- re-routing -------------------------------------------------------------------------

@pytest.mark.parametrize("policy", ["ecmp", "greedy", "greedy-ls", "edge-coloring"])
@pytest.mark.parametrize("max_moves", [None, 0])
def test_every_flow_hit_by_a_failure_is_rerouted(policy: str, max_moves: int | None) -> None:
    g = clos(4, 8, 4)
    rr = Rerouter(g, policy, seed=2, max_moves=max_moves)
    for job in jobs_on_clos(g, 4, 8, seed=5):
        rr.add_job(job)
    before = dict(rr.paths)
    users = [(p[1], p[2]) for p in before.values() if len(p) == 5]
    leaf, spine = users[0]
    res = rr.fail_link(spine, leaf)
    assert res.hit and set(res.hit) == {f for f, p in before.items()
                                        if (leaf, spine) in itertools.pairwise(p)
                                        or (spine, leaf) in itertools.pairwise(p)}
    for fid in res.hit:
        p = rr.paths[fid]
        assert (leaf, spine) not in itertools.pairwise(p)
        assert (spine, leaf) not in itertools.pairwise(p)
    assert res.moved >= len(res.hit)
    if max_moves == 0:
        assert res.moved == len(res.hit)  # churn limited to the forced moves
    rec = rr.recover_link(spine, leaf)
    assert rec.hit == ()


def test_rerouter_job_events_and_errors() -> None:
    g = clos(4, 4, 4)
    jobs = jobs_on_clos(g, 2, 6, seed=1)
    rr = Rerouter(g, "greedy")
    rr.add_job(jobs[0])
    res = rr.add_job(jobs[1])
    assert res.moved == 0  # greedy keeps the routing in force, places the new flows
    assert len(rr.paths) == 12
    rr.remove_job("j0")
    assert len(rr.paths) == 6
    with pytest.raises(InputError):
        rr.remove_job("j0")
    with pytest.raises(InputError, match="no link"):
        rr.fail_link("spine9", "leaf0")


def test_periodic_full_reroute_respects_churn_limit() -> None:
    g = clos(4, 8, 4)
    rr = Rerouter(g, "ecmp", seed=1)
    for job in jobs_on_clos(g, 4, 8, seed=4):
        rr.add_job(job)
    before = dict(rr.paths)
    inst = Instance(rr.graph, rr.flows)
    k0 = inst.full_key(inst.choice_of(before))
    rr.policy, rr.max_moves = "greedy-ls", 3
    res = rr.reroute(full=True)
    assert res.hit == () and 0 < res.moved <= 3
    assert inst.full_key(inst.choice_of(rr.paths)) > k0  # the moves made help
    rr.max_moves = None
    res = rr.reroute(full=True)
    assert inst.full_key(inst.choice_of(rr.paths)) == inst.upper_key()


@pytest.mark.parametrize("policy", ROUTING_POLICIES)
def test_last_job_leaving_leaves_an_empty_routing(policy: str) -> None:
    g = clos(2, 2, 2)
    rr = Rerouter(g, policy, time_budget_s=0.2)
    rr.add_job(jobs_on_clos(g, 1, 4, seed=1)[0])
    assert len(rr.paths) == 4
    res = rr.remove_job("j0")
    assert rr.paths == {} and res.moved == 0
    assert route(policy, g, []).paths == {}


def test_wan_lightpaths_choose_lightpath_per_flow() -> None:
    from testbed.routing.topology import wan_lightpaths
    # two DCs joined by two 100 Gb/s lightpaths, a third DC by one
    g = wan_lightpaths({"a": 4, "b": 4, "c": 2}, [("a", "b", 100.0), ("a", "b", 100.0),
                                                   ("b", "c", 50.0)])
    assert [p[2] for p in candidate_paths(g, "h0", "h4")] == ["lp0", "lp1"]
    assert [p[2] for p in candidate_paths(g, "h4", "h8")] == ["lp2"]
    # two jobs, each a ring over two hosts in a and two in b
    jobs = [Job("j0", ("h0", "h4", "h1", "h5")), Job("j1", ("h2", "h6", "h3", "h7"))]
    fl = flows_of(jobs)
    k = _keys(g, fl, ["shortest", "ecmp", "greedy", "ilp"], 1)
    assert k["shortest"][0][0] == pytest.approx(25.0)  # 4 flows each way on one lightpath
    assert k["greedy"][0][0] == pytest.approx(50.0) == k["ilp"][0][0]
    with pytest.raises(InputError, match="unknown DC"):
        wan_lightpaths({"a": 1}, [("a", "z", 10.0)])
