"""Controller core: optical state, lightpath set-up and tear-down, the rules they need (no os-ken).

The os-ken app and the REST API call this; it calls the same optical layer as the
simulator (`OpticalNetwork.from_scenario`, `allocate_or_reason`, `fail_link`,
`block_slots`), keeps the state in SQLite, and pushes the resulting flow rules through a
`Southbound` (the app: FlowMods + barrier) and per-lightpath capacities through a
`CapacityChannel` (the fibre emulators' control sockets, controllers.channels).

`ControllerCore` owns the lock and the wiring; its parts, each a small class the core
calls under the lock:
- `controllers.lightpaths.LightpathBook`: the live lightpaths, ids, VLAN ids, views;
- `controllers.backups.Backups`: protection (backup routes, deferred installs);
- `controllers.restoration.Restorer`: fibre and slot-block failures and repairs;
- `controllers.caps.CapTeller`: the emulators' per-lightpath caps;
- `controllers.traffic.TrafficControl`: fabric flow routing and the WAN assignment.
No module of the core imports os-ken or the emulator (tests/test_controller_split.py).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from controllers.backups import Backups
from controllers.caps import CapacityChannel, CapTeller
from controllers.controls import RunControls, check_layout_controls
from controllers.errors import RequestError
from controllers.flowroute import fabric_link_of_port
from controllers.layout import Layout
from controllers.lightpaths import (
    VID_MAX,
    VID_MIN,
    LightpathBook,
    fibres_of_row,
    route_of,
    spectrum_view,
    topology_view,
)
from controllers.metrics import ControllerMetrics
from controllers.restoration import Moves, Restoration, Restorer, observe
from controllers.rules import (
    NODE_END,
    FlowRule,
    LayoutIndex,
    LightpathRoute,
    RoutingPolicy,
    ShortestPathRouting,
    check_route,
    desired_rules,
)
from controllers.store import LightpathRow, Store
from controllers.traffic import TrafficControl
from testbed.optical import Lightpath, OpticalNetwork
from testbed.spec.models import SPECTRUM_POLICIES, Scenario

log = logging.getLogger("lightpipe.controller")

__all__ = ["VID_MAX", "VID_MIN", "ControllerCore", "RequestError", "Restoration",
           "Southbound"]


class Southbound(Protocol):
    """Installs the desired rules on the connected switches and waits until they are in."""

    def sync(self, desired: dict[int, dict[tuple, FlowRule]]) -> None: ...


class ControllerCore:
    """All controller state and decisions; thread-safe (one lock)."""

    def __init__(self, scenario: Scenario, store: Store, *, layout: Layout | None = None,
                 routing: RoutingPolicy | None = None, southbound: Southbound | None = None,
                 capacity: CapacityChannel | None = None,
                 metrics: ControllerMetrics | None = None,
                 clock: Callable[[], float] = time.perf_counter,
                 controls: RunControls | None = None, protection: bool = False,
                 protect_delay_s: float | None = None) -> None:
        """controls: the run whose fibre control channels a layout may name (every
        layout is checked against it; None: not checked, for in-process use).
        protection: give each lightpath a fibre-disjoint backup route, installed as
        fast-failover groups (controllers/protection.py); decisions stay the same.
        protect_delay_s: a new lightpath's protection (backup hops, groups) is installed
        this long after its set-up, once no other set-up came meanwhile (1 s at most),
        for all pending ones at once, so that a set-up waits for its working route's
        rules only; None: with the set-up."""
        if layout is not None and controls is not None:
            check_layout_controls(layout, controls)
        self.controls = controls
        self.scenario = scenario
        self.store = store
        self.routing = routing or ShortestPathRouting()
        self.southbound = southbound
        self.capacity = capacity
        self.clock = clock
        self.lock = threading.RLock()
        self.net = OpticalNetwork.from_scenario(scenario)
        self.metrics = metrics or ControllerMetrics()
        self.metrics.watch_network(self.net)  # spectrum and fibre state (issue 13)
        self.dc_node = {d.name: d.node for d in scenario.dcs}
        # Lightpath ends that are optical nodes without a DC ("node:<id>", ROADM rules only)
        self.dc_node.update({f"{NODE_END}{n}": n for n in self.net.topology.nodes})
        # random_fit draws from the same stream as the simulator (testbed.sim.engine)
        self.rng = random.Random(f"{getattr(scenario.workload, 'seed', 1)}:spectrum")
        self.layout: LayoutIndex | None = LayoutIndex.build(layout) if layout else None
        self.protection = protection
        self.book = LightpathBook()
        self.backups = Backups(self.net, on=protection, delay_s=protect_delay_s)
        self.caps = CapTeller(capacity, self.metrics)
        self.restorer = Restorer(self.net, self.book, store, self.backups, self.dc_node,
                                 self.rng)
        # Per-flow routing of all-reduce jobs inside DC fabrics (POST /routing/jobs), and
        # which lightpath each cross-DC job flow takes (controllers.wanroute).
        self.traffic = TrafficControl(self.metrics, scenario.policy.routing,
                                      getattr(scenario.workload, "seed", 1), clock=clock)
        self._load()

    @property
    def rows(self) -> dict[int, LightpathRow]:
        """The live lightpaths' rows by id (the book's own dict: read under the lock)."""
        return self.book.rows

    @property
    def optical(self) -> dict[int, Lightpath]:
        """Controller id -> the optical lightpath it holds (the book's own dict)."""
        return self.book.optical

    # ---- start-up --------------------------------------------------------------------
    def _load(self) -> None:
        """Rebuild the optical state from the store (controller restart)."""
        # Wavelength losses not repaired, first: a stored lightpath never holds a lost
        # slot (fail_slots moved it), so assign() below refuses a store that says so.
        for u, v, first, n in self.store.lost_slots():
            self.net.block_slots(u, v, first, n)
        for row in self.store.lightpaths():
            path = self.net.path_info(row.nodes)
            self.book.add(row, self.net.assign(path, row.first_slot, row.n_slots,
                                               bitrate_gbps=row.bitrate_gbps))
        for u, v in self.store.failed_fibres():
            self.net.fail_link(u, v)
        if len(self.book):
            log.info("re-read %d lightpaths from %s", len(self.book), self.store.path)
        self._update_gauges()

    def set_layout(self, layout: Layout) -> None:
        """Adopt a (new) data-plane layout and program it (ValueError, and nothing
        changed, if it does not fit the lightpaths, flows or the run's controls)."""
        if self.controls is not None:
            check_layout_controls(layout, self.controls)
        ix = LayoutIndex.build(layout)
        with self.lock:
            for row in self.book:
                check_route(ix, self._route(row))
            self.traffic.check_layout(ix)  # registered flows: hosts must stay
            self.layout = ix
            self.backups.routes_changed()
            self.traffic.relayout(ix)
            self._program()
            for row in self.book:
                self.caps.set(ix, row, on=True)

    # ---- views ------------------------------------------------------------------------
    def desired(self) -> dict[int, dict[tuple, FlowRule]]:
        with self.lock:
            if self.layout is None:
                return {}
            fabric = self.traffic.fabric(self.layout)
            out = desired_rules(fabric, self.routing, (self._route(r) for r in self.book))
            vids = {r.id: r.vid for r in self.book}
            for x in self.traffic.rules(fabric, vids):
                out.setdefault(x.dpid, {})[x.key] = x
            return out

    def view(self, row: LightpathRow) -> dict[str, Any]:
        """A lightpath's REST view (with `backup` and `protected` when protection is on)."""
        d = self.book.view(row)
        d.update(self.backups.view(self.layout, row))
        return d

    def lightpaths(self) -> list[dict[str, Any]]:
        with self.lock:
            return [self.view(r) for r in self.book]

    def lightpath(self, lp_id: int) -> dict[str, Any]:
        with self.lock:
            row = self.book.get(lp_id)
            if row is None:
                raise RequestError(404, f"no lightpath {lp_id}")
            return self.view(row)

    def spectrum(self) -> list[dict[str, Any]]:
        with self.lock:
            return spectrum_view(self.net)

    def topology(self) -> dict[str, Any]:
        with self.lock:
            return topology_view(self.net, self.scenario,
                                 self.layout.layout if self.layout else None)

    # ---- lightpaths -------------------------------------------------------------------
    def request(self, src_dc: str, dst_dc: str, *, bitrate_gbps: float | None = None,
                slots: int | None = None, policy: str | None = None,
                src_host: str | None = None, dst_host: str | None = None,
                job_id: int | None = None, vid: int | None = None) -> dict[str, Any]:
        """Set up a lightpath between two DCs; RequestError (4xx) if refused or blocked.

        vid: ask for this VLAN id (409 `vid_taken` if a live lightpath has it).
        """
        t0 = self.clock()
        policy = policy or self.scenario.policy.spectrum
        self._check_request(src_dc, dst_dc, bitrate_gbps, slots, policy, src_host, dst_host)
        if vid is not None and not VID_MIN <= vid <= VID_MAX:
            raise RequestError(400, f"vid must be {VID_MIN}..{VID_MAX}, got {vid}")
        t_lock = time.perf_counter()
        with self.lock:
            self.metrics.phase("lock", t_lock)
            if vid is not None and self.book.vid_taken(vid):
                raise RequestError(409, f"VLAN id {vid} is taken by a live lightpath",
                                   reason="vid_taken")
            self.metrics.requests.inc()
            t_rmsa = time.perf_counter()
            got = self.net.allocate_or_reason(self.dc_node[src_dc], self.dc_node[dst_dc],
                                              bitrate_gbps=bitrate_gbps, slots=slots,
                                              policy=policy, rng=self.rng)
            self.metrics.phase("rmsa", t_rmsa)
            if isinstance(got, str):
                self.metrics.blocks.labels(reason=got).inc()
                raise RequestError(409, f"blocked: {got} between {src_dc} and {dst_dc}",
                                   reason=got)
            vid = self.book.free_vid() if vid is None else vid
            if vid is None:
                self.net.release(got)
                self.metrics.blocks.labels(reason="no_vlan").inc()
                raise RequestError(409, "blocked: no free VLAN id", reason="no_vlan")
            row = LightpathRow(id=self.book.next_id(), vid=vid, src_dc=src_dc, dst_dc=dst_dc,
                               src_host=src_host, dst_host=dst_host,
                               bitrate_gbps=bitrate_gbps, slots_req=slots, policy=policy,
                               nodes=list(got.nodes), first_slot=got.first_slot,
                               n_slots=got.n_slots, modulation=got.modulation,
                               capacity_gbps=got.capacity_gbps, job_id=job_id,
                               created_s=time.time())
            return self._commit(row, got, t0)

    def adopt(self, lp: Lightpath, src_dc: str, dst_dc: str, *, job_id: int | None = None,
              src_host: str | None = None, dst_host: str | None = None,
              policy: str | None = None, program: bool = True) -> dict[str, Any]:
        """Make an optical lightpath already held in `self.net` (e.g. by a job placement)
        a controller lightpath: VLAN id, stored row, rules, emulator caps.

        Restoration re-places it by its slot count. On RequestError the caller still
        holds (and must release) the optical lightpath.
        """
        t0 = self.clock()
        with self.lock:
            if self.dc_node.get(src_dc) != lp.nodes[0] or self.dc_node.get(dst_dc) != lp.nodes[-1]:
                raise RequestError(400, f"route {'-'.join(lp.nodes)} does not join "
                                   f"{src_dc} and {dst_dc}")
            vid = self.book.free_vid()
            if vid is None:
                self.metrics.blocks.labels(reason="no_vlan").inc()
                raise RequestError(409, "blocked: no free VLAN id", reason="no_vlan")
            row = LightpathRow(id=self.book.next_id(), vid=vid, src_dc=src_dc, dst_dc=dst_dc,
                               src_host=src_host, dst_host=dst_host, bitrate_gbps=None,
                               slots_req=lp.n_slots,
                               policy=policy or self.scenario.policy.spectrum,
                               nodes=list(lp.nodes), first_slot=lp.first_slot,
                               n_slots=lp.n_slots, modulation=lp.modulation,
                               capacity_gbps=lp.capacity_gbps, job_id=job_id,
                               created_s=time.time())
            if self.layout is not None:
                try:
                    check_route(self.layout, self._route(row))
                except ValueError as exc:
                    raise RequestError(422, str(exc)) from None
            self.metrics.requests.inc()
            return self._commit(row, lp, t0, program=program)

    def _commit(self, row: LightpathRow, lp: Lightpath, t0: float,
                program: bool = True) -> dict[str, Any]:
        """Store a new lightpath, cap it on the emulators, install its rules; its view."""
        t = time.perf_counter()
        self.store.save([row])
        self.metrics.phase("store", t)
        self.book.add(row, lp)
        # the emulators' caps are told while the rules go in (both done before the reply)
        caps = self.caps.begin(self.layout, row)
        deferred = self.backups.defer(row.id)
        if program:
            try:
                self._program()
            except Exception as exc:  # all or nothing: no lightpath without its rules
                self.caps.end(caps)
                log.exception("lightpath %d: rules not installed; rolled back", row.id)
                self.store.save([], delete_ids=[row.id])
                self._drop(row.id)
                self._update_gauges()
                raise RequestError(503, f"rules for the lightpath could not be installed: "
                                   f"{type(exc).__name__}: {exc}") from None
        self.caps.end(caps)
        if deferred:
            self.backups.schedule(self.protect_pending)
        self._update_gauges()
        dt = self.clock() - t0
        self.metrics.setup_seconds.observe(dt)
        view = self.view(row)
        view["setup_s"] = dt
        return view

    def protect_pending(self) -> None:
        """Install the protection of every lightpath set up without it yet."""
        with self.lock:
            if not self.backups.take_pending():
                return
            try:
                self._program()
            except Exception:  # a switch gone: its full sync installs everything later
                log.exception("protection not installed")

    def program(self) -> None:
        """Install the desired rules now (after adopt/delete with program=False)."""
        with self.lock:
            self._program()

    def delete(self, lp_id: int, program: bool = True) -> dict[str, Any]:
        with self.lock:
            row = self.book.get(lp_id)
            if row is None:
                raise RequestError(404, f"no lightpath {lp_id}")
            self.store.save([], delete_ids=[lp_id])
            self._drop(lp_id)
            if program:
                self._program()
            self._update_gauges()
            return self.view(row)

    def _drop(self, lp_id: int) -> None:
        self.backups.forget(lp_id)
        row, lp = self.book.pop(lp_id)
        if lp.id in self.net.lightpaths:
            self.net.release(lp)
        self.caps.set(self.layout, row, on=False)

    # ---- per-flow routing (all-reduce jobs in DC fabrics) -------------------------------
    def _ix(self) -> LayoutIndex:
        if self.layout is None:
            raise RequestError(409, "no layout yet (PUT /layout)")
        return self.layout

    def routing_call(self, what: str, *args: Any) -> dict[str, Any]:
        """Run a FlowRouting change (register, unregister, set_policy) and install the
        resulting rules; RequestError for bad input."""
        with self.lock:
            out = self.traffic.call(self._ix(), what, *args)
            self._program()
            if what == "set_policy":  # PUT /routing answers with the whole view
                out["wan"] = self.traffic.wan.view()
            return out

    def routing_view(self) -> dict[str, Any]:
        with self.lock:
            return self.traffic.view()

    def reassign_wan(self) -> bool:
        """Assign the running jobs' cross-DC flows to lightpaths if anything changed."""
        with self.lock:
            return self.traffic.reassign(self.layout, self.book)

    def fabric_link_of_port(self, dpid: int, port: int) -> tuple[str, str] | None:
        ix = self.layout
        return fabric_link_of_port(ix).get((dpid, port)) if ix else None

    def fabric_port_status(self, dpid: int, port: int, up: bool) -> bool:
        """A PortStatus on a fabric port: the link is down while either end is down (the
        two ends report separately, in any order). True if the routing changed."""
        with self.lock:
            got = self.traffic.port_status(self._ix(), dpid, port, up)
            if got is None:
                return False
            a, b, link_up = got
            return self.set_fabric_link(a, b, up=link_up)

    def set_fabric_link(self, a: str, b: str, up: bool) -> bool:
        """A DC fabric link went down (or up): re-route the flows, install (True if changed)."""
        with self.lock:
            changed = self.traffic.flows.set_link(self._ix(), a, b, up)
            if changed:
                self._program()
            return changed

    # ---- failures ---------------------------------------------------------------------
    def fail_fibre(self, u: str, v: str, t0: float | None = None) -> Restoration:
        """Cut fibre u-v: re-route its lightpaths with new spectrum, or drop them (lost).

        Same rule as the simulator: release every hit lightpath first, then re-place them
        in id order with their original request (bitrate or slots, spectrum policy).
        t0: when the cut was detected (default now); restoration time counts from it.
        """
        t0 = self.clock() if t0 is None else t0
        with self.lock:
            res, moves = self.restorer.cut(self.layout, u, v)
            if moves is None:  # cut already
                return res
            self._settle(res, moves, t0)
        observe(self.metrics, res, f"fibre {u}-{v} cut")
        return res

    def repair_fibre(self, u: str, v: str) -> None:
        with self.lock:
            if self.restorer.repair(u, v) and self.protection:
                self._program()  # lightpaths without a backup may have one again

    def fail_slots(self, u: str, v: str, first_slot: int, n_slots: int,
                   t0: float | None = None) -> Restoration:
        """Wavelength loss: slots first_slot..+n_slots-1 of fibre u-v go out of service
        (both directions) until repair_slots; the lightpaths using any of them are
        re-placed (other slots, or another route) or dropped (lost), by the simulator's
        rule (controllers.restoration). The block is stored, so a restarted controller
        keeps it out of service.
        """
        t0 = self.clock() if t0 is None else t0
        with self.lock:
            res, moves = self.restorer.lose_slots(self.layout, u, v, first_slot, n_slots)
            self._settle(res, moves, t0)
        observe(self.metrics, res, f"fibre {u}-{v} slots {first_slot}.."
                f"{first_slot + n_slots - 1} lost")
        return res

    def repair_slots(self, u: str, v: str, first_slot: int, n_slots: int) -> list[int]:
        """Wavelength repair: the slots are usable again (the lightpaths moved away by
        fail_slots stay where they are, as in the simulator); the fibre's slots still
        out of service."""
        with self.lock:
            return self.restorer.repair_slots(u, v, first_slot, n_slots)

    def fibre_state(self, u: str, v: str) -> dict[str, Any]:
        """Whether fibre u-v is cut, and its slots out of service."""
        with self.lock:
            return self.restorer.fibre_state(u, v)

    def _settle(self, res: Restoration, moves: Moves, t0: float) -> None:
        """After a restoration's decisions: install the rules, then move the emulators'
        caps outside the timed part (traffic flows once the rules are in): removed on
        the fibres a lightpath left, set (changed in place, keeping e.g. its delay
        correction) on its route now. Lock held."""
        self._program()
        res.seconds = self.clock() - t0
        for i, old in moves.before.items():
            row = self.book.get(i)
            self.caps.set(self.layout, old, on=False,
                          keep=set() if row is None else fibres_of_row(row))
        for row in moves.changed:
            self.caps.set(self.layout, row, on=True)
        self._update_gauges()

    def fibre_of_port(self, dpid: int, port: int) -> tuple[str, str] | None:
        ix = self.layout
        return ix.fibre_of_port.get((dpid, port)) if ix else None

    # ---- helpers ----------------------------------------------------------------------
    def _check_request(self, src_dc: str, dst_dc: str, bitrate_gbps: float | None,
                       slots: int | None, policy: str, src_host: str | None,
                       dst_host: str | None) -> None:
        for name in (src_dc, dst_dc):
            if name not in self.dc_node:
                dcs = sorted(d.name for d in self.scenario.dcs)
                raise RequestError(404, f"unknown DC {name!r} (known: {', '.join(dcs)}; or "
                                   f"{NODE_END}<optical node>)")
        if self.dc_node[src_dc] == self.dc_node[dst_dc]:
            raise RequestError(400, f"{src_dc} and {dst_dc} sit on the same optical node "
                               f"{self.dc_node[src_dc]}: no lightpath needed")
        if (bitrate_gbps is None) == (slots is None):
            raise RequestError(400, "give exactly one of bitrate_gbps and slots")
        if slots is not None and not 1 <= slots <= self.net.slots:
            raise RequestError(400, f"slots must be 1..{self.net.slots}, got {slots}")
        if policy not in SPECTRUM_POLICIES:
            raise RequestError(400, f"unknown spectrum policy {policy!r} "
                               f"(known: {', '.join(SPECTRUM_POLICIES)})")
        if (src_host is None) != (dst_host is None):
            raise RequestError(400, "give both src_host and dst_host, or neither")
        if src_host is not None:
            ix = self.layout
            for host, dc in ((src_host, src_dc), (dst_host, dst_dc)):
                if ix is None or host not in ix.hosts or ix.hosts[host].dc != dc:
                    raise RequestError(404, f"no host {host!r} in DC {dc}")

    def _route(self, row: LightpathRow) -> LightpathRoute:
        return route_of(row, self.backups.held(self.layout, row))

    def _program(self) -> None:
        t = time.perf_counter()
        if self.layout is not None:
            self.reassign_wan()
        if self.southbound is not None and self.layout is not None:
            desired = self.desired()
            self.metrics.phase("rules", t)
            self.southbound.sync(desired)

    def _update_gauges(self) -> None:
        self.book.update_gauges(self.metrics, self.net)
