"""A routing problem compiled for speed: link indices, candidate paths, fast metric keys."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
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
        # host -> (its leaf, the host's link to or from it), None if not one leaf's host
        self._host_up: dict[str, tuple[str, int] | None] = {}
        self._host_down: dict[str, tuple[str, int] | None] = {}
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
        if h in self._host_up:
            return self._host_up[h]
        got = None
        nbrs = self.g._succ.get(h)
        if self.role.get(h) == HOST and nbrs is not None and len(nbrs) == 1:
            leaf = next(iter(nbrs))
            if self.role.get(leaf) == LEAF:
                got = (leaf, self.idx.offset[h])
        self._host_up[h] = got
        return got

    def host_down(self, h: str) -> tuple[str, int] | None:
        """A host's leaf and the leaf's link to it; None unless h is a host with one
        downlink from a leaf."""
        if h in self._host_down:
            return self._host_down[h]
        got = None
        nbrs = self.g._pred.get(h)
        if self.role.get(h) == HOST and nbrs is not None and len(nbrs) == 1:
            leaf = next(iter(nbrs))
            if self.role.get(leaf) == LEAF:
                got = (leaf, self._leaf_out(leaf)[h])
        self._host_down[h] = got
        return got

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
    tables (see `Instance.own_lists`) of those flows."""

    paths: list[Sequence[tuple[str, ...]]]
    mat: list[np.ndarray]
    mask: list[np.ndarray]
    cols: list[np.ndarray]
    ocap: list[np.ndarray]
    ocap_max: list[float]
    batch: tuple[list[int], list[int], list[int], np.ndarray] | None = None
    part: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
    tables: dict[int, tuple[list[list[int]], list[list[float]]]] | None = None


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

    def compile(self, flows: Sequence[Flow]) -> Compiled:
        """Every flow's candidates at once, as `pair` gives them one by one. On a 2-layer
        Clos, the flows between two leaves that reach every spine are compiled together
        (one gather from the leaves' spine-link arrays), and so are those between leaves
        that miss some spine (one mask of the spines joining each pair); the others
        (hosts on one leaf, leaves no spine joins, other fabrics) go through `pair`."""
        sc = self._spines
        n, n_sp = len(flows), len(sc.spines)
        out = Compiled([None] * n, [None] * n, [None] * n, [None] * n, [None] * n,  # type: ignore[list-item]
                       [0.0] * n)
        rows: list[int] = []
        ab: list[tuple[int, int, int, int]] = []
        part: list[int] = []
        pab: list[tuple[int, int, int, int]] = []
        pleaves: list[tuple[str, str]] = []
        if n_sp > 1:
            whole_up, whole_down = sc.whole
            leaf_no, spines = sc.leaf_no, sc.spines
            ups, downs, host_up, host_down = sc._host_up, sc._host_down, sc.host_up, sc.host_down
            up_rows, down_rows = sc.lists[0], sc.lists[1]
        for i, f in enumerate(flows):
            if n_sp > 1:
                src, dst = f.src, f.dst
                up = ups[src] if src in ups else host_up(src)
                down = downs[dst] if dst in downs else host_down(dst)
                if up is not None and down is not None and src != dst:
                    a, b = leaf_no[up[0]], leaf_no[down[0]]
                    if a != b and whole_up[a] and whole_down[b]:
                        rows.append(i)
                        ab.append((a, b, up[1], down[1]))
                        out.paths[i] = SpinePaths(src, up[0], spines, down[0], dst)
                        continue
                    if a != b and any(x >= 0 and y >= 0 for x, y in zip(
                            up_rows[a], down_rows[b], strict=True)):
                        part.append(i)
                        pab.append((a, b, up[1], down[1]))
                        pleaves.append((up[0], down[0]))
                        continue
            pr = self.pair(f.src, f.dst)
            out.paths[i], out.mat[i], out.mask[i] = pr.paths, pr.mat, pr.mask
            out.cols[i], out.ocap[i], out.ocap_max[i] = pr.cols, pr.ocap, pr.ocap_max
        if rows:
            arr = np.array(ab, dtype=np.int64)
            up_l, down_l = sc.up[arr[:, 0]], sc.down[arr[:, 1]]
            mat = np.empty((len(rows), n_sp, 4), dtype=np.int64)
            mat[:, :, 0] = arr[:, 2:3]
            mat[:, :, 1] = up_l
            mat[:, :, 2] = down_l
            mat[:, :, 3] = arr[:, 3:4]
            mat.flags.writeable = False
            ocap = np.minimum(self.cap[up_l], self.cap[down_l])
            mask = sc.spine_mask(n_sp)
            cols = np.flatnonzero(mask[0])
            for i, m, oc, top in zip(rows, mat, ocap, ocap.max(axis=1).tolist(), strict=True):
                out.mat[i], out.mask[i], out.cols[i], out.ocap[i], out.ocap_max[i] = \
                    m, mask, cols, oc, top
            out.batch = (rows, arr[:, 0].tolist(), arr[:, 1].tolist(), mat)
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
        # cands[i]: flow i's candidate paths; cand_mat[i]: (candidates, hops) link indices,
        # row k candidate k (cand_links is the same list: cand_links[i][k] is one row;
        # read-only); own_mask[i]: links not on every candidate; own_cols[i]: their
        # columns; own_cap[i]: their least capacity per candidate, own_cap_max[i] its largest
        comp = fabric.compile(self.flows)
        self.cands, self.cand_mat, self.own_mask = comp.paths, comp.mat, comp.mask
        self.own_cols, self.own_cap, self.own_cap_max = comp.cols, comp.ocap, comp.ocap_max
        self._batch, self._part, self._tables = comp.batch, comp.part, comp.tables or {}
        self.cand_links = self.cand_mat
        self._own: dict[tuple[int, int], np.ndarray] = {}
        jobs = list(dict.fromkeys(f.job for f in self.flows))
        self.job_names = jobs
        jpos = {j: i for i, j in enumerate(jobs)}
        self.job_of = np.array([jpos[f.job] for f in self.flows], dtype=np.int64)
        self.pos = {f.id: i for i, f in enumerate(self.flows)}

    @cached_property
    def own_lists(self) -> tuple[list[list[list[int]]], list[list[list[float]]]]:
        """Greedy's tables as Python lists: per flow, its own links by column
        (`[i][c][k]`: own column c's link on candidate k) and their capacities (same
        shape). Flows compiled in a batch share their leaves' rows."""
        n = len(self.flows)
        links: list[list[list[int]]] = [[]] * n
        caps: list[list[list[float]]] = [[]] * n
        done = [False] * n
        if self._batch is not None:
            rows, src_leaf, dst_leaf, _ = self._batch
            up, down, cap_up, cap_down = self.fabric._spines.lists
            for i, a, b in zip(rows, src_leaf, dst_leaf, strict=True):
                links[i], caps[i], done[i] = [up[a], down[b]], [cap_up[a], cap_down[b]], True
        for i, (lk, cp) in self._tables.items():
            links[i], caps[i], done[i] = lk, cp, True
        for i in range(n):
            if not done[i] and len(self.cand_mat[i]) > 1:  # one candidate: nothing to choose
                own = self.cand_mat[i][:, self.own_cols[i]].T
                links[i], caps[i] = own.tolist(), self.cap[own].tolist()
        return links, caps

    @cached_property
    def common(self) -> list[set[int]]:
        """Per flow, the links every candidate uses (its host links on a Clos)."""
        return [set(m[0][~mask[0]].tolist()) for m, mask in zip(self.cand_mat, self.own_mask,
                                                                strict=True)]

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

    def rates_all(self, choice: Sequence[int]) -> np.ndarray:
        """Max-min rates of every flow on its chosen candidate: `rates(all flows, choice)`,
        the batch-compiled flows' links gathered in one step (the filling does not depend
        on the order of the (flow, link) pairs, so the rates are the same to the bit)."""
        n = len(self.flows)
        if self._batch is None and self._part is None:
            return self.rates(list(range(n)), choice)
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
            for i in np.flatnonzero(rest).tolist():
                row = self.cand_links[i][choice[i]]
                links.append(row)
                owner.append(np.full(len(row), i, dtype=np.int64))
        return fill_pairs(self.cap, np.concatenate(owner), np.concatenate(links), n)

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
