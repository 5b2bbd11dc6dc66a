"""Candidate routes of RMSA-v0's compiled envs: every route once, k shortest per failure set.

`OpticalNetwork.candidate_paths(src, dst)` returns the k shortest routes on the fibres up,
or, when dst -> src is already in the network's cache, those routes reversed (which may
differ from src -> dst's own k shortest where lengths tie). The compiled env keeps which
of the two each pair got (layout's `flags`) and takes the routes from this book: the k
shortest of a pair under a set of cut fibres are computed once (`fill`) and shared by
every env and episode; each route is registered once with its PathInfo from the
scenario's OpticalNetwork (length, modulation, spectra), so it is the reference's own.
"""

from __future__ import annotations

from collections import OrderedDict

import networkx as nx
import numpy as np

from testbed.gym.layout import FWD, REV
from testbed.optical.network import OpticalNetwork, PathInfo
from testbed.optical.paths import k_shortest_paths

_KSP_CACHE: OrderedDict[tuple[object, ...], list[tuple[str, ...]]] = OrderedDict()
KSP_CACHE_SIZE = 200_000  # (graph, failure set, k, src, dst) entries kept per process


def cached_ksp(graph_key: tuple[object, ...], graph: nx.Graph, src: str, dst: str,
               k: int) -> list[tuple[str, ...]]:
    """k_shortest_paths, remembered per process by graph key (every env of a topology
    and failure set computes each pair once)."""
    key = (graph_key, k, src, dst)
    got = _KSP_CACHE.get(key)
    if got is None:
        got = [tuple(p) for p in k_shortest_paths(graph, src, dst, k)]
        _KSP_CACHE[key] = got
        if len(_KSP_CACHE) > KSP_CACHE_SIZE:
            _KSP_CACHE.popitem(last=False)
    return got


class RouteBook:
    """Routes (ids into `rt`/`rg`) and the k shortest per (failure set, ordered pair)."""

    def __init__(self, net: OpticalNetwork, k: int, fail_sets: list[frozenset[int]]) -> None:
        self.net = net
        self.k = k
        self.nodes: tuple[str, ...] = tuple(net.topology.nodes)
        self.index = {n: i for i, n in enumerate(self.nodes)}
        self.n = len(self.nodes)
        self.fail_sets = fail_sets
        self.link_ends = [(f.u, f.v) for f in net.topology.fibres]  # link index order
        # what the k shortest routes depend on: the fibres (order, ends, lengths)
        self._topo_key = tuple((f.u, f.v, float(f.length_km)) for f in net.topology.fibres)
        self.paths: list[PathInfo] = []
        self.names: list[str] = []  # "1-3-6" per route
        self.links: list[frozenset[int]] = []
        self._ids: dict[tuple[str, ...], int] = {}
        self._graphs: dict[int, nx.Graph] = {}
        self.hops = max(1, self.n - 1)
        self.rt = np.zeros((64, 1 + self.hops), np.int32)  # [hops, spectra...] per route
        self.rg = np.zeros(64, np.float64)  # Gb/s per slot (0: beyond every reach)
        self.ksp = np.full((len(fail_sets), self.n * self.n, 2, k), -1, np.int32)
        self.ksp[:, :, 0, 0] = -2  # not computed yet
        self.version = 0  # changes whenever a route or a pair's routes are added

    def route_id(self, nodes: tuple[str, ...]) -> int:
        """The id of the route through `nodes` (registered on first sight)."""
        got = self._ids.get(nodes)
        if got is not None:
            return got
        p = self.net.path_info(nodes)
        r = len(self.paths)
        if r == len(self.rg):
            self.rt = np.concatenate([self.rt, np.zeros_like(self.rt)])
            self.rg = np.concatenate([self.rg, np.zeros_like(self.rg)])
        self.rt[r, 0] = len(p.spectra)
        self.rt[r, 1:1 + len(p.spectra)] = p.spectra
        self.rg[r] = p.gbps_per_slot if p.modulation is not None else 0.0
        self.paths.append(p)
        self.names.append("-".join(p.nodes))
        self.links.append(frozenset(p.links))
        self._ids[nodes] = r
        self.version += 1
        return r

    def graph(self, fs: int) -> nx.Graph:
        """The working graph under failure set fs (as OpticalNetwork._working_graph)."""
        got = self._graphs.get(fs)
        if got is None:
            failed = self.fail_sets[fs]
            got = self.net.graph
            if failed:
                got = got.copy()
                got.remove_edges_from(self.link_ends[link] for link in failed)
            self._graphs[fs] = got
        return got

    def fill(self, fs: int, pair: int) -> None:
        """The k shortest routes of pair and of its reverse under failure set fs: each
        pair's own (FWD) and the reverse pair's reversed (REV)."""
        s, d = divmod(pair, self.n)
        rev = d * self.n + s
        g = self.graph(fs)
        src, dst = self.nodes[s], self.nodes[d]
        gk = (self._topo_key, tuple(self.nodes), self.fail_sets[fs])
        there = cached_ksp(gk, g, src, dst, self.k)
        back = cached_ksp(gk, g, dst, src, self.k)
        for p_i, own, other in ((pair, there, back), (rev, back, there)):
            row = self.ksp[fs, p_i]
            row[:] = -1
            for i, nodes in enumerate(own):
                row[FWD - 1, i] = self.route_id(nodes)
            for i, nodes in enumerate(other):
                row[REV - 1, i] = self.route_id(tuple(reversed(nodes)))
        self.version += 1

    def routes(self, fs: int, pair: int, how: int) -> list[int]:
        """The route ids of pair under fs found as `how` (FWD/REV), computed if needed."""
        if self.ksp[fs, pair, 0, 0] == -2:
            self.fill(fs, pair)
        return [int(r) for r in self.ksp[fs, pair, how - 1] if r >= 0]

    def pair(self, src: str, dst: str) -> int:
        return self.index[src] * self.n + self.index[dst]


def version_fail_sets(net: OpticalNetwork, events: list[object]) -> tuple[list[int],
                                                                          list[frozenset[int]]]:
    """Per route version (1 + one per cut or repair, in event order) its failure set's
    index, and the distinct failure sets: what `OpticalNetwork.paths_version` counts."""
    failed: set[int] = set()
    sets: list[frozenset[int]] = [frozenset()]
    vfs = [0]
    for ev in events:
        kind = getattr(ev, "kind", "")
        if kind not in ("fiber_cut", "fiber_repair"):
            continue
        u, v = ev.link  # type: ignore[attr-defined]
        link = net.link_id(u, v)
        if kind == "fiber_cut":
            failed.add(link)
        else:
            failed.discard(link)
        key = frozenset(failed)
        if key not in sets:
            sets.append(key)
        vfs.append(sets.index(key))
    return vfs, sets
