"""Discrete-event simulator of pipeline jobs: arrivals, departures, queueing, network events.

Events are processed in time order (ties: departures and repairs before arrivals, so
freed resources are seen by a job arriving at the same instant). Admission ``block``
refuses a job that cannot be placed on arrival; ``queue`` keeps it waiting and retries
after every departure or repair: FIFO with head-of-line blocking for the baselines and
cba, dynamic priority without head-of-line blocking for bace-pipe and joint (the
placement kind's `queue`, overridden by policy.queue).

A fibre cut (or wavelength loss) takes down the lightpaths on it. What a hit job's
boundary gets follows `policy.protection` (testbed/jobs/faults.py): restoration on other
routes (its iteration time is re-timed), a switch to its standby lightpath (1+1, backup),
or nothing until the fibre's repair (none, or no spectrum for a detour). The outage the
job sees then passes through the workers' model (`policy.workers`,
testbed.analysis.faultimpact.outage_effect): the job is frozen until its traffic flows
again, or its collective times out and it fails (reason ``collective_timeout``) or
restarts and redoes the interrupted iteration. A boundary with no route even after the
repair is interrupted: under ``block`` the job ends with reason ``interrupted``; under
``queue`` it returns to the queue with its remaining iterations.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from testbed.analysis.faultimpact import (
    Effect,
    WorkerModel,
    touched_iteration_s,
)
from testbed.jobs import faults as jf
from testbed.jobs.cluster import Allocation, Cluster
from testbed.jobs.model import energy_kwh, price_integral_usd_per_kwh_h
from testbed.jobs.outcome import Job, Placed, Refused
from testbed.jobs.placement import get_placement
from testbed.jobs.policies import Planner
from testbed.optical import Lightpath
from testbed.spec.faults import indexed_network_events
from testbed.spec.models import EventSpec

log = logging.getLogger(__name__)

# event kinds in tie-break order (a repair's re-join after the repair itself)
_DEPART, _NET, _REJOIN, _FAIL, _ARRIVE = 0, 1, 2, 3, 4


@dataclass
class JobState:
    """Everything the simulator tracks for one job."""

    job: Job
    arrival_s: float
    remaining_iter: float
    start_s: float | None = None
    end_s: float | None = None
    alloc: Allocation | None = None
    iteration_ms: float = 0.0
    bubble_ratio: float = 0.0
    schedule: str = ""
    seg_start_s: float = 0.0
    version: int = 0
    energy_kwh: float = 0.0
    cost_usd: float = 0.0
    run_s: float = 0.0
    iterations_done: float = 0.0
    blocked: bool = False
    reason: str = ""
    restored: int = 0
    interrupted: int = 0
    routes: list[str] = field(default_factory=list)
    placement: list[str] = field(default_factory=list)
    solver: dict[str, object] | None = None
    # every lightpath the job held: [boundary, Lightpath, set-up s, tear-down s or None]
    lightpath_log: list[list[Any]] = field(default_factory=list)
    open_lightpaths: dict[tuple[int, str, str], int] = field(default_factory=dict)
    lightpath_roles: list[str] = field(default_factory=list)  # per log entry: working/standby
    # network events: no progress before stall_until_s; (time, iterations done) points;
    # what each hit did (testbed/jobs/faults.py impact_of); boundaries down until a repair
    stall_until_s: float = 0.0
    trace: list[tuple[float, float]] = field(default_factory=list)
    hits: list[dict[str, Any]] = field(default_factory=list)
    down: list[int] = field(default_factory=list)
    rejoin_token: int = 0
    restarts: int = 0
    error: str | None = None


class JobSimulator:
    """Runs a list of jobs through one policy on one cluster."""

    def __init__(self, cluster: Cluster, planner: Planner, admission: str,
                 events: Sequence[EventSpec] = (),
                 on_change: Callable[[JobSimulator], None] | None = None,
                 outages_s: Mapping[int, float] | None = None,
                 cut_phases: Mapping[tuple[int, int], Any] | None = None) -> None:
        self.cluster = cluster
        self.planner = planner
        self.admission = admission
        # flaps expanded, testbed faults left out; each with its spec event's index
        self.indexed_events = indexed_network_events(events)
        self.events = [ev for _, ev in self.indexed_events]
        self.protection = planner.policy.protection
        self.workers = WorkerModel.from_spec(planner.policy.workers)
        # spec event index -> the outage a restored / switched job sees (e.g. measured)
        self.outages_s = dict(outages_s or {})
        # (job id, spec event index) -> the hit lightpath's phase at the cut
        # (testbed.jobs.faults.CutPhase): the transport model of that hit
        self.cut_phases = dict(cut_phases or {})
        kind = get_placement(planner.policy.placement)
        queue = planner.policy.queue
        self.priority_queue = (kind.queue if queue == "auto" else queue) == "priority"
        self.upgrades = kind.upgrade
        self.on_change = on_change  # test hook: called after every event
        self.now = 0.0
        self.queue: list[JobState] = []
        self.running: dict[int, JobState] = {}
        self.done: list[JobState] = []
        self._heap: list[tuple[float, int, int, object]] = []
        self._seq = itertools.count()
        self._gpu_area = 0.0
        self._spec_area = 0.0
        self._last_t = 0.0
        self.restored_lightpaths = 0
        self.upgraded_lightpaths = 0
        self.lost_lightpaths = 0
        self.switched_lightpaths = 0
        self.unprotected_boundaries = 0

    # ---- bookkeeping ---------------------------------------------------------------
    def _push(self, t: float, kind: int, payload: object) -> None:
        heapq.heappush(self._heap, (t, kind, next(self._seq), payload))

    def _advance(self, t: float) -> None:
        dt = t - self._last_t
        if dt > 0:
            self._gpu_area += dt * self.cluster.used_gpus
            self._spec_area += dt * self.cluster.network.utilization()
        self._last_t = t
        self.now = t

    def _settle(self, st: JobState) -> None:
        """Account the running segment up to now: iterations, energy, cost."""
        assert st.alloc is not None
        dur = self.now - st.seg_start_s
        if dur <= 0:
            return
        st.run_s += dur
        frozen_to = min(self.now, max(st.seg_start_s, st.stall_until_s))
        if frozen_to > st.seg_start_s:
            st.trace.append((frozen_to, st.iterations_done))
        done = min(st.remaining_iter, (self.now - frozen_to) * 1000.0 / st.iteration_ms)
        st.iterations_done += done
        st.remaining_iter = max(0.0, st.remaining_iter - done)
        st.trace.append((self.now, st.iterations_done))
        for d in st.alloc.stage_dcs:
            dc = self.cluster.dcs[d]
            power_kwh_per_h = energy_kwh(st.job.req.gpus_per_stage, dc.gpu.power_w, 3600.0)
            st.energy_kwh += power_kwh_per_h * dur / 3600.0
            st.cost_usd += power_kwh_per_h * price_integral_usd_per_kwh_h(
                dc.price_usd_per_kwh, dc.price_curve, st.seg_start_s, self.now)
        st.seg_start_s = self.now

    def _schedule_departure(self, st: JobState) -> None:
        st.version += 1
        end = max(self.now, st.stall_until_s) + st.remaining_iter * st.iteration_ms / 1000.0
        self._push(end, _DEPART, (st, st.version))

    # ---- placement -------------------------------------------------------------------
    def _try_start(self, st: JobState) -> Placed | Refused:
        res = self.planner.place(st.job, self.now)
        if isinstance(res, Refused):
            return res
        if st.start_s is None:
            st.start_s = self.now
        st.trace.append((self.now, st.iterations_done))
        st.alloc = res.alloc
        if self.protection.scheme in ("1+1", "backup"):
            self.unprotected_boundaries += jf.reserve_standby(
                self.cluster, res.alloc, self.planner.policy.spectrum, self.planner.rng)
        st.iteration_ms = res.timing.iteration_ms
        st.bubble_ratio = res.timing.bubble_ratio
        st.schedule = res.timing.schedule
        st.solver = res.solver
        st.seg_start_s = self.now
        dcs = self.cluster.dcs
        st.placement = [dcs[d].name for d in res.alloc.stage_dcs]
        st.routes = [_lp_text(lp) for lp in res.alloc.lightpaths]
        self._track(st)
        self.running[st.job.req.job_id] = st
        self._schedule_departure(st)
        return res

    def _priority(self, st: JobState) -> float:
        """bace-pipe: response ratio (wait + run) / run, damped for bandwidth-heavy jobs
        when the network is busy (higher first)."""
        req = st.job.req
        f, b = self.planner.stage_fb(st.job, [0] * req.stages)
        run_s = max(1e-9, st.remaining_iter * (req.microbatches + req.stages - 1)
                    * max(fi + bi for fi, bi in zip(f, b, strict=True)) / 1000.0)
        # bandwidth intensity: baseline transfer (fixed slots at 25 Gb/s/slot) / forward time
        tx_ms = 8.0 * st.job.act_mb / (self.planner.policy.fixed_slots * 25.0)
        heavy = min(1.0, tx_ms / min(f))
        util = self.cluster.network.utilization()
        wait = self.now - st.arrival_s
        return (wait + run_s) / run_s * (1.0 - 0.5 * util * heavy)

    def _serve_queue(self) -> None:
        if not self.queue:
            return
        if self.priority_queue:
            order = sorted(self.queue, key=lambda s: (-self._priority(s), s.arrival_s))
            still = []
            for st in order:
                if isinstance(self._try_start(st), Refused):
                    still.append(st)
            self.queue = sorted(still, key=lambda s: s.arrival_s)
            return
        while self.queue:
            if isinstance(self._try_start(self.queue[0]), Refused):
                return  # head-of-line blocking
            self.queue.pop(0)

    def _upgrade_running(self) -> None:
        """cba (and variants)/joint: after a release, raise lightpaths set up short."""
        if not self.upgrades:
            return
        for st in list(self.running.values()):
            if st.alloc is None or not st.alloc.short_gbps or st.down \
                    or st.stall_until_s > self.now:
                continue
            self._settle(st)
            if self.planner.upgrade(st.job, st.alloc):
                self.upgraded_lightpaths += 1
                t = self.planner.timing(st.job, st.alloc.stage_dcs, st.alloc.lightpaths,
                                        st.schedule)
                st.iteration_ms, st.bubble_ratio = t.iteration_ms, t.bubble_ratio
                st.routes = [_lp_text(lp) for lp in st.alloc.lightpaths]
                self._track(st)
                self._schedule_departure(st)

    def _track(self, st: JobState, closing: bool = False) -> None:
        """Log the job's lightpaths: close the ones it no longer holds (at now), open the
        new ones (lightpaths.csv)."""
        live = self.cluster.network.lightpaths
        held: dict[tuple[int, str, str], Any] = {}
        if not closing and st.alloc is not None:
            for role, lps in (("working", enumerate(st.alloc.lightpaths)),
                              ("standby", st.alloc.standby.items())):
                for b, lp in lps:
                    if lp is not None and lp.id in live:
                        held[(b, _lp_text(lp), role)] = lp
        for key in [k for k in st.open_lightpaths if k not in held]:
            st.lightpath_log[st.open_lightpaths.pop(key)][3] = self.now
        for key, lp in held.items():
            if key not in st.open_lightpaths:
                st.open_lightpaths[key] = len(st.lightpath_log)
                st.lightpath_log.append([key[0], lp, self.now, None])
                st.lightpath_roles.append(key[2])

    def _finish(self, st: JobState, reason: str = "") -> None:
        self._settle(st)
        assert st.alloc is not None
        self._track(st, closing=True)
        self.cluster.free_allocation(st.alloc, st.job.req.gpus_per_stage)
        self.running.pop(st.job.req.job_id, None)
        st.version += 1
        st.end_s = self.now
        st.reason = reason
        self.done.append(st)

    # ---- network events --------------------------------------------------------------
    def _network_event(self, ev: EventSpec, index: int = -1) -> None:
        net = self.cluster.network
        hit = net.apply_event(ev)
        self.lost_lightpaths += len(hit)
        ids = {lp.id for lp in hit}
        for st in list(self.running.values()):
            assert st.alloc is not None
            for b in [b for b, lp in st.alloc.standby.items() if lp.id in ids]:
                del st.alloc.standby[b]  # a standby lost: protect again below
            lost = [b for b, lp in enumerate(st.alloc.lightpaths) if lp is not None
                    and lp.id in ids]
            if not lost:
                if self.protection.scheme in ("1+1", "backup"):
                    self.unprotected_boundaries += jf.reserve_standby(
                        self.cluster, st.alloc, self.planner.policy.spectrum,
                        self.planner.rng)
                    self._track(st)
                continue
            self._settle(st)
            if not self._hit(st, ev, index, lost):
                self._interrupt(st)
        self._serve_queue()

    def _hit(self, st: JobState, ev: EventSpec, index: int, lost: list[int]) -> bool:
        """A running job whose working lightpaths `lost` went down: give them what the
        protection scheme gives, pass the outage through the workers' model, freeze,
        fail or restart the job. False: no route now and none after any repair."""
        alloc = st.alloc
        assert alloc is not None
        prot = self.protection
        old = [alloc.lightpaths[b] for b in lost]
        outage, left = 0.0, list(lost)
        if prot.scheme in ("1+1", "backup"):
            for b in lost:
                lp = alloc.standby.pop(b, None)
                if lp is not None and lp.id in self.cluster.network.lightpaths:
                    alloc.lightpaths[b] = lp
                    left.remove(b)
                    self.switched_lightpaths += 1
            if len(left) < len(lost):
                outage = self.outages_s.get(
                    index, prot.switch_s if prot.scheme == "1+1" else prot.restoration_s)
        route = "standby" if len(left) < len(lost) else "detour"
        if left and prot.scheme != "none" and self.planner.restore(st.job, alloc, left):
            self.restored_lightpaths += len(left)
            st.restored += 1
            outage = max(outage, self.outages_s.get(index, prot.restoration_s))
            left = []
        repair_s = math.inf
        if left and prot.scheme != "none":
            # no route with free spectrum: the lightpath is lost for good, as LightPipe's
            # controller drops it; the job stops now (interrupted, as before protection)
            self._record_lost(st, ev, index, old)
            return False
        if left:  # down until the fibre (slot block) is repaired
            repair_s = jf.repair_at_s(self.indexed_events, ev, self.now)
            outage = max(outage, repair_s - self.now)
            route = "same route after the repair"
        steady_ms = st.iteration_ms
        if not left:
            t = self.planner.timing(st.job, alloc.stage_dcs, alloc.lightpaths, st.schedule)
            st.iteration_ms, st.bubble_ratio = t.iteration_ms, t.bubble_ratio
        new = [alloc.lightpaths[b] for b in lost]
        rtt_s, rtt_after_s = jf.hop_rtts_s([o for o in old if o is not None],
                                           new if not left else old)
        phase = st.iterations_done - math.floor(st.iterations_done + 1e-9)
        phase = max(0.0, phase)
        effect = jf.phase_effect(self.cut_phases.get((st.job.req.job_id, index)),
                                 phase=phase, steady_s=steady_ms / 1000.0, outage_s=outage,
                                 rtt_s=rtt_s, rtt_after_s=rtt_after_s,
                                 workers=self.workers, restarts_used=st.restarts)
        w = self.workers
        st.hits.append({
            "index": index, "kind": ev.kind, "target": ev.target, "at_s": self.now,
            "outage_s": outage, "effect": effect, "phase": phase,
            "steady_s": steady_ms / 1000.0, "after_s": st.iteration_ms / 1000.0,
            "scheme": prot.scheme, "transport": w.transport,
            "timeout_s": w.collective_timeout_s, "on_fault": w.on_fault,
            "restart_s": w.restart_s, "route": route,
            "predicted_touched_s": touched_iteration_s(
                phase, steady_ms / 1000.0, st.iteration_ms / 1000.0, effect)})
        st.routes = [_lp_text(lp) for lp in alloc.lightpaths]
        if not effect.survived:
            assert effect.fail_after_s is not None
            st.stall_until_s = self.now + effect.fail_after_s
            st.error = effect.error
            st.down = []
            st.version += 1  # no departure: the job ends at its time-out
            self._track(st)
            self._push(st.stall_until_s, _FAIL, (st, st.version))
            return True
        if effect.redo_fraction > 0:  # restarted: the interrupted iteration again
            st.iterations_done -= effect.redo_fraction
            st.remaining_iter += effect.redo_fraction
            st.trace.append((self.now, st.iterations_done))
        st.restarts += effect.restarts
        st.stall_until_s = max(st.stall_until_s, self.now + effect.freeze_s)
        if left:
            if not math.isfinite(repair_s):
                return False
            st.down = left
            st.rejoin_token += 1
            self._push(repair_s, _REJOIN, (st, st.rejoin_token))
        elif prot.scheme in ("1+1", "backup"):
            self.unprotected_boundaries += jf.reserve_standby(
                self.cluster, alloc, self.planner.policy.spectrum, self.planner.rng)
        self._track(st)
        self._schedule_departure(st)
        return True

    def _record_lost(self, st: JobState, ev: EventSpec, index: int,
                     old: list[Lightpath | None]) -> None:
        """The hit of a job whose lost boundary got no new route (it is interrupted)."""
        t = st.iteration_ms / 1000.0
        effect = Effect(False, 0.0, fail_after_s=0.0,
                        error="lightpath lost: no route with free spectrum for its "
                        "boundary (restoration failed); the job is interrupted")
        w = self.workers
        st.hits.append({
            "index": index, "kind": ev.kind, "target": ev.target, "at_s": self.now,
            "outage_s": math.inf, "effect": effect,
            "phase": max(0.0, st.iterations_done - math.floor(st.iterations_done + 1e-9)),
            "steady_s": t, "after_s": t, "scheme": self.protection.scheme,
            "transport": w.transport, "timeout_s": w.collective_timeout_s,
            "on_fault": w.on_fault, "restart_s": w.restart_s, "route": "lost",
            "predicted_touched_s": math.inf})

    def _rejoin(self, st: JobState) -> None:
        """The fibre a waiting job's boundaries were on is back: set them up again (k
        paths, the repaired route first), re-time; no spectrum: interrupted."""
        alloc = st.alloc
        assert alloc is not None
        down, st.down = st.down, []
        self._settle(st)
        if not self.planner.restore(st.job, alloc, down):
            self._interrupt(st)
            return
        t = self.planner.timing(st.job, alloc.stage_dcs, alloc.lightpaths, st.schedule)
        st.iteration_ms, st.bubble_ratio = t.iteration_ms, t.bubble_ratio
        st.routes = [_lp_text(lp) for lp in alloc.lightpaths]
        if self.protection.scheme in ("1+1", "backup"):
            self.unprotected_boundaries += jf.reserve_standby(
                self.cluster, alloc, self.planner.policy.spectrum, self.planner.rng)
        self._track(st)
        self._schedule_departure(st)

    def _interrupt(self, st: JobState) -> None:
        """No route for a boundary, now or after a repair: the job stops (queue: back to
        the queue with its remaining iterations; block: ends, reason interrupted)."""
        assert st.alloc is not None
        st.interrupted += 1
        st.down = []
        if self.admission == "queue":
            self._track(st, closing=True)
            self.cluster.free_allocation(st.alloc, st.job.req.gpus_per_stage)
            self.running.pop(st.job.req.job_id)
            st.version += 1
            st.alloc = None
            st.stall_until_s = 0.0
            self.queue.append(st)
            self.queue.sort(key=lambda s: s.arrival_s)
        else:
            self._finish(st, "interrupted")

    # ---- main loop -------------------------------------------------------------------
    def load(self, jobs: Sequence[Job], arrivals_s: Sequence[float]) -> None:
        """Queue the jobs' arrivals and the network events."""
        for job, t in zip(jobs, arrivals_s, strict=True):
            self._push(t, _ARRIVE, JobState(job, t, float(job.req.iterations)))
        for i, ev in self.indexed_events:
            self._push(ev.at_s, _NET, (i, ev))

    def step_event(self) -> JobState | bool:
        """Pop the next event (the heap must not be empty) and handle a departure or a
        network event; an arrival is returned, the clock at its time, for the caller to
        admit. False: a stale departure (re-timed or interrupted job), nothing done."""
        t, kind, _, payload = heapq.heappop(self._heap)
        if kind == _DEPART:
            st, version = payload  # type: ignore[misc]
            if version != st.version:
                return False
            self._advance(t)
            self._settle(st)
            st.remaining_iter = 0.0
            self._finish(st)
            self._serve_queue()
            self._upgrade_running()
        elif kind == _NET:
            self._advance(t)
            index, ev = payload  # type: ignore[misc]
            self._network_event(ev, index)
        elif kind == _REJOIN:
            st, token = payload  # type: ignore[misc]
            if token != st.rejoin_token or not st.down or st.job.req.job_id not in \
                    self.running or self.running[st.job.req.job_id] is not st:
                return False
            self._advance(t)
            self._rejoin(st)
            self._serve_queue()
        elif kind == _FAIL:
            st, version = payload  # type: ignore[misc]
            if version != st.version:
                return False
            self._advance(t)
            self._finish(st, "collective_timeout")
            self._serve_queue()
            self._upgrade_running()
        else:
            self._advance(t)
            return payload  # type: ignore[no-any-return]
        return True

    def admit_or_block(self, st: JobState) -> Placed | Refused:
        """Start an arrived job now (admission: block), or record it blocked."""
        res = self._try_start(st)
        if isinstance(res, Refused):
            st.blocked, st.reason, st.end_s = True, res.reason, self.now
            self.done.append(st)
        return res

    def run(self, jobs: Sequence[Job], arrivals_s: Sequence[float],
            tick: Callable[[], None] | None = None) -> list[JobState]:
        self.load(jobs, arrivals_s)
        while self._heap or self.queue:
            if not self._heap:  # only waiting jobs left: the head never fits an idle cluster
                st = self.queue.pop(0)
                st.blocked = st.start_s is None  # a re-queued interrupted job ran already
                st.reason = "never_fits" if st.blocked else "interrupted"
                st.end_s = self.now
                self.done.append(st)
                self._serve_queue()
                continue
            got = self.step_event()
            if got is False:
                continue
            if isinstance(got, JobState):
                if self.admission == "queue":
                    self.queue.append(got)
                    self._serve_queue()
                else:
                    self.admit_or_block(got)
                if tick is not None:
                    tick()
            if self.on_change is not None:
                self.on_change(self)
        return self.done

    @property
    def makespan_s(self) -> float:
        return self._last_t

    def gpu_utilization(self) -> float:
        span = self._last_t
        return self._gpu_area / (span * self.cluster.total_gpus) if span > 0 else 0.0

    def spectrum_utilization(self) -> float:
        span = self._last_t
        return self._spec_area / span if span > 0 else 0.0


def _lp_text(lp: object) -> str:
    if lp is None:
        return "fabric"
    return (f"{'-'.join(lp.nodes)}:{lp.first_slot}+{lp.n_slots}:"  # type: ignore[attr-defined]
            f"{lp.modulation}:{lp.capacity_gbps:g}G")  # type: ignore[attr-defined]
