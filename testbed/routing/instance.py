"""A routing problem compiled for speed: link indices, candidate paths, fast metric keys."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import networkx as nx
import numpy as np

from testbed.errors import InputError
from testbed.routing.flows import Flow
from testbed.routing.maxmin import LinkIndex, fill
from testbed.routing.metric import RATE_DECIMALS
from testbed.routing.topology import HOST, LEAF, SPINE


def candidate_paths(graph: nx.DiGraph, src: str, dst: str) -> list[tuple[str, ...]]:
    """The shortest (fewest-hop) paths from host `src` to host `dst`: on a 2-layer Clos one
    per live spine (in spine order), elsewhere networkx's all shortest paths (sorted).
    InputError if the hosts are unknown or not connected."""
    for h in (src, dst):
        if h not in graph or graph.nodes[h].get("role") != HOST:
            raise InputError("flow", f"{h!r} is not a host of the fabric")
    if src == dst:
        raise InputError("flow", f"flow from {src!r} to itself")
    role = graph.nodes
    up = [v for v in graph.successors(src)]
    down = [u for u in graph.predecessors(dst)]
    if len(up) == 1 and len(down) == 1 and role[up[0]].get("role") == LEAF \
            and role[down[0]].get("role") == LEAF:
        la, lb = up[0], down[0]
        if la == lb:
            return [(src, la, dst)]
        out = [(src, la, s, lb, dst) for s in graph.successors(la)
               if role[s].get("role") == SPINE and graph.has_edge(s, lb)]
        if out:
            return sorted(out, key=lambda p: _natural(p[2]))
    try:
        paths = [tuple(p) for p in nx.all_shortest_paths(graph, src, dst)]
    except nx.NetworkXNoPath:
        raise InputError("flow", f"no path from {src} to {dst} in the fabric") from None
    return sorted(paths, key=lambda p: [_natural(n) for n in p])


class _SpineCache:
    """Fast candidate paths (and their link indices) on a 2-layer Clos: hosts on one leaf,
    leaves under spines. Per leaf, the up- and down-link index to every spine (-1: none)."""

    def __init__(self, graph: nx.DiGraph, index: dict[tuple[str, str], int]) -> None:
        self.g = graph
        self.index = index
        self.role: dict[str, str | None] = dict(graph.nodes(data="role"))
        self.spines = sorted((n for n, r in self.role.items() if r == SPINE), key=_natural)
        self.up: dict[str, np.ndarray] = {}
        self.down: dict[str, np.ndarray] = {}

    def _links(self, leaf: str, up: bool) -> np.ndarray:
        cache = self.up if up else self.down
        got = cache.get(leaf)
        if got is None:
            idx = self.index
            got = cache[leaf] = np.array(
                [idx.get((leaf, s) if up else (s, leaf), -1) for s in self.spines],
                dtype=np.int64)
        return got

    def paths(self, src: str, dst: str) -> tuple[list[tuple[str, ...]], np.ndarray] | None:
        g, role = self.g, self.role
        if role.get(src) != HOST or role.get(dst) != HOST or src == dst:
            return None
        up, down = list(g.succ[src]), list(g.pred[dst])
        if len(up) != 1 or len(down) != 1:
            return None
        la, lb = up[0], down[0]
        if role.get(la) != LEAF or role.get(lb) != LEAF:
            return None
        hu, hd = self.index[(src, la)], self.index[(lb, dst)]
        if la == lb:
            return [(src, la, dst)], np.array([[hu, hd]], dtype=np.int64)
        u, d = self._links(la, True), self._links(lb, False)
        sel = np.flatnonzero((u >= 0) & (d >= 0))
        if not sel.size:
            return None
        mat = np.empty((sel.size, 4), dtype=np.int64)
        mat[:, 0], mat[:, 1], mat[:, 2], mat[:, 3] = hu, u[sel], d[sel], hd
        sp = self.spines
        return [(src, la, sp[k], lb, dst) for k in sel.tolist()], mat


def _natural(name: str) -> tuple[str, int]:
    head = name.rstrip("0123456789")
    tail = name[len(head):]
    return head, int(tail) if tail else -1


class Fabric:
    """A fabric compiled once: link indices and capacities, and per host pair its candidate
    paths with their link indices. Keep one while the graph does not change (a controller
    between job events) and pass it to `route(..., fabric=)`; rebuild after a failure."""

    def __init__(self, graph: nx.DiGraph) -> None:
        self.graph = graph
        self.idx = LinkIndex(graph)
        self.cap = self.idx.capacity_gbps
        self._spines = _SpineCache(graph, self.idx.index)
        # (src, dst) -> (paths, link matrix, own-link mask, own-link min capacity)
        self._pairs: dict[tuple[str, str], tuple[list[tuple[str, ...]], np.ndarray,
                                                 np.ndarray, np.ndarray]] = {}

    def pair(self, src: str, dst: str) -> tuple[list[tuple[str, ...]], np.ndarray,
                                                np.ndarray, np.ndarray]:
        got = self._pairs.get((src, dst))
        if got is None:
            sp = self._spines.paths(src, dst)
            if sp is None:
                paths = candidate_paths(self.graph, src, dst)
                sp = paths, np.array([self.idx.links_of(p) for p in paths], dtype=np.int64)
            paths, mat = sp
            # all candidates are shortest paths: a link every candidate uses sits at one hop
            mask = ~(mat == mat[0]).all(axis=0)[None, :].repeat(len(mat), axis=0)
            ocap = np.where(mask, self.cap[mat], np.inf).min(axis=1)
            got = self._pairs[(src, dst)] = (paths, mat, mask, ocap)
        return got


class Instance:
    """Graph + flows with numbered links, candidate paths per flow and job indices."""

    def __init__(self, graph: nx.DiGraph, flows: Sequence[Flow],
                 fabric: Fabric | None = None) -> None:
        ids = [f.id for f in flows]
        if len(set(ids)) != len(ids):
            raise InputError("flows", "flow ids must be unique")
        if fabric is None or fabric.graph is not graph:
            fabric = Fabric(graph)
        self.graph = graph
        self.fabric = fabric
        self.flows = list(flows)
        self.idx = fabric.idx
        self.cap = fabric.cap
        self.cands: list[list[tuple[str, ...]]] = []
        # cand_mat[i]: (candidates, hops) link indices; cand_links[i][k]: one row;
        # own_mask[i]: links not on every candidate; own_cap[i]: their least capacity
        self.cand_mat: list[np.ndarray] = []
        self.own_mask: list[np.ndarray] = []
        self.own_cap: list[np.ndarray] = []
        for f in self.flows:
            paths, mat, mask, ocap = fabric.pair(f.src, f.dst)
            self.cands.append(paths)
            self.cand_mat.append(mat)
            self.own_mask.append(mask)
            self.own_cap.append(ocap)
        self.cand_links = [list(m) for m in self.cand_mat]
        self.common = [set(m[0][~mask[0]].tolist()) for m, mask in zip(self.cand_mat,
                                                                      self.own_mask,
                                                                      strict=True)]
        self._own: dict[tuple[int, int], np.ndarray] = {}
        jobs = list(dict.fromkeys(f.job for f in self.flows))
        self.job_names = jobs
        jpos = {j: i for i, j in enumerate(jobs)}
        self.job_of = np.array([jpos[f.job] for f in self.flows], dtype=np.int64)
        self.pos = {f.id: i for i, f in enumerate(self.flows)}

    def own(self, i: int, k: int) -> np.ndarray:
        """Links of flow i's candidate k that not every candidate of the flow uses."""
        got = self._own.get((i, k))
        if got is None:
            got = self._own[(i, k)] = self.cand_mat[i][k][self.own_mask[i][k]]
        return got

    def choice_of(self, paths: Mapping[str, Sequence[str]] | None) -> list[int | None]:
        """Candidate index per flow for a routing (None where absent or not a candidate)."""
        out: list[int | None] = [None] * len(self.flows)
        if not paths:
            return out
        for i, f in enumerate(self.flows):
            p = paths.get(f.id)
            if p is None:
                continue
            try:
                out[i] = self.cands[i].index(tuple(p))
            except ValueError:
                out[i] = None
        return out

    def paths_of(self, choice: Sequence[int]) -> dict[str, tuple[str, ...]]:
        return {f.id: self.cands[i][c] for i, (f, c) in enumerate(zip(self.flows, choice,
                                                                       strict=True))}

    def rates(self, flows: Sequence[int], choice: Sequence[int | None]) -> np.ndarray:
        """Max-min rates of `flows` (indices) on their chosen candidates."""
        return fill(self.cap, [self.cand_links[i][choice[i]] for i in flows])  # type: ignore[index]

    def key(self, flows: Sequence[int], rates: np.ndarray) -> tuple:
        """Metric key of the routed `flows` with their `rates` (larger is better)."""
        fl = np.asarray(flows, dtype=np.int64)
        jb = np.full(len(self.job_names), np.inf)
        np.minimum.at(jb, self.job_of[fl], rates)
        jb = jb[np.isfinite(jb)]
        return (tuple(np.round(np.sort(jb), RATE_DECIMALS).tolist()),
                tuple(np.round(np.sort(rates), RATE_DECIMALS).tolist()))

    def full_key(self, choice: Sequence[int]) -> tuple:
        allf = range(len(self.flows))
        return self.key(list(allf), self.rates(list(allf), choice))

    def upper_key(self) -> tuple:
        """Metric key no routing can beat: max-min rates with only the links every
        candidate of a flow uses (its host links), i.e. a network core of infinite capacity."""
        allf = list(range(len(self.flows)))
        links = [np.array(sorted(c), dtype=np.int64) for c in self.common]
        return self.key(allf, fill(self.cap, links))

    def loads(self, choice: Sequence[int | None]) -> np.ndarray:
        """Number of flows on every link."""
        load = np.zeros(len(self.cap), dtype=np.int64)
        for i, c in enumerate(choice):
            if c is not None:
                np.add.at(load, self.cand_links[i][c], 1)
        return load
