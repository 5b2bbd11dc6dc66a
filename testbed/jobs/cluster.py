"""Cluster state for pipeline jobs: DCs with free GPUs on top of the optical network.

GPUs are counted per DC; spectrum is held by `testbed.optical.OpticalNetwork`. A job's
allocation (`Allocation`) is one DC per stage plus, for every stage boundary that
crosses DCs, one lightpath from the optical layer. `Cluster.commit` / `Cluster.free`
take and return both, so nothing else changes GPU or spectrum state.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import networkx as nx

from testbed.catalog import GPUType
from testbed.jobs.model import gpu_type
from testbed.optical import Lightpath, OpticalNetwork, PathInfo
from testbed.spec.models import DCSpec, Scenario


@dataclass(frozen=True)
class DC:
    """A datacenter as the job layer sees it."""

    index: int
    name: str
    node: str
    gpus: int
    gpu: GPUType
    price_usd_per_kwh: float
    price_curve: tuple[float, ...] | None
    fabric_gbps: float
    fabric_latency_ms: float

    @classmethod
    def from_spec(cls, i: int, spec: DCSpec) -> DC:
        curve = tuple(spec.price_curve_usd_per_kwh) if spec.price_curve_usd_per_kwh else None
        return cls(i, spec.name, spec.node, spec.gpus, gpu_type(spec.gpu),
                   spec.price_usd_per_kwh, curve, spec.fabric_gbps, spec.fabric_latency_ms)


@dataclass(frozen=True)
class LinkChoice:
    """A lightpath to set up for one boundary: route, first slot and block size."""

    path: PathInfo
    first_slot: int
    n_slots: int


@dataclass
class Allocation:
    """What a placed job holds: DC per stage and a lightpath (or None) per boundary."""

    stage_dcs: tuple[int, ...]
    lightpaths: list[Lightpath | None] = field(default_factory=list)
    # CBA's blocking flag: boundary -> capacity (Gb/s) it asked for but did not get
    short_gbps: dict[int, float] = field(default_factory=dict)
    # protection 1+1 / backup: boundary -> its link-disjoint standby lightpath
    standby: dict[int, Lightpath] = field(default_factory=dict)


class Cluster:
    """Free GPUs per DC and the optical network's spectrum."""

    def __init__(self, dcs: Sequence[DC], network: OpticalNetwork) -> None:
        self.dcs = list(dcs)
        self.network = network
        self.free = [dc.gpus for dc in self.dcs]
        self.total_gpus = sum(dc.gpus for dc in self.dcs)
        g = network.graph
        dist = dict(nx.all_pairs_dijkstra_path_length(g, weight="length_km"))
        self.distance_km = [[dist[a.node].get(b.node, float("inf")) for b in self.dcs]
                            for a in self.dcs]
        self._paths: dict[tuple[int, int], list[PathInfo]] = {}
        self._paths_version = network.paths_version

    @classmethod
    def from_scenario(cls, scenario: Scenario) -> Cluster:
        return cls([DC.from_spec(i, d) for i, d in enumerate(scenario.dcs)],
                   OpticalNetwork.from_scenario(scenario))

    def snapshot(self) -> Cluster:
        """An independent copy to plan on: free GPUs and the optical state
        (`OpticalNetwork.copy`) copied, DCs and distances shared; what the copy takes or
        frees leaves this cluster as it is. `commit_planned` then takes the plan here."""
        new = object.__new__(Cluster)
        new.dcs = self.dcs
        new.network = self.network.copy()
        new.free = list(self.free)
        new.total_gpus = self.total_gpus
        new.distance_km = self.distance_km
        new._paths = dict(self._paths)
        new._paths_version = self._paths_version
        return new

    def state_key(self) -> tuple[object, ...]:
        """Free GPUs per DC and the optical state key: equal keys, same placements."""
        return (tuple(self.free), *self.network.state_key())

    def keep_paths(self, snap: Cluster) -> None:
        """Keep the candidate routes a snapshot computed (unless fibres were cut or repaired
        since), so that the next placement sees the same route cache as if it had been
        planned here."""
        if snap._paths_version == self._paths_version \
                and snap.network.paths_version == self.network.paths_version:
            for key, paths in snap._paths.items():
                self._paths.setdefault(key, paths)
        self.network.keep_paths(snap.network)

    def commit_planned(self, alloc: Allocation, gpus_per_stage: int) -> Allocation:
        """Take here what `alloc`, planned on a snapshot, holds there: the same DC per stage
        and the same route and slot block per boundary (`commit`: ValueError, and nothing
        taken, if the GPUs or any of the slots are gone or a fibre of a route is cut)."""
        links = [None if lp is None else LinkChoice(lp.path, lp.first_slot, lp.n_slots)
                 for lp in alloc.lightpaths]
        got = self.commit(alloc.stage_dcs, gpus_per_stage, links)
        got.short_gbps = dict(alloc.short_gbps)
        return got

    @property
    def used_gpus(self) -> int:
        return self.total_gpus - sum(self.free)

    def paths(self, d1: int, d2: int) -> list[PathInfo]:
        """Up candidate routes between two DCs' nodes, shortest first (cached until the
        optical layer's paths change, i.e. a cut or repair)."""
        net = self.network
        if self._paths_version != net.paths_version:
            self._paths.clear()
            self._paths_version = net.paths_version
        key = (d1, d2)
        got = self._paths.get(key)
        if got is None:
            got = [p for p in net.candidate_paths(self.dcs[d1].node, self.dcs[d2].node)
                   if p.modulation is not None and net.path_up(p)]
            self._paths[key] = got
        return got

    def commit(self, stage_dcs: Sequence[int], gpus_per_stage: int,
               links: Sequence[LinkChoice | None]) -> Allocation:
        """Take GPUs and set up lightpaths; ValueError (and nothing taken) if impossible."""
        need = [0] * len(self.dcs)
        for d in stage_dcs:
            need[d] += gpus_per_stage
        if any(n > f for n, f in zip(need, self.free, strict=True)):
            raise ValueError("not enough free GPUs for this placement")
        made: list[Lightpath | None] = []
        try:
            for lk in links:
                made.append(None if lk is None else
                            self.network.assign(lk.path, lk.first_slot, lk.n_slots))
        except ValueError:
            for lp in made:
                if lp is not None:
                    self.network.release(lp)
            raise
        for d, n in enumerate(need):
            self.free[d] -= n
        return Allocation(tuple(stage_dcs), made)

    def free_allocation(self, alloc: Allocation, gpus_per_stage: int) -> None:
        """Return the allocation's GPUs and release its live lightpaths (standby too)."""
        for d in alloc.stage_dcs:
            self.free[d] += gpus_per_stage
        live = self.network.lightpaths
        for lp in [*alloc.lightpaths, *alloc.standby.values()]:
            if lp is not None and lp.id in live:
                self.network.release(lp)
        alloc.lightpaths = [None] * len(alloc.lightpaths)
        alloc.standby = {}
