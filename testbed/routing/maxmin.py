"""Max-min fair rates of unsplittable flows on fixed paths, by progressive filling (numpy)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import cached_property
from itertools import accumulate, chain, count, repeat

import networkx as nx
import numpy as np

from testbed.errors import InputError

_EPS = 1e-9


class LinkIndex:
    """Links of a digraph numbered 0..L-1 (graph.edges' order) with a capacity array (Gb/s).
    Link (u, v) is `offset[u]` + v's position among u's successors; `index` (a dict keyed by
    (u, v)) and `edges` are built on first use."""

    def __init__(self, graph: nx.DiGraph) -> None:
        self.graph = graph
        # read from networkx's adjacency dict (its views are ~4x slower)
        adj = graph._adj
        # (node u's links start after all links of the nodes before it; the running
        # sum has one value more than there are nodes: the total, left out)
        self.offset: dict[str, int] = dict(zip(adj, accumulate(map(len, adj.values()),
                                                               initial=0), strict=False))
        try:  # every link has a capacity (the fast path)
            caps = [d["capacity_gbps"] for nbrs in adj.values() for d in nbrs.values()]
            self.capacity_gbps = np.fromiter(caps, dtype=float, count=len(caps))
        except (KeyError, TypeError, ValueError):  # a missing one (or None) becomes nan
            attrs = chain.from_iterable(map(dict.values, adj.values()))
            self.capacity_gbps = np.array(list(map(dict.get, attrs, repeat(
                "capacity_gbps"))), dtype=float)
        self._out: dict[str, dict[str, int]] = {}

    @cached_property
    def edges(self) -> list[tuple[str, str]]:
        return [(u, v) for u, nbrs in self.graph._adj.items() for v in nbrs]

    @cached_property
    def index(self) -> dict[tuple[str, str], int]:
        return dict(zip(self.edges, count()))

    def out_links(self, u: str) -> dict[str, int]:
        """Successor -> link index of node u's out-links."""
        got = self._out.get(u)
        if got is None:
            got = self._out[u] = dict(zip(self.graph._adj[u], count(self.offset[u])))
        return got

    def links_of(self, path: Sequence[str]) -> np.ndarray:
        """Link indices along a node path; InputError if a hop is not a link."""
        try:
            return np.array([self.index[(path[i], path[i + 1])] for i in range(len(path) - 1)],
                            dtype=np.int64)
        except KeyError as exc:
            raise InputError("path", f"hop {exc.args[0][0]}-{exc.args[0][1]} is not a link "
                             "of the fabric") from None


def fill(capacity_gbps: np.ndarray, flow_links: Sequence[np.ndarray]) -> np.ndarray:
    """Progressive filling: all unfrozen flows grow at the same pace; a link that fills
    freezes its flows. Returns one rate per flow (Gb/s). A flow with no links gets inf."""
    n = len(flow_links)
    rates = np.full(n, np.inf)
    if n == 0:
        return rates
    lens = np.fromiter((len(x) for x in flow_links), dtype=np.int64, count=n)
    pair_link = np.concatenate(flow_links) if lens.sum() else np.zeros(0, dtype=np.int64)
    pair_flow = np.repeat(np.arange(n), lens)
    return _fill_pairs(capacity_gbps, pair_flow, pair_link, n, rates)


def fill_pairs(capacity_gbps: np.ndarray, pair_flow: np.ndarray, pair_link: np.ndarray,
               n: int) -> np.ndarray:
    """`fill` with the flows' links given as (flow, link) pairs in any order: flow
    pair_flow[j] uses link pair_link[j]. One rate per flow 0..n-1 (inf: no link)."""
    return _fill_pairs(capacity_gbps, pair_flow, pair_link, n, np.full(n, np.inf))


def _fill_pairs(cap: np.ndarray, pair_flow: np.ndarray, pair_link: np.ndarray, n: int,
                rates: np.ndarray) -> np.ndarray:
    # Only the links some flow crosses take part: renumbered 0..k-1 (a fabric's thousands
    # of links would otherwise be counted in every round; the same arithmetic per link).
    links, pair_link = np.unique(pair_link, return_inverse=True)
    cap = np.asarray(cap)[links]
    n_links = len(cap)
    rem = cap.astype(float).copy()
    active = np.zeros(n, dtype=bool)
    active[pair_flow] = True  # flows with no links keep rate inf
    level = 0.0
    pf, pl = pair_flow, pair_link
    while pf.size:
        counts = np.bincount(pl, minlength=n_links)
        used = counts > 0
        share = np.full(n_links, np.inf)
        share[used] = rem[used] / counts[used]
        step = float(share.min())
        level += step
        rem[used] -= step * counts[used]
        full = used & (rem <= _EPS * np.maximum(cap, 1.0))
        frozen = np.unique(pf[full[pl]])
        rates[frozen] = level
        active[frozen] = False
        keep = active[pf]
        pf, pl = pf[keep], pl[keep]
    return rates


def max_min_rates(graph: nx.DiGraph, paths: Mapping[str, Sequence[str]]) -> dict[str, float]:
    """Max-min fair rate (Gb/s) of every flow given its one path (node list), by
    progressive filling over the graph's `capacity_gbps`."""
    idx = LinkIndex(graph)
    ids = list(paths)
    rates = fill(idx.capacity_gbps, [idx.links_of(paths[f]) for f in ids])
    return {f: float(r) for f, r in zip(ids, rates, strict=True)}
