"""Job traffic the core routes: all-reduce flows in the DC fabrics and cross-DC flows on lightpaths.

`TrafficControl` holds the per-flow routing of registered all-reduce jobs inside the DC
fabrics (`controllers.flowjobs.FlowRouting`) and the assignment of the running jobs'
cross-DC flows to the live lightpaths (`controllers.wanroute.WanRouting`), and gives the
rules both want. The job services add their flows' sources (`wan_sources`, e.g.
JobService.wan_flows). Not thread-safe: the core calls it under its lock and installs
what changed. No os-ken, no emulator import.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from controllers.errors import RequestError
from controllers.flowjobs import FlowRouting, RoutingError
from controllers.flowroute import GroupRule, fabric_link_of_port, without_failed
from controllers.metrics import ControllerMetrics
from controllers.rules import FlowRule, LayoutIndex
from controllers.store import LightpathRow
from controllers.wanroute import WanFlow, WanLightpath, WanRouting, wan_rules

ROUTING_CALLS = ("register", "unregister", "set_policy")


def wan_lightpaths(ix: LayoutIndex | None, rows: Iterable[LightpathRow]) -> list[WanLightpath]:
    """Live lightpaths between two DCs of the layout (candidates for job flows), by id."""
    if ix is None:
        return []
    return [WanLightpath(r.id, r.vid, r.src_dc, r.dst_dc, r.capacity_gbps)
            for r in sorted(rows, key=lambda r: r.id)
            if r.src_dc in ix.edge and r.dst_dc in ix.edge]


class TrafficControl:
    """Fabric flow routing, the WAN lightpath assignment, and the fabric ports' state."""

    def __init__(self, metrics: ControllerMetrics, policy: str, seed: int,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.flows = FlowRouting(metrics, policy=policy, seed=seed, clock=clock)
        # Which lightpath each cross-DC job flow takes; sources beside the fabric's own
        # all-reduce rings (e.g. JobService.wan_flows: pipeline stage-to-stage transfers).
        self.wan = WanRouting(metrics, clock=clock)
        self.wan_sources: list[Callable[[], list[WanFlow]]] = []
        self.fabric_port_up: dict[tuple[int, int], bool] = {}

    # ---- layout -----------------------------------------------------------------------
    def check_layout(self, ix: LayoutIndex) -> None:
        """ValueError if a registered routing job's host is not in the new layout."""
        for job in self.flows.jobs.values():
            missing = [m for m in job.members if m not in ix.hosts]
            if missing:
                raise ValueError(f"routing job {job.id}: host {missing[0]} is not in "
                                 "the new layout")

    def relayout(self, ix: LayoutIndex) -> None:
        """A new layout adopted: switch names may have changed, so route afresh."""
        if self.flows.jobs:
            self.flows.paths.clear()
            self.flows.reroute(ix, "layout")

    # ---- rules ------------------------------------------------------------------------
    def fabric(self, ix: LayoutIndex) -> LayoutIndex:
        """The layout without the failed fabric links (what the fabric rules route on)."""
        return without_failed(ix, self.flows.failed)

    def rules(self, fabric: LayoutIndex,
              vids: Mapping[int, int]) -> list[FlowRule | GroupRule]:
        """The flows' rules and groups, then the WAN flows' rules for the live lightpaths
        (`vids`: lightpath id -> VLAN id), on `fabric` (see `fabric`)."""
        rules, groups = self.flows.rules(fabric)
        live = {f: lp for f, lp in self.wan.assignment.items() if lp in vids}
        return [*groups, *rules, *wan_rules(fabric, vids, live)]

    def reassign(self, ix: LayoutIndex | None, rows: Iterable[LightpathRow]) -> bool:
        """Assign the running jobs' cross-DC flows to lightpaths if anything changed."""
        if ix is None:
            return False
        rows = list(rows)
        sources = [self.flows.wan_flows(ix)] + [src() for src in self.wan_sources]
        flows = [f for got in sources for f in got if f.src in ix.hosts and f.dst in ix.hosts]
        host_dc = {h: ix.hosts[h].dc for f in flows for h in (f.src, f.dst)}
        return self.wan.update(self.flows.policy, self.flows.seed, flows,
                               wan_lightpaths(ix, rows), host_dc)

    # ---- changes and views ------------------------------------------------------------
    def call(self, ix: LayoutIndex, what: str, *args: Any) -> dict[str, Any]:
        """A FlowRouting change (register, unregister, set_policy) and its view;
        RequestError for bad input. The caller installs the resulting rules (and adds
        the WAN view to set_policy's, after its re-assignment)."""
        if what not in ROUTING_CALLS:
            raise ValueError(f"unknown routing call {what!r}")
        try:
            out = getattr(self.flows, what)(ix, *args)
        except RoutingError as exc:
            raise RequestError(400 if "unknown routing policy" in str(exc) else 422,
                               str(exc)) from None
        except KeyError as exc:
            raise RequestError(404, f"no routing job {exc.args[0]}") from None
        return dict(out)

    def view(self) -> dict[str, Any]:
        return {**self.flows.view(), "wan": self.wan.view()}

    def port_status(self, ix: LayoutIndex, dpid: int, port: int,
                    up: bool) -> tuple[str, str, bool] | None:
        """A PortStatus on a switch port: for a fabric port, its link's ends and whether
        the link is up now (down while either end is down; the two ends report
        separately, in any order); None for other ports."""
        ports = fabric_link_of_port(ix)
        link = ports.get((dpid, port))
        if link is None:
            return None
        self.fabric_port_up[(dpid, port)] = up
        ends = [e for e, lk in ports.items() if lk == link]
        return link[0], link[1], all(self.fabric_port_up.get(e, True) for e in ends)
