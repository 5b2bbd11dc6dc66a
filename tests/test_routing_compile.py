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
