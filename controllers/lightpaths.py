"""The controller's live lightpaths: rows and optical lightpaths by id, VLAN ids, views, gauges.

`LightpathBook` keeps, per controller lightpath id, the stored row (`LightpathRow`) and
the optical lightpath it holds in the `OpticalNetwork`; it hands out ids and VLAN ids
(2..4094, lowest free) and renders the REST views. Not thread-safe: the core calls it
under its lock. No os-ken, no emulator import.
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import pairwise
from typing import Any

from controllers.layout import Layout
from controllers.metrics import ControllerMetrics
from controllers.rules import LightpathRoute
from controllers.store import LightpathRow
from testbed.optical import Lightpath, OpticalNetwork
from testbed.spec.models import Scenario

VID_MIN, VID_MAX = 2, 4094


def fibres_of_row(row: LightpathRow) -> set[frozenset[str]]:
    """The fibres (unordered node pairs) the lightpath's route crosses."""
    return {frozenset(e) for e in pairwise(row.nodes)}


def route_of(row: LightpathRow, backup: tuple[str, ...] | None) -> LightpathRoute:
    """What the rules need of a lightpath, with the backup its switches hold (or None)."""
    return LightpathRoute(row.id, row.vid, row.src_dc, row.dst_dc, tuple(row.nodes),
                          row.src_host, row.dst_host, backup)


class LightpathBook:
    """Live lightpaths by controller id: the stored row and the optical lightpath."""

    def __init__(self) -> None:
        self.rows: dict[int, LightpathRow] = {}
        self.optical: dict[int, Lightpath] = {}  # controller id -> optical lightpath

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self) -> Iterator[LightpathRow]:
        """The rows, in the order they were added."""
        return iter(self.rows.values())

    def get(self, lp_id: int) -> LightpathRow | None:
        return self.rows.get(lp_id)

    def add(self, row: LightpathRow, lp: Lightpath) -> None:
        self.rows[row.id] = row
        self.optical[row.id] = lp

    def pop(self, lp_id: int) -> tuple[LightpathRow, Lightpath]:
        """Forget the lightpath (KeyError if unknown); its row and optical lightpath."""
        return self.rows.pop(lp_id), self.optical.pop(lp_id)

    def next_id(self) -> int:
        return max(self.rows, default=0) + 1

    def vid_taken(self, vid: int) -> bool:
        return any(r.vid == vid for r in self.rows.values())

    def free_vid(self) -> int | None:
        """The lowest VLAN id no live lightpath has, None when all are taken."""
        used = {r.vid for r in self.rows.values()}
        for vid in range(VID_MIN, VID_MAX + 1):
            if vid not in used:
                return vid
        return None

    def hit_by(self, optical_ids: set[int]) -> list[int]:
        """Controller ids, in id order, of the lightpaths whose optical lightpath is one of
        `optical_ids` (e.g. those a fibre cut released)."""
        return sorted(i for i, lp in self.optical.items() if lp.id in optical_ids)

    def move(self, lp_id: int, got: Lightpath) -> LightpathRow:
        """The lightpath re-placed on `got` (same id and VLAN; `restored` + 1); its row."""
        row = self.rows[lp_id]
        row.nodes, row.first_slot, row.n_slots = list(got.nodes), got.first_slot, got.n_slots
        row.modulation, row.capacity_gbps = got.modulation, got.capacity_gbps
        row.restored += 1
        self.optical[lp_id] = got
        return row

    def view(self, row: LightpathRow) -> dict[str, Any]:
        """The REST view of a lightpath (without the protection's keys)."""
        d = row.to_dict()
        d["fibres"] = [[a, b] for a, b in pairwise(row.nodes)]
        d["slots"] = list(range(row.first_slot, row.first_slot + row.n_slots))
        lp = self.optical.get(row.id)
        if lp is not None:
            d["length_km"] = lp.length_km
            d["latency_ms"] = lp.latency_ms
        return d

    def update_gauges(self, metrics: ControllerMetrics, net: OpticalNetwork) -> None:
        """Lightpaths active, and slots used per fibre."""
        metrics.active.set(len(self.rows))
        for f in net.topology.fibres:
            metrics.slots_used.labels(fibre=f"{f.u}-{f.v}").set(net.mask(f.u, f.v).bit_count())


def spectrum_view(net: OpticalNetwork) -> list[dict[str, Any]]:
    """GET /spectrum: per fibre the used slots, an occupancy string, cut, lost slots."""
    out = []
    for f in net.topology.fibres:
        occ = net.occupancy(f.u, f.v)
        out.append({"u": f.u, "v": f.v, "slots": net.slots,
                    "used": [i for i, b in enumerate(occ) if b],
                    "occupancy": "".join("1" if b else "0" for b in occ),
                    "failed": net.is_failed(f.u, f.v),
                    "lost_slots": net.lost_slots(f.u, f.v)})
    return out


def topology_view(net: OpticalNetwork, scenario: Scenario,
                  layout: Layout | None) -> dict[str, Any]:
    """GET /topology: nodes, fibres (length, cut), DCs, the grid and the layout's hosts."""
    t = net.topology
    return {"name": t.name, "nodes": list(t.nodes),
            "fibres": [{"u": f.u, "v": f.v, "length_km": f.length_km,
                        "failed": net.is_failed(f.u, f.v)} for f in t.fibres],
            "dcs": [{"name": d.name, "node": d.node, "gpus": d.gpus} for d in scenario.dcs],
            "slots": net.slots, "k_paths": net.k_paths,
            "hosts": [h.model_dump() for h in layout.hosts] if layout else []}
