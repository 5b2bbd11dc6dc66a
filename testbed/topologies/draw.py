"""Draw a topology to PNG (matplotlib, headless), fibre lengths on the edges."""

from __future__ import annotations

from pathlib import Path

from testbed.topologies import Topology


def draw_topology(topo: Topology, path: str | Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import networkx as nx

    from testbed.topologies.layout import spread_layout

    g = topo.graph()
    pos = spread_layout(g)  # no two nodes overlap (NSFNET 9, 12, 13, 14 did)
    fig, ax = plt.subplots(figsize=(9, 6), dpi=110)
    nx.draw_networkx(g, pos, ax=ax, node_color="#4c78a8", font_color="white",
                     node_size=420, font_size=9, edge_color="#888888")
    labels = {(f.u, f.v): f"{f.length_km:g}" for f in topo.fibres}
    nx.draw_networkx_edge_labels(g, pos, edge_labels=labels, ax=ax, font_size=7)
    ax.set_title(f"{topo.name}: {len(topo.nodes)} nodes, {len(topo.fibres)} fibres (km)")
    ax.axis("off")
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp.png")
    fig.savefig(tmp, bbox_inches="tight")
    plt.close(fig)
    tmp.replace(target)
    return target
