"""OpticalNetwork: per-fibre spectrum occupancy, candidate paths, lightpath allocate/release.

The pure optical API used by the simulator, the pipeline-job placement and the SDN
controller. Spectrum of each fibre is a Python int bitmap (bit i set = slot i busy);
a lightpath holds the same contiguous block of slots on every fibre of its route.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from itertools import pairwise
from typing import TYPE_CHECKING

import networkx as nx

from testbed.optical.modulation import (
    Modulation,
    choose_modulation,
    choose_modulation_by_gsnr,
    modulation_table,
    slots_for,
)
from testbed.optical.paths import k_shortest_paths
from testbed.optical.spectrum import bits, block_mask, choose_start, full_mask
from testbed.spec.faults import NETWORK_KINDS
from testbed.spec.models import OpticalSpec
from testbed.topologies import Topology

if TYPE_CHECKING:
    from testbed.optical.qot import GnpyQoT
    from testbed.spec.models import EventSpec, Scenario

# Reasons a request is refused (requests.csv `reason` column).
NO_PATH = "no_path"  # no route (disconnected, or every candidate crosses a failed fibre)
NO_REACH = "no_reach"  # every working candidate is longer than the longest reach
NO_SPECTRUM = "no_spectrum"  # no candidate has a fitting free block


@dataclass(frozen=True)
class PathInfo:
    """A candidate route between two nodes with the modulation its length allows."""

    nodes: tuple[str, ...]
    fibres: tuple[tuple[str, str], ...]  # (u, v) in the direction of travel
    length_km: float
    modulation: str | None  # None: longer than every format's reach
    gbps_per_slot: float  # 0.0 when modulation is None
    spectra: tuple[int, ...] = field(repr=False, compare=False)  # internal bitmap indices
    links: tuple[int, ...] = field(repr=False, compare=False)  # internal fibre indices
    gsnr_db: float | None = field(default=None, compare=False)  # qot: gnpy only

    @property
    def hops(self) -> int:
        return len(self.fibres)


@dataclass(frozen=True)
class Lightpath:
    """A lightpath: one contiguous slot block held on every fibre of its route."""

    id: int
    src: str
    dst: str
    nodes: tuple[str, ...]
    fibres: tuple[tuple[str, str], ...]
    first_slot: int
    n_slots: int  # guard slots included
    modulation: str
    capacity_gbps: float  # (n_slots - guard_slots) x gbps_per_slot
    length_km: float
    latency_ms: float
    bitrate_gbps: float | None = None  # what was asked for, if asked by bitrate
    path: PathInfo = field(repr=False, compare=False, default=None)  # type: ignore[assignment]

    @property
    def slots(self) -> range:
        return range(self.first_slot, self.first_slot + self.n_slots)


class OpticalNetwork:
    """Spectrum state of a topology under an optical spec (flex or fixed grid)."""

    def __init__(self, topology: Topology, optical: OpticalSpec | None = None) -> None:
        self.topology = topology
        self.optical = optical or OpticalSpec()
        opt = self.optical
        self.fixed_grid = opt.grid == "fixed"
        self.slots: int = (opt.wavelengths or 0) if self.fixed_grid else opt.slots
        self.guard_slots: int = 0 if self.fixed_grid else opt.guard_slots
        self.k_paths: int = opt.k_paths
        self.per_direction = opt.spectrum_sharing == "per_direction"
        self.modulations: tuple[Modulation, ...] = modulation_table(opt)
        # qot: gnpy: the format comes from the path's GSNR (testbed/optical/qot.py)
        self.qot: GnpyQoT | None = None
        if opt.qot == "gnpy":
            from testbed.optical.qot import qot_model

            self.qot = qot_model(opt)
        self.full = full_mask(self.slots)
        self.graph = topology.graph()
        self._link_index: dict[frozenset[str], int] = {}
        self._link_ends: list[tuple[str, str]] = []
        for f in topology.fibres:
            self._link_index[frozenset((f.u, f.v))] = len(self._link_ends)
            self._link_ends.append((f.u, f.v))
        n_spectra = len(self._link_ends) * (2 if self.per_direction else 1)
        # _occ: slots held by lightpaths; _blocked: slots out of service (cut, lost
        # wavelengths); _busy = _occ | _blocked is what allocation looks at.
        self._occ: list[int] = [0] * n_spectra
        self._blocked: list[int] = [0] * n_spectra
        self._busy: list[int] = [0] * n_spectra
        self._failed: set[int] = set()
        self._lost: dict[int, int] = {}  # spectrum -> slots out of service (wavelength loss)
        self._paths: dict[tuple[str, str], list[PathInfo]] = {}
        self._paths_version = 0
        self._live: dict[int, Lightpath] = {}
        self._next_id = 0
        self.used_slot_fibres = 0  # sum over live lightpaths of n_slots x spectra held

    @classmethod
    def from_scenario(cls, scenario: Scenario) -> OpticalNetwork:
        from testbed.spec import topology_of

        return cls(topology_of(scenario), scenario.optical)

    # Set at construction and never changed afterwards: a copy shares them.
    _SHARED = frozenset({"topology", "optical", "fixed_grid", "slots", "guard_slots", "k_paths",
                         "per_direction", "modulations", "qot", "full", "graph", "_link_index",
                         "_link_ends"})

    def copy(self) -> OpticalNetwork:
        """An independent copy of the spectrum and fibre state, to plan on (e.g. a job
        placement outside the SDN controller's lock) without touching this network.

        Occupancy, blocked slots, cut fibres, live lightpaths, the lightpath id counter and
        the candidate-route cache are copied (bitmaps are ints, lightpaths and routes are
        frozen: a shallow copy of each container suffices); the topology, its graph and the
        fibre index are shared (never changed after construction). A lightpath the copy
        sets up gets the id this network would give it next, so both number alike.
        """
        new = object.__new__(type(self))
        for name, value in vars(self).items():
            if name in self._SHARED or isinstance(value, int):
                new.__dict__[name] = value
            elif isinstance(value, list | dict | set):
                new.__dict__[name] = type(value)(value)
            else:  # a new attribute: decide whether it is shared or copied
                raise TypeError(f"OpticalNetwork.copy: no rule for attribute {name!r}")
        return new

    def state_key(self) -> tuple[tuple[int, ...], frozenset[int]]:
        """What allocation looks at: the busy (held or out of service) slot bitmap of every
        spectrum and the cut fibres. Equal keys: every find_block/allocate answers alike."""
        return tuple(self._busy), frozenset(self._failed)

    def keep_paths(self, other: OpticalNetwork) -> None:
        """Take the candidate routes a copy computed (same cut fibres since the copy: the
        same routes); routes already cached here stay."""
        if other._paths_version != self._paths_version:
            return
        for key, paths in other._paths.items():
            self._paths.setdefault(key, paths)

    # ---- topology and paths -------------------------------------------------------
    def link_id(self, u: str, v: str) -> int:
        """Index of the fibre u-v (either order); KeyError if there is none."""
        try:
            return self._link_index[frozenset((u, v))]
        except KeyError:
            raise KeyError(f"no fibre {u}-{v} in topology {self.topology.name}") from None

    def spectrum_id(self, u: str, v: str) -> int:
        """Index of the bitmap used when travelling u -> v."""
        link = self.link_id(u, v)
        if not self.per_direction:
            return link
        return 2 * link + (0 if self._link_ends[link][0] == u else 1)

    def slot_masks(self) -> tuple[list[int], list[int], list[int]]:
        """The per-spectrum slot bitmasks (occupied, busy = occupied | blocked, blocked),
        the lists themselves: for loops that allocate in place (the simulator's)."""
        return self._occ, self._busy, self._blocked

    @property
    def n_spectra(self) -> int:
        return len(self._occ)

    def candidate_paths(self, src: str, dst: str) -> list[PathInfo]:
        """The k shortest routes src -> dst by length (cached), with their modulation.

        Computed on the fibres that are up: while a fibre is cut, candidates avoid it
        (restoration finds another route); the cache is reset on every cut/repair.
        Routes longer than every format's reach are listed with modulation None;
        allocation skips them.
        """
        key = (src, dst)
        cached = self._paths.get(key)
        if cached is not None:
            return cached
        rev = self._paths.get((dst, src))
        node_lists = ([list(reversed(p.nodes)) for p in rev] if rev is not None
                      else k_shortest_paths(self._working_graph(), src, dst, self.k_paths))
        paths = [self.path_info(nodes) for nodes in node_lists]
        self._paths[key] = paths
        return paths

    def _working_graph(self) -> nx.Graph:
        if not self._failed:
            return self.graph
        g = self.graph.copy()
        g.remove_edges_from(self._link_ends[link] for link in self._failed)
        return g

    @property
    def paths_version(self) -> int:
        """Changes whenever cached candidate paths are invalidated (a cut or a repair)."""
        return self._paths_version

    def path_info(self, nodes: list[str] | tuple[str, ...]) -> PathInfo:
        """PathInfo for an explicit route (list of nodes joined by fibres)."""
        hops = list(pairwise(nodes))
        if not hops:
            raise ValueError("a route needs at least two nodes")
        length = 0.0
        for u, v in hops:
            if not self.graph.has_edge(u, v):
                raise KeyError(f"no fibre {u}-{v} in topology {self.topology.name}")
            length += self.graph[u][v]["length_km"]
        gsnr: float | None = None
        if self.qot is None:
            mod = choose_modulation(length, self.modulations)
        else:
            gsnr = self.qot.gsnr_db([self.graph[u][v]["length_km"] for u, v in hops])
            mod = choose_modulation_by_gsnr(gsnr, self.modulations, self.optical.gsnr_margin_db)
        return PathInfo(nodes=tuple(nodes), fibres=tuple(hops), length_km=length,
                        modulation=mod.name if mod else None,
                        gbps_per_slot=mod.gbps_per_slot if mod else 0.0,
                        spectra=tuple(self.spectrum_id(u, v) for u, v in hops),
                        links=tuple(self.link_id(u, v) for u, v in hops), gsnr_db=gsnr)

    def latency_ms(self, path: PathInfo) -> float:
        """Propagation (length x propagation_us_per_km) plus node_delay_ms per node passed."""
        opt = self.optical
        return path.length_km * opt.propagation_us_per_km / 1000.0 \
            + opt.node_delay_ms * len(path.nodes)

    def path_up(self, path: PathInfo) -> bool:
        """True if no fibre of the path is cut."""
        return not any(link in self._failed for link in path.links)

    # ---- spectrum -----------------------------------------------------------------
    def slots_needed(self, bitrate_gbps: float, path: PathInfo) -> int | None:
        """ceil(bitrate / path's per-slot rate) + guard slots; None if out of reach."""
        if path.modulation is None:
            return None
        return slots_for(bitrate_gbps, path.gbps_per_slot, self.guard_slots)

    def free_mask(self, path: PathInfo) -> int:
        """Bitmap of slots free on every fibre of the path (continuity)."""
        busy = 0
        for s in path.spectra:
            busy |= self._busy[s]
        return self.full & ~busy

    def find_block(self, path: PathInfo, n_slots: int, policy: str = "first_fit",
                   rng: random.Random | None = None) -> int | None:
        """First slot of a free contiguous n-slot block on the path chosen by policy."""
        if n_slots < 1 or n_slots > self.slots:
            return None
        return choose_start(self.free_mask(path), n_slots, policy, rng)

    def allocate(self, src: str, dst: str, *, bitrate_gbps: float | None = None,
                 slots: int | None = None, policy: str = "first_fit",
                 rng: random.Random | None = None,
                 paths: list[PathInfo] | None = None) -> Lightpath | None:
        """Set up a lightpath src -> dst on the first candidate path with a fitting block.

        Give bitrate_gbps (slots from the path's modulation + guard) or slots (the
        total block size, guard included). None if the request is blocked; see
        `allocate_or_reason` for why.
        """
        result = self.allocate_or_reason(src, dst, bitrate_gbps=bitrate_gbps, slots=slots,
                                         policy=policy, rng=rng, paths=paths)
        return result if isinstance(result, Lightpath) else None

    def allocate_or_reason(self, src: str, dst: str, *, bitrate_gbps: float | None = None,
                           slots: int | None = None, policy: str = "first_fit",
                           rng: random.Random | None = None,
                           paths: list[PathInfo] | None = None) -> Lightpath | str:
        """Like allocate, but returns the block reason (no_path, no_reach, no_spectrum)."""
        if (bitrate_gbps is None) == (slots is None):
            raise ValueError("give exactly one of bitrate_gbps and slots")
        if policy == "random_fit" and rng is None:
            raise ValueError("random_fit needs an rng")
        candidates = self.candidate_paths(src, dst) if paths is None else paths
        reason = NO_PATH
        for path in candidates:
            if not self.path_up(path):
                continue
            if path.modulation is None:
                reason = NO_REACH if reason == NO_PATH else reason
                continue
            reason = NO_SPECTRUM
            n = slots if slots is not None else self.slots_needed(bitrate_gbps or 0.0, path)
            assert n is not None
            first = self.find_block(path, n, policy, rng)
            if first is not None:
                return self.assign(path, first, n, bitrate_gbps=bitrate_gbps)
        return reason

    def assign(self, path: PathInfo, first_slot: int, n_slots: int, *,
               bitrate_gbps: float | None = None) -> Lightpath:
        """Hold slots first_slot..+n_slots-1 on every fibre of path; ValueError if not free."""
        if path.modulation is None:
            raise ValueError(f"path {'-'.join(path.nodes)} ({path.length_km:g} km) is beyond "
                             "the reach of every modulation format")
        if n_slots < 1 or first_slot < 0 or first_slot + n_slots > self.slots:
            raise ValueError(f"block {first_slot}+{n_slots} outside the grid 0..{self.slots - 1}")
        mask = block_mask(first_slot, n_slots)
        for s in path.spectra:
            if self._busy[s] & mask:
                raise ValueError(f"slots {first_slot}..{first_slot + n_slots - 1} are not free "
                                 f"on path {'-'.join(path.nodes)}")
        for s in path.spectra:
            self._occ[s] |= mask
            self._busy[s] |= mask
        self.used_slot_fibres += n_slots * len(path.spectra)
        lp = Lightpath(id=self._next_id, src=path.nodes[0], dst=path.nodes[-1],
                       nodes=path.nodes, fibres=path.fibres, first_slot=first_slot,
                       n_slots=n_slots, modulation=path.modulation,
                       capacity_gbps=max(0, n_slots - self.guard_slots) * path.gbps_per_slot,
                       length_km=path.length_km, latency_ms=self.latency_ms(path),
                       bitrate_gbps=bitrate_gbps, path=path)
        self._next_id += 1
        self._live[lp.id] = lp
        return lp

    def release(self, lightpath: Lightpath) -> None:
        """Free exactly the lightpath's slots; KeyError if it is not live."""
        if self._live.pop(lightpath.id, None) is None:
            raise KeyError(f"lightpath {lightpath.id} is not live")
        mask = block_mask(lightpath.first_slot, lightpath.n_slots)
        for s in lightpath.path.spectra:
            self._occ[s] &= ~mask
            self._busy[s] = self._occ[s] | self._blocked[s]
        self.used_slot_fibres -= lightpath.n_slots * len(lightpath.path.spectra)

    @property
    def lightpaths(self) -> dict[int, Lightpath]:
        """Live lightpaths by id (read-only view; do not modify)."""
        return self._live

    # ---- failures -----------------------------------------------------------------
    def fail_link(self, u: str, v: str) -> list[Lightpath]:
        """Cut fibre u-v (both directions): release and return the lightpaths on it.

        The caller decides what happens to them (re-route with allocate, or count
        them lost). While cut, no path through the fibre is usable.
        """
        link = self.link_id(u, v)
        self._failed.add(link)
        self._paths.clear()
        self._paths_version += 1
        for s in self._link_spectra(link):
            self._blocked[s] = self.full
            self._busy[s] = self.full
        hit = [lp for lp in self._live.values() if link in lp.path.links]
        for lp in hit:
            self.release(lp)
        return hit

    def repair_link(self, u: str, v: str) -> None:
        """Bring fibre u-v back (slots lost with block_slots stay blocked until unblocked)."""
        link = self.link_id(u, v)
        self._failed.discard(link)
        self._paths.clear()
        self._paths_version += 1
        for s in self._link_spectra(link):
            self._blocked[s] = self._lost.get(s, 0)
            self._busy[s] = self._occ[s] | self._blocked[s]

    def block_slots(self, u: str, v: str, first_slot: int, n_slots: int) -> list[Lightpath]:
        """Take slots out of service on fibre u-v (wavelength loss): release and return
        the lightpaths using any of them."""
        link = self.link_id(u, v)
        mask = block_mask(first_slot, n_slots) & self.full
        lost = self._lost
        for s in self._link_spectra(link):
            lost[s] = lost.get(s, 0) | mask
            self._blocked[s] |= mask
            self._busy[s] |= mask
        hit = [lp for lp in self._live.values() if link in lp.path.links
               and block_mask(lp.first_slot, lp.n_slots) & mask]
        for lp in hit:
            self.release(lp)
        return hit

    def apply_event(self, ev: EventSpec) -> list[Lightpath]:
        """Apply a network event (fiber_cut / fiber_repair / wavelength_loss /
        wavelength_repair of a scenario's `events`): the lightpaths it hits, released
        (none for a repair)."""
        if ev.kind not in NETWORK_KINDS or ev.link is None:
            raise ValueError(f"{ev.kind!r} is not a network event")
        u, v = ev.link
        if ev.kind == "fiber_cut":
            return self.fail_link(u, v)
        if ev.kind == "fiber_repair":
            self.repair_link(u, v)
            return []
        assert ev.first_slot is not None and ev.slots is not None
        if ev.kind == "wavelength_loss":
            return self.block_slots(u, v, ev.first_slot, ev.slots)
        self.unblock_slots(u, v, ev.first_slot, ev.slots)  # wavelength_repair
        return []

    def unblock_slots(self, u: str, v: str, first_slot: int, n_slots: int) -> None:
        """Return slots taken out with block_slots to service (wavelength repair)."""
        link = self.link_id(u, v)
        mask = block_mask(first_slot, n_slots) & self.full
        lost = self._lost
        for s in self._link_spectra(link):
            lost[s] = lost.get(s, 0) & ~mask
            if link not in self._failed:
                self._blocked[s] = lost[s]
                self._busy[s] = self._occ[s] | self._blocked[s]

    def is_failed(self, u: str, v: str) -> bool:
        return self.link_id(u, v) in self._failed

    def lost_slots(self, u: str, v: str) -> list[int]:
        """Slot indices of fibre u-v out of service by block_slots (not yet unblocked)."""
        return bits(self._lost.get(self._link_spectra(self.link_id(u, v))[0], 0))

    def _link_spectra(self, link: int) -> tuple[int, ...]:
        return (2 * link, 2 * link + 1) if self.per_direction else (link,)

    # ---- views ----------------------------------------------------------------------
    def mask(self, u: str, v: str) -> int:
        """Bitmap of slots held by lightpaths on fibre u-v (direction u -> v)."""
        return self._occ[self.spectrum_id(u, v)]

    def occupancy(self, u: str, v: str) -> list[bool]:
        """Per slot: True if a lightpath holds it on fibre u-v (direction u -> v)."""
        m = self.mask(u, v)
        return [bool(m >> i & 1) for i in range(self.slots)]

    def unavailable(self, u: str, v: str) -> list[int]:
        """Slot indices not usable on u-v (held, or out of service)."""
        return bits(self._busy[self.spectrum_id(u, v)])

    def lightpaths_on(self, u: str, v: str) -> list[Lightpath]:
        link = self.link_id(u, v)
        return [lp for lp in self._live.values() if link in lp.path.links]

    def utilization(self) -> float:
        """Fraction of all slots on all fibres (and directions) held by lightpaths."""
        total = self.slots * len(self._occ)
        return sum(m.bit_count() for m in self._occ) / total if total else 0.0
