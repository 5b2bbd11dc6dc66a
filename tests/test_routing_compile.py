"""The fast 2-layer Clos compile of a routing instance equals the generic one (same paths,
link rows, own-link masks and capacities), including after link failures; the lazy path
list behaves as a list."""

from __future__ import annotations

import numpy as np
import pytest

from testbed.routing.flows import flows_of, jobs_on_clos
from testbed.routing.instance import Fabric, SpinePaths
from testbed.routing.topology import clos


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
