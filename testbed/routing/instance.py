"""A routing problem compiled for speed: link indices, candidate paths, fast metric keys."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from itertools import count, islice, repeat
from typing import NamedTuple, overload

import networkx as nx
import numpy as np

from testbed.errors import InputError
from testbed.routing.flows import Flow
from testbed.routing.maxmin import LinkIndex, fill, fill_pairs
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


class SpinePaths(Sequence[tuple[str, ...]]):
    """The candidate paths src-leaf-spine-leaf-dst of one host pair on a 2-layer Clos, one
    per spine (in spine order), made into tuples only when asked for (a routing needs one
    path per flow, not all of them)."""

    __slots__ = ("dst", "la", "lb", "spines", "src")

    def __init__(self, src: str, la: str, spines: list[str], lb: str, dst: str) -> None:
        self.src, self.la, self.spines, self.lb, self.dst = src, la, spines, lb, dst

    def __len__(self) -> int:
        return len(self.spines)

    @overload
    def __getitem__(self, k: int) -> tuple[str, ...]: ...

    @overload
    def __getitem__(self, k: slice) -> list[tuple[str, ...]]: ...

    def __getitem__(self, k: int | slice) -> tuple[str, ...] | list[tuple[str, ...]]:
        if isinstance(k, slice):
            return [self[i] for i in range(len(self))[k]]
        return (self.src, self.la, self.spines[k], self.lb, self.dst)

    def index(self, value: object, start: int = 0, stop: int | None = None) -> int:
        p = tuple(value) if isinstance(value, Iterable) else ()
        if len(p) == 5 and (p[0], p[1], p[3], p[4]) == (self.src, self.la, self.lb, self.dst):
            k = self.spines.index(p[2]) if p[2] in self.spines else -1
            if k >= 0 and start <= k and (stop is None or k < stop):
                return k
        raise ValueError(f"{value!r} is not a candidate path")

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence) and not isinstance(other, str):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"SpinePaths({list(self)!r})"


# Own-link mask of k > 1 candidates src-leaf-spine-leaf-dst: the two spine links.
_SPINE_OWN = np.array([False, True, True, False])
_NO_COLS = np.zeros(0, dtype=np.int64)
_NO_COLS.flags.writeable = False
_SPINE_COLS = np.flatnonzero(_SPINE_OWN)
_SPINE_COLS.flags.writeable = False


class Pair(NamedTuple):
    """One host pair's candidates, compiled (see `Fabric.pair`)."""

    paths: Sequence[tuple[str, ...]]
    mat: np.ndarray
    mask: np.ndarray
    cols: np.ndarray
    ocap: np.ndarray
    ocap_max: float


class _SpineCache:
    """Fast candidate paths (and their link indices) on a 2-layer Clos: hosts on one leaf,
    leaves under spines. Per leaf, the up- and down-link index to every spine (-1: none),
    as two (leaves x spines) arrays; per leaf pair, what all its host pairs share (spines,
    spine links, capacities)."""

    def __init__(self, graph: nx.DiGraph, idx: LinkIndex, cap: np.ndarray) -> None:
        self.g = graph
        self.idx = idx
        self.cap = cap
        self.role: dict[str, str | None] = {n: d.get("role") for n, d in graph._node.items()}
        self.spines = sorted((n for n, r in self.role.items() if r == SPINE), key=_natural)
        self.leaves = [n for n, r in self.role.items() if r == LEAF]
        self.leaf_no = {leaf: i for i, leaf in enumerate(self.leaves)}
        # (leaf a, leaf b) -> a Pair with the host-link columns (0 and 3) still 0, or None
        # where no spine joins them
        self.leaf_pairs: dict[tuple[str, str], Pair | None] = {}
        self._masks: dict[int, np.ndarray] = {}  # read-only, shared by every pair
        # host -> its leaf's number (-1: not one leaf's host) and the host's link to (up)
        # or from (down) it
        self._up_no: dict[str, int] = {}
        self._up_link: dict[str, int] = {}
        self._down_no: dict[str, int] = {}
        self._down_link: dict[str, int] = {}
        # leaf -> how many of its first successors are the spines in order (see _rows)
        self._lead: dict[str, int] = {}
        self._to_hosts: dict[str, dict[str, int]] = {}  # leaf -> {successor: link} after them

    def _rows(self, nodes: list[str], targets: list[str]) -> np.ndarray:
        """(nodes x targets): link index node -> target, -1 where there is none. A node
        whose successors begin with every target in order (as `clos()` builds them) gives
        a run of consecutive indices without a lookup."""
        adj, offset, out = self.g._adj, self.idx.offset, self.idx.out_links
        n_t = len(targets)
        arr = np.array([offset[u] for u in nodes], dtype=np.int64)[:, None] \
            + np.arange(n_t, dtype=np.int64)
        for r, u in enumerate(nodes):
            if list(islice(adj[u], n_t)) == targets:
                self._lead[u] = n_t
            else:
                arr[r] = list(map(out(u).get, targets, repeat(-1)))
        return arr

    @cached_property
    def up(self) -> np.ndarray:
        """(leaves x spines): link index leaf -> spine, -1 where there is none."""
        return self._rows(self.leaves, self.spines)

    @cached_property
    def down(self) -> np.ndarray:
        """(leaves x spines): link index spine -> leaf, -1 where there is none."""
        return np.ascontiguousarray(self._rows(self.spines, self.leaves).T)

    @cached_property
    def whole(self) -> tuple[list[bool], list[bool]]:
        """Per leaf: a link up to every spine; a link down from every spine."""
        if not self.spines:
            return [False] * len(self.leaves), [False] * len(self.leaves)
        return (self.up >= 0).all(axis=1).tolist(), (self.down >= 0).all(axis=1).tolist()

    @cached_property
    def lists(self) -> tuple[list[list[int]], list[list[int]], list[list[float]],
                             list[list[float]]]:
        """`up` and `down` as lists of rows, and their links' capacities (nan: no link)."""
        cap = np.append(self.cap, np.nan)  # index -1: no link
        return (self.up.tolist(), self.down.tolist(), cap[self.up].tolist(),
                cap[self.down].tolist())

    def _leaf_pair(self, la: str, lb: str) -> Pair | None:
        key = (la, lb)
        if key in self.leaf_pairs:
            return self.leaf_pairs[key]
        a, b = self.leaf_no[la], self.leaf_no[lb]
        u, d = self.up[a], self.down[b]
        if self.whole[0][a] and self.whole[1][b]:  # every spine joins them
            names, uu, dd = self.spines, u, d
        else:
            sel = np.flatnonzero((u >= 0) & (d >= 0))
            names, uu, dd = [self.spines[k] for k in sel.tolist()], u[sel], d[sel]
        got: Pair | None = None
        if len(names):
            n = len(names)
            tmpl = np.zeros((n, 4), dtype=np.int64)
            tmpl[:, 1], tmpl[:, 2] = uu, dd
            if n > 1:  # distinct spines: the spine links are each candidate's own
                mask = self.spine_mask(n)
                ocap = np.minimum(self.cap[uu], self.cap[dd])
            else:
                mask = np.zeros((1, 4), dtype=bool)
                ocap = np.full(1, np.inf)
            got = Pair(names, tmpl, mask, np.flatnonzero(mask[0]), ocap, float(ocap.max()))
        self.leaf_pairs[key] = got
        return got

    def spine_mask(self, n: int) -> np.ndarray:
        """The own-link mask of n > 1 candidates through one spine each (read-only, shared)."""
        mask = self._masks.get(n)
        if mask is None:
            mask = self._masks[n] = np.broadcast_to(_SPINE_OWN, (n, 4))
        return mask

    def host_up(self, h: str) -> tuple[str, int] | None:
        """A host's leaf and its link to it; None unless h is a host with one uplink to a
        leaf."""
        no, link = self.resolve([h], [])[:2]
        return None if no[0] < 0 else (self.leaves[no[0]], link[0])

    def host_down(self, h: str) -> tuple[str, int] | None:
        """A host's leaf and the leaf's link to it; None unless h is a host with one
        downlink from a leaf."""
        no, link = self.resolve([], [h])[2:]
        return None if no[0] < 0 else (self.leaves[no[0]], link[0])

    def resolve(self, srcs: Sequence[str], dsts: Sequence[str]
                ) -> tuple[list[int], list[int], list[int], list[int]]:
        """`host_up` of every source and `host_down` of every destination as leaf numbers
        (-1: none) and links. Looked up together when every host has one neighbour that
        way, a leaf (a Clos as `clos()` builds it: C-level maps, nothing stored per
        host), else one by one (remembered)."""
        up = self._bulk(srcs, True)
        down = self._bulk(dsts, False)
        if up is None:
            up_no, up_link = self._up_no, self._up_link
            for h in srcs:
                if h not in up_no:
                    up_no[h], up_link[h] = self._one(h, True)
            up = list(map(up_no.__getitem__, srcs)), list(map(up_link.__getitem__, srcs))
        if down is None:
            down_no, down_link = self._down_no, self._down_link
            for h in dsts:
                if h not in down_no:
                    down_no[h], down_link[h] = self._one(h, False)
            down = (list(map(down_no.__getitem__, dsts)),
                    list(map(down_link.__getitem__, dsts)))
        return up[0], up[1], down[0], down[1]

    def _bulk(self, hosts: Sequence[str], up: bool) -> tuple[list[int], list[int]] | None:
        """`_one` for many hosts at once, if every one is a host with one neighbour that
        way, a leaf; None otherwise."""
        if not hosts:
            return [], []
        role = self.role
        nbrs = list(map((self.g._succ if up else self.g._pred).get, hosts))
        if None in nbrs or set(map(len, nbrs)) != {1} or set(map(role.get, hosts)) != {HOST}:
            return None
        leaves = list(map(next, map(iter, nbrs)))
        if set(map(role.get, leaves)) != {LEAF}:
            return None
        if up:  # the host's only out-link
            links = list(map(self.idx.offset.__getitem__, hosts))
        else:  # the leaf's link to the host
            outs = {leaf: self._leaf_out(leaf) for leaf in dict.fromkeys(leaves)}
            links = list(map(dict.__getitem__, map(outs.__getitem__, leaves), hosts))
        return list(map(self.leaf_no.__getitem__, leaves)), links

    def _one(self, h: str, up: bool) -> tuple[int, int]:
        """(leaf number, link) of host h's one link up to (or down from) a leaf; (-1, -1)
        unless h is a host with exactly one neighbour that way, a leaf."""
        nbrs = (self.g._succ if up else self.g._pred).get(h)
        if nbrs is not None and len(nbrs) == 1 and self.role.get(h) == HOST:
            for leaf in nbrs:
                if self.role.get(leaf) == LEAF:
                    return self.leaf_no[leaf], (self.idx.offset[h] if up
                                                else self._leaf_out(leaf)[h])
        return -1, -1

    def _leaf_out(self, leaf: str) -> dict[str, int]:
        """Successor -> link index of a leaf's out-links, skipping the leading run of
        spines found by `_rows` (the hosts' links are what is looked up here)."""
        got = self._to_hosts.get(leaf)
        if got is None:
            skip = self._lead.get(leaf, 0)
            got = self._to_hosts[leaf] = dict(zip(islice(self.g._adj[leaf], skip, None),
                                                  count(self.idx.offset[leaf] + skip)))
        return got

    def pair(self, src: str, dst: str) -> Pair | None:
        """The pair's candidates through one spine each, None if the fabric is not a
        2-layer Clos around them."""
        up, down = self.host_up(src), self.host_down(dst)
        if up is None or down is None or src == dst:
            return None
        (la, hu), (lb, hd) = up, down
        if la == lb:  # hosts on one leaf: one path, no own links
            return Pair([(src, la, dst)], np.array([[hu, hd]], dtype=np.int64),
                        np.zeros((1, 2), dtype=bool), _NO_COLS, np.full(1, np.inf), np.inf)
        lp = self._leaf_pair(la, lb)
        if lp is None:
            return None
        mat = lp.mat.copy()
        mat[:, 0], mat[:, 3] = hu, hd
        return lp._replace(paths=SpinePaths(src, la, lp.paths, lb, dst), mat=mat)  # type: ignore[arg-type]


def _natural(name: str) -> tuple[str, int]:
    head = name.rstrip("0123456789")
    tail = name[len(head):]
    return head, int(tail) if tail else -1


@dataclass
class Compiled:
    """Candidates of a list of flows (see `Fabric.compile`): per flow what a `Pair` holds;
    `batch` = (flow positions, their source and destination leaves' numbers, their link
    matrices stacked: flows x candidates x hops) for the flows between leaves that reach
    every spine, compiled together; `part` = (flow positions, each one's first row in
    `rows`, rows: every candidate of those flows, one after the other) for the flows
    between leaves that miss some spine, compiled together too; `tables`: greedy's list
    tables (see `Instance.own_lists`) of those flows. `n_cands`: candidates per flow.

    Compiled with `lazy`, the batch flows' entries of `paths`, `mat`, `mask`, `cols` and
    `ocap` stay None until `materialize()` (a from-scratch greedy reads the batch arrays
    and never needs them); `ocap_max` and `n_cands` are always complete."""

    paths: list[Sequence[tuple[str, ...]]]
    mat: list[np.ndarray]
    mask: list[np.ndarray]
    cols: list[np.ndarray]
    ocap: list[np.ndarray]
    ocap_max: list[float]
    batch: tuple[list[int], list[int], list[int], np.ndarray] | None = None
    part: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
    tables: dict[int, tuple[list[list[int]], list[list[float]]]] | None = None
    n_cands: list[int] = field(default_factory=list)
    # batch flows: their host links (up from the source, down to the destination) and
    # candidates' least own-link capacities (flows x spines), the flows and the spines
    batch_hosts: tuple[list[int], list[int]] | None = None
    batch_ocap: np.ndarray | None = None
    batch_mask: np.ndarray | None = None
    flows: Sequence[Flow] = ()
    spines: list[str] = field(default_factory=list)
    leaves: list[str] = field(default_factory=list)
    lazy: bool = False

    def materialize(self) -> Compiled:
        """Fill in the batch flows' per-flow entries (views of the batch arrays)."""
        if self.lazy and self.batch is not None and self.batch_ocap is not None:
            rows, src_leaf, dst_leaf, mat = self.batch
            n_sp = mat.shape[1]
            mask = self.batch_mask if self.batch_mask is not None else \
                np.broadcast_to(_SPINE_OWN, (n_sp, 4))
            cols, spines, leaves, flows = _SPINE_COLS, self.spines, self.leaves, self.flows
            for i, a, b, m, oc in zip(rows, src_leaf, dst_leaf, mat, self.batch_ocap,
                                      strict=True):
                f = flows[i]
                self.paths[i] = SpinePaths(f.src, leaves[a], spines, leaves[b], f.dst)
                self.mat[i], self.mask[i], self.cols[i], self.ocap[i] = m, mask, cols, oc
        self.lazy = False
        return self


class Fabric:
    """A fabric compiled once: link indices and capacities, and per host pair its candidate
    paths with their link indices. Keep one while the graph does not change (a controller
    between job events) and pass it to `route(..., fabric=)`; rebuild after a failure."""

    def __init__(self, graph: nx.DiGraph) -> None:
        self.graph = graph
        self.idx = LinkIndex(graph)
        self.cap = self.idx.capacity_gbps
        self._spines = _SpineCache(graph, self.idx, self.cap)
        self._cols: dict[bytes, np.ndarray] = {}
        self._pairs: dict[tuple[str, str], Pair] = {}

    def pair(self, src: str, dst: str) -> Pair:
        """Candidate paths, their link matrix (candidates x hops), the own-link mask (links
        not on every candidate; the same in every row), its columns, each candidate's least
        own-link capacity (inf without own links) and the largest of those."""
        got = self._pairs.get((src, dst))
        if got is None:
            got = self._spines.pair(src, dst)
            if got is None:
                got = self._generic(src, dst)
            self._pairs[(src, dst)] = got
        return got

    def compile(self, flows: Sequence[Flow], lazy: bool = False) -> Compiled:
        """Every flow's candidates at once, as `pair` gives them one by one. On a 2-layer
        Clos, the flows between two leaves that reach every spine are compiled together
        (one gather from the leaves' spine-link arrays), and so are those between leaves
        that miss some spine (one mask of the spines joining each pair); the others
        (hosts on one leaf, leaves no spine joins, other fabrics) go through `pair`.
        `lazy`: the batch flows' per-flow entries are left to `Compiled.materialize`."""
        sc = self._spines
        n, n_sp = len(flows), len(sc.spines)
        out = Compiled([None] * n, [None] * n, [None] * n, [None] * n, [None] * n,  # type: ignore[list-item]
                       [0.0] * n, n_cands=[0] * n, flows=flows, spines=sc.spines,
                       leaves=sc.leaves, lazy=lazy)
        rows: list[int] = []
        src_leaf: list[int] = []
        dst_leaf: list[int] = []
        hu_l: list[int] = []
        hd_l: list[int] = []
        part: list[int] = []
        pab: list[tuple[int, int, int, int]] = []
        pleaves: list[tuple[str, str]] = []
        n_cands = out.n_cands
        rest: Sequence[int] = range(n)
        if n_sp > 1 and n:
            whole_up, whole_down = sc.whole
            up_rows, down_rows = sc.lists[0], sc.lists[1]
            up_no, up_link, down_no, down_link = sc.resolve([f.src for f in flows],
                                                            [f.dst for f in flows])
            leaves = sc.leaves
            # the flows between two leaves that reach every spine, found at once
            a_all, b_all = np.array(up_no), np.array(down_no)
            ok = (a_all >= 0) & (b_all >= 0) & (a_all != b_all)  # (not on one leaf)
            wu, wd = np.array([*whole_up, False]), np.array([*whole_down, False])
            batch = ok & wu[a_all] & wd[b_all]  # (index -1: the False appended)
            sel = np.flatnonzero(batch)
            if sel.size:
                rows = sel.tolist()
                src_leaf, dst_leaf = a_all[sel].tolist(), b_all[sel].tolist()
                hu_l = np.array(up_link)[sel].tolist()
                hd_l = np.array(down_link)[sel].tolist()
                for i in rows:
                    n_cands[i] = n_sp
            rest = np.flatnonzero(~batch).tolist()
            for i in np.flatnonzero(ok & ~batch).tolist():
                a, b = up_no[i], down_no[i]
                if any(x >= 0 and y >= 0 for x, y in zip(up_rows[a], down_rows[b],
                                                        strict=True)):
                    part.append(i)
                    pab.append((a, b, up_link[i], down_link[i]))
                    pleaves.append((leaves[a], leaves[b]))
            if part:
                done = set(part)
                rest = [i for i in rest if i not in done]
        for i in rest:
            f = flows[i]
            pr = self.pair(f.src, f.dst)
            out.paths[i], out.mat[i], out.mask[i] = pr.paths, pr.mat, pr.mask
            out.cols[i], out.ocap[i], out.ocap_max[i] = pr.cols, pr.ocap, pr.ocap_max
            n_cands[i] = len(pr.mat)
        if rows:
            a_arr, b_arr = np.array(src_leaf, dtype=np.int64), np.array(dst_leaf, dtype=np.int64)
            up_l, down_l = sc.up[a_arr], sc.down[b_arr]
            mat = np.empty((len(rows), n_sp, 4), dtype=np.int64)
            mat[:, :, 0] = np.array(hu_l, dtype=np.int64)[:, None]
            mat[:, :, 1] = up_l
            mat[:, :, 2] = down_l
            mat[:, :, 3] = np.array(hd_l, dtype=np.int64)[:, None]
            mat.flags.writeable = False
            ocap = np.minimum(self.cap[up_l], self.cap[down_l])
            ocap_max = out.ocap_max
            for i, top in zip(rows, ocap.max(axis=1).tolist(), strict=True):
                ocap_max[i] = top
            out.batch = (rows, src_leaf, dst_leaf, mat)
            out.batch_hosts, out.batch_ocap = (hu_l, hd_l), ocap
            out.batch_mask = sc.spine_mask(n_sp)
            if not lazy:
                out.lazy = True
                out.materialize()
        if part:
            self._compile_part(flows, out, part, pab, pleaves)
        return out

    def _compile_part(self, flows: Sequence[Flow], out: Compiled, part: list[int],
                      pab: list[tuple[int, int, int, int]],
                      pleaves: list[tuple[str, str]]) -> None:
        """`compile` for flows between leaves that miss some spine: per flow, the spines
        with a link up from its source leaf and down to its destination leaf, in order."""
        sc = self._spines
        arr = np.array(pab, dtype=np.int64)
        up_l, down_l = sc.up[arr[:, 0]], sc.down[arr[:, 1]]
        joined = (up_l >= 0) & (down_l >= 0)
        fi, si = np.nonzero(joined)  # by flow, then spine: each flow's candidates in order
        uu, dd = up_l[fi, si], down_l[fi, si]
        mat = np.empty((len(fi), 4), dtype=np.int64)
        mat[:, 0], mat[:, 1], mat[:, 2], mat[:, 3] = arr[fi, 2], uu, dd, arr[fi, 3]
        mat.flags.writeable = False
        cu, cd = self.cap[uu], self.cap[dd]
        ocap = np.minimum(cu, cd)
        counts = joined.sum(axis=1)
        starts = np.zeros(len(part) + 1, dtype=np.int64)
        np.cumsum(counts, out=starts[1:])
        tops = np.maximum.reduceat(ocap, starts[:-1]).tolist()
        bounds, spine_no = starts.tolist(), si.tolist()
        up_v, down_v, cu_v, cd_v = uu.tolist(), dd.tolist(), cu.tolist(), cd.tolist()
        spines, tables = sc.spines, {}
        one_mask = np.zeros((1, 4), dtype=bool)
        one_mask.flags.writeable = False
        for j, i in enumerate(part):
            a, b = bounds[j], bounds[j + 1]
            f, (la, lb) = flows[i], pleaves[j]
            out.paths[i] = SpinePaths(f.src, la, [spines[k] for k in spine_no[a:b]], lb, f.dst)
            out.mat[i] = mat[a:b]
            if b - a > 1:
                mask = sc.spine_mask(b - a)
                out.mask[i], out.cols[i], out.ocap[i], out.ocap_max[i] = \
                    mask, _SPINE_COLS, ocap[a:b], tops[j]
                tables[i] = ([up_v[a:b], down_v[a:b]], [cu_v[a:b], cd_v[a:b]])
            else:  # one spine: no own links
                out.mask[i], out.cols[i], out.ocap[i], out.ocap_max[i] = \
                    one_mask, _NO_COLS, np.full(1, np.inf), np.inf
        out.part = (np.array(part, dtype=np.int64), starts[:-1], mat)
        out.tables = tables
        for j, i in enumerate(part):
            out.n_cands[i] = bounds[j + 1] - bounds[j]

    def _generic(self, src: str, dst: str) -> Pair:
        paths = candidate_paths(self.graph, src, dst)
        mat = np.array([self.idx.links_of(p) for p in paths], dtype=np.int64)
        # all candidates are shortest paths: a link every candidate uses sits at one hop
        mask = ~(mat == mat[0]).all(axis=0)[None, :].repeat(len(mat), axis=0)
        ocap = np.where(mask, self.cap[mat], np.inf).min(axis=1)
        cols = self._cols.get(mask[0].tobytes())
        if cols is None:
            cols = self._cols[mask[0].tobytes()] = np.flatnonzero(mask[0])
        return Pair(paths, mat, mask, cols, ocap, float(ocap.max()))


class Instance:
    """Graph + flows with numbered links, candidate paths per flow and job indices.

    cands[i]: flow i's candidate paths; cand_mat[i]: (candidates, hops) link indices, row
    k candidate k (cand_links is the same list: cand_links[i][k] is one row; read-only);
    own_mask[i]: links not on every candidate; own_cols[i]: their columns; own_cap[i]:
    their least capacity per candidate, own_cap_max[i] its largest; n_cands[i]: how many
    candidates. The per-flow arrays of flows compiled in a batch are made on first use of
    these lists (a from-scratch greedy reads the batch arrays instead)."""

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
        comp = self._comp = fabric.compile(self.flows, lazy=True)
        self.own_cap_max, self.n_cands = comp.ocap_max, comp.n_cands
        self._batch, self._part, self._tables = comp.batch, comp.part, comp.tables or {}
        self._own: dict[tuple[int, int], np.ndarray] = {}
        self.pos = dict(zip(ids, range(len(ids)), strict=True))

    @cached_property
    def job_names(self) -> list[str]:
        return list(dict.fromkeys(f.job for f in self.flows))

    @cached_property
    def job_of(self) -> np.ndarray:
        """Per flow, its job's position in `job_names`."""
        jpos = {j: i for i, j in enumerate(self.job_names)}
        return np.array([jpos[f.job] for f in self.flows], dtype=np.int64)

    @cached_property
    def cands(self) -> list[Sequence[tuple[str, ...]]]:
        return self._comp.materialize().paths

    @cached_property
    def cand_mat(self) -> list[np.ndarray]:
        return self._comp.materialize().mat

    @property
    def cand_links(self) -> list[np.ndarray]:
        return self.cand_mat

    @cached_property
    def own_mask(self) -> list[np.ndarray]:
        return self._comp.materialize().mask

    @cached_property
    def own_cols(self) -> list[np.ndarray]:
        return self._comp.materialize().cols

    @cached_property
    def own_cap(self) -> list[np.ndarray]:
        return self._comp.materialize().ocap

    @cached_property
    def own_lists(self) -> tuple[list[list[list[int]]], list[list[list[float]]]]:
        """Greedy's tables as Python lists: per flow, its own links by column
        (`[i][c][k]`: own column c's link on candidate k) and their capacities (same
        shape). Flows compiled in a batch share their leaves' rows."""
        links, caps, _ = self.rest_tables
        links, caps = list(links), list(caps)
        if self._batch is not None:
            rows, src_leaf, dst_leaf, _ = self._batch
            up, down, cap_up, cap_down = self.fabric._spines.lists
            for i, a, b in zip(rows, src_leaf, dst_leaf, strict=True):
                links[i], caps[i] = [up[a], down[b]], [cap_up[a], cap_down[b]]
        return links, caps

    @cached_property
    def common_lists(self) -> list[list[int]]:
        """Per flow, the links every candidate uses, as a list (a candidate's links are
        these and its own links: greedy's load update)."""
        out = list(self.rest_tables[2])
        if self._batch is not None and self._comp.batch_hosts is not None:
            for i, hu, hd in zip(self._batch[0], *self._comp.batch_hosts, strict=True):
                out[i] = [hu, hd]
        return out

    @cached_property
    def rest_tables(self) -> tuple[list[list[list[int]]], list[list[list[float]]],
                                   list[list[int]]]:
        """`own_lists` and `common_lists` of the flows not compiled in a batch (empty
        lists for those: greedy reads their leaves' rows, `batch_of`)."""
        n = len(self.flows)
        links: list[list[list[int]]] = [[]] * n
        caps: list[list[list[float]]] = [[]] * n
        common: list[list[int]] = [[]] * n
        skip = [False] * n
        if self._batch is not None:
            for i in self._batch[0]:
                skip[i] = True
        for i, (lk, cp) in self._tables.items():
            links[i], caps[i] = lk, cp
        comp, n_cands, tables = self._comp, self.n_cands, self._tables
        for i in range(n):
            if skip[i]:
                continue
            mat, mask = comp.mat[i], comp.mask[i]  # (not a batch flow: compiled)
            common[i] = mat[0][~mask[0]].tolist()
            if n_cands[i] > 1 and i not in tables:  # one candidate: nothing to choose
                own = mat[:, comp.cols[i]].T
                links[i], caps[i] = own.tolist(), self.cap[own].tolist()
        return links, caps, common

    @cached_property
    def batch_of(self) -> tuple[list[int], list[int], list[int], list[int]]:
        """Per flow compiled in a batch: its source leaf's and destination leaf's numbers
        (rows of the leaves' tables `Fabric._spines.lists`) and its host links up and
        down; -1 for the other flows."""
        n = len(self.flows)
        sa, sb, hu, hd = [-1] * n, [-1] * n, [-1] * n, [-1] * n
        if self._batch is not None and self._comp.batch_hosts is not None:
            rows, src_leaf, dst_leaf, _ = self._batch
            ups, downs = self._comp.batch_hosts
            for i, a, b, u, d in zip(rows, src_leaf, dst_leaf, ups, downs, strict=True):
                sa[i], sb[i], hu[i], hd[i] = a, b, u, d
        return sa, sb, hu, hd

    @cached_property
    def common(self) -> list[set[int]]:
        """Per flow, the links every candidate uses (its host links on a Clos)."""
        return [set(c) for c in self.common_lists]

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
        comp = self._comp
        if not comp.lazy or comp.batch is None:
            return {f.id: self.cands[i][c] for i, (f, c) in enumerate(zip(
                self.flows, choice, strict=True))}
        # batch flows' paths straight from their leaves (their lists are not made)
        got: list[tuple[str, ...] | None] = [None] * len(self.flows)
        rows, src_leaf, dst_leaf, _ = comp.batch
        spines, leaves, flows = comp.spines, comp.leaves, self.flows
        for i, a, b in zip(rows, src_leaf, dst_leaf, strict=True):
            f = flows[i]
            got[i] = (f.src, leaves[a], spines[choice[i]], leaves[b], f.dst)
        paths = comp.paths  # (the other flows' entries are compiled)
        return {f.id: (p if p is not None else paths[i][choice[i]])
                for i, (f, p) in enumerate(zip(flows, got, strict=True))}

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

    def rates_all(self, choice: Sequence[int]) -> np.ndarray:
        """Max-min rates of every flow on its chosen candidate: `rates(all flows, choice)`,
        the batch-compiled flows' links gathered in one step (the filling does not depend
        on the order of the (flow, link) pairs, so the rates are the same to the bit)."""
        n = len(self.flows)
        if self._batch is None and self._part is None:
            return self.rates(list(range(n)), choice)
        owner, links = self._gather(choice)
        return fill_pairs(self.cap, owner, links, n)

    def _gather(self, choice: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """(flow, link) pairs of every flow's chosen candidate, in no particular order."""
        n = len(self.flows)
        ch = np.array(choice, dtype=np.int64)
        links: list[np.ndarray] = []
        owner: list[np.ndarray] = []
        rest = np.ones(n, dtype=bool)
        if self._batch is not None:
            rows, _, _, mat = self._batch
            pos = np.array(rows, dtype=np.int64)
            links.append(mat[np.arange(len(rows)), ch[pos]].ravel())
            owner.append(np.repeat(pos, mat.shape[2]))
            rest[pos] = False
        if self._part is not None:
            pos, first, pmat = self._part
            links.append(pmat[first + ch[pos]].ravel())
            owner.append(np.repeat(pos, pmat.shape[1]))
            rest[pos] = False
        if rest.any():
            mats = self._comp.mat  # (the rest are not batch flows: compiled)
            for i in np.flatnonzero(rest).tolist():
                row = mats[i][choice[i]]
                links.append(row)
                owner.append(np.full(len(row), i, dtype=np.int64))
        if not links:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        return np.concatenate(owner), np.concatenate(links)

    def unbeatable(self, choice: Sequence[int]) -> bool:
        """True when no routing of these flows has a better metric key than `choice`, by a
        test cheaper than one filling. It holds when the links every candidate of a flow
        uses (its host links) have the same least capacity U for every flow, and on
        `choice` every link l with load_l flows has capacity_l / load_l >= U. Then
        progressive filling ends in its first step, every flow at exactly U, while in any
        routing a flow's rate is at most U (its own host link caps it): every rate, every
        job's bottleneck, and so both sorted and rounded vectors of the key are at most
        those of `choice`. U must also lie far from a rounding boundary of the key's
        RATE_DECIMALS (float noise in another routing's filling, at most a few ulps per
        round, cannot then round above U)."""
        n = len(self.flows)
        if n == 0:
            return False
        links = self._gather(choice)[1]
        if not len(links):
            return False
        cap = self.cap
        load = np.bincount(links, minlength=len(cap))
        with np.errstate(divide="ignore", invalid="ignore"):  # (unused links: inf, or nan
            u = float((cap / load).min())  # for no capacity: then no shortcut) the
        if not (0.0 < u < 1e4):  # filling's first step, to the bit
            return False
        # another routing's filling runs at most n rounds, each off by a few ulps of U
        scaled = u * 10.0 ** RATE_DECIMALS
        margin = max(1e-3, 8.0 * n * float(np.finfo(float).eps) * scaled)
        if abs(scaled - np.floor(scaled) - 0.5) <= margin:
            return False
        c_owner, c_link = self._common_pairs
        c_cap = cap[c_link]
        if not len(c_cap) or float(c_cap.min()) < u:
            return False
        return bool(np.bincount(c_owner[c_cap == u], minlength=n).all())

    @cached_property
    def _common_pairs(self) -> tuple[np.ndarray, np.ndarray]:
        """(flow, link) pairs of every flow's links common to all its candidates."""
        owner: list[int] = []
        links: list[int] = []
        skip = np.zeros(len(self.flows), dtype=bool)
        parts_o: list[np.ndarray] = []
        parts_l: list[np.ndarray] = []
        if self._batch is not None and self._comp.batch_hosts is not None:
            rows = np.array(self._batch[0], dtype=np.int64)  # their host links, at once
            parts_o += [rows, rows]
            parts_l += [np.array(h, dtype=np.int64) for h in self._comp.batch_hosts]
            skip[rows] = True
        common = None
        for i in np.flatnonzero(~skip).tolist():
            if common is None:
                common = self.common_lists
            c = common[i]
            owner.extend([i] * len(c))
            links.extend(c)
        parts_o.append(np.array(owner, dtype=np.int64))
        parts_l.append(np.array(links, dtype=np.int64))
        return np.concatenate(parts_o), np.concatenate(parts_l)

    def full_key(self, choice: Sequence[int]) -> tuple:
        return self.key(list(range(len(self.flows))), self.rates_all(choice))

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
