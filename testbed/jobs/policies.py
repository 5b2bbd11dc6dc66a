"""The planner: what every placement policy shares (layouts, lightpath set-up, timing, cost).

`Planner(cluster, policy).place(job, now_s)` applies the policy named in
`policy.placement`, a plain function of `testbed.jobs.placement` (PLACEMENTS); the
planner also raises short lightpaths (`upgrade`) and restores lost ones (`restore`).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from functools import lru_cache

from testbed.catalog import ModelArch
from testbed.jobs.cluster import Allocation, Cluster
from testbed.jobs.model import (
    StageTimes,
    energy_kwh,
    mean_price_usd_per_kwh,
    stage_times,
)
from testbed.jobs.outcome import NO_GPUS, NO_SPECTRUM, Job, Placed, Refused
from testbed.jobs.placement import get_placement
from testbed.jobs.timing import PipeTiming, Timer
from testbed.optical import Lightpath, PathInfo
from testbed.spec.models import PolicySpec

MAX_LAYOUTS = 8


class Planner:
    """Applies one placement policy to a cluster."""

    def __init__(self, cluster: Cluster, policy: PolicySpec, timer: Timer | None = None,
                 rng: random.Random | None = None, max_stages_per_dc: int | None = None) -> None:
        self.cluster = cluster
        self.max_stages_per_dc = max_stages_per_dc
        self.policy = policy
        self.timer = timer or Timer()
        self.rng = rng or random.Random(0)
        self.name = policy.placement
        self._place = get_placement(policy.placement).place
        self.ilp_stats: list[dict[str, object]] = []
        self._fb_cache: dict[tuple, tuple[list[float], list[float]]] = {}

    # ---- shared pieces --------------------------------------------------------------
    def place(self, job: Job, now_s: float) -> Placed | Refused:
        if job.req.stages * job.req.gpus_per_stage > sum(self.cluster.free):
            return Refused(NO_GPUS)
        return self._place(self, job, now_s)

    def times(self, job: Job, dc: int) -> StageTimes:
        return _stage_times(job.arch, job.req.stages, job.req.gpus_per_stage,
                            self.cluster.dcs[dc].gpu.name, self.policy.mfu)

    def stage_fb(self, job: Job, stage_dcs: Sequence[int]) -> tuple[list[float], list[float]]:
        """Forward and backward ms of every stage in its DC (memoised per GPU pattern)."""
        dcs = self.cluster.dcs
        key = (job.arch, job.req.gpus_per_stage, tuple(dcs[d].gpu.name for d in stage_dcs))
        hit = self._fb_cache.get(key)
        if hit is None:
            f, b = [], []
            for s, d in enumerate(stage_dcs):
                t = self.times(job, d)
                f.append(t.forward_ms[s])
                b.append(t.backward_ms[s])
            hit = self._fb_cache[key] = (f, b)
        return hit

    def fill(self, job: Job, order: Sequence[int]) -> tuple[int, ...] | None:
        """Pack consecutive stages into DCs in the given order (as many as fit)."""
        g, left = job.req.gpus_per_stage, job.req.stages
        out: list[int] = []
        cap = self.max_stages_per_dc or left
        for d in order:
            take = min(left, self.cluster.free[d] // g, cap)
            out += [d] * take
            left -= take
            if not left:
                return tuple(out)
        return None

    def nearest_order(self, anchor: int) -> list[int]:
        dist = self.cluster.distance_km[anchor]
        return sorted(range(len(self.cluster.dcs)), key=lambda d: (d != anchor, dist[d], d))

    def anchors(self) -> list[int]:
        """DCs with room for a stage, most free GPUs first."""
        free = self.cluster.free
        return sorted((d for d in range(len(free)) if free[d] > 0), key=lambda d: (-free[d], d))

    def layouts(self, job: Job, orders: Sequence[Sequence[int]]) -> list[tuple[int, ...]]:
        seen: list[tuple[int, ...]] = []
        for order in orders:
            lay = self.fill(job, order)
            if lay is not None and lay not in seen:
                seen.append(lay)
            if len(seen) >= MAX_LAYOUTS:
                break
        return seen

    def slots_no_stall(self, job: Job, f_next_ms: float, path: PathInfo) -> int:
        """Data slots so that one activation's transfer takes <= f_next_ms on this path."""
        need = 8.0 * job.act_mb / (f_next_ms * path.gbps_per_slot)
        return max(1, math.ceil(need - 1e-9))

    def hops(self, alloc_links: Sequence[Lightpath | None],
             stage_dcs: Sequence[int]) -> list[tuple[float, float]]:
        out = []
        for b, lp in enumerate(alloc_links):
            if lp is None:
                dc = self.cluster.dcs[stage_dcs[b]]
                out.append((dc.fabric_latency_ms, dc.fabric_gbps))
            else:
                out.append((lp.latency_ms, lp.capacity_gbps))
        return out

    def timing(self, job: Job, stage_dcs: Sequence[int], links: Sequence[Lightpath | None],
               schedule: str | None = None) -> PipeTiming:
        f, b = self.stage_fb(job, stage_dcs)
        return self.timer.time(f, b, self.hops(links, stage_dcs), job.act_mb,
                               job.req.microbatches, schedule or self.policy.schedule)

    def run_cost_usd(self, job: Job, stage_dcs: Sequence[int], iteration_ms: float,
                     start_s: float, window: bool = True) -> tuple[float, float]:
        """(energy kWh, electricity USD) of the whole run if it started now (window: the
        price curve over the run's own hours; else each DC's daily mean price)."""
        run_s = iteration_ms / 1000.0 * job.req.iterations
        kwh = usd = 0.0
        for d in stage_dcs:
            dc = self.cluster.dcs[d]
            e = energy_kwh(job.req.gpus_per_stage, dc.gpu.power_w, run_s)
            kwh += e
            usd += e * mean_price_usd_per_kwh(dc.price_usd_per_kwh, dc.price_curve,
                                              start_s if window else 0.0,
                                              run_s if window else 86400.0)
        return kwh, usd

    def setup(self, job: Job, stage_dcs: Sequence[int],
               demand: Callable[[int, PathInfo, float], tuple[int, int]],
               k: int | None, order: Sequence[int] | None = None
               ) -> tuple[Allocation | None, str]:
        """Take GPUs, then lightpaths boundary by boundary in `order`.

        demand(b, path, f_next_ms) -> (wanted data slots, least acceptable data slots).
        Paths are tried shortest first; at each slot count from wanted down to least.
        On failure everything is rolled back and (None, reason) returned.
        """
        cl, net = self.cluster, self.cluster.network
        p, g = job.req.stages, job.req.gpus_per_stage
        try:
            alloc = cl.commit(stage_dcs, g, [None] * (p - 1))
        except ValueError:
            return None, NO_GPUS
        f, _ = self.stage_fb(job, stage_dcs)
        guard = net.guard_slots
        boundaries = order if order is not None else range(p - 1)
        for bnd in boundaries:
            d1, d2 = stage_dcs[bnd], stage_dcs[bnd + 1]
            if d1 == d2:
                continue
            paths = cl.paths(d1, d2)
            if k is not None:
                paths = paths[:k]
            got: Lightpath | None = None
            wants = []
            for path in paths:  # first every path at the wanted count, then degrade
                want, least = demand(bnd, path, f[bnd + 1])
                want = min(want, self.policy.max_slots)
                wants.append((path, want, min(least, want)))
            for path, want, _ in wants:
                first = net.find_block(path, want + guard, self.policy.spectrum, self.rng)
                if first is not None:
                    got = net.assign(path, first, want + guard)
                    break
            if got is None:
                for path, want, least in wants:
                    for n in range(want - 1, least - 1, -1):
                        first = net.find_block(path, n + guard, self.policy.spectrum, self.rng)
                        if first is not None:
                            got = net.assign(path, first, n + guard)
                            alloc.short_gbps[bnd] = want * path.gbps_per_slot
                            break
                    if got is not None:
                        break
            if got is None:
                cl.free_allocation(alloc, g)
                return None, NO_SPECTRUM if paths else "no_path"
            alloc.lightpaths[bnd] = got
        return alloc, ""

    def estimate_ms(self, job: Job, stage_dcs: Sequence[int],
                    links: Sequence[Lightpath | None]) -> float:
        """Analytic iteration time used to rank layouts (the MILP's objective, no slot
        term): sum(f+b) + 2 sum(lat + tx) + (m - 1) max(f+b, tx)."""
        f, b = self.stage_fb(job, stage_dcs)
        comp = [x + y for x, y in zip(f, b, strict=True)]
        total, cyc = sum(comp), max(comp)
        for lat, gbps in self.hops(links, stage_dcs):
            tx = 8.0 * job.act_mb / gbps
            total += 2.0 * (lat + tx)
            cyc = max(cyc, tx)
        return total + (job.req.microbatches - 1) * cyc

    def best_of(self, job: Job, layouts: Sequence[tuple[int, ...]],
                 setup: Callable[[tuple[int, ...]], tuple[Allocation | None, str]],
                 score: Callable[[tuple[int, ...], float], float],
                 schedules: Sequence[str] = (), exact: bool = False) -> Placed | Refused:
        """Rank layouts by score(layout, iteration ms) (set up, then rolled back); the
        iteration time is the analytic estimate, or with exact=True the schedule
        engine's timing of the policy's schedule. Commit the best and time it with the
        engine, with the policy's schedule or the fastest of `schedules`."""
        best: tuple[float, tuple[int, ...]] | None = None
        reason = NO_GPUS
        g = job.req.gpus_per_stage
        alloc: Allocation | None = None
        for lay in layouts:
            alloc, why = setup(lay)
            if alloc is None:
                reason = why
                continue
            it_ms = (self.timing(job, lay, alloc.lightpaths).iteration_ms if exact
                     else self.estimate_ms(job, lay, alloc.lightpaths))
            val = score(lay, it_ms)
            if best is None or val < best[0]:
                best = (val, lay)
            if len(layouts) > 1:
                self.cluster.free_allocation(alloc, g)
                alloc = None
        if best is None:
            return Refused(reason)
        lay = best[1]
        if alloc is None:
            alloc, why = setup(lay)
            if alloc is None:  # cannot happen: same state, same deterministic setup
                return Refused(why)
        cands = [self.timing(job, lay, alloc.lightpaths, s)
                 for s in dict.fromkeys((self.policy.schedule, *schedules))]
        return Placed(alloc, min(cands, key=lambda t: t.iteration_ms))

    # ---- CBA's blocking flag: raise short lightpaths when spectrum frees up ---------
    def upgrade(self, job: Job, alloc: Allocation) -> bool:
        """Give flagged boundaries the capacity they asked for (make before break: the
        new lightpath is set up before the old one is released). True if any changed."""
        net = self.cluster.network
        changed = False
        for bnd, want_gbps in list(alloc.short_gbps.items()):
            old = alloc.lightpaths[bnd]
            if old is None or old.id not in net.lightpaths:
                continue
            d1, d2 = alloc.stage_dcs[bnd], alloc.stage_dcs[bnd + 1]
            for path in self.cluster.paths(d1, d2):
                n = min(self.policy.max_slots, math.ceil(want_gbps / path.gbps_per_slot - 1e-9))
                if n * path.gbps_per_slot <= old.capacity_gbps:
                    continue
                first = net.find_block(path, n + net.guard_slots, self.policy.spectrum, self.rng)
                if first is None:
                    continue
                alloc.lightpaths[bnd] = net.assign(path, first, n + net.guard_slots)
                net.release(old)
                del alloc.short_gbps[bnd]
                changed = True
                break
        return changed

    # ---- restoration after a network event --------------------------------------------
    def restore(self, job: Job, alloc: Allocation, lost: Sequence[int]) -> bool:
        """Re-provision the lost boundaries (same DCs, k paths, same slot count)."""
        net = self.cluster.network
        made: list[tuple[int, Lightpath]] = []
        for b in lost:
            old = alloc.lightpaths[b]
            assert old is not None
            d1, d2 = alloc.stage_dcs[b], alloc.stage_dcs[b + 1]
            lp = None
            for path in self.cluster.paths(d1, d2):
                first = net.find_block(path, old.n_slots, self.policy.spectrum, self.rng)
                if first is not None:
                    lp = net.assign(path, first, old.n_slots)
                    break
            if lp is None:
                for _, x in made:
                    net.release(x)
                return False
            made.append((b, lp))
        for b, lp in made:
            alloc.lightpaths[b] = lp
        return True


@lru_cache(maxsize=4096)
def _stage_times(arch: ModelArch, stages: int, gpus_per_stage: int, gpu: str,
                 mfu: float) -> StageTimes:
    from testbed.jobs.model import gpu_type

    return stage_times(arch, [gpu_type(gpu)] * stages, gpus_per_stage, mfu)
