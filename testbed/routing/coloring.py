"""Edge-colouring routing: inter-leaf flows as a bipartite multigraph, one colour per spine."""

from __future__ import annotations

import numpy as np

from testbed.routing.instance import Instance
from testbed.routing.topology import SPINE


def bipartite_edge_coloring(edges: list[tuple[str, str]]) -> list[int]:
    """Colour the edges (u on the left, v on the right) of a bipartite multigraph with
    max-degree colours so that no two edges at a node share a colour (Koenig; alternating
    path flips)."""
    at: dict[tuple[int, str], dict[int, int]] = {}
    color = [-1] * len(edges)

    def free(node: tuple[int, str]) -> int:
        used = at.setdefault(node, {})
        c = 0
        while c in used:
            c += 1
        return c

    for e, (u, v) in enumerate(edges):
        U, V = (0, u), (1, v)
        a, b = free(U), free(V)
        if a in at[V]:
            # flip the a/b alternating path from V (it cannot reach U, which lacks a)
            path, x, c = [], V, a
            while c in at.get(x, {}):
                e2 = at[x][c]
                path.append(e2)
                u2, v2 = edges[e2]
                x = (1, v2) if x == (0, u2) else (0, u2)
                c = b if c == a else a
            for e2 in path:
                u2, v2 = edges[e2]
                del at[(0, u2)][color[e2]]
                del at[(1, v2)][color[e2]]
            for e2 in path:
                u2, v2 = edges[e2]
                color[e2] = b if color[e2] == a else a
                at[(0, u2)][color[e2]] = e2
                at[(1, v2)][color[e2]] = e2
        color[e] = a
        at[U][a] = e
        at[V][a] = e
    return color


def edge_coloring(inst: Instance) -> list[int]:
    """Flows between leaves coloured so that each colour is a matching of source and
    destination leaves; colour c goes to spine c mod S (the S spines in order). Where that
    spine is not a candidate (a failed link), or the fabric is not a 2-layer Clos, the
    candidate with the least-loaded busiest link is taken."""
    g = inst.graph
    spines = sorted((n for n, r in g.nodes(data="role") if r == SPINE),
                    key=lambda n: (len(n), n))
    multi = [i for i, cs in enumerate(inst.cands) if len(cs[0]) == 5]
    colors = bipartite_edge_coloring([(inst.cands[i][0][1], inst.cands[i][0][3])
                                      for i in multi])
    choice: list[int | None] = [None if len(cs) > 1 else 0 for cs in inst.cands]
    want = dict(zip(multi, colors, strict=True))
    load = np.zeros(len(inst.cap), dtype=np.int64)
    for i, c in enumerate(choice):
        if c is not None:
            np.add.at(load, inst.cand_links[i][c], 1)
    for i in range(len(inst.flows)):
        if choice[i] is not None:
            continue
        pick = None
        if i in want and spines:
            sp = spines[want[i] % len(spines)]
            pick = next((k for k, p in enumerate(inst.cands[i]) if p[2] == sp), None)
        if pick is None:
            pick = min(range(len(inst.cands[i])),
                       key=lambda k: (float(((load[inst.cand_links[i][k]] + 1)
                                             / inst.cap[inst.cand_links[i][k]]).max()), k))
        choice[i] = pick
        np.add.at(load, inst.cand_links[i][pick], 1)
    return [int(c) for c in choice]  # type: ignore[arg-type]
