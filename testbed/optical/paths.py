"""k shortest loop-free paths by total fibre length (networkx, Yen's algorithm)."""

from __future__ import annotations

from itertools import islice

import networkx as nx


def k_shortest_paths(graph: nx.Graph, src: str, dst: str, k: int,
                     weight: str = "length_km") -> list[list[str]]:
    """Up to k simple paths from src to dst, shortest total `weight` first ([] if none)."""
    if src == dst:
        raise ValueError(f"source and destination are the same node {src!r}")
    if src not in graph or dst not in graph:
        return []
    try:
        return [list(p) for p in islice(nx.shortest_simple_paths(graph, src, dst,
                                                                  weight=weight), k)]
    except nx.NetworkXNoPath:
        return []
