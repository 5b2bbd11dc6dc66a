"""LightPipe/Placement-v0: CBA-style placement of pipeline jobs' stages on DCs (Gymnasium).

One step = one arriving pp_jobs job. Action d (0..D-1) anchors the job at DC d: its
stages fill DC d, then the nearest DCs by fibre km (`Planner.fill` in
`Planner.nearest_order(d)`, at most max_stages_per_dc each), exactly the layouts CBA
chooses among; the stage-to-stage lightpaths are then set up with CBA's
communication-bound-aware slot sizing (`testbed.jobs.placement.cba_setup`: k paths,
first fit by default). Action D rejects the job.

Jobs arrive, run and leave as in `lightpipe sim` (`testbed.jobs.engine.JobSimulator`:
departures, fibre cuts with restoration, CBA's upgrades of lightpaths set up short);
admission is always `block`. Reward: minus the placed job's iteration time in seconds
from the schedule engine (`Planner.timing`, the simulator's own), or minus the block
penalty when the job is blocked (a forbidden action or a reject). docs/gym.md has the
spaces, the penalty and the assumptions.
"""

from __future__ import annotations

import math
import random
from typing import Any

import numpy as np
from gymnasium import spaces

from testbed.errors import InputError
from testbed.gym.base import LightPipeEnv
from testbed.gym.scenario import ScenarioLike, check_count, load, with_pp_jobs
from testbed.jobs.cluster import Allocation, Cluster
from testbed.jobs.engine import JobSimulator, JobState
from testbed.jobs.model import model_catalog
from testbed.jobs.outcome import NO_GPUS, NO_SPECTRUM, Job, Placed, Refused
from testbed.jobs.placement import cba_setup
from testbed.jobs.policies import Planner
from testbed.jobs.sim import resolve_jobs
from testbed.jobs.timing import Timer
from testbed.spec.models import PPJobsWorkload, Scenario
from testbed.traces import generate_jobs

DEFAULT_BLOCK_PENALTY = 4.0  # x the job's reference iteration time (docs/gym.md)
REJECTED = "rejected"
MIN_EPISODE_JOBS = 10  # a generated workload of fewer jobs (emulation demos) is extended
_F32_MAX = float(np.finfo(np.float32).max)


class _AgentPlanner(Planner):
    """The simulator's planner with the agent as its placement policy: `place` answers the
    decision the env committed (restore, upgrade and timing are the Planner's own)."""

    pending: Placed | Refused = Refused(NO_GPUS)

    def place(self, job: Job, now_s: float) -> Placed | Refused:
        return self.pending


class _SteppedJobs(JobSimulator):
    """JobSimulator run one arrival at a time: `next_arrival` processes departures and
    network events (the simulator's handlers) up to the next arrival; `decide` starts
    the job with the planner's pending decision or records it blocked."""

    def next_arrival(self) -> JobState | None:
        while self._heap:
            got = self.step_event()
            if isinstance(got, JobState):
                return got
        return None

    def decide(self, st: JobState) -> Placed | Refused:
        return self.admit_or_block(st)


class PlacementEnv(LightPipeEnv):
    """CBA-style job placement on LightPipe's job simulator (module docstring)."""

    def __init__(self, scenario: ScenarioLike | None = None, *,
                 episode_jobs: int | None = None, allow_reject: bool = False,
                 block_penalty: float = DEFAULT_BLOCK_PENALTY,
                 render_mode: str | None = None) -> None:
        self.check_render_mode("Placement-v0", render_mode)
        if episode_jobs is not None:
            check_count("episode_jobs", episode_jobs, 1, 10_000_000)
        if not isinstance(block_penalty, int | float) or not 0 <= block_penalty < math.inf:
            raise InputError("block_penalty", f"must be >= 0, got {block_penalty}")
        sc = with_pp_jobs(load(scenario))
        wl = sc.workload
        assert isinstance(wl, PPJobsWorkload)
        self.scenario: Scenario = sc
        self.workload = wl
        self.episode_jobs = episode_jobs
        self.allow_reject = allow_reject
        self.block_penalty = block_penalty
        self._catalog = model_catalog(wl.models)
        self._models = sorted(self._catalog)
        self._model_index = {m: i for i, m in enumerate(self._models)}
        self._timer = Timer()
        self._base = Cluster.from_scenario(sc)
        self.cluster = self._base
        self.n_dcs = len(self.cluster.dcs)
        self.reject_action = self.n_dcs
        self.action_space = spaces.Discrete(self.n_dcs + 1)
        d = self.n_dcs
        self.observation_space = spaces.Dict({
            "free_gpus": spaces.Box(0.0, 1.0, (d,), np.float32),
            "estimate_s": spaces.Box(0.0, _F32_MAX, (d,), np.float32),
            "spectrum_used": spaces.Box(0.0, 1.0, (self.cluster.network.n_spectra,),
                                        np.float32),
            "job": spaces.Box(0.0, _F32_MAX, (4,), np.float32),
            "model": spaces.Discrete(len(self._models)),
        })
        self._ref_ms: dict[tuple[Any, ...], float] = {}
        self.jobs = self.blocked = 0
        self._ended = True

    # ---- episode ---------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None
              ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Start an episode: an idle cluster and the job stream of the episode seed (the
        scenario's seed on the first reset without one; as RMSA-v0)."""
        ep = self.start_episode(seed)
        sc, wl = self.scenario, self.workload
        if wl.trace is not None:  # a trace: its jobs, cut at episode_jobs
            reqs = generate_jobs(wl)[:self.episode_jobs]
        else:  # generated: episode_jobs (or at least MIN_EPISODE_JOBS) of the same process
            n = self.episode_jobs or max(wl.jobs, MIN_EPISODE_JOBS)
            reqs = generate_jobs(wl.model_copy(update={"jobs": n}), random.Random(ep))
        jobs = resolve_jobs(wl, reqs)
        if self.cluster is not self._base:
            self._base.keep_paths(self.cluster)  # routes found (same cuts: same routes)
        self.cluster = self._base.snapshot()
        self.planner = _AgentPlanner(self.cluster, sc.policy, self._timer, random.Random(ep),
                                     wl.max_stages_per_dc)
        # trial set-ups run on a snapshot, through a planner of their own
        self._trial = Planner(self.cluster, sc.policy, self._timer, self.planner.rng,
                              wl.max_stages_per_dc)
        self.sim = _SteppedJobs(self.cluster, self.planner, "block", sc.events)
        self.sim.upgrades = True  # CBA: lightpaths set up short are raised later
        self.sim.load(jobs, [r.arrival_s for r in reqs])
        self._total = len(jobs)
        self.jobs = self.blocked = 0
        self.iteration_s_sum = 0.0
        self._ended = False
        st = self.sim.next_arrival()
        if st is None:
            raise InputError("workload", "the workload has no jobs")
        self._begin(st)
        return self._obs(), self._info()

    def step(self, action: Any) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        a = self.step_action(action)
        st = self._st
        job = st.job
        planned = self._plans[a] if a != self.reject_action and self._mask[a] else None
        if planned is None:
            self.planner.pending = Refused(self._refusal(a))
        else:
            alloc = self.cluster.commit_planned(planned, job.req.gpus_per_stage)
            timing = self.planner.timing(job, alloc.stage_dcs, alloc.lightpaths)
            self.planner.pending = Placed(alloc, timing)
        res = self.sim.decide(st)
        self.jobs += 1
        info_step: dict[str, Any]
        if isinstance(res, Placed):
            it_s = res.timing.iteration_ms / 1000.0
            self.iteration_s_sum += it_s
            reward = -it_s
            info_step = {"placed": True, "iteration_time_s": it_s,
                         "bubble_ratio": res.timing.bubble_ratio, "reason": "",
                         "placement": [self.cluster.dcs[d].name for d in res.alloc.stage_dcs]}
        else:
            self.blocked += 1
            reward = -self.block_penalty_s(job)
            info_step = {"placed": False, "iteration_time_s": 0.0, "bubble_ratio": 0.0,
                         "reason": res.reason, "placement": []}
        truncated = self.jobs >= self._total
        if not truncated:
            nxt = self.sim.next_arrival()
            if nxt is None:
                truncated = True
            else:
                self._begin(nxt)
        if truncated:  # the last observation: the same job on the cluster it left
            self._ended = True
            self._begin(st)
        info = self._info()
        info.update(info_step)
        return self._obs(), float(reward), False, truncated, info

    def _refusal(self, a: int) -> str:
        """Why the job is blocked: the anchor's set-up failure (no_gpus, no_spectrum,
        no_path); for a reject, "rejected" when some anchor could have placed it, else
        no_spectrum (or no_path) when a layout had the GPUs, else no_gpus."""
        if a != self.reject_action:
            return self._why[a]
        if self._mask[:self.n_dcs].any():
            return REJECTED
        whys = set(self._why)
        return next((w for w in (NO_SPECTRUM, "no_path") if w in whys), NO_GPUS)

    def decided(self) -> int:
        return self.jobs

    @property
    def job(self) -> Job:
        """The job the current observation asks to place."""
        return self._st.job

    def block_penalty_s(self, job: Job) -> float:
        """What blocking the job costs: block_penalty x its reference iteration time (all
        stages in one DC of the fastest GPU type, boundaries on that DC's fabric)."""
        return self.block_penalty * self.reference_ms(job) / 1000.0

    def reference_ms(self, job: Job) -> float:
        """The job's iteration time with every boundary on the fastest DC's fabric."""
        dcs = self.cluster.dcs
        fast = max(range(len(dcs)), key=lambda d: (dcs[d].gpu.peak_tflops, -d))
        key = (job.arch, job.req.stages, job.req.gpus_per_stage, job.req.microbatches, fast)
        got = self._ref_ms.get(key)
        if got is None:
            lay = (fast,) * job.req.stages
            got = self.planner.timing(job, lay, [None] * (job.req.stages - 1)).iteration_ms
            self._ref_ms[key] = got
        return got

    def cba_action(self) -> int:
        """The action that places the current job as the `cba` policy would (CBA's layout
        search and ranking, run on a snapshot), or reject when cba refuses it."""
        from testbed.jobs.placement import cba

        snap = self.cluster.snapshot()
        self._trial.cluster = snap
        res = cba(self._trial, self._st.job, self.sim.now)
        self.cluster.keep_paths(snap)
        if isinstance(res, Refused):
            return self.reject_action
        lay = res.alloc.stage_dcs
        for d, got in enumerate(self._layouts):
            if got == lay and self._mask[d]:
                return d
        raise AssertionError(f"cba chose layout {lay}, which no anchor gives")

    # ---- candidates, mask, observation ----------------------------------------------
    def _begin(self, st: JobState) -> None:
        """The current job: every anchor's layout set up (and rolled back) on a snapshot."""
        self._st = st
        job = st.job
        g = job.req.gpus_per_stage
        snap = self.cluster.snapshot()
        trial = self._trial
        trial.cluster = snap
        n = self.n_dcs
        mask = np.zeros(n + 1, np.int8)
        plans: list[Allocation | None] = [None] * n
        layouts: list[tuple[int, ...] | None] = [None] * n
        why = [NO_GPUS] * n
        est = np.zeros(n, np.float32)
        seen: dict[tuple[int, ...], tuple[Allocation | None, str, float]] = {}
        for d in range(n):
            # an anchor needs a free GPU (cba's anchors); the fill may still skip it
            lay = trial.fill(job, trial.nearest_order(d)) if self.cluster.free[d] else None
            layouts[d] = lay
            if lay is None:
                continue
            got = seen.get(lay)
            if got is None:
                alloc, reason = cba_setup(trial, job, lay)
                ms = 0.0
                if alloc is not None:
                    ms = trial.estimate_ms(job, lay, alloc.lightpaths)
                    kept = Allocation(alloc.stage_dcs, list(alloc.lightpaths),
                                      dict(alloc.short_gbps))
                    snap.free_allocation(alloc, g)
                    alloc = kept
                got = seen[lay] = (alloc, reason, ms)
            plans[d], why[d] = got[0], got[1]
            if got[0] is not None:
                mask[d] = 1
                est[d] = min(got[2] / 1000.0, _F32_MAX)
        self.cluster.keep_paths(snap)  # the routes the trials found, for the next job
        if self.allow_reject or not mask.any():
            mask[n] = 1
        self._plans, self._why, self._layouts, self._mask, self._est = (
            plans, why, layouts, mask, est)

    def _obs(self) -> dict[str, Any]:
        cl = self.cluster
        net = cl.network
        busy = net.slot_masks()[1]
        req = self._st.job.req
        return {
            "free_gpus": np.array([f / dc.gpus for f, dc in zip(cl.free, cl.dcs, strict=True)],
                                  np.float32),
            "estimate_s": self._est.copy(),
            "spectrum_used": np.array([b.bit_count() / net.slots for b in busy], np.float32),
            "job": np.array([req.stages, req.gpus_per_stage, req.microbatches,
                             self._st.job.act_mb], np.float32),
            "model": self._model_index[req.model],
        }

    def _info(self) -> dict[str, Any]:
        return {"action_mask": self._mask.copy(), "job_id": self._st.job.req.job_id,
                "time_s": self.sim.now, "jobs": self.jobs, "blocked": self.blocked}
