"""The fast 2-layer Clos compile of a routing instance (per pair and in one batch) equals the
generic one (same paths, link rows, own-link masks and capacities), including after link
failures; the lazy path list behaves as a list; the fast greedy loop makes the reference
loop's choices; the fast graph copy is networkx's copy."""

from __future__ import annotations

import itertools
import random

import networkx as nx
import numpy as np
import pytest

from testbed.routing.flows import Flow, Job, flows_of, jobs_on_clos
from testbed.routing.greedy import greedy, greedy_reference
from testbed.routing.instance import Fabric, Instance, SpinePaths
from testbed.routing.topology import clos, copy_graph, fat_tree, wan_lightpaths


def _same(fabric: Fabric, src: str, dst: str) -> None:
    fast = fabric.pair(src, dst)
    slow = fabric._generic(src, dst)
    assert list(fast.paths) == list(slow.paths)
    assert np.array_equal(fast.mat, slow.mat)
    assert np.array_equal(fast.mask, slow.mask)
    assert np.array_equal(fast.cols, slow.cols)
    assert np.array_equal(fast.ocap, slow.ocap) and fast.ocap_max == slow.ocap_max


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_clos_pairs_equal_generic(seed: int) -> None:
    g = clos(8, 16, 4)
    fabric = Fabric(g)
    for f in flows_of(jobs_on_clos(g, 6, 8, seed=seed)):
        _same(fabric, f.src, f.dst)
    _same(fabric, "h1", "h2")  # one leaf: a single path, no own links


def test_clos_pairs_equal_generic_with_links_gone() -> None:
    g = clos(4, 8, 2)
    g.remove_edge("leaf1", "spine2")  # leaf1 can no longer go up to spine2
    g.remove_edge("spine3", "leaf4")
    for u, v in (("leaf2", "spine1"), ("spine1", "leaf2")):
        g.edges[u, v]["capacity_gbps"] = 40.0  # unequal capacities
    fabric = Fabric(g)
    hosts = [n for n, r in g.nodes(data="role") if r == "host"]
    for a in hosts:
        for b in hosts:
            if a != b:
                _same(fabric, a, b)


def test_spine_paths_is_a_list() -> None:
    p = SpinePaths("h1", "leaf1", ["spine1", "spine2", "spine3"], "leaf2", "h5")
    as_list = [("h1", "leaf1", s, "leaf2", "h5") for s in ("spine1", "spine2", "spine3")]
    assert len(p) == 3 and list(p) == as_list and p == as_list
    assert p[-1] == as_list[-1] and p[1:] == as_list[1:]
    assert p.index(["h1", "leaf1", "spine2", "leaf2", "h5"]) == 1
    for bad in (("h1", "leaf1", "spine9", "leaf2", "h5"), ("h2", "leaf1", "spine1", "leaf2",
                                                           "h5"), ("h1", "h5")):
        with pytest.raises(ValueError):
            p.index(bad)
    with pytest.raises(IndexError):
        p[3]
    assert as_list[2] in p


def _graphs() -> list[tuple[str, nx.DiGraph]]:
    """Fabrics the batch compile must handle like `pair`: intact, oversubscribed, links and
    a spine gone, unequal capacities, one spine, leaf pairs joined by one spine or none, a
    fat-tree, lightpaths between DCs."""
    out = [("clos", clos(8, 16, 4)), ("oversub", clos(4, 8, 4, oversubscription=2.0)),
           ("one-spine", clos(1, 4, 4))]
    g = clos(6, 12, 4)
    rng = random.Random(5)
    for s, leaf in rng.sample([(s, leaf) for s in range(6) for leaf in range(12)], 10):
        g.remove_edge(f"spine{s}", f"leaf{leaf}")
        g.remove_edge(f"leaf{leaf}", f"spine{s}")
    g.edges["leaf3", "spine1"]["capacity_gbps"] = 40.0
    out.append(("failed", g))
    h = clos(4, 8, 2)
    for leaf in range(8):
        h.remove_edge("spine2", f"leaf{leaf}")
        h.remove_edge(f"leaf{leaf}", "spine2")
    sparse = clos(3, 6, 2)  # leaf0 reaches spine2 only, leaf1 all but spine2: some pairs
    for u, v in (("leaf0", "spine0"), ("leaf0", "spine1"), ("leaf1", "spine2")):  # have one
        sparse.remove_edge(u, v)  # spine, leaf0-leaf1 none (a longer generic path)
        sparse.remove_edge(v, u)
    out += [("spine-down", h), ("sparse", sparse), ("fat-tree", fat_tree(4)),
            ("wan", wan_lightpaths({"a": 4, "b": 4, "c": 2},
                                   [("a", "b", 100.0), ("a", "b", 50.0), ("b", "c", 100.0)]))]
    return out


@pytest.mark.parametrize("name,g", _graphs())
def test_batch_compile_equals_pairs_and_generic(name: str, g: nx.DiGraph) -> None:
    hosts = [n for n, r in g.nodes(data="role") if r == "host"]
    flows = [Flow(f"f{k}", "j", a, b, 1.0) for k, (a, b) in
             enumerate(itertools.permutations(hosts, 2))]
    comp = Fabric(g).compile(flows)
    if name in ("clos", "oversub", "failed"):
        assert comp.batch is not None  # the batch paths are taken where they apply
    if name in ("failed", "spine-down", "sparse"):
        assert comp.part is not None
    ref = Fabric(g)
    for i, f in enumerate(flows):
        slow = ref._generic(f.src, f.dst)
        assert list(comp.paths[i]) == list(slow.paths)
        assert np.array_equal(comp.mat[i], slow.mat)
        assert np.array_equal(comp.mask[i], slow.mask)
        assert np.array_equal(comp.cols[i], slow.cols)
        assert np.array_equal(comp.ocap[i], slow.ocap) and comp.ocap_max[i] == slow.ocap_max
    inst = Instance(g, flows)
    links, caps = inst.own_lists  # greedy's list tables say the same
    for i in range(len(flows)):
        own = inst.cand_mat[i][:, inst.own_cols[i]].T
        assert links[i] == own.tolist()
        if own.size:
            assert np.array_equal(np.array(caps[i]).min(axis=0), inst.own_cap[i])
    rng = random.Random(len(flows))
    allf = list(range(len(flows)))
    for _ in range(5):  # the gathered filling gives the per-flow filling's rates, bit for bit
        choice = [rng.randrange(len(c)) for c in inst.cands]
        assert np.array_equal(inst.rates_all(choice), inst.rates(allf, choice))


@pytest.mark.parametrize("name,g", _graphs())
def test_fast_greedy_equals_reference(name: str, g: nx.DiGraph) -> None:
    """Same choices as the reference loop from scratch, from a partial start, in a random
    order and with random ties, on fabrics where free candidates run out (few spines,
    unequal capacities) and where they do not."""
    hosts = [n for n, r in g.nodes(data="role") if r == "host"]
    for seed in range(8):
        rng = random.Random(seed)
        size = min(len(hosts), rng.randint(3, 8))
        jobs = []
        for j in range(rng.randint(1, 4)):
            jobs.append(Job(f"j{j}", tuple(rng.sample(hosts, size)),
                            pattern=rng.choice(["ring", "ring", "pipeline", "all_to_all"])))
        inst = Instance(g, flows_of(jobs))
        n = len(inst.flows)
        assert greedy(inst) == greedy_reference(inst)
        start: list[int | None] = list(greedy_reference(inst))
        off = rng.sample(range(n), n // 2)
        for i in off:
            start[i] = None
        assert greedy(inst, start, order=off) == greedy_reference(inst, start, order=off)
        assert greedy(inst, start, order=off, rng=random.Random(seed)) == \
            greedy_reference(inst, start, order=off, rng=random.Random(seed))


@pytest.mark.parametrize("name,g", _graphs())
def test_copy_graph_is_networkx_copy(name: str, g: nx.DiGraph) -> None:
    """Same nodes, successors and predecessors in the same order (link numbers follow the
    adjacency order), equal and independent attribute dicts, one dict per edge."""
    g.graph["note"] = name
    ref, got = g.copy(), copy_graph(g)
    assert type(got) is type(ref) and got.graph == ref.graph
    assert list(got.nodes(data=True)) == list(ref.nodes(data=True))
    assert list(got.edges(data=True)) == list(ref.edges(data=True))
    for v in ref:
        assert list(got._pred[v]) == list(ref._pred[v])
    for u, v in got.edges:
        assert got._succ[u][v] is got._pred[v][u] and got._succ[u][v] is not g._succ[u][v]
    u, v = next(iter(got.edges))
    got.edges[u, v]["capacity_gbps"] = -1.0
    got.nodes[u]["role"] = "changed"
    got.remove_edge(u, v)
    assert g.edges[u, v]["capacity_gbps"] != -1.0 and g.nodes[u]["role"] != "changed"
    assert g.has_edge(u, v)


def _dual_homed() -> nx.DiGraph:
    """A Clos whose host h0 has a second uplink (to leaf1): not one leaf's host."""
    g = clos(4, 4, 2)
    g.add_edge("h0", "leaf1", capacity_gbps=100.0)
    g.add_edge("leaf1", "h0", capacity_gbps=100.0)
    return g


@pytest.mark.parametrize("name,g", [*_graphs(), ("dual-homed", _dual_homed())])
def test_bulk_host_lookup_equals_one_by_one(name: str, g: nx.DiGraph) -> None:
    """`_SpineCache.resolve` (hosts looked up together where the fabric allows) gives
    what the one-host look-up gives, for every node as source and as destination."""
    nodes = list(g.nodes)
    fast = Fabric(g)._spines.resolve(nodes, nodes)
    sc = Fabric(g)._spines
    slow_up = [sc._one(h, True) for h in nodes]
    slow_down = [sc._one(h, False) for h in nodes]
    assert list(zip(fast[0], fast[1], strict=True)) == slow_up
    assert list(zip(fast[2], fast[3], strict=True)) == slow_down
    one = Fabric(g)._spines  # one host at a time, as `pair` asks
    for h, (a, k), (b, m) in zip(nodes, slow_up, slow_down, strict=True):
        assert one.host_up(h) == (None if a < 0 else (one.leaves[a], k))
        assert one.host_down(h) == (None if b < 0 else (one.leaves[b], m))
    if name == "dual-homed":
        assert slow_up[nodes.index("h0")] == (-1, -1) and slow_up[nodes.index("h1")][0] >= 0


def _random_instances() -> list[tuple[str, Instance]]:
    """Fabrics where greedy's routing has every flow at its host links' rate and where it
    cannot (oversubscribed, unequal capacities, shared hosts), several traffic patterns."""
    out = []
    fabrics = [("clos", clos(8, 16, 4)), ("few-spines", clos(2, 16, 4)),
               ("oversub", clos(4, 8, 4, oversubscription=2.0)),
               ("slow-hosts", clos(8, 8, 4, host_rate_gbps=25.0, spine_rate_gbps=100.0))]
    for name, g in _graphs() + fabrics:
        hosts = [n for n, r in g.nodes(data="role") if r == "host"]
        for seed in range(6):
            rng = random.Random(seed)
            size = min(len(hosts), rng.randint(2, 8))
            jobs = [Job(f"j{j}", tuple(rng.sample(hosts, size)),
                        pattern=rng.choice(["ring", "ring", "pipeline", "all_to_all"]))
                    for j in range(rng.randint(1, 3))]
            out.append((f"{name}-{seed}", Instance(g, flows_of(jobs))))
        for seed in range(2):  # distinct hosts, one ring each: where greedy can reach
            n_jobs = max(1, min(4, len(hosts) // 4))  # the bound
            out.append((f"{name}-rings-{seed}", Instance(g, flows_of(jobs_on_clos(
                g, n_jobs, min(4, len(hosts)), seed=seed)))))
    return out


def test_unbeatable_routings_are_never_beaten() -> None:
    """Where `Instance.unbeatable` says greedy's routing cannot be beaten, no routing
    (ECMP, the shortest, random ones, every one on small instances) has a better metric
    key, so the guard's answer is the same without comparing."""
    from testbed.routing.policies import ecmp_index

    said = 0
    for name, inst in _random_instances():
        choice = greedy(inst)
        if not inst.unbeatable(choice):
            continue
        said += 1
        key = inst.full_key(choice)
        rng = random.Random(name)
        others = [[ecmp_index(f, n, s) for f, n in zip(inst.flows, inst.n_cands, strict=True)]
                  for s in range(4)] + [[0] * len(inst.flows)]
        others += [[rng.randrange(n) for n in inst.n_cands] for _ in range(30)]
        if np.prod([float(n) for n in inst.n_cands]) <= 4096:
            others += [list(c) for c in itertools.product(*[range(n) for n in inst.n_cands])]
        for other in others:
            assert not inst.full_key(other) > key, (name, other)
        assert key == inst.upper_key()  # every flow at its host links' rate
    assert said >= 10  # the shortcut is exercised


def test_guard_decides_as_the_full_comparison() -> None:
    """`route("greedy")` with the shortcut chooses exactly what comparing greedy's key with
    ECMP's (or the routing in force) chooses, on instances where it applies and not."""
    from testbed.routing.policies import Context, _ecmp, _guard

    for name, inst in _random_instances():
        choice = greedy(inst)
        for seed in (0, 3):
            ctx = Context(tuple([None] * len(inst.flows)), seed, 1.0, None)
            base = _ecmp(inst, ctx)[0]
            want = base if inst.full_key(base) > inst.full_key(choice) else choice
            info: dict = {}
            assert _guard(inst, ctx, list(choice), info) == want, name
            assert ("guard" in info) == (want is base and base != choice)


def test_from_scratch_greedy_leaves_the_batch_lists_unmade() -> None:
    """On the paper's fabric a from-scratch greedy reads the batch arrays: the per-flow
    candidate lists are not made (made on first use, equal to the eager compile's)."""
    from testbed.routing.policies import route

    g = clos(32, 64, 8)
    flows = flows_of(jobs_on_clos(g, 16, 16, seed=2))
    inst = Instance(g, flows)
    r = route("greedy", g, flows, instance=inst)
    assert inst._comp.lazy and "cands" not in inst.__dict__
    eager = Fabric(g).compile(flows)
    assert [list(c) for c in inst.cands] == [list(c) for c in eager.paths]
    assert all(np.array_equal(a, b) for a, b in zip(inst.cand_mat, eager.mat, strict=True))
    assert r.paths == inst.paths_of(greedy(inst)) == Instance(g, flows).paths_of(
        greedy_reference(Instance(g, flows)))
