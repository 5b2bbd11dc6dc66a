"""Pure mapping of a scenario onto an emulated network: nodes, names, rates, delays, VLANs.

No Mininet here: the plan is plain data that the network builder turns into namespaces,
switches and link emulators, and that tests check without root.

Rates: a fibre's capacity is all of its spectrum at the best modulation for the fibre
(flex grid: slots x gbps_per_slot; fixed grid: wavelengths x gbps_per_wavelength); a
lightpath's capacity is its slots (or wavelengths) at the best modulation for its path.
Best: in reach (optical.qot: reach) or by the GSNR GNPy computes (qot: gnpy).
Emulated rate and delay come from the run's `Scale` (testbed.emu.scale): delay =
length_km x optical.propagation_us_per_km, plus the optical node delay of the node a
fibre enters, both scaled.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from itertools import combinations, pairwise
from typing import Any

import networkx as nx

from testbed import names
from testbed.emu.scale import Scale
from testbed.errors import InputError
from testbed.optical.modulation import (
    Modulation,
    choose_modulation,
    choose_modulation_by_gsnr,
    modulation_table,
)
from testbed.spec import Scenario, topology_of
from testbed.spec.check import dc_host_count

PREFIX_LEN = 6  # "lp" + 4 hex digits
FIRST_VLAN = 101


def new_prefix() -> str:
    """A fresh per-run name prefix: 'lp' + 4 random hex digits."""
    return "lp" + secrets.token_hex(2)


@dataclass(frozen=True)
class HostPlan:
    name: str        # user-facing, e.g. "dc-a-h0"
    node: str        # Mininet node name (prefixed, short)
    dc: str
    ip: str          # with prefix length, e.g. "10.1.0.1/8"
    mac: str
    switch: str      # the DC switch (leaf) it hangs off


@dataclass(frozen=True)
class SwitchPlan:
    node: str
    kind: str        # "dc", "leaf", "spine" or "roadm"
    dpid: str        # 16 hex digits
    label: str       # DC name or optical node id


@dataclass(frozen=True)
class LinkPlan:
    a: str
    b: str
    rate_mbps: float | None = None  # emulated HTB rate both ways (leaf-spine fabrics); None: none


@dataclass(frozen=True)
class FibrePlan:
    u: str                 # optical node ids
    v: str
    roadm_u: str           # switch node names
    roadm_v: str
    middle: str            # middle namespace node name
    length_km: float
    delay_ms: float        # one-way, emulated
    rate_mbps: float       # emulated
    real_gbps: float
    modulation: str
    loss: float


@dataclass(frozen=True)
class LightpathPlan:
    vlan: int
    dc_a: str
    dc_b: str
    path: tuple[str, ...]  # optical node ids from dc_a's node to dc_b's node
    real_gbps: float       # capacity of its slots
    slots: int
    rate_mbps: float       # emulated
    delay_ms: float        # one-way along the path, emulated


@dataclass(frozen=True)
class EmuPlan:
    prefix: str
    scenario: str
    scale: Scale
    fabric: str
    hosts: tuple[HostPlan, ...]
    switches: tuple[SwitchPlan, ...]
    links: tuple[LinkPlan, ...]            # host-switch, fabric and DC-ROADM links
    fibres: tuple[FibrePlan, ...]
    lightpaths: tuple[LightpathPlan, ...]
    dc_subnets: dict[str, str] = field(default_factory=dict)   # dc -> "10.d.0.0/16"
    dc_roadm: dict[str, str] = field(default_factory=dict)     # dc -> roadm node name

    def host(self, name: str) -> HostPlan:
        for h in self.hosts:
            if h.name == name or h.node == name:
                return h
        raise KeyError(name)

    def fibre(self, a: str, b: str) -> FibrePlan:
        for f in self.fibres:
            if {f.u, f.v} == {a, b}:
                return f
        raise KeyError(f"{a}-{b}")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _chooser(opt: Any) -> Callable[[Sequence[float]], Modulation]:
    """Best format for a route given by its links' lengths (km): in reach (qot: reach) or
    whose required GSNR plus the margin holds (qot: gnpy, GSNR from GNPy); if none holds,
    the most robust one (with regeneration)."""
    table = modulation_table(opt)
    if opt.qot != "gnpy":
        longest = max(table, key=lambda m: m.reach_km)
        return lambda lengths: choose_modulation(sum(lengths), table) or longest
    from testbed.optical.qot import qot_model

    qot = qot_model(opt)
    robust = min(table, key=lambda m: m.required_gsnr_db or 0.0)
    return lambda lengths: choose_modulation_by_gsnr(
        qot.gsnr_db(list(lengths)), table, opt.gsnr_margin_db) or robust


def _ifname(name: str, suffix_len: int = 0) -> str:
    """Check a node name leaves room for Mininet's '-ethN' interface suffix."""
    try:
        names.check_ifname(name)
    except ValueError as exc:
        raise InputError("emulation", str(exc)) from None
    if len(name) + suffix_len > 15:
        raise InputError("emulation", f"node name {name!r} too long for interface names")
    return name


def build_plan(scenario: Scenario, prefix: str | None = None) -> EmuPlan:
    """Map a scenario onto hosts, switches, fibres and lightpaths (raises InputError)."""
    emu = scenario.emulation
    opt = scenario.optical
    prefix = prefix or new_prefix()
    if not (len(prefix) == PREFIX_LEN and prefix.startswith("lp")):
        raise InputError("emulation", f"bad run prefix {prefix!r}")
    if len(scenario.dcs) < 1:
        raise InputError("dcs", "emulation needs at least one DC")
    topo = topology_of(scenario)
    graph = topo.graph()
    best = _chooser(opt)
    scale = Scale.of(emu)
    node_delay_ms = scale.delay_ms(opt.node_delay_ms)

    def too_fast(what: str, rate_mbps: float) -> None:
        if rate_mbps > emu.max_rate_mbps:
            need = scale.divisor_needed(rate_mbps, emu.max_rate_mbps)
            raise InputError("emulation.max_rate_mbps",
                             f"{what} would run at {rate_mbps:g} Mbit/s emulated, above "
                             f"{emu.max_rate_mbps:g}; raise emulation.bandwidth_divisor to "
                             f">= {need} or lower the capacity")

    switches: list[SwitchPlan] = []

    def add_switch(kind: str, label: str) -> str:
        node = _ifname(f"{prefix}s{len(switches) + 1}", 6)
        switches.append(SwitchPlan(node, kind, f"{len(switches) + 1:016x}", label))
        return node

    roadm = {n: add_switch("roadm", n) for n in topo.nodes}
    hosts: list[HostPlan] = []
    links: list[LinkPlan] = []
    dc_subnets: dict[str, str] = {}
    dc_roadm: dict[str, str] = {}
    if len(scenario.dcs) > 250:
        raise InputError("dcs", "at most 250 DCs can be emulated")
    for d, dc in enumerate(scenario.dcs):
        if dc.node not in roadm:
            raise InputError(f"dcs[{d}].node", f"unknown optical node {dc.node!r}")
        n_hosts = dc_host_count(scenario, dc)
        dc_subnets[dc.name] = f"10.{d + 1}.0.0/16"
        dc_roadm[dc.name] = roadm[dc.node]
        if emu.dc_fabric == "single":
            leaves = [add_switch("dc", dc.name)]
            links.append(LinkPlan(leaves[0], roadm[dc.node]))
        else:
            # Hosts in blocks of hosts_per_leaf (default: spread evenly), as
            # testbed.routing.topology.from_scenario lays the same fabric out.
            ls = emu.leaf_spine
            up_mbps = scale.rate_mbps(ls.spine_link_gbps)
            too_fast(f"leaf-spine link of {dc.name}", up_mbps)
            host_mbps = scale.rate_mbps(ls.host_link_gbps)
            too_fast(f"host link of {dc.name}", host_mbps)
            per_leaf = ls.hosts_per_leaf or max(1, -(-n_hosts // ls.leaves))
            spines = [add_switch("spine", dc.name) for _ in range(ls.spines)]
            n_leaves = min(ls.leaves, -(-n_hosts // per_leaf))
            leaves = [add_switch("leaf", dc.name) for _ in range(n_leaves)]
            links.extend(LinkPlan(leaf, sp, up_mbps) for leaf in leaves for sp in spines)
            links.extend(LinkPlan(sp, roadm[dc.node]) for sp in spines)
        for i in range(n_hosts):
            idx = len(hosts) + 1
            node = _ifname(f"{prefix}h{idx}", 5)
            leaf = leaves[0] if emu.dc_fabric == "single" else leaves[i // per_leaf]
            mac = f"02:00:00:{d + 1:02x}:{(i + 1) >> 8:02x}:{(i + 1) & 0xFF:02x}"
            hosts.append(HostPlan(f"{dc.name}-h{i}", node, dc.name,
                                  f"10.{d + 1}.{(i + 1) >> 8}.{(i + 1) & 0xFF}/8", mac, leaf))
            links.append(LinkPlan(node, leaf, None if emu.dc_fabric == "single" else host_mbps))

    fibres: list[FibrePlan] = []
    for k, f in enumerate(topo.fibres):
        if opt.grid == "fixed":
            assert opt.wavelengths is not None and opt.gbps_per_wavelength is not None
            real_gbps, mod_name = opt.wavelengths * opt.gbps_per_wavelength, "fixed"
        else:
            mod = best([f.length_km])
            real_gbps, mod_name = opt.slots * mod.gbps_per_slot, mod.name
        rate_mbps = scale.rate_mbps(real_gbps)
        too_fast(f"fibre {f.u}-{f.v} ({real_gbps:g} Gb/s real)", rate_mbps)
        delay_ms = scale.delay_ms(f.length_km * opt.propagation_us_per_km / 1000.0) + node_delay_ms
        fibres.append(FibrePlan(f.u, f.v, roadm[f.u], roadm[f.v],
                                _ifname(f"{prefix}f{k + 1}", 5), f.length_km,
                                round(delay_ms, 6), rate_mbps, real_gbps, mod_name,
                                emu.fibre_loss))
    by_pair = {frozenset((f.u, f.v)): f for f in fibres}

    lightpaths: list[LightpathPlan] = []
    for a, b in combinations(scenario.dcs, 2):
        if a.node == b.node:
            continue  # same optical node: traffic turns around in the ROADM
        try:
            path = nx.shortest_path(graph, a.node, b.node, weight="length_km")
        except nx.NetworkXNoPath:
            raise InputError("dcs", f"no optical path between {a.name} and {b.name}") from None
        hop_km = [graph[u][v]["length_km"] for u, v in pairwise(path)]
        if opt.grid == "fixed":
            assert opt.gbps_per_wavelength is not None
            per_unit = opt.gbps_per_wavelength
        else:
            per_unit = best(hop_km).gbps_per_slot
        units = max(1, math.ceil(emu.lightpath_gbps / per_unit - 1e-9))
        real_gbps = units * per_unit
        rate_mbps = scale.rate_mbps(real_gbps)
        too_fast(f"lightpath {a.name}-{b.name} ({real_gbps:g} Gb/s real)", rate_mbps)
        delay_ms = sum(by_pair[frozenset((u, v))].delay_ms
                       for u, v in pairwise(path))
        vlan = FIRST_VLAN + len(lightpaths)
        if vlan > 4094:
            raise InputError("dcs", "too many DC pairs for 802.1Q VLAN ids")
        lightpaths.append(LightpathPlan(vlan, a.name, b.name, tuple(path), real_gbps, units,
                                        rate_mbps, round(delay_ms, 6)))
    return EmuPlan(prefix, scenario.name, scale, emu.dc_fabric, tuple(hosts),
                   tuple(switches), tuple(links), tuple(fibres), tuple(lightpaths),
                   dc_subnets, dc_roadm)
