"""Measurements that share no fibre, grouped to run side by side (probes, pings)."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import networkx as nx

# Measurements at a time: lightpath probes always; the RTT pings of the calibration and
# the verification only on networks with more than PINGS_ALONE_MAX DC-pair paths (on
# the 14-DC NSFNET, 91 paths, 3x faster). A median RTT measured beside other pings
# carries their load on the shared switches: on small networks (the bundled scenarios)
# paths are pinged one at a time, as the traffic that follows sees them.
SIDE_BY_SIDE = 8
PINGS_ALONE_MAX = 12


def ping_parallel(paths: int) -> int:
    """How many DC-pair paths to ping at a time on a network with this many."""
    return 1 if paths <= PINGS_ALONE_MAX else SIDE_BY_SIDE

T = TypeVar("T")
R = TypeVar("R")


def disjoint_batches(fibres: Sequence[frozenset[object]]) -> list[list[int]]:
    """Indices in batches whose fibre sets are pairwise disjoint: a greedy colouring of
    the conflict graph (largest degree first); batches ordered by their first index,
    each in index order."""
    g = nx.Graph()
    g.add_nodes_from(range(len(fibres)))
    g.add_edges_from((i, j) for i, j in itertools.combinations(range(len(fibres)), 2)
                     if fibres[i] & fibres[j])
    colour = nx.greedy_color(g, strategy="largest_first")
    batches: dict[int, list[int]] = {}
    for i in range(len(fibres)):
        batches.setdefault(colour[i], []).append(i)
    return sorted(batches.values(), key=lambda b: b[0])


def run_batched(items: Sequence[T], fibres: Sequence[frozenset[object]],
                fn: Callable[[T], R], parallel: int) -> list[R]:
    """fn over items, those that share no fibre side by side (at most `parallel` threads;
    1: one after the other); results in item order."""
    if parallel <= 1:
        return [fn(x) for x in items]
    out: dict[int, R] = {}
    for batch in disjoint_batches(fibres):
        with ThreadPoolExecutor(max_workers=min(parallel, len(batch))) as ex:
            for i, r in zip(batch, ex.map(lambda i: fn(items[i]), batch), strict=True):
                out[i] = r
    return [out[i] for i in range(len(items))]
