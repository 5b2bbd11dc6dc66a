"""Spread node positions of a topology drawing so that no two nodes overlap."""

from __future__ import annotations

import math

import networkx as nx


def spread_layout(g: nx.Graph, min_dist: float = 0.22,
                  rounds: int = 400) -> dict[str, tuple[float, float]]:
    """Kamada-Kawai on hop distances, scaled to [-1, 1], then nodes closer than min_dist
    are pushed apart (a few hundred rounds of pairwise repulsion, edges untouched)."""
    if g.number_of_nodes() == 0:
        return {}
    if g.number_of_nodes() == 1:
        return {next(iter(g.nodes)): (0.0, 0.0)}
    raw = nx.kamada_kawai_layout(g)
    pos = {n: [float(x), float(y)] for n, (x, y) in raw.items()}
    nodes = list(pos)
    for _ in range(rounds):
        moved = False
        for i, a in enumerate(nodes):
            for b in nodes[i + 1:]:
                dx = pos[b][0] - pos[a][0]
                dy = pos[b][1] - pos[a][1]
                d = math.hypot(dx, dy)
                if d >= min_dist:
                    continue
                if d < 1e-9:
                    dx, dy, d = 1e-3 * (1 + i), 1e-3, math.hypot(1e-3 * (1 + i), 1e-3)
                push = (min_dist - d) / 2 + 1e-4
                ux, uy = dx / d, dy / d
                pos[a][0] -= ux * push
                pos[a][1] -= uy * push
                pos[b][0] += ux * push
                pos[b][1] += uy * push
                moved = True
        if not moved:
            break
    return {n: (p[0], p[1]) for n, p in pos.items()}


def min_distance(pos: dict[str, tuple[float, float]]) -> float:
    """The smallest distance between two nodes of a layout (inf for fewer than two)."""
    pts = list(pos.values())
    return min((math.dist(p, q) for i, p in enumerate(pts) for q in pts[i + 1:]),
               default=math.inf)
