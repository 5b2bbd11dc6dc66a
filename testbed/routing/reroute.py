"""Event-driven re-routing: jobs arrive and leave, links fail and recover; churn counted."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

import networkx as nx

from testbed.errors import InputError
from testbed.routing.flows import Flow, Job, job_flows
from testbed.routing.instance import Fabric, Instance
from testbed.routing.policies import Routing, get_policy, route
from testbed.routing.topology import copy_graph

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RerouteResult:
    """The routing after an event, flows that changed path (churn) and flows the event
    forced off their path (a failed link on it)."""

    routing: Routing
    moved: int
    hit: tuple[str, ...]
    wall_s: float


class Rerouter:
    """Keeps the job set, the failed links and the routing in force; every event
    recomputes the routing with `policy` from the current one. With `max_moves`, at most
    that many flows that could stay move (flows of new jobs and flows on a failed link
    always get a path), the moves that improve the metric most first."""

    def __init__(self, graph: nx.DiGraph, policy: str = "greedy", *, seed: int = 0,
                 max_moves: int | None = None, time_budget_s: float | None = None) -> None:
        get_policy(policy)
        if max_moves is not None and max_moves < 0:
            raise InputError("max_moves", f"must be >= 0, got {max_moves}")
        self.base = graph
        self.policy = policy
        self.seed = seed
        self.max_moves = max_moves
        self.time_budget_s = time_budget_s
        self.failed: set[frozenset[str]] = set()
        self.jobs: dict[str, Job] = {}
        self.paths: dict[str, tuple[str, ...]] = {}
        self._fabric: Fabric | None = None  # compiled live fabric, dropped on link events

    @property
    def graph(self) -> nx.DiGraph:
        """The fabric without its failed links."""
        return self.fabric.graph

    @property
    def fabric(self) -> Fabric:
        if self._fabric is None:
            g = copy_graph(self.base)
            for link in self.failed:
                u, v = tuple(link)
                for a, b in ((u, v), (v, u)):
                    if g.has_edge(a, b):
                        g.remove_edge(a, b)
            self._fabric = Fabric(g)
        return self._fabric

    @property
    def flows(self) -> list[Flow]:
        return [f for j in self.jobs.values() for f in job_flows(j)]

    def add_job(self, job: Job) -> RerouteResult:
        if job.name in self.jobs:
            raise InputError("job", f"job {job.name!r} is already running")
        self.jobs[job.name] = job
        return self.reroute()

    def remove_job(self, name: str) -> RerouteResult:
        if self.jobs.pop(name, None) is None:
            raise InputError("job", f"no job {name!r}; running: {', '.join(self.jobs) or 'none'}")
        return self.reroute()

    def fail_link(self, u: str, v: str) -> RerouteResult:
        if not self.base.has_edge(u, v):
            raise InputError("link", f"no link {u}-{v} in the fabric")
        self.failed.add(frozenset((u, v)))
        self._fabric = None
        return self.reroute()

    def recover_link(self, u: str, v: str) -> RerouteResult:
        if frozenset((u, v)) not in self.failed:
            raise InputError("link", f"link {u}-{v} has not failed")
        self.failed.discard(frozenset((u, v)))
        self._fabric = None
        return self.reroute()

    def reroute(self, full: bool = False) -> RerouteResult:
        """Recompute the routing for the current jobs and links (also the periodic step).
        `full`: from scratch, ignoring the routing in force (then `max_moves` bounds how
        many flows that could stay actually move)."""
        t0 = time.perf_counter()
        fabric = self.fabric
        g = fabric.graph
        flows = self.flows
        down = {tuple(sorted(x)) for x in self.failed}
        old = {f.id: self.paths[f.id] for f in flows if f.id in self.paths}
        hit = tuple(fid for fid, p in old.items()
                    if any(tuple(sorted((p[i], p[i + 1]))) in down for i in range(len(p) - 1)))
        inst = Instance(g, flows, fabric)
        new = route(self.policy, g, flows, current=None if full else old, seed=self.seed,
                    time_budget_s=self.time_budget_s, max_moves=self.max_moves,
                    instance=inst).paths
        if self.max_moves is not None:
            new = _limit_churn(inst, old, new, set(hit), self.max_moves)
        moved = sum(1 for fid, p in old.items() if new[fid] != p)
        self.paths = dict(new)
        wall = time.perf_counter() - t0
        log.debug("reroute %s: %d flows, %d moved, %d hit, %.3f s", self.policy, len(flows),
                  moved, len(hit), wall)
        return RerouteResult(Routing(dict(new), self.policy, wall), moved, hit, wall)


def _limit_churn(inst: Instance, old: dict[str, tuple[str, ...]],
                 new: dict[str, tuple[str, ...]], hit: set[str], max_moves: int
                 ) -> dict[str, tuple[str, ...]]:
    """Keep old paths except where forced (new flows, flows hit), then apply at most
    `max_moves` of the policy's other changes, best metric gain first, while they help."""
    out = {fid: (p if fid in hit or fid not in old else old[fid]) for fid, p in new.items()}
    optional = [fid for fid in new if fid in old and fid not in hit and new[fid] != old[fid]]
    if len(optional) <= max_moves:
        return dict(new)
    choice = inst.choice_of(out)
    key = inst.full_key(choice)  # type: ignore[arg-type]
    for _ in range(max_moves):
        best: tuple[tuple, str] | None = None
        for fid in optional:
            i = inst.pos[fid]
            prev = choice[i]
            choice[i] = inst.cands[i].index(new[fid])
            k = inst.full_key(choice)  # type: ignore[arg-type]
            choice[i] = prev
            if k > key and (best is None or k > best[0]):
                best = (k, fid)
        if best is None:
            break
        key, fid = best
        choice[inst.pos[fid]] = inst.cands[inst.pos[fid]].index(new[fid])
        out[fid] = new[fid]
        optional.remove(fid)
    return out


def moved_flows(old: dict[str, Sequence[str]], new: dict[str, Sequence[str]]) -> list[str]:
    """Flow ids present in both routings whose path differs."""
    return [fid for fid, p in old.items() if fid in new and tuple(new[fid]) != tuple(p)]
