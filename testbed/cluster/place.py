"""Placement of an emulation plan on machines: DCs whole, only WAN fibres cross machines.

The unit placed is an optical node with the DCs attached to it (a DC's switches and
hosts hang off its ROADM bridge by plain veths, so they must share its machine). Groups
are spread by emulated hosts (then GPUs) with the longest-processing-time rule, largest
first, ties by name: deterministic. ROADMs with no DC (transit nodes) go where most of
their placed neighbours are. A swap pass then trades groups between machines while it
removes crossing fibres without raising the most loaded machine's host count. A fibre's
middle node (its delay/rate emulator) stays on its first end's machine; the tunnel
carries its link to the second end's ROADM (testbed.cluster.tunnel).
The controller and the monitor run on the first machine of the cluster file.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from testbed.emu.plan import EmuPlan
from testbed.errors import InputError
from testbed.spec import Scenario

MAX_SWAP_GROUPS = 64  # the swap pass is quadratic in groups; beyond, greedy only


@dataclass(frozen=True)
class CrossingFibre:
    """A fibre whose two ROADMs sit on different machines."""

    index: int          # 1-based position in plan.fibres (its middle node is <prefix>f<index>)
    u: str              # optical node ids
    v: str
    middle: str         # the fibre emulator's node, on machine_u
    machine_u: str
    machine_v: str
    delay_ms: float     # one-way, emulated (the tunnel's own latency is part of it)
    rate_mbps: float


@dataclass(frozen=True)
class MachineLoad:
    hosts: int = 0
    gpus: int = 0
    dcs: int = 0
    switches: int = 0
    fibre_emulators: int = 0


@dataclass(frozen=True)
class Placement:
    machines: tuple[str, ...]
    services: str                               # controller + monitor
    dc_machine: dict[str, str]                  # DC name -> machine
    optical_machine: dict[str, str]             # optical node id -> machine
    node_machine: dict[str, str]                # plan node name -> machine
    crossing: tuple[CrossingFibre, ...]
    load: dict[str, MachineLoad] = field(default_factory=dict)

    def nodes_on(self, machine: str) -> list[str]:
        return [n for n, m in self.node_machine.items() if m == machine]


@dataclass
class _Group:
    node: str                  # optical node id
    dcs: list[str]
    hosts: int
    gpus: int


def parse_overrides(items: Sequence[str], dcs: Sequence[str],
                    machines: Sequence[str]) -> dict[str, str]:
    """`DC=MACHINE` strings (the --place option) into a mapping (InputError)."""
    out: dict[str, str] = {}
    for item in items:
        dc, sep, machine = item.partition("=")
        if not sep:
            raise InputError("--place", f"{item!r}: expected DC=MACHINE")
        if dc not in dcs:
            raise InputError("--place", f"unknown DC {dc!r} (one of: {', '.join(dcs)})")
        if machine not in machines:
            raise InputError("--place", f"unknown machine {machine!r} "
                             f"(one of: {', '.join(machines)})")
        if out.get(dc, machine) != machine:
            raise InputError("--place", f"DC {dc!r} placed twice")
        out[dc] = machine
    return out


def place(scenario: Scenario, plan: EmuPlan, machines: Sequence[str],
          overrides: Mapping[str, str] | None = None) -> Placement:
    """Assign every DC, switch, host and fibre emulator of `plan` to one machine."""
    if not machines:
        raise InputError("machines", "a cluster needs at least one machine")
    overrides = dict(overrides or {})
    for dc, m in overrides.items():
        if m not in machines:
            raise InputError("--place", f"{dc}={m}: unknown machine {m!r}")
    hosts_of: dict[str, int] = {}
    for h in plan.hosts:
        hosts_of[h.dc] = hosts_of.get(h.dc, 0) + 1
    groups: dict[str, _Group] = {}
    for dc in scenario.dcs:
        g = groups.setdefault(dc.node, _Group(dc.node, [], 0, 0))
        g.dcs.append(dc.name)
        g.hosts += hosts_of.get(dc.name, 0)
        g.gpus += dc.gpus
    fixed: dict[str, str] = {}  # optical node -> machine, from the overrides
    for g in groups.values():
        wanted = {overrides[d] for d in g.dcs if d in overrides}
        if len(wanted) > 1:
            raise InputError("--place", f"DCs {', '.join(g.dcs)} share optical node "
                             f"{g.node!r} and must share a machine")
        if wanted:
            fixed[g.node] = wanted.pop()

    order = {m: i for i, m in enumerate(machines)}
    hosts_load = dict.fromkeys(machines, 0)
    gpus_load = dict.fromkeys(machines, 0)
    where: dict[str, str] = {}
    for node, m in sorted(fixed.items()):
        where[node] = m
        hosts_load[m] += groups[node].hosts
        gpus_load[m] += groups[node].gpus
    free = sorted((g for g in groups.values() if g.node not in fixed),
                  key=lambda g: (-g.hosts, -g.gpus, g.node))
    for g in free:
        m = min(machines, key=lambda x: (hosts_load[x], gpus_load[x], order[x]))
        where[g.node] = m
        hosts_load[m] += g.hosts
        gpus_load[m] += g.gpus

    edges = [(f.u, f.v) for f in plan.fibres]
    roadms = sorted(s.label for s in plan.switches if s.kind == "roadm")
    optical = _with_transit(where, edges, machines, roadms)
    if len(machines) > 1 and len(free) <= MAX_SWAP_GROUPS:
        optical = _swap_pass(where, [g.node for g in free], groups, edges, machines, roadms)

    return _finish(plan, machines, optical, scenario)


def _with_transit(where: Mapping[str, str], edges: Sequence[tuple[str, str]],
                  machines: Sequence[str], roadms: Sequence[str] = ()) -> dict[str, str]:
    """Place optical nodes without a DC where most of their placed neighbours are (in
    rounds, so that chains of transit nodes follow), ties by fewer ROADMs, then order."""
    out = dict(where)
    nodes = sorted({n for e in edges for n in e} | set(roadms))
    adj: dict[str, list[str]] = {n: [] for n in nodes}
    for u, v in edges:
        adj[u].append(v)
        adj[v].append(u)
    order = {m: i for i, m in enumerate(machines)}
    while True:
        todo = [n for n in nodes if n not in out]
        if not todo:
            return out
        progressed = False
        for n in todo:
            votes = [out[x] for x in adj[n] if x in out]
            if not votes:
                continue
            count = {m: votes.count(m) for m in set(votes)}
            roadms = {m: sum(1 for x in out.values() if x == m) for m in machines}
            out[n] = max(count, key=lambda m: (count[m], -roadms[m], -order[m]))
            progressed = True
        if not progressed:  # a component with no DC at all: on the first machine
            out[todo[0]] = machines[0]


def _crossings(optical: Mapping[str, str], edges: Sequence[tuple[str, str]]) -> int:
    return sum(1 for u, v in edges if optical[u] != optical[v])


def _swap_pass(where: dict[str, str], free: Sequence[str], groups: Mapping[str, _Group],
               edges: Sequence[tuple[str, str]], machines: Sequence[str],
               roadms: Sequence[str]) -> dict[str, str]:
    """Swap pairs of free groups on different machines while that removes crossings and
    keeps the most loaded machine's host count (then GPU count) where it was."""

    def peak(w: Mapping[str, str]) -> tuple[int, int]:
        hosts = dict.fromkeys(machines, 0)
        gpus = dict.fromkeys(machines, 0)
        for node, m in w.items():
            hosts[m] += groups[node].hosts
            gpus[m] += groups[node].gpus
        return max(hosts.values()), max(gpus.values())

    cur = _with_transit(where, edges, machines, roadms)
    best_cut, best_peak = _crossings(cur, edges), peak(where)
    improved = True
    while improved and best_cut > 0:
        improved = False
        for i, a in enumerate(free):
            for b in free[i + 1:]:
                if where[a] == where[b]:
                    continue
                trial = dict(where)
                trial[a], trial[b] = where[b], where[a]
                if peak(trial) > best_peak:
                    continue
                optical = _with_transit(trial, edges, machines, roadms)
                cut = _crossings(optical, edges)
                if cut < best_cut:
                    where.clear()
                    where.update(trial)
                    cur, best_cut, improved = optical, cut, True
    return cur


def _finish(plan: EmuPlan, machines: Sequence[str], optical: Mapping[str, str],
            scenario: Scenario) -> Placement:
    """Every plan node's machine, the crossing fibres, the loads; checks that only fibres
    cross machines."""
    dc_machine = {dc.name: optical[dc.node] for dc in scenario.dcs}
    node_machine: dict[str, str] = {}
    for h in plan.hosts:
        node_machine[h.node] = dc_machine[h.dc]
    for s in plan.switches:
        node_machine[s.node] = optical[s.label] if s.kind == "roadm" else dc_machine[s.label]
    crossing = []
    for k, f in enumerate(plan.fibres, start=1):
        node_machine[f.middle] = optical[f.u]
        if optical[f.u] != optical[f.v]:
            crossing.append(CrossingFibre(k, f.u, f.v, f.middle, optical[f.u], optical[f.v],
                                          f.delay_ms, f.rate_mbps))
    for link in plan.links:
        if node_machine[link.a] != node_machine[link.b]:  # a bug here, not bad input
            raise AssertionError(f"link {link.a}-{link.b} would cross machines")
    load = {}
    for m in machines:
        dcs = [d for d in scenario.dcs if dc_machine[d.name] == m]
        load[m] = MachineLoad(
            hosts=sum(1 for h in plan.hosts if node_machine[h.node] == m),
            gpus=sum(d.gpus for d in dcs), dcs=len(dcs),
            switches=sum(1 for s in plan.switches if node_machine[s.node] == m),
            fibre_emulators=sum(1 for f in plan.fibres if node_machine[f.middle] == m))
    return Placement(tuple(machines), machines[0], dc_machine, dict(optical), node_machine,
                     tuple(crossing), load)
