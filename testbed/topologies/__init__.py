"""Topology library: optical reference networks with fibre lengths in km, as plain data."""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path

import networkx as nx

from testbed.errors import InputError
from testbed.io.bounded import TOPOLOGY_MAX_BYTES, read_bounded_text
from testbed.names import NODE_NAME_RE


@dataclass(frozen=True)
class Fibre:
    """An undirected fibre between two optical nodes."""

    u: str
    v: str
    length_km: float


@dataclass(frozen=True)
class Topology:
    """A named optical topology: nodes and fibres (plain data, no behaviour)."""

    name: str
    nodes: tuple[str, ...]
    fibres: tuple[Fibre, ...]
    source: str = ""

    def graph(self) -> nx.Graph:
        """An undirected networkx graph with `length_km` on each edge."""
        g = nx.Graph(name=self.name)
        g.add_nodes_from(self.nodes)
        for f in self.fibres:
            g.add_edge(f.u, f.v, length_km=f.length_km)
        return g

    def node_range(self) -> str:
        """Short human description of the node ids (for error messages)."""
        if all(n.isdigit() for n in self.nodes):
            ids = sorted(int(n) for n in self.nodes)
            if ids == list(range(ids[0], ids[-1] + 1)):
                return f"{ids[0]}..{ids[-1]}"
        shown = ", ".join(self.nodes[:8])
        return shown + (", ..." if len(self.nodes) > 8 else "")


# name -> data file in testbed/topologies/data
LIBRARY: dict[str, str] = {
    "nsfnet": "nsfnet.csv",
    "nsfnet21": "nsfnet21.csv",
    "usnet": "usnet.csv",
    "cost239": "cost239.csv",
    "jpn12": "jpn12.csv",
}


def library_names() -> list[str]:
    """Names of the bundled topologies whose data files are present."""
    data = resources.files("testbed.topologies") / "data"
    return [n for n, f in LIBRARY.items() if (data / f).is_file()]


@cache
def load_library(name: str) -> Topology:
    """Load a bundled topology by name."""
    if name not in library_names():
        raise InputError("topology.library", f"unknown topology {name!r} "
                         f"(known: {', '.join(library_names())})")
    text = (resources.files("testbed.topologies") / "data" / LIBRARY[name]).read_text()
    return parse_csv(text, name=name, origin=f"library topology {name}")


def load_file(path: str | Path) -> Topology:
    """Load a topology from a CSV file (`u,v,length_km`, `#` comment lines)."""
    p = Path(path)
    text = read_bounded_text(p, "topology.file", TOPOLOGY_MAX_BYTES)
    return parse_csv(text, name=p.stem, origin=str(p))


def parse_csv(text: str, name: str, origin: str) -> Topology:
    """Parse the topology CSV format; the first `#` line is kept as the source note."""
    source = ""
    rows: list[str] = []
    for line in text.splitlines():
        if line.startswith("#"):
            source = source or line.lstrip("# ").strip()
        elif line.strip():
            rows.append(line)
    reader = csv.DictReader(io.StringIO("\n".join(rows)))
    if reader.fieldnames is None or not {"u", "v", "length_km"} <= set(reader.fieldnames):
        raise InputError("topology.file", f"{origin}: header must be u,v,length_km")
    fibres: list[Fibre] = []
    nodes: dict[str, None] = {}
    seen: set[frozenset[str]] = set()
    for lineno, row in enumerate(reader, start=2):
        u, v = (row.get("u") or "").strip(), (row.get("v") or "").strip()
        for end in (u, v):
            if not NODE_NAME_RE.fullmatch(end):
                raise InputError("topology.file", f"{origin}: row {lineno}: bad node id {end!r}")
        raw = (row.get("length_km") or "").strip()
        if not raw:
            raise InputError("topology.file", f"{origin}: row {lineno}: no length_km (each "
                             "row is u,v,length_km, the fibre length in km)")
        try:
            length = float(raw)
        except ValueError:
            raise InputError("topology.file", f"{origin}: row {lineno}: length_km must be "
                             f"a number of km, got {raw!r}") from None
        if not length > 0:
            raise InputError("topology.file",
                             f"{origin}: row {lineno}: length_km must be > 0, got {length}")
        if u == v or frozenset((u, v)) in seen:
            raise InputError("topology.file",
                             f"{origin}: row {lineno}: self-loop or duplicate fibre {u}-{v}")
        seen.add(frozenset((u, v)))
        nodes.setdefault(u)
        nodes.setdefault(v)
        fibres.append(Fibre(u, v, length))
    if not fibres:
        raise InputError("topology.file", f"{origin}: no fibres")
    return Topology(name=name, nodes=_sorted_nodes(nodes), fibres=tuple(fibres), source=source)


def _sorted_nodes(nodes: dict[str, None]) -> tuple[str, ...]:
    if all(n.isdigit() for n in nodes):
        return tuple(sorted(nodes, key=int))
    return tuple(nodes)


def summary(topo: Topology) -> dict[str, object]:
    """Size and length statistics of a topology (for `lightpipe topologies`)."""
    g = topo.graph()
    lengths = [f.length_km for f in topo.fibres]
    connected = nx.is_connected(g)
    return {
        "name": topo.name,
        "nodes": g.number_of_nodes(),
        "fibres": g.number_of_edges(),
        "min_km": min(lengths),
        "mean_km": round(sum(lengths) / len(lengths), 1),
        "max_km": max(lengths),
        "total_km": round(sum(lengths), 1),
        "mean_degree": round(2 * g.number_of_edges() / g.number_of_nodes(), 2),
        "diameter_hops": nx.diameter(g) if connected else None,
        "connected": connected,
        "source": topo.source,
    }
