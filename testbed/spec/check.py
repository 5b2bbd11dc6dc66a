"""Cross-field checks of a parsed scenario (names exist, capacities fit, graph connected)."""

from __future__ import annotations

import networkx as nx

from testbed.catalog import MODELS
from testbed.errors import SpecError
from testbed.spec.models import DCSpec, EventSpec, PPJobsWorkload, Scenario
from testbed.topologies import Fibre, Topology, load_file, load_library


def topology_of(scenario: Scenario) -> Topology:
    """The scenario's topology as plain data (library, CSV file or explicit links)."""
    t = scenario.topology
    if t.library is not None:
        return load_library(t.library)
    if t.file is not None:
        return load_file(t.file)
    assert t.links is not None
    nodes: dict[str, None] = dict.fromkeys(t.nodes or [])
    seen: set[frozenset[str]] = set()
    fibres = []
    for i, link in enumerate(t.links):
        key = frozenset((link.u, link.v))
        if key in seen:
            raise SpecError(f"topology.links[{i}]", f"duplicate fibre {link.u}-{link.v}")
        seen.add(key)
        for end, field in ((link.u, "u"), (link.v, "v")):
            if t.nodes is not None and end not in nodes:
                raise SpecError(f"topology.links[{i}].{field}",
                                f"node {end!r} is not in topology.nodes")
            nodes.setdefault(end)
        fibres.append(Fibre(link.u, link.v, link.length_km))
    return Topology(name=scenario.name, nodes=tuple(nodes), fibres=tuple(fibres),
                    source="explicit links in the scenario")


def dc_host_count(scenario: Scenario, dc: DCSpec) -> int:
    """Emulated hosts of a DC: leaves x hosts_per_leaf (leaf-spine in blocks), else the
    DC's `hosts` or emulation.hosts_per_dc."""
    emu = scenario.emulation
    ls = emu.leaf_spine
    if emu.dc_fabric == "leaf_spine" and ls.hosts_per_leaf is not None:
        return ls.leaves * ls.hosts_per_leaf
    return dc.hosts or emu.hosts_per_dc


def model_names(workload: PPJobsWorkload) -> set[str]:
    return set(MODELS) | {m.name for m in workload.models}


def check_scenario(scenario: Scenario) -> Topology:
    """Raise SpecError (with a field path) for the first cross-field problem; return topology."""
    topo = topology_of(scenario)
    graph = topo.graph()
    node_set = set(topo.nodes)

    seen_names: dict[str, int] = {}
    seen_nodes: dict[str, int] = {}
    for i, dc in enumerate(scenario.dcs):
        if dc.name in seen_names:
            raise SpecError(f"dcs[{i}].name",
                            f"duplicate DC name {dc.name!r} (also dcs[{seen_names[dc.name]}])")
        seen_names[dc.name] = i
        if dc.node not in node_set:
            raise SpecError(f"dcs[{i}].node", f"unknown node {dc.node!r} "
                            f"(topology {topo.name} has {topo.node_range()})")
        if dc.node in seen_nodes:
            raise SpecError(f"dcs[{i}].node", f"node {dc.node!r} already hosts "
                            f"dcs[{seen_nodes[dc.node]}]; one DC per optical node")
        seen_nodes[dc.node] = i

    fibres = {frozenset((f.u, f.v)) for f in topo.fibres}
    for i, ev in enumerate(scenario.events):
        if ev.kind == "worker_kill":
            _check_worker_kill(scenario, i, ev)
        if ev.link is None:
            continue
        if ev.link[0] not in node_set or ev.link[1] not in node_set \
                or frozenset(ev.link) not in fibres:
            raise SpecError(f"events[{i}].link", f"no fibre {ev.link[0]}-{ev.link[1]} "
                            f"in topology {topo.name}")
        if ev.first_slot is not None and ev.slots is not None:
            limit = _spectrum_units(scenario)
            if ev.first_slot + ev.slots > limit:
                raise SpecError(f"events[{i}].slots", f"slots {ev.first_slot}.."
                                f"{ev.first_slot + ev.slots - 1} exceed the grid (0..{limit - 1})")

    opt = scenario.optical
    if opt.guard_slots >= opt.slots and opt.grid == "flex":
        raise SpecError("optical.guard_slots", "must be smaller than optical.slots")

    wl = scenario.workload
    if wl.kind == "lightpath_requests":
        endpoints = [dc.node for dc in scenario.dcs] if wl.endpoints == "dcs" else list(node_set)
        if len(endpoints) < 2:
            path = "dcs" if wl.endpoints == "dcs" else "topology"
            raise SpecError(path, "lightpath requests need at least two endpoints")
        _check_connected(graph, endpoints, topo.name)
    elif wl.kind == "allreduce_jobs":
        _check_allreduce(scenario)
    else:
        if not scenario.dcs:
            raise SpecError("dcs", "pp_jobs workloads need at least one DC")
        known = model_names(wl)
        total_gpus = sum(dc.gpus for dc in scenario.dcs)
        for i, tmpl in enumerate(wl.mix):
            if tmpl.model not in known:
                raise SpecError(f"workload.mix[{i}].model", f"unknown model {tmpl.model!r} "
                                f"(known: {', '.join(sorted(known))})")
            need = tmpl.stages * tmpl.gpus_per_stage
            if need > total_gpus:
                raise SpecError(f"workload.mix[{i}]", f"needs {need} GPUs "
                                f"but the DCs have {total_gpus} in total")
        dup = {m.name for m in wl.models} & set(MODELS)
        if dup:
            raise SpecError("workload.models", f"model {sorted(dup)[0]!r} is already in the "
                            "catalogue; choose another name")
        if len(scenario.dcs) > 1:
            _check_connected(graph, [dc.node for dc in scenario.dcs], topo.name)
    return topo


def _check_allreduce(scenario: Scenario) -> None:
    """allreduce_jobs: a leaf-spine fabric, every member an emulated host, hosts fit."""
    emu = scenario.emulation
    if emu.dc_fabric != "leaf_spine":
        raise SpecError("emulation.dc_fabric", "allreduce_jobs routes flows through a DC "
                        "fabric: set dc_fabric: leaf_spine")
    if emu.leaf_spine.hosts_per_leaf is None:
        raise SpecError("emulation.leaf_spine.hosts_per_leaf", "allreduce_jobs needs the "
                        "hosts of each leaf (hosts_per_leaf)")
    known: dict[str, str] = {}
    for i, dc in enumerate(scenario.dcs):
        n = dc_host_count(scenario, dc)
        if dc.hosts is not None and emu.leaf_spine.hosts_per_leaf is not None and dc.hosts != n:
            raise SpecError(f"dcs[{i}].hosts", f"{dc.hosts} hosts, but leaves x hosts_per_leaf "
                            f"= {n}")
        known.update({f"{dc.name}-h{k}": dc.name for k in range(n)})
    wl = scenario.workload
    from testbed.spec.models import ROUTING_POLICIES  # = testbed.routing's registry (tested)

    for k, policy in enumerate(getattr(wl, "policies", [])):
        if policy not in ROUTING_POLICIES:
            raise SpecError(f"workload.policies[{k}]", f"unknown routing policy {policy!r} "
                            f"(known: {', '.join(ROUTING_POLICIES)})")
    for j, job in enumerate(getattr(wl, "jobs", [])):
        for m in job.members:
            if m not in known:
                raise SpecError(f"workload.jobs[{j}].members", f"unknown host {m!r} (hosts are "
                                "<dc>-h0, <dc>-h1, ...)")


def _spectrum_units(scenario: Scenario) -> int:
    opt = scenario.optical
    return opt.wavelengths if opt.grid == "fixed" and opt.wavelengths else opt.slots


def _check_connected(graph: nx.Graph, endpoints: list[str], name: str) -> None:
    comp = nx.node_connected_component(graph, endpoints[0])
    cut_off = sorted(set(endpoints) - comp)
    if cut_off:
        raise SpecError("topology", f"disconnected: node {cut_off[0]!r} cannot reach "
                        f"{endpoints[0]!r} in topology {name}")


def _check_worker_kill(scenario: Scenario, i: int, ev: EventSpec) -> None:
    """A worker_kill needs pipeline workers, a job the run emulates and a stage it has."""
    wl = scenario.workload
    if wl.kind != "pp_jobs":
        raise SpecError(f"events[{i}].kind", f"worker_kill needs a pp_jobs workload "
                        f"(pipeline workers), not {wl.kind}")
    max_jobs = scenario.emulation.max_jobs
    if isinstance(ev.job, int) and ev.job >= max_jobs:
        raise SpecError(f"events[{i}].job", f"job index {ev.job} outside the emulated jobs "
                        f"(emulation.max_jobs: {max_jobs}, so 0..{max_jobs - 1})")
    assert isinstance(wl, PPJobsWorkload) and ev.stage is not None
    if wl.mix and wl.trace is None:
        most = max(t.stages for t in wl.mix)
        if ev.stage >= most:
            raise SpecError(f"events[{i}].stage", f"stage {ev.stage} outside the jobs' "
                            f"stages (the mix has at most {most}: 0..{most - 1})")
