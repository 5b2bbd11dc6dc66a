"""POST /jobs: place a pipeline job on the controller's own optical state and set it up.

`JobService` runs a named placement policy of `testbed.jobs` (sp-ff, delay-first,
cost-first, cba, cba-ilp, bace-pipe, joint) on a `Cluster` whose optical network IS the
controller's `core.net`, so GPUs and spectrum are accounted in one place: the policy
takes GPUs and holds spectrum exactly as in the simulator, then every cross-DC stage
boundary's optical lightpath is adopted by the controller (VLAN id, OpenFlow rules,
emulator caps), carrying only the traffic between the two stages' emulated hosts when
a layout is known. Jobs are stored in the controller's SQLite store and come back after
a restart (their lightpaths are re-read by the core; GPUs are re-counted).

Concurrency: the policy runs on a snapshot of the state (`Cluster.snapshot`: free GPUs
and a copy of the optical network) outside `core.lock`, so other REST calls and fibre-cut
restoration go on meanwhile; the chosen DCs, routes and slot blocks are then committed
under the lock (`Cluster.commit_planned`). If the state changed and the plan no longer
fits, the job is planned again on a fresh snapshot (bounded, then 409 `conflict`). A
placement's time and the number computing at once are bounded (controllers.placing:
503 `timeout` / `busy`).
"""

from __future__ import annotations

import logging
import random
from collections import Counter
from dataclasses import dataclass
from typing import Any

from controllers.core import ControllerCore
from controllers.errors import RequestError
from controllers.placing import PlaceLimits, PlaceRunner, Ticket
from controllers.wanroute import WanFlow
from testbed.catalog import ModelArch
from testbed.jobs.cluster import DC, Cluster
from testbed.jobs.model import model_catalog
from testbed.jobs.outcome import Job, Placed, Refused
from testbed.jobs.policies import Planner
from testbed.jobs.timing import Timer
from testbed.spec.models import PLACEMENT_POLICIES, PolicySpec, PPJobsWorkload
from testbed.traces import JobRequest

log = logging.getLogger("lightpipe.controller.jobs")


@dataclass(frozen=True)
class _Snapshot:
    """A placement's private copy of the state, taken under the core's lock."""

    cluster: Cluster  # Cluster.snapshot(): free GPUs and optical state copied
    rng: random.Random  # the service's RNG state at the snapshot
    rng_epoch: int  # JobService._rng_epoch at the snapshot
    key: tuple[object, ...]  # Cluster.state_key() at the snapshot
    job_id: int  # the id the job would get if nothing else were placed meanwhile


class JobService:
    """Places, lists and removes pipeline jobs (thread-safe through core.lock; placements
    are planned outside it, under `limits`)."""

    def __init__(self, core: ControllerCore, limits: PlaceLimits | None = None) -> None:
        self.core = core
        self.limits = limits or PlaceLimits()
        self.runner = PlaceRunner(self.limits, core.lock, core.metrics)
        sc = core.scenario
        try:
            self.dcs = [DC.from_spec(i, d) for i, d in enumerate(sc.dcs)]
        except (KeyError, ValueError) as exc:  # unknown GPU type in the spec
            raise ValueError(f"cannot build the job cluster: {exc}") from None
        self.cluster = Cluster(self.dcs, core.net)
        extra = sc.workload.models if isinstance(sc.workload, PPJobsWorkload) else []
        self.catalog = model_catalog(extra)
        # Same cross-domain spreading rule as the simulator's planner for this scenario.
        self.max_stages_per_dc = (sc.workload.max_stages_per_dc
                                  if isinstance(sc.workload, PPJobsWorkload) else None)
        self.timer = Timer()
        self.rng = random.Random(getattr(sc.workload, "seed", 1))
        self._rng_epoch = 0  # placements whose RNG draws were kept (JobService._keep)
        self.dc_index = {d.name: d.index for d in self.dcs}
        self.jobs: dict[int, dict[str, Any]] = {}
        for job_id, body in core.store.jobs().items():
            self.jobs[job_id] = body
            for st in body["stages_placement"]:
                self.cluster.free[self.dc_index[st["dc"]]] -= body["gpus_per_stage"]
        core.metrics.jobs_active.set(len(self.jobs))
        core.traffic.wan_sources.append(self.wan_flows)

    def wan_flows(self) -> list[WanFlow]:
        """The running jobs' cross-DC stage-to-stage transfers (host pairs), for the
        lightpath assignment (controllers.wanroute)."""
        return [WanFlow(job_id, e["src_host"], e["dst_host"], "pipeline")
                for job_id, body in sorted(self.jobs.items()) for e in body["boundaries"]
                if e.get("src_host") and e.get("dst_host") and e["src_dc"] != e["dst_dc"]]

    # ---- API ---------------------------------------------------------------------------
    def list(self) -> list[dict[str, Any]]:
        with self.core.lock:
            return [self._live_view(b) for b in self.jobs.values()]

    def get(self, job_id: int) -> dict[str, Any]:
        with self.core.lock:
            if job_id not in self.jobs:
                raise RequestError(404, f"no job {job_id}")
            return self._live_view(self.jobs[job_id])

    def place(self, req: Any) -> dict[str, Any]:
        """Place `req` (api.JobRequest) and set up its lightpaths; RequestError if not
        (409 refused or conflicting, 503 busy or over the time limit)."""
        policy_name = req.policy or self.core.scenario.policy.placement
        if policy_name not in PLACEMENT_POLICIES:
            raise RequestError(400, f"unknown placement policy {policy_name!r} "
                               f"(known: {', '.join(PLACEMENT_POLICIES)})")
        arch = self.catalog.get(req.model)
        if arch is None:
            raise RequestError(404, f"unknown model {req.model!r} (known: "
                               f"{', '.join(sorted(self.catalog))})")
        if req.stages > arch.layers:
            raise RequestError(400, f"{req.stages} stages for a {arch.layers}-layer model")
        total = sum(d.gpus for d in self.dcs)
        if req.stages * req.gpus_per_stage > total:
            raise RequestError(409, f"the job needs {req.stages * req.gpus_per_stage} GPUs; "
                               f"all DCs together have {total}", reason="no_gpus")
        update: dict[str, Any] = {"placement": policy_name}
        if req.schedule is not None:
            update["schedule"] = req.schedule
        policy = self.core.scenario.policy.model_copy(update=update)
        t0 = self.core.clock()
        self.core.metrics.job_requests.inc()
        return self.runner.run(lambda ticket: self._place(req, arch, policy, t0, ticket))

    def _place(self, req: Any, arch: ModelArch, policy: PolicySpec, t0: float,
               ticket: Ticket) -> dict[str, Any]:
        """Plan on a snapshot outside the core's lock, then commit under it; plan again on
        a fresh snapshot (at most limits.attempts plans) when the state changed meanwhile
        and the plan no longer fits, or a refusal may no longer hold."""
        core = self.core
        attempts = self.limits.attempts
        for attempt in range(1, attempts + 1):
            with core.lock:
                ticket.check()
                snap = self._snapshot()
            got = self._plan(snap, req, arch, policy, ticket)
            with core.lock:
                ticket.check()
                if not isinstance(got, Placed):
                    if attempt < attempts and self.cluster.state_key() != snap.key:
                        self._replan(f"refused ({got.reason}) on a state that has changed")
                        continue
                    ticket.final = True
                    self._keep(snap)
                    core.metrics.job_refusals.labels(reason=got.reason).inc()
                    raise RequestError(409, f"job refused by {policy.placement}: {got.reason}",
                                       reason=got.reason)
                try:
                    alloc = self.cluster.commit_planned(got.alloc, req.gpus_per_stage)
                except ValueError as exc:  # GPUs or slots taken, or a fibre cut, meanwhile
                    self._replan(str(exc))
                    continue
                ticket.final = True
                self._keep(snap)
                return self._commit(req, policy.placement, Placed(alloc, got.timing,
                                                                  got.solver), t0)
        with core.lock:
            ticket.check()
            ticket.final = True
        core.metrics.job_refusals.labels(reason="conflict").inc()
        raise RequestError(409, f"job not placed: the state changed under each of its "
                           f"{attempts} placements (concurrent requests); try again",
                           reason="conflict")

    def _snapshot(self) -> _Snapshot:
        """What a placement plans on (call under the core's lock)."""
        rng = random.Random()
        rng.setstate(self.rng.getstate())
        snap = self.cluster.snapshot()
        return _Snapshot(snap, rng, self._rng_epoch, snap.state_key(),
                         max(self.jobs, default=0) + 1)

    def _plan(self, snap: _Snapshot, req: Any, arch: ModelArch, policy: PolicySpec,
              ticket: Ticket) -> Placed | Refused:
        """The placement policy on the snapshot (no lock held)."""
        left_s = ticket.remaining_s()
        if left_s < policy.ilp_time_limit_s:  # the MILP (cba-ilp) gets what time is left
            policy = policy.model_copy(update={"ilp_time_limit_s": max(0.05, left_s)})
        jr = JobRequest(snap.job_id, 0.0, req.model, req.stages, req.gpus_per_stage,
                        req.microbatches, req.iterations)
        planner = Planner(snap.cluster, policy, timer=self.timer, rng=snap.rng,
                          max_stages_per_dc=req.max_stages_per_dc or self.max_stages_per_dc)
        self.core.metrics.job_planning.inc()
        try:
            return planner.place(Job(jr, arch), 0.0)
        finally:
            self.core.metrics.job_planning.dec()

    def _keep(self, snap: _Snapshot) -> None:
        """The placement's outcome is final: the RNG continues from where its planning left
        it (unless another placement's planning was kept since the snapshot), and the
        routes it computed stay cached; so a sequence of requests draws exactly as when
        every placement ran on the live state."""
        if snap.rng_epoch == self._rng_epoch:
            self.rng.setstate(snap.rng.getstate())
            self._rng_epoch += 1
        self.cluster.keep_paths(snap.cluster)

    def _replan(self, why: str) -> None:
        self.core.metrics.job_replans.inc()
        log.info("job placement planned again: %s", why)

    def _commit(self, req: Any, policy_name: str, got: Placed, t0: float) -> dict[str, Any]:
        """Set the committed placement up (call under the core's lock): its lightpaths
        become controller lightpaths, the job is stored; all or nothing."""
        core = self.core
        job_id = max(self.jobs, default=0) + 1
        try:
            body = self._set_up(job_id, req, policy_name, got)
        except BaseException:
            self.cluster.free_allocation(got.alloc, req.gpus_per_stage)
            raise
        core.store.save_job(job_id, body)
        self.jobs[job_id] = body
        core.program()  # its flows join the lightpath assignment
        core.metrics.jobs_active.set(len(self.jobs))
        core.metrics.job_setup_seconds.observe(core.clock() - t0)
        log.info("job %d (%s, %d stages) placed by %s on %s", job_id, req.model,
                 req.stages, policy_name, ",".join(body["dcs"]))
        return self._live_view(body)

    def remove(self, job_id: int) -> dict[str, Any]:
        """Tear down the job's lightpaths and return its GPUs."""
        core = self.core
        with core.lock:
            body = self.jobs.get(job_id)
            if body is None:
                raise RequestError(404, f"no job {job_id}")
            view = self._live_view(body)
            for lp_id in body["lightpath_ids"]:
                if lp_id in core.rows and core.rows[lp_id].job_id == job_id:
                    core.delete(lp_id, program=False)
            for st in body["stages_placement"]:
                self.cluster.free[self.dc_index[st["dc"]]] += body["gpus_per_stage"]
            core.store.delete_job(job_id)
            del self.jobs[job_id]
            core.program()  # after the job left: its flows leave the assignment
            core.metrics.jobs_active.set(len(self.jobs))
            view["removed"] = True
            return view

    # ---- helpers -------------------------------------------------------------------------
    def _set_up(self, job_id: int, req: Any, policy_name: str, got: Placed) -> dict[str, Any]:
        core = self.core
        alloc = got.alloc
        dcs = [self.dcs[d].name for d in alloc.stage_dcs]
        hosts = self._hosts(dcs)
        boundaries: list[dict[str, Any]] = []
        made: list[int] = []
        used_pairs: set[frozenset[str]] = set()
        try:
            for b, lp in enumerate(alloc.lightpaths):
                a_dc, b_dc = dcs[b], dcs[b + 1]
                entry: dict[str, Any] = {"boundary": b, "src_stage": b, "dst_stage": b + 1,
                                         "src_dc": a_dc, "dst_dc": b_dc,
                                         "src_host": hosts[b], "dst_host": hosts[b + 1],
                                         "lightpath_id": None}
                if lp is not None:
                    pair = frozenset((hosts[b] or "", hosts[b + 1] or ""))
                    by_host = hosts[b] is not None and pair not in used_pairs
                    used_pairs.add(pair)
                    view = core.adopt(lp, a_dc, b_dc, job_id=job_id,
                                      src_host=hosts[b] if by_host else None,
                                      dst_host=hosts[b + 1] if by_host else None,
                                      program=False)
                    made.append(view["id"])
                    entry["lightpath_id"] = view["id"]
                    if b in alloc.short_gbps:
                        entry["short_gbps"] = alloc.short_gbps[b]
                boundaries.append(entry)
            core.program()
        except BaseException:
            for lp_id in made:  # releases their spectrum too
                core.delete(lp_id, program=False)
            core.program()
            raise
        t = got.timing
        return {
            "id": job_id, "model": req.model, "stages": req.stages,
            "gpus_per_stage": req.gpus_per_stage, "microbatches": req.microbatches,
            "iterations": req.iterations, "policy": policy_name, "schedule": t.schedule,
            "iteration_ms": t.iteration_ms, "bubble_ratio": t.bubble_ratio,
            "duration_s": t.iteration_ms * req.iterations / 1000.0,
            "dcs": dcs,
            "stages_placement": [{"stage": i, "dc": dc, "host": hosts[i],
                                  "ip": self._host_ip(hosts[i])} for i, dc in enumerate(dcs)],
            "boundaries": boundaries, "lightpath_ids": made,
            "solver": got.solver,
        }

    def _hosts(self, dcs: list[str]) -> list[str | None]:
        """An emulated host per stage: the least-loaded host of its DC (stages of live jobs
        and of this job counted), ties by name; None without a layout."""
        ix = self.core.layout
        if ix is None:
            return [None] * len(dcs)
        load: Counter[str] = Counter(
            st["host"] for b in self.jobs.values() for st in b["stages_placement"]
            if st.get("host"))
        out: list[str | None] = []
        for dc in dcs:
            cands = sorted(h.name for h in ix.hosts_by_dc.get(dc, []))
            if not cands:
                out.append(None)
                continue
            pick = min(cands, key=lambda n: (load[n], n))
            load[pick] += 1
            out.append(pick)
        return out

    def _host_ip(self, host: str | None) -> str | None:
        ix = self.core.layout
        if host is None or ix is None or host not in ix.hosts:
            return None
        return ix.hosts[host].ip

    def _live_view(self, body: dict[str, Any]) -> dict[str, Any]:
        """The stored job with each boundary's lightpath as it is now (after restoration:
        the new route/slots; a lost one: null with `lost: true`)."""
        core = self.core
        out = dict(body)
        bounds = []
        for e in body["boundaries"]:
            e = dict(e)
            lp_id = e.get("lightpath_id")
            if lp_id is not None:
                row = core.rows.get(lp_id)
                if row is None or row.job_id != body["id"]:
                    e["lightpath"], e["lost"] = None, True
                else:
                    e["lightpath"] = core.view(row)
            else:
                e["lightpath"] = None
            bounds.append(e)
        out["boundaries"] = bounds
        return out
