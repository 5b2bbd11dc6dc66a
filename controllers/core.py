"""Controller core: optical state, lightpath set-up/tear-down, restoration (no os-ken).

The os-ken app and the REST API call this; it calls the same optical layer as the
simulator (`OpticalNetwork.from_scenario`, `allocate_or_reason`, `fail_link`,
`block_slots`), keeps
the state in SQLite, and pushes the resulting flow rules through a `Southbound`
(the app: FlowMods + barrier) and per-lightpath capacities through a `CapacityChannel`
(the fibre emulators' control sockets).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

from controllers.controls import RunControls, check_layout_controls
from controllers.flowjobs import FlowRouting
from controllers.flowroute import fabric_link_of_port, without_failed
from controllers.layout import Layout
from controllers.metrics import ControllerMetrics
from controllers.protection import backup_route
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
from controllers.wanroute import WanFlow, WanLightpath, WanRouting, wan_rules
from testbed.optical import Lightpath, OpticalNetwork
from testbed.optical.spectrum import free_runs
from testbed.spec.models import SPECTRUM_POLICIES, Scenario

log = logging.getLogger("lightpipe.controller")

VID_MIN, VID_MAX = 2, 4094


class Southbound(Protocol):
    """Installs the desired rules on the connected switches and waits until they are in."""

    def sync(self, desired: dict[int, dict[tuple, FlowRule]]) -> None: ...


class CapacityChannel(Protocol):
    """Tells a fibre emulator a lightpath's capacity (or removes it)."""

    def set_cap(self, control: str, vid: int, rate_mbps: float | None) -> None: ...


class NetemChannel:
    """CapacityChannel for netem-mode fibres: the layout's control is "netem:<descriptor>"
    (written by testbed.emu.links.NetemLink.write_descriptor); the per-lightpath cap is an
    HTB class + flower VLAN filter in the fibre's middle namespace (tc through mnexec)."""

    def __init__(self, controls: RunControls | None = None) -> None:
        self.links: dict[str, Any] = {}
        self.controls = controls

    def link(self, control: str) -> Any:
        import json
        from pathlib import Path

        from testbed.emu.links import NetemLink

        if self.controls is not None:  # the run's own descriptor, naming the run's node
            desc = self.controls.netem_descriptor(control)
        else:
            desc = json.loads(Path(control.removeprefix(NetemLink.NETEM_CONTROL)).read_text())
        got = self.links.get(control)
        if got is None:
            got = self.links[control] = NetemLink.from_descriptor(desc)
        else:  # the delay calibration may have changed the fibre's delay since
            got.refresh_correction(desc)
        return got

    def set_cap(self, control: str, vid: int, rate_mbps: float | None) -> None:
        link = self.link(control)
        if link.caps_mbps.get(vid) == rate_mbps:
            return  # already so (e.g. the emulator's start-up caps): no tc rebuild
        if _under_eventlet():
            # pyroute2's netlink sockets hang under eventlet's monkey-patching (the os-ken
            # controller process): send the requests from a plain child process.
            import subprocess
            import sys

            path = control.removeprefix("netem:")
            argv = [sys.executable, "-m", "testbed.emu.links", "--descriptor", path,
                    "--vlan", str(vid)] + (["--remove"] if rate_mbps is None
                                           else ["--rate-mbps", repr(rate_mbps)])
            r = subprocess.run(argv, capture_output=True, text=True, check=False)
            if r.returncode != 0:
                raise RuntimeError(f"netem cap VLAN {vid}: {r.stderr.strip()[-300:]}")
            if rate_mbps is None:
                link.caps_mbps.pop(vid, None)
            else:
                link.caps_mbps[vid] = rate_mbps
            return
        try:
            link.set_cap(vid, rate_mbps)
        except Exception as exc:  # RuntimeFailure from tc
            raise RuntimeError(str(exc)) from None


def _under_eventlet() -> bool:
    import sys

    patcher = getattr(sys.modules.get("eventlet"), "patcher", None)
    return bool(patcher is not None and patcher.is_monkey_patched("socket"))


class ForwarderChannel:
    """CapacityChannel over the emulator's control socket (testbed.emu.forwarder), or
    tc/HTB for netem-mode fibres (control "netem:<descriptor>")."""

    def __init__(self, controls: RunControls | None = None) -> None:
        """controls: accept only the run's own control channels (the controller process
        always gives one); None trusts every control (in-process use and tests)."""
        self.netem = NetemChannel(controls)
        self.controls = controls

    def set_cap(self, control: str, vid: int, rate_mbps: float | None) -> None:
        from testbed.emu.forwarder import control_request

        if control.startswith("netem:"):
            self.netem.set_cap(control, vid, rate_mbps)
            return
        if self.controls is not None:
            self.controls.check(control)

        req: dict[str, Any] = ({"vlan": vid, "remove": True} if rate_mbps is None
                               else {"vlan": vid, "rate_mbps": rate_mbps})
        reply = control_request(control, req, timeout_s=2.0)
        if not reply.get("ok", True):
            raise RuntimeError(f"forwarder {control}: {reply}")


class RequestError(Exception):
    """A request the controller refuses: HTTP status and a one-line message."""

    def __init__(self, status: int, message: str, reason: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.reason = reason


@dataclass
class Restoration:
    """Outcome of one fibre cut or slot-block loss: what was re-placed, what was lost,
    and how long it took."""

    fibre: tuple[str, str]
    restored: list[int] = field(default_factory=list)
    lost: list[int] = field(default_factory=list)
    seconds: float = 0.0
    block: tuple[int, int] | None = None  # (first_slot, n_slots) of a wavelength loss
    # protected lightpaths re-placed on the backup route their switches already used
    # (None: protection off)
    on_backup: list[int] | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"fibre": list(self.fibre), "restored": self.restored,
                               "lost": self.lost, "restoration_s": self.seconds}
        if self.block is not None:
            out["first_slot"], out["slots"] = self.block
        if self.on_backup is not None:
            out["on_backup"] = self.on_backup
        return out


def _fibres(row: LightpathRow) -> set[frozenset[str]]:
    return {frozenset(e) for e in zip(row.nodes, row.nodes[1:], strict=False)}


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
        self._cap_pool: ThreadPoolExecutor | None = None  # set-ups' caps, in parallel
        # working route -> its backup, for the current layout and cut fibres
        self._backups: dict[tuple[str, ...], tuple[str, ...] | None] = {}
        self.protect_delay_s = protect_delay_s
        self._unprotected: set[int] = set()  # set up, protection not installed yet
        self._protect_timer: threading.Timer | None = None
        self._protect_since = 0.0  # when the oldest pending protection was asked for
        self.rows: dict[int, LightpathRow] = {}
        self.optical: dict[int, Lightpath] = {}  # controller id -> optical lightpath
        # Per-flow routing of all-reduce jobs inside DC fabrics (POST /routing/jobs).
        self.flows = FlowRouting(self.metrics, policy=scenario.policy.routing,
                                 seed=getattr(scenario.workload, "seed", 1), clock=clock)
        self.fabric_port_up: dict[tuple[int, int], bool] = {}
        # Which lightpath each cross-DC job flow takes (controllers.wanroute); the job
        # services add their flows' sources (e.g. JobService.wan_flows).
        self.wan = WanRouting(self.metrics, clock=clock)
        self.wan_sources: list[Callable[[], list[WanFlow]]] = [
            lambda: self.flows.wan_flows(self.layout)]
        self._load()

    # ---- start-up --------------------------------------------------------------------
    def _load(self) -> None:
        """Rebuild the optical state from the store (controller restart)."""
        # Wavelength losses not repaired, first: a stored lightpath never holds a lost
        # slot (fail_slots moved it), so assign() below refuses a store that says so.
        for u, v, first, n in self.store.lost_slots():
            self.net.block_slots(u, v, first, n)
        for row in self.store.lightpaths():
            path = self.net.path_info(row.nodes)
            self.optical[row.id] = self.net.assign(path, row.first_slot, row.n_slots,
                                                   bitrate_gbps=row.bitrate_gbps)
            self.rows[row.id] = row
        for u, v in self.store.failed_fibres():
            self.net.fail_link(u, v)
        if self.rows:
            log.info("re-read %d lightpaths from %s", len(self.rows), self.store.path)
        self._update_gauges()

    def set_layout(self, layout: Layout) -> None:
        """Adopt a (new) data-plane layout and program it (ValueError, and nothing
        changed, if it does not fit the lightpaths, flows or the run's controls)."""
        if self.controls is not None:
            check_layout_controls(layout, self.controls)
        ix = LayoutIndex.build(layout)
        with self.lock:
            for row in self.rows.values():
                check_route(ix, self._route(row))
            for job in self.flows.jobs.values():  # registered flows: hosts must stay
                missing = [m for m in job.members if m not in ix.hosts]
                if missing:
                    raise ValueError(f"routing job {job.id}: host {missing[0]} is not in "
                                     "the new layout")
            self.layout = ix
            self._backups.clear()
            if self.flows.jobs:  # switch names may have changed: route afresh
                self.flows.paths.clear()
                self.flows.reroute(ix, "layout")
            self._program()
            for row in self.rows.values():
                self._caps(row, on=True)

    # ---- views ------------------------------------------------------------------------
    def desired(self) -> dict[int, dict[tuple, FlowRule]]:
        with self.lock:
            if self.layout is None:
                return {}
            ix = without_failed(self.layout, self.flows.failed)
            out = desired_rules(ix, self.routing, (self._route(r) for r in self.rows.values()))
            rules, groups = self.flows.rules(ix)
            vids = {r.id: r.vid for r in self.rows.values()}
            live = {f: lp for f, lp in self.wan.assignment.items() if lp in vids}
            for x in (*groups, *rules, *wan_rules(ix, vids, live)):
                out.setdefault(x.dpid, {})[x.key] = x
            return out

    def lightpaths(self) -> list[dict[str, Any]]:
        with self.lock:
            return [self._view(r) for r in self.rows.values()]

    def lightpath(self, lp_id: int) -> dict[str, Any]:
        with self.lock:
            row = self.rows.get(lp_id)
            if row is None:
                raise RequestError(404, f"no lightpath {lp_id}")
            return self._view(row)

    def spectrum(self) -> list[dict[str, Any]]:
        with self.lock:
            out = []
            for f in self.net.topology.fibres:
                occ = self.net.occupancy(f.u, f.v)
                out.append({"u": f.u, "v": f.v, "slots": self.net.slots,
                            "used": [i for i, b in enumerate(occ) if b],
                            "occupancy": "".join("1" if b else "0" for b in occ),
                            "failed": self.net.is_failed(f.u, f.v),
                            "lost_slots": self.net.lost_slots(f.u, f.v)})
            return out

    def topology(self) -> dict[str, Any]:
        with self.lock:
            t = self.net.topology
            return {"name": t.name, "nodes": list(t.nodes),
                    "fibres": [{"u": f.u, "v": f.v, "length_km": f.length_km,
                                "failed": self.net.is_failed(f.u, f.v)} for f in t.fibres],
                    "dcs": [{"name": d.name, "node": d.node, "gpus": d.gpus}
                            for d in self.scenario.dcs],
                    "slots": self.net.slots, "k_paths": self.net.k_paths,
                    "hosts": ([h.model_dump() for h in self.layout.layout.hosts]
                              if self.layout else [])}

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
            self._phase("lock", t_lock)
            if vid is not None and any(r.vid == vid for r in self.rows.values()):
                raise RequestError(409, f"VLAN id {vid} is taken by a live lightpath",
                                   reason="vid_taken")
            self.metrics.requests.inc()
            t_rmsa = time.perf_counter()
            got = self.net.allocate_or_reason(self.dc_node[src_dc], self.dc_node[dst_dc],
                                              bitrate_gbps=bitrate_gbps, slots=slots,
                                              policy=policy, rng=self.rng)
            self._phase("rmsa", t_rmsa)
            if isinstance(got, str):
                self.metrics.blocks.labels(reason=got).inc()
                raise RequestError(409, f"blocked: {got} between {src_dc} and {dst_dc}",
                                   reason=got)
            vid = self._free_vid() if vid is None else vid
            if vid is None:
                self.net.release(got)
                self.metrics.blocks.labels(reason="no_vlan").inc()
                raise RequestError(409, "blocked: no free VLAN id", reason="no_vlan")
            lp_id = max(self.rows, default=0) + 1
            row = LightpathRow(id=lp_id, vid=vid, src_dc=src_dc, dst_dc=dst_dc,
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
            vid = self._free_vid()
            if vid is None:
                self.metrics.blocks.labels(reason="no_vlan").inc()
                raise RequestError(409, "blocked: no free VLAN id", reason="no_vlan")
            lp_id = max(self.rows, default=0) + 1
            row = LightpathRow(id=lp_id, vid=vid, src_dc=src_dc, dst_dc=dst_dc,
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
        self._phase("store", t)
        self.rows[row.id] = row
        self.optical[row.id] = lp
        # the emulators' caps are told while the rules go in (both done before the reply)
        caps = self._caps_begin(row)
        deferred = self.protection and self.protect_delay_s is not None
        if deferred:
            self._unprotected.add(row.id)
        if program:
            try:
                self._program()
            except Exception as exc:  # all or nothing: no lightpath without its rules
                self._caps_end(caps)
                log.exception("lightpath %d: rules not installed; rolled back", row.id)
                self.store.save([], delete_ids=[row.id])
                self._drop(row.id)
                self._update_gauges()
                raise RequestError(503, f"rules for the lightpath could not be installed: "
                                   f"{type(exc).__name__}: {exc}") from None
        self._caps_end(caps)
        if deferred:
            self._schedule_protection()
        self._update_gauges()
        dt = self.clock() - t0
        self.metrics.setup_seconds.observe(dt)
        view = self._view(row)
        view["setup_s"] = dt
        return view

    def _schedule_protection(self) -> None:
        """(Re)start the timer that installs the pending protections (lock held)."""
        now = time.monotonic()
        timer = self._protect_timer
        if timer is not None and timer.is_alive():
            if now - self._protect_since >= 1.0:
                return  # a steady stream of set-ups: do not postpone any more
            timer.cancel()
        else:
            self._protect_since = now
        assert self.protect_delay_s is not None
        self._protect_timer = threading.Timer(self.protect_delay_s, self.protect_pending)
        self._protect_timer.daemon = True
        self._protect_timer.start()

    def protect_pending(self) -> None:
        """Install the protection of every lightpath set up without it yet."""
        with self.lock:
            if not self._unprotected:
                return
            self._unprotected.clear()
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
            row = self.rows.get(lp_id)
            if row is None:
                raise RequestError(404, f"no lightpath {lp_id}")
            self.store.save([], delete_ids=[lp_id])
            self._drop(lp_id)
            if program:
                self._program()
            self._update_gauges()
            return self._view(row)

    def _drop(self, lp_id: int) -> None:
        self._unprotected.discard(lp_id)
        row = self.rows.pop(lp_id)
        lp = self.optical.pop(lp_id)
        if lp.id in self.net.lightpaths:
            self.net.release(lp)
        self._caps(row, on=False)

    # ---- per-flow routing (all-reduce jobs in DC fabrics) -------------------------------
    def _ix(self) -> LayoutIndex:
        if self.layout is None:
            raise RequestError(409, "no layout yet (PUT /layout)")
        return self.layout

    def routing_call(self, what: str, *args: Any) -> dict[str, Any]:
        """Run a FlowRouting change (register, unregister, set_policy) and install the
        resulting rules; RequestError for bad input."""
        from controllers.flowjobs import RoutingError

        with self.lock:
            ix = self._ix()
            try:
                out = getattr(self.flows, what)(ix, *args)
            except RoutingError as exc:
                raise RequestError(400 if "unknown routing policy" in str(exc) else 422,
                                   str(exc)) from None
            except KeyError as exc:
                raise RequestError(404, f"no routing job {exc.args[0]}") from None
            self._program()
            if what == "set_policy":  # PUT /routing answers with the whole view
                return {**out, "wan": self.wan.view()}
            return dict(out)

    def routing_view(self) -> dict[str, Any]:
        with self.lock:
            return {**self.flows.view(), "wan": self.wan.view()}

    def wan_lightpaths(self) -> list[WanLightpath]:
        """Live lightpaths between two DCs of the layout (candidates for job flows)."""
        ix = self.layout
        if ix is None:
            return []
        return [WanLightpath(r.id, r.vid, r.src_dc, r.dst_dc, r.capacity_gbps)
                for r in sorted(self.rows.values(), key=lambda r: r.id)
                if r.src_dc in ix.edge and r.dst_dc in ix.edge]

    def reassign_wan(self) -> bool:
        """Assign the running jobs' cross-DC flows to lightpaths if anything changed."""
        with self.lock:
            ix = self.layout
            if ix is None:
                return False
            flows = [f for src in self.wan_sources for f in src()
                     if f.src in ix.hosts and f.dst in ix.hosts]
            host_dc = {h: ix.hosts[h].dc for f in flows for h in (f.src, f.dst)}
            return self.wan.update(self.flows.policy, self.flows.seed, flows,
                                   self.wan_lightpaths(), host_dc)

    def fabric_link_of_port(self, dpid: int, port: int) -> tuple[str, str] | None:
        ix = self.layout
        return fabric_link_of_port(ix).get((dpid, port)) if ix else None

    def fabric_port_status(self, dpid: int, port: int, up: bool) -> bool:
        """A PortStatus on a fabric port: the link is down while either end is down (the
        two ends report separately, in any order). True if the routing changed."""
        with self.lock:
            ix = self._ix()
            ports = fabric_link_of_port(ix)
            link = ports.get((dpid, port))
            if link is None:
                return False
            self.fabric_port_up[(dpid, port)] = up
            ends = [e for e, lk in ports.items() if lk == link]
            link_up = all(self.fabric_port_up.get(e, True) for e in ends)
            return self.set_fabric_link(*link, up=link_up)

    def set_fabric_link(self, a: str, b: str, up: bool) -> bool:
        """A DC fabric link went down (or up): re-route the flows, install (True if changed)."""
        with self.lock:
            ix = self._ix()
            changed = self.flows.set_link(ix, a, b, up)
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
            self._check_fibre(u, v)
            res = Restoration((u, v))
            if self.net.is_failed(u, v):
                return res
            hit = {lp.id for lp in self.net.fail_link(u, v)}
            self._backups.clear()  # backups crossing the cut need another route
            self._restore(hit, res, t0, failed=(u, v))
        self._restored(res, f"fibre {u}-{v} cut")
        return res

    def repair_fibre(self, u: str, v: str) -> None:
        with self.lock:
            self._check_fibre(u, v)
            if self.net.is_failed(u, v):
                self.net.repair_link(u, v)
                self.store.save([], repaired=(u, v))
                self._backups.clear()
                if self.protection:  # lightpaths without a backup may have one again
                    self._program()
                log.info("fibre %s-%s repaired", u, v)

    def fail_slots(self, u: str, v: str, first_slot: int, n_slots: int,
                   t0: float | None = None) -> Restoration:
        """Wavelength loss: slots first_slot..+n_slots-1 of fibre u-v go out of service
        (both directions) until repair_slots; the lightpaths using any of them are
        re-placed (other slots, or another route) or dropped (lost).

        The simulator's rule (testbed.sim.engine._apply_event): release every hit
        lightpath first, then re-place them in id order with their original request.
        The block is stored, so a restarted controller keeps it out of service.
        """
        t0 = self.clock() if t0 is None else t0
        with self.lock:
            self._check_fibre(u, v)
            self._check_block(u, v, first_slot, n_slots)
            res = Restoration((u, v), block=(first_slot, n_slots))
            hit = {lp.id for lp in self.net.block_slots(u, v, first_slot, n_slots)}
            self._restore(hit, res, t0, lost=(u, v, self._lost_runs(u, v)))
        self._restored(res, f"fibre {u}-{v} slots {first_slot}..{first_slot + n_slots - 1} "
                       "lost")
        return res

    def repair_slots(self, u: str, v: str, first_slot: int, n_slots: int) -> list[int]:
        """Wavelength repair: the slots are usable again (the lightpaths moved away by
        fail_slots stay where they are, as in the simulator); the fibre's slots still
        out of service."""
        with self.lock:
            self._check_fibre(u, v)
            self._check_block(u, v, first_slot, n_slots)
            self.net.unblock_slots(u, v, first_slot, n_slots)
            self.store.save([], lost=(u, v, self._lost_runs(u, v)))
            log.info("fibre %s-%s slots %d..%d repaired", u, v, first_slot,
                     first_slot + n_slots - 1)
            return self.net.lost_slots(u, v)

    def fibre_state(self, u: str, v: str) -> dict[str, Any]:
        """Whether fibre u-v is cut, and its slots out of service."""
        with self.lock:
            self._check_fibre(u, v)
            return {"failed": self.net.is_failed(u, v),
                    "lost_slots": self.net.lost_slots(u, v)}

    def _restore(self, hit: set[int], res: Restoration, t0: float,
                 failed: tuple[str, str] | None = None,
                 lost: tuple[str, str, list[tuple[int, int]]] | None = None) -> None:
        """Re-place the hit optical lightpaths (already released by the network) in
        controller-id order with their original request, or drop them; store the change
        (with the cut or the lost slots) in one transaction, install the rules, move the
        emulators' caps. Called with the lock held."""
        ids = sorted(i for i, lp in self.optical.items() if lp.id in hit)
        # the backups the switches held (a cut fibre is on the working route, never on
        # its disjoint backup, so the cut does not change these)
        was = {i: self._installed_backup(self.rows[i]) for i in ids}
        if self.protection:
            res.on_backup = []
        changed: list[LightpathRow] = []
        old_caps = {i: LightpathRow(**self.rows[i].to_dict()) for i in ids}
        for i in ids:
            row = self.rows[i]
            got = self.net.allocate_or_reason(self.dc_node[row.src_dc],
                                              self.dc_node[row.dst_dc],
                                              bitrate_gbps=row.bitrate_gbps,
                                              slots=row.slots_req, policy=row.policy,
                                              rng=self.rng)
            if isinstance(got, str):
                res.lost.append(i)
                continue
            row.nodes, row.first_slot, row.n_slots = list(got.nodes), got.first_slot, \
                got.n_slots
            row.modulation, row.capacity_gbps = got.modulation, got.capacity_gbps
            row.restored += 1
            self.optical[i] = got
            changed.append(row)
            res.restored.append(i)
            if res.on_backup is not None and was[i] == tuple(got.nodes):
                res.on_backup.append(i)
        for i in res.lost:
            self._unprotected.discard(i)
            self.rows.pop(i)
            self.optical.pop(i)
        self.store.save(changed, delete_ids=res.lost, failed=failed, lost=lost)
        self._program()
        # Traffic flows again once the rules are in; the emulators' per-lightpath
        # caps follow outside the timed part: removed on the fibres the lightpath left,
        # set (changed in place, keeping e.g. its delay correction) on its route now.
        res.seconds = self.clock() - t0
        for i, old in old_caps.items():
            row = self.rows.get(i)
            self._caps(old, on=False, keep=set() if row is None else _fibres(row))
        for row in changed:
            self._caps(row, on=True)
        self._update_gauges()

    def _restored(self, res: Restoration, what: str) -> None:
        self.metrics.restoration_seconds.observe(res.seconds)
        self.metrics.restored.inc(len(res.restored))
        self.metrics.lost.inc(len(res.lost))
        self.metrics.restored_on_backup.inc(len(res.on_backup or ()))
        log.info("%s: %d restored, %d lost in %.1f ms", what, len(res.restored),
                 len(res.lost), res.seconds * 1e3)

    def _lost_runs(self, u: str, v: str) -> list[tuple[int, int]]:
        """Fibre u-v's slots out of service as (first_slot, n_slots) runs."""
        mask = 0
        for i in self.net.lost_slots(u, v):
            mask |= 1 << i
        return free_runs(mask)

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

    def _check_fibre(self, u: str, v: str) -> None:
        try:
            self.net.link_id(u, v)
        except KeyError as exc:
            raise RequestError(404, str(exc.args[0])) from None

    def _check_block(self, u: str, v: str, first_slot: int, n_slots: int) -> None:
        if n_slots < 1 or first_slot < 0 or first_slot + n_slots > self.net.slots:
            raise RequestError(400, f"slots {first_slot}..{first_slot + n_slots - 1} are "
                               f"outside fibre {u}-{v}'s grid 0..{self.net.slots - 1}")

    def _free_vid(self) -> int | None:
        used = {r.vid for r in self.rows.values()}
        for vid in range(VID_MIN, VID_MAX + 1):
            if vid not in used:
                return vid
        return None

    def _route(self, row: LightpathRow) -> LightpathRoute:
        return LightpathRoute(row.id, row.vid, row.src_dc, row.dst_dc, tuple(row.nodes),
                              row.src_host, row.dst_host, self._installed_backup(row))

    def _installed_backup(self, row: LightpathRow) -> tuple[str, ...] | None:
        """The backup the switches hold for the lightpath (None while it is pending)."""
        return None if row.id in self._unprotected else self._backup(row.nodes)

    def _backup(self, nodes: list[str] | tuple[str, ...]) -> tuple[str, ...] | None:
        """The backup route of a working route (protection on, a layout, one exists):
        the shortest fibre-disjoint route over the layout's fibres that are not cut."""
        ix = self.layout
        if not self.protection or ix is None:
            return None
        key = tuple(nodes)
        if key not in self._backups:
            self._backups[key] = backup_route(
                self.net.graph, key,
                lambda u, v: (u, v) in ix.fibre_port and not self.net.is_failed(u, v))
        return self._backups[key]

    def _view(self, row: LightpathRow) -> dict[str, Any]:
        d = row.to_dict()
        d["fibres"] = [[a, b] for a, b in zip(row.nodes, row.nodes[1:], strict=False)]
        d["slots"] = list(range(row.first_slot, row.first_slot + row.n_slots))
        lp = self.optical.get(row.id)
        if lp is not None:
            d["length_km"] = lp.length_km
            d["latency_ms"] = lp.latency_ms
        if self.protection:
            backup = self._backup(row.nodes)
            d["backup"] = None if backup is None else list(backup)
            d["protected"] = self._installed_backup(row) is not None
        return d

    def _phase(self, name: str, since: float) -> float:
        """Count the time since `since` to phase `name`; now."""
        now = time.perf_counter()
        self.metrics.phase_seconds.labels(phase=name).inc(now - since)
        return now

    def _program(self) -> None:
        t = time.perf_counter()
        if self.layout is not None:
            self.reassign_wan()
        if self.southbound is not None and self.layout is not None:
            desired = self.desired()
            self._phase("rules", t)
            self.southbound.sync(desired)

    def _caps_begin(self, row: LightpathRow) -> list[Future[None]]:
        """Start setting the lightpath's cap on each fibre of its route, all at once."""
        ix = self.layout
        if self.capacity is None or ix is None:
            return []
        controls = [c for u, v in zip(row.nodes, row.nodes[1:], strict=False)
                    if (c := ix.fibre_control.get(frozenset((u, v)))) is not None]
        if not controls:
            return []
        if self._cap_pool is None:
            self._cap_pool = ThreadPoolExecutor(8, thread_name_prefix="caps")
        rate = row.capacity_gbps * ix.layout.mbps_per_gbps
        return [self._cap_pool.submit(self._cap_one, c, row, rate) for c in controls]

    def _caps_end(self, caps: list[Future[None]]) -> None:
        t = time.perf_counter()
        for f in caps:
            f.result()
        self._phase("caps", t)

    def _cap_one(self, control: str, row: LightpathRow, rate: float | None) -> None:
        assert self.capacity is not None
        try:
            self.capacity.set_cap(control, row.vid, rate)
        except Exception as exc:  # an emulator's cap: logged and counted, never fatal
            self.metrics.capacity_errors.inc()
            log.warning("%s: cannot set lightpath %d capacity: %s", control, row.id, exc)

    def _caps(self, row: LightpathRow, on: bool, keep: set[frozenset[str]] | None = None
              ) -> None:
        """Set (on) or remove the lightpath's cap on each fibre of its route but `keep`."""
        ix = self.layout
        if self.capacity is None or ix is None:
            return
        rate = row.capacity_gbps * ix.layout.mbps_per_gbps if on else None
        for u, v in zip(row.nodes, row.nodes[1:], strict=False):
            if keep and frozenset((u, v)) in keep:
                continue
            control = ix.fibre_control.get(frozenset((u, v)))
            if control is None:
                continue
            try:
                self.capacity.set_cap(control, row.vid, rate)
            except Exception as exc:  # an emulator's cap: logged and counted, never fatal
                self.metrics.capacity_errors.inc()
                log.warning("fibre %s-%s: cannot set lightpath %d capacity: %s", u, v,
                            row.id, exc)

    def _update_gauges(self) -> None:
        self.metrics.active.set(len(self.rows))
        for f in self.net.topology.fibres:
            self.metrics.slots_used.labels(fibre=f"{f.u}-{f.v}").set(
                self.net.mask(f.u, f.v).bit_count())
