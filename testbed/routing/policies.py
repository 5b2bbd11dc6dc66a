"""Routing policy registry and `route(policy, graph, flows, current)` -> one path per flow."""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import networkx as nx

from testbed.errors import InputError
from testbed.routing.flows import Flow
from testbed.routing.instance import Fabric, Instance


@dataclass
class Routing:
    """One path (node tuple, source host to destination host) per flow id."""

    paths: dict[str, tuple[str, ...]]
    policy: str
    wall_s: float
    info: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Context:
    """What every policy gets besides the instance."""

    current: tuple[int | None, ...]
    seed: int
    time_budget_s: float
    max_moves: int | None


PolicyFn = Callable[[Instance, Context], tuple[list[int], dict]]


@dataclass(frozen=True)
class RoutingPolicy:
    """A registered routing policy and what it does."""

    name: str
    fn: PolicyFn
    description: str


def ecmp_port(flow: Flow) -> int:
    """The flow's source port (ephemeral range), fixed by its id as a socket's would be."""
    return 32768 + zlib.crc32(flow.id.encode()) % 28232


def ecmp_index(flow: Flow, n_paths: int, seed: int, dport: int = 29500) -> int:
    """ECMP as a switch does it: a hash of the 5-tuple (plus the switch's seed) modulo
    the number of equal-cost next hops. Deterministic for a seed."""
    key = f"{seed}|{flow.src}|{flow.dst}|{ecmp_port(flow)}|{dport}|6".encode()
    return zlib.crc32(key) % n_paths


def _keep_current(inst: Instance, ctx: Context) -> list[int | None]:
    return list(ctx.current)


def _ecmp(inst: Instance, ctx: Context) -> tuple[list[int], dict]:
    return [ecmp_index(f, n, ctx.seed) for f, n in zip(inst.flows, inst.n_cands,
                                                       strict=True)], {}


def _shortest(inst: Instance, ctx: Context) -> tuple[list[int], dict]:
    return [0] * len(inst.flows), {}


def _coloring(inst: Instance, ctx: Context) -> tuple[list[int], dict]:
    from testbed.routing.coloring import edge_coloring
    return edge_coloring(inst), {}


def _guard(inst: Instance, ctx: Context, choice: list[int], info: dict) -> list[int]:
    """Never return worse than the status quo: the routing in force where it covers every
    flow, else what ECMP would do. The paper's greedy falls below ECMP in a few instances
    (about 0.2 % of random small Clos instances, docs/routing.md); the guard costs two
    max-min fillings, none where `Instance.unbeatable` shows that greedy's routing has the
    best metric any routing can have (every flow at its host links' rate)."""
    if inst.unbeatable(choice):  # no routing's metric is better: nothing to compare
        return choice
    if all(c is not None for c in ctx.current) and ctx.current:
        base, name = [int(c) for c in ctx.current], "current"  # type: ignore[arg-type]
    else:
        base, name = _ecmp(inst, ctx)[0], "ecmp"
    if inst.full_key(base) > inst.full_key(choice):
        info["guard"] = name
        return base
    return choice


def _greedy(inst: Instance, ctx: Context) -> tuple[list[int], dict]:
    from testbed.routing.greedy import greedy
    info: dict = {}
    return _guard(inst, ctx, greedy(inst, _keep_current(inst, ctx)), info), info


def _greedy_ls(inst: Instance, ctx: Context) -> tuple[list[int], dict]:
    from testbed.routing.coloring import edge_coloring
    from testbed.routing.greedy import greedy, iterated_local_search, local_search
    info: dict = {}
    start = _guard(inst, ctx, greedy(inst, _keep_current(inst, ctx)), info)
    source = "greedy" if "guard" not in info else info["guard"]
    if all(c is None for c in ctx.current):  # from scratch: also try the colouring start
        alt = edge_coloring(inst)
        if inst.full_key(alt) > inst.full_key(start):
            start, source = alt, "edge-coloring"
    if ctx.max_moves is not None:  # churn-bounded: plain hill climbing, no kicks
        out, moves = local_search(inst, start, time_budget_s=ctx.time_budget_s,
                                  max_moves=ctx.max_moves)
        return out, {"start": source, "local_moves": moves}
    out, kicks, gains = iterated_local_search(inst, start, seed=ctx.seed,
                                              time_budget_s=ctx.time_budget_s)
    return out, {"start": source, "kicks": kicks, "improving_kicks": gains}


def _sa(inst: Instance, ctx: Context) -> tuple[list[int], dict]:
    from testbed.routing.sa import anneal
    start = [c if c is not None else ecmp_index(f, inst.n_cands[i], ctx.seed)
             for i, (f, c) in enumerate(zip(inst.flows, ctx.current, strict=True))]
    return anneal(inst, start, seed=ctx.seed, time_budget_s=ctx.time_budget_s,
                  max_moves=ctx.max_moves or 20000)


def _ilp(inst: Instance, ctx: Context) -> tuple[list[int], dict]:
    from testbed.routing.greedy import greedy, local_search
    from testbed.routing.ilp import solve
    choice, info = solve(inst, time_budget_s=ctx.time_budget_s, hint=greedy(inst))
    # the ILP fixes the first criteria exactly; strictly improving moves (which keep them)
    # then raise the remaining jobs' and flows' rates
    choice, moves = local_search(inst, choice, time_budget_s=min(1.0, ctx.time_budget_s))
    info["polish_moves"] = moves
    return choice, info


POLICIES: dict[str, RoutingPolicy] = {p.name: p for p in (
    RoutingPolicy("ecmp", _ecmp, "per-flow 5-tuple hash over the equal-cost paths (seeded)"),
    RoutingPolicy("shortest", _shortest, "one fixed shortest path per host pair "
                  "(the first spine): single-path routing"),
    RoutingPolicy("edge-coloring", _coloring, "bipartite edge colouring of leaf-to-leaf "
                  "flows, one colour per spine"),
    RoutingPolicy("greedy", _greedy, "the paper's greedy: flows placed one by one on the "
                  "path keeping the metric highest (never worse than ECMP / the routing in "
                  "force)"),
    RoutingPolicy("greedy-ls", _greedy_ls, "greedy (or the edge colouring, if better), then "
                  "local search: single-flow moves and two-flow ejection chains while the "
                  "metric improves, random kicks while time is left (seeded); bounded by "
                  "time and max_moves"),
    RoutingPolicy("sa", _sa, "simulated annealing on the metric from ECMP (seeded, "
                  "bounded by time and max_moves)"),
    RoutingPolicy("ilp", _ilp, "exact optimum of the bottleneck (HiGHS), then fewest jobs "
                  "at it, then local-search polish; small instances; proven gap reported"),
)}

# Policies that start from the current routing (keep valid paths) rather than from scratch.
INCREMENTAL = ("greedy", "greedy-ls", "sa")


def policy_names() -> list[str]:
    return list(POLICIES)


def get_policy(name: str) -> RoutingPolicy:
    """Look a policy up by name; the error lists the valid names."""
    pol = POLICIES.get(name)
    if pol is None:
        raise InputError("policy", f"unknown routing policy {name!r}; valid: "
                         f"{', '.join(POLICIES)}")
    return pol


def route(policy: str, graph: nx.DiGraph, flows: Sequence[Flow],
          current: Mapping[str, Sequence[str]] | None = None, *, seed: int = 0,
          time_budget_s: float | None = None, max_moves: int | None = None,
          instance: Instance | None = None, fabric: Fabric | None = None) -> Routing:
    """One path per flow by `policy`. `current` (flow id -> path) is the routing in force:
    incremental policies keep its paths that are still candidates; others ignore it.
    `time_budget_s` bounds sa, greedy-ls and ilp (defaults 1 s, 1 s, 10 s); `max_moves`
    bounds their moves. `fabric` (a `Fabric` of this graph) saves compiling the graph
    again. Wall time and policy details are in the result."""
    pol = get_policy(policy)
    if time_budget_s is None:
        time_budget_s = 10.0 if pol.name == "ilp" else 1.0
    if time_budget_s <= 0:
        raise InputError("time_budget_s", f"must be > 0, got {time_budget_s}")
    if max_moves is not None and max_moves < 0:
        raise InputError("max_moves", f"must be >= 0, got {max_moves}")
    t0 = time.perf_counter()
    if not (instance.flows if instance is not None else flows):
        return Routing({}, pol.name, time.perf_counter() - t0, {})
    inst = instance if instance is not None else Instance(graph, flows, fabric)
    cur = inst.choice_of(current) if pol.name in INCREMENTAL else [None] * len(inst.flows)
    ctx = Context(tuple(cur), int(seed), float(time_budget_s), max_moves)
    choice, info = pol.fn(inst, ctx)
    return Routing(inst.paths_of(choice), pol.name, time.perf_counter() - t0, info)
