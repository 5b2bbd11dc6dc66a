"""Placement policies: DC per stage, lightpath (route, slots) per boundary, pipeline schedule.

Every policy returns a committed `Placed` (GPUs taken, lightpaths set up through the
optical layer) or a `Refused` reason, leaving the cluster unchanged. Rules (docs/jobs.md):

* sp-ff: anchor = DC with most free GPUs, then nearest DCs; stages packed in that
  order; shortest path only, ``fixed_slots`` slots, spectrum policy (first-fit).
* delay-first: every anchor (fastest GPUs first); each boundary takes up to
  ``max_slots`` on the first of k paths that fits; the fastest layout (engine) wins.
* cost-first: DCs in order of electricity price (cheapest first); shortest path,
  ``fixed_slots`` slots.
* cba: boundaries are communication-bound (CB) when the transfer at the baseline
  allocation (``fixed_slots`` on the shortest path) takes longer than the receiving
  stage's forward time. Every boundary gets just enough slots that transfer <= that
  compute time (CB ones more than the baseline, non-CB ones fewer); CB boundaries are
  set up first, on the first of k paths with a fitting block; a CB boundary that cannot
  get its slots degrades down to half. The 3 shortest layouts (fibre km) are set up and
  ranked by the analytic iteration model; the others only if those fail.
* cba-ilp: the MILP of `testbed.jobs.milp` over all DCs, k paths, candidate slot counts
  and first-fit-disjoint blocks.
* bace-pipe: bandwidth-aware pathfinder (only paths on which a block of at least the
  no-stall slot count fits) and a cost-minimising choice among layouts (cost per work,
  cheapest price, every anchor) by the electricity cost of the whole run.
* joint: cba's slot sizing, layouts of cba and bace-pipe scored by normalised
  iteration time + cost, and the fastest pipeline schedule among `JOINT_SCHEDULES`.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache

from testbed.catalog import ModelArch
from testbed.jobs import milp
from testbed.jobs.cluster import DC, Allocation, Cluster, LinkChoice
from testbed.jobs.model import (
    StageTimes,
    activation_mb,
    energy_kwh,
    mean_price_usd_per_kwh,
    stage_times,
)
from testbed.jobs.timing import PipeTiming, Timer
from testbed.optical import Lightpath, PathInfo
from testbed.optical.spectrum import fitting_starts
from testbed.spec.models import PolicySpec
from testbed.traces import JobRequest

JOINT_SCHEDULES = ("gpipe", "1f1b", "zb-h1", "geopipe")
MAX_LAYOUTS = 8
CBA_LAYOUTS = 3
ILP_BLOCKS = 2  # cba-ilp: first-fit-disjoint candidate blocks per (route, slots)
BACE_PRICE_WINDOW = True  # rank by the price curve over the run window

# refusal reasons (jobs.csv `reason`)
NO_GPUS = "no_gpus"
NO_SPECTRUM = "no_spectrum"
NO_BANDWIDTH = "no_bandwidth"  # bace-pipe: no path carries the transfer without stalling


@dataclass
class Placed:
    """A committed placement and its pipeline timing."""

    alloc: Allocation
    timing: PipeTiming
    solver: dict[str, object] | None = None


@dataclass(frozen=True)
class Refused:
    reason: str


@dataclass(frozen=True)
class Job:
    """A job request resolved against the model catalogue."""

    req: JobRequest
    arch: ModelArch

    @property
    def act_mb(self) -> float:
        return activation_mb(self.arch)


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
        self._place: Callable[[Job, float], Placed | Refused] = {
            "sp-ff": self._sp_ff, "delay-first": self._delay_first,
            "cost-first": self._cost_first, "cba": self._cba, "cba-ilp": self._cba_ilp,
            "bace-pipe": self._bace, "joint": self._joint,
        }[policy.placement]
        self.ilp_stats: list[dict[str, object]] = []
        self._fb_cache: dict[tuple, tuple[list[float], list[float]]] = {}

    # ---- shared pieces --------------------------------------------------------------
    def place(self, job: Job, now_s: float) -> Placed | Refused:
        if job.req.stages * job.req.gpus_per_stage > sum(self.cluster.free):
            return Refused(NO_GPUS)
        return self._place(job, now_s)

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

    def _setup(self, job: Job, stage_dcs: Sequence[int],
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

    def _best_of(self, job: Job, layouts: Sequence[tuple[int, ...]],
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

    # ---- policies ---------------------------------------------------------------------
    def _fixed(self, b: int, path: PathInfo, f_next: float) -> tuple[int, int]:
        return self.policy.fixed_slots, self.policy.fixed_slots

    def _fill_fixed(self, job: Job, order: list[int] | None) -> Placed | Refused:
        """Fill DCs in `order`; shortest path, the fixed slot count, first fit."""
        lay = self.fill(job, order) if order is not None else None
        if lay is None:
            return Refused(NO_GPUS)
        alloc, why = self._setup(job, lay, self._fixed, k=1)
        if alloc is None:
            return Refused(why)
        return Placed(alloc, self.timing(job, lay, alloc.lightpaths))

    def _sp_ff(self, job: Job, now_s: float) -> Placed | Refused:
        anchors = self.anchors()
        return self._fill_fixed(job, self.nearest_order(anchors[0]) if anchors else None)

    def _cost_first(self, job: Job, now_s: float) -> Placed | Refused:
        dcs = self.cluster.dcs
        order = sorted(range(len(dcs)), key=lambda d: (_mean_price(dcs[d], now_s), d))
        return self._fill_fixed(job, order)

    def _delay_first(self, job: Job, now_s: float) -> Placed | Refused:
        dcs = self.cluster.dcs
        anchors = sorted(self.anchors(), key=lambda d: (-dcs[d].gpu.peak_tflops,
                                                        -self.cluster.free[d], d))
        lays = self.layouts(job, [self.nearest_order(a) for a in anchors])
        full = self.policy.max_slots

        def setup(lay: tuple[int, ...]) -> tuple[Allocation | None, str]:
            return self._setup(job, lay, lambda b, p, f: (full, 1), k=None)

        return self._best_of(job, lays, setup, lambda lay, it: it, exact=True)

    def cb_labels(self, job: Job, stage_dcs: Sequence[int]) -> list[bool]:
        """CB label per boundary: baseline transfer (fixed_slots, shortest path) > f_next."""
        f, _ = self.stage_fb(job, stage_dcs)
        out = []
        for b in range(len(stage_dcs) - 1):
            d1, d2 = stage_dcs[b], stage_dcs[b + 1]
            if d1 == d2:
                dc = self.cluster.dcs[d1]
                tx = 8.0 * job.act_mb / dc.fabric_gbps
            else:
                paths = self.cluster.paths(d1, d2)
                if not paths:
                    out.append(True)
                    continue
                tx = 8.0 * job.act_mb / (self.policy.fixed_slots * paths[0].gbps_per_slot)
            out.append(tx > f[b + 1])
        return out

    def _cba_setup(self, job: Job, lay: tuple[int, ...]) -> tuple[Allocation | None, str]:
        labels = self.cb_labels(job, lay)
        order = sorted(range(len(labels)), key=lambda b: (not labels[b], b))

        def demand(b: int, path: PathInfo, f_next: float) -> tuple[int, int]:
            n = self.slots_no_stall(job, f_next, path)
            return (n, max(1, n // 2)) if labels[b] else (n, n)

        return self._setup(job, lay, demand, k=None, order=order)

    def chain_km(self, lay: Sequence[int]) -> float:
        dist = self.cluster.distance_km
        return sum(dist[a][b] for a, b in itertools.pairwise(lay))

    def _cba(self, job: Job, now_s: float) -> Placed | Refused:
        lays = self.layouts(job, [self.nearest_order(a) for a in self.anchors()])
        # set up only the CBA_LAYOUTS shortest chains (fibre km between consecutive stages)
        lays = sorted(lays, key=self.chain_km)
        res = self._best_of(job, lays[:CBA_LAYOUTS], lambda lay: self._cba_setup(job, lay),
                            lambda lay, est: est)
        if isinstance(res, Refused) and len(lays) > CBA_LAYOUTS:  # fall back to the rest
            res = self._best_of(job, lays[CBA_LAYOUTS:], lambda lay: self._cba_setup(job, lay),
                                lambda lay, est: est)
        return res

    def _bace_setup(self, job: Job, lay: tuple[int, ...]) -> tuple[Allocation | None, str]:
        def demand(b: int, path: PathInfo, f_next: float) -> tuple[int, int]:
            n = min(self.slots_no_stall(job, f_next, path), self.policy.max_slots)
            return self.policy.max_slots, n

        alloc, why = self._setup(job, lay, demand, k=None)
        return alloc, (NO_BANDWIDTH if why == NO_SPECTRUM else why)

    def cost_orders(self, now_s: float) -> list[list[int]]:
        """DCs by electricity price, and by price x watts per TFLOP/s (cost per work)."""
        dcs = self.cluster.dcs
        idx = range(len(dcs))
        cheap = sorted(idx, key=lambda d: (_mean_price(dcs[d], now_s), d))
        eff = sorted(idx, key=lambda d: (_mean_price(dcs[d], now_s) * dcs[d].gpu.power_w
                                         / dcs[d].gpu.peak_tflops, d))
        return [eff, cheap]

    def _bace(self, job: Job, now_s: float) -> Placed | Refused:
        orders = self.cost_orders(now_s) + [self.nearest_order(a) for a in self.anchors()]
        lays = self.layouts(job, orders)

        def score(lay: tuple[int, ...], est_ms: float) -> float:
            _, usd = self.run_cost_usd(job, lay, est_ms, now_s, window=BACE_PRICE_WINDOW)
            return usd + 1e-9 * est_ms

        return self._best_of(job, lays, lambda lay: self._bace_setup(job, lay), score,
                             exact=True)

    def _joint(self, job: Job, now_s: float) -> Placed | Refused:
        orders = self.cost_orders(now_s) + [self.nearest_order(a) for a in self.anchors()]
        lays = self.layouts(job, orders)
        # reference values for normalisation: the ideal (no network) run on the first layout
        ref_t: list[float] = []
        ref_c: list[float] = []

        def score(lay: tuple[int, ...], est_ms: float) -> float:
            _, usd = self.run_cost_usd(job, lay, est_ms, now_s)
            if not ref_t:
                ref_t.append(est_ms)
                ref_c.append(max(usd, 1e-12))
            return est_ms / ref_t[0] + usd / ref_c[0]

        return self._best_of(job, lays, lambda lay: self._cba_setup(job, lay), score,
                             schedules=JOINT_SCHEDULES, exact=True)

    # ---- exact MILP -------------------------------------------------------------------
    def ilp_instance(self, job: Job) -> tuple[milp.JointInstance, dict[int, PathInfo]]:
        """The job's MILP: k paths, slot counts {no-stall, fixed}, first-fit-disjoint blocks."""
        cl, net = self.cluster, self.cluster.network
        p, g = job.req.stages, job.req.gpus_per_stage
        nd = len(cl.dcs)
        times = [self.times(job, d) for d in range(nd)]
        compute = [[times[d].forward_ms[s] + times[d].backward_ms[s] for d in range(nd)]
                   for s in range(p)]
        guard = net.guard_slots
        blocks_per = max(1, min(ILP_BLOCKS, p - 1))
        path_of: dict[int, PathInfo] = {}
        options: list[dict[tuple[int, int], list[milp.LinkOption]]] = []
        usable = [d for d in range(nd) if cl.free[d] >= g]
        for b in range(p - 1):
            per: dict[tuple[int, int], list[milp.LinkOption]] = {}
            for d1 in usable:
                for d2 in usable:
                    if d1 == d2:
                        continue
                    f_next = times[d2].forward_ms[b + 1]
                    opts: list[milp.LinkOption] = []
                    for path in cl.paths(d1, d2):
                        free = net.free_mask(path)
                        lat = net.latency_ms(path)
                        counts = {min(self.slots_no_stall(job, f_next, path),
                                      self.policy.max_slots), self.policy.fixed_slots}
                        for n in sorted(counts):
                            starts = fitting_starts(free, n + guard)
                            last_end = -1
                            picked = 0
                            while starts and picked < blocks_per:
                                first = (starts & -starts).bit_length() - 1
                                starts &= starts - 1
                                if first <= last_end:
                                    continue
                                opt = milp.LinkOption(path.nodes, path.spectra, first,
                                                      n + guard, lat, n * path.gbps_per_slot,
                                                      path.modulation or "")
                                path_of[id(opt)] = path
                                opts.append(opt)
                                last_end = first + n + guard - 1
                                picked += 1
                    if opts:
                        per[(d1, d2)] = opts
            options.append(per)
        dc0 = cl.dcs[0]
        inst = milp.JointInstance(
            dcs=[dc.name for dc in cl.dcs], free_gpus=list(cl.free), gpus_per_stage=g,
            compute_ms=compute, activation_mb=job.act_mb, microbatches=job.req.microbatches,
            fabric_latency_ms=dc0.fabric_latency_ms, fabric_gbps=dc0.fabric_gbps,
            options=options, max_stages_per_dc=self.max_stages_per_dc)
        return inst, path_of

    def _cba_ilp(self, job: Job, now_s: float) -> Placed | Refused:
        inst, path_of = self.ilp_instance(job)
        sol = milp.solve(inst, time_limit_s=self.policy.ilp_time_limit_s)
        if sol is None:
            return Refused(NO_SPECTRUM)
        self.ilp_stats.append({"status": sol.status, "gap": sol.gap, "solve_s": sol.solve_s})
        links = [None if o is None else LinkChoice(path_of[id(o)], o.first_slot, o.slots)
                 for o in sol.links]
        alloc = self.cluster.commit(sol.stage_dcs, job.req.gpus_per_stage, links)
        return Placed(alloc, self.timing(job, sol.stage_dcs, alloc.lightpaths),
                      solver={"status": sol.status, "gap": sol.gap,
                              "objective_ms": sol.objective_ms})

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


def _mean_price(dc: DC, now_s: float) -> float:
    return mean_price_usd_per_kwh(dc.price_usd_per_kwh, dc.price_curve, now_s, 86400.0)


@lru_cache(maxsize=4096)
def _stage_times(arch: ModelArch, stages: int, gpus_per_stage: int, gpu: str,
                 mfu: float) -> StageTimes:
    from testbed.jobs.model import gpu_type

    return stage_times(arch, [gpu_type(gpu)] * stages, gpus_per_stage, mfu)
