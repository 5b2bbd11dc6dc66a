"""Per-flow routing of registered all-reduce jobs in the DC fabrics (controller state).

Jobs are registered with their members in ring order (`POST /routing/jobs`); each ring
gives one flow per member (member i -> member i+1, a host pair). On every change (job
arrival or departure, fabric link failure or repair, policy change) the flows are
re-routed together by the active policy of `testbed.routing` and the controller installs
the resulting per-flow rules (controllers.flowroute). Policy `ecmp` installs OVS select
groups instead (the switches hash each connection's 5-tuple) plus per-pair counting
rules on the spines. Pure: no os-ken; the core calls it under its lock.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from controllers.flowroute import (
    GroupRule,
    counting_rules,
    ecmp_rules,
    link_key,
    path_rules,
    routing_graph,
)
from controllers.metrics import ControllerMetrics
from controllers.rules import FlowRule, LayoutIndex
from controllers.wanroute import WanFlow
from testbed.errors import InputError
from testbed.routing.paths import FlowKey, ring_flow_bytes, ring_keys, route_paths

log = logging.getLogger("lightpipe.controller.routing")

ECMP = "ecmp"


class RoutingError(ValueError):
    """A request the flow router refuses (unknown host, policy, link; host reused)."""


@dataclass
class AllreduceJob:
    id: int
    members: tuple[str, ...]
    buffer_bytes: int

    def flows(self) -> list[FlowKey]:
        return ring_keys(self.members, self.id)

    def flow_bytes(self) -> float:
        """Bytes each ring flow carries per all-reduce: 2 (n-1)/n of the buffer."""
        return ring_flow_bytes(self.members, self.buffer_bytes)


def known_policies() -> list[str]:
    """Policies the controller accepts: testbed.routing's registry (ecmp = select groups)."""
    try:
        from testbed.routing.policies import POLICIES
    except ImportError:  # the routing package is not part of this build
        return [ECMP]
    return sorted(set(POLICIES) | {ECMP})


class FlowRouting:
    """Registered jobs, the active policy, the current paths and the failed fabric links."""

    def __init__(self, metrics: ControllerMetrics, policy: str = ECMP, seed: int = 1,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.metrics = metrics
        self.policy = policy
        self.seed = seed
        self.clock = clock
        self.jobs: dict[int, AllreduceJob] = {}
        self.paths: dict[FlowKey, tuple[str, ...]] = {}
        self.rates_gbps: dict[FlowKey, float] = {}
        self.failed: set[frozenset[str]] = set()
        self.last: dict[str, Any] = {}
        self.reroutes = 0
        self.intra: set[FlowKey] = set()  # flows inside one DC (routed here)

    # ---- changes ------------------------------------------------------------------------
    def register(self, ix: LayoutIndex, members: list[str], buffer_bytes: int) -> dict[str, Any]:
        if len(members) < 2 or len(set(members)) != len(members):
            raise RoutingError("members: give at least two distinct hosts")
        busy = {m: j.id for j in self.jobs.values() for m in j.members}
        for m in members:
            h = ix.hosts.get(m)
            if h is None:
                raise RoutingError(f"unknown host {m!r}")
            if m in busy:
                raise RoutingError(f"host {m} is in job {busy[m]} already")
        # Members may span DCs: the cross-DC ring flows are assigned to lightpaths
        # (controllers.wanroute, `wan_flows`), the rest routed in the DC fabrics here.
        job = AllreduceJob(max(self.jobs, default=0) + 1, tuple(members), buffer_bytes)
        self.jobs[job.id] = job
        self.reroute(ix, "arrival")
        return self.job_view(job)

    def unregister(self, ix: LayoutIndex, job_id: int) -> dict[str, Any]:
        job = self.jobs.pop(job_id, None)
        if job is None:
            raise KeyError(job_id)
        self.reroute(ix, "departure")
        return self.job_view(job)

    def set_policy(self, ix: LayoutIndex, policy: str) -> dict[str, Any]:
        if policy not in known_policies():
            raise RoutingError(f"unknown routing policy {policy!r} "
                               f"(known: {', '.join(known_policies())})")
        self.policy = policy
        self.paths.clear()  # a fresh start: moves are not counted across policies
        self.reroute(ix, "policy")
        return self.view()

    def set_link(self, ix: LayoutIndex, a: str, b: str, up: bool) -> bool:
        """A fabric link went down or up; re-route if that changed anything."""
        key = link_key(a, b)
        if (key not in self.failed) == up:
            return False
        if up:
            self.failed.discard(key)
        else:
            self.failed.add(key)
        self.reroute(ix, "repair" if up else "failure")
        return True

    # ---- routing ------------------------------------------------------------------------
    def reroute(self, ix: LayoutIndex, reason: str) -> dict[str, Any]:
        """Route every flow with the active policy; count the flows that moved."""
        t0 = self.clock()
        keys = [k for j in sorted(self.jobs) for k in self.jobs[j].flows()
                if ix.hosts[k[1]].dc == ix.hosts[k[2]].dc]
        self.intra = set(keys)
        old = self.paths
        if self.policy == ECMP or not keys:
            new: dict[FlowKey, tuple[str, ...]] = {}
            rates: dict[FlowKey, float] = {}
        else:
            new, rates = self._route(ix, keys)
        moved = sum(1 for k, p in new.items() if k in old and old[k] != p)
        dt = self.clock() - t0
        self.paths, self.rates_gbps = new, rates
        self.reroutes += 1
        self.last = {"reason": reason, "policy": self.policy, "moved": moved,
                     "flows": len(keys), "computation_s": dt}
        m = self.metrics
        m.routing_moved.labels(policy=self.policy).inc(moved)
        m.routing_reroutes.labels(policy=self.policy, reason=reason).inc()
        m.routing_seconds.labels(policy=self.policy).observe(dt)
        m.routing_bottleneck.clear()
        for job in self.jobs.values():
            b = self.bottleneck_gbps(job)
            if b is not None:
                m.routing_bottleneck.labels(policy=self.policy,
                                            allreduce_job=str(job.id)).set(b * 1e9 / 8)
        log.info("re-route (%s, %s): %d flows, %d moved, %.1f ms", reason, self.policy,
                 len(keys), moved, dt * 1e3)
        return self.last

    def _route(self, ix: LayoutIndex,
               keys: list[FlowKey]) -> tuple[dict[FlowKey, tuple[str, ...]], dict[FlowKey, float]]:
        from testbed.emu.priority import compute_thread

        graph = routing_graph(ix, self.failed)
        demand = {j: job.flow_bytes() for j, job in self.jobs.items()}
        try:
            with compute_thread():  # a policy's search may take seconds: not in SCHED_RR
                paths, rates, _ = route_paths(self.policy, graph, keys, demand,
                                              seed=self.seed, current=self.paths)
        except InputError as exc:  # e.g. a host cut off by failures
            raise RoutingError(str(exc)) from None
        return paths, rates

    def wan_flows(self, ix: LayoutIndex | None) -> list[WanFlow]:
        """The ring flows between two DCs (members spanning DCs), for the lightpath
        assignment."""
        if ix is None:
            return []
        return [WanFlow(j, s, d, "allreduce") for job in self.jobs.values()
                for j, s, d in job.flows()
                if s in ix.hosts and d in ix.hosts and ix.hosts[s].dc != ix.hosts[d].dc]

    def bottleneck_gbps(self, job: AllreduceJob) -> float | None:
        """The slowest max-min rate of the job's flows inside the DC fabrics (cross-DC
        flows: GET /routing `wan`)."""
        rates = [self.rates_gbps.get(k) for k in job.flows() if k in self.intra]
        if not rates or any(r is None for r in rates):
            return None
        return min(r for r in rates if r is not None)

    # ---- rules and views ---------------------------------------------------------------
    def rules(self, ix: LayoutIndex) -> tuple[list[FlowRule], list[GroupRule]]:
        """What to install for the flows (ix: the index without failed links)."""
        if self.policy == ECMP:
            rules, groups = ecmp_rules(ix)
            pairs = [(s, d) for j in self.jobs.values() for _, s, d in j.flows()]
            pairs += [(d, s) for s, d in pairs]  # both directions: what each carries
            return rules + counting_rules(ix, pairs), groups
        flows = [(s, d, p) for (_, s, d), p in sorted(self.paths.items())]
        return path_rules(ix, flows), []

    def job_view(self, job: AllreduceJob) -> dict[str, Any]:
        b = self.bottleneck_gbps(job)
        return {"id": job.id, "members": list(job.members), "buffer_bytes": job.buffer_bytes,
                "flow_bytes": job.flow_bytes(), "bottleneck_gbps": b,
                "flows": [{"src": s, "dst": d, "path": list(self.paths[(j, s, d)])
                           if (j, s, d) in self.paths else None,
                           "rate_gbps": self.rates_gbps.get((j, s, d))}
                          for j, s, d in job.flows()]}

    def view(self) -> dict[str, Any]:
        return {"policy": self.policy, "seed": self.seed,
                "jobs": [self.job_view(j) for j in self.jobs.values()],
                "failed_links": sorted(sorted(k) for k in self.failed),
                "reroutes": self.reroutes, "last": self.last}
