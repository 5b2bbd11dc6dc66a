"""Placement policies as plain functions in a registry: name -> place(planner, job, now_s).

Every policy returns a committed `Placed` (GPUs taken, lightpaths set up through the
optical layer) or a `Refused` reason, leaving the cluster unchanged. It uses the shared
pieces of `testbed.jobs.policies.Planner` (fill, layouts, setup, best_of, timing). Rules
(docs/jobs.md):

* sp-ff: anchor = DC with most free GPUs, then nearest DCs; stages packed in that
  order; shortest path only, ``fixed_slots`` slots, spectrum policy (first-fit).
* delay-first: every anchor (fastest GPUs first); each boundary takes up to
  ``max_slots`` on the first of k paths that fits; the fastest layout (engine) wins.
* cost-first (rigid, cheap): only its home, the cheapest DCs (daily mean price) that
  could hold the job in an empty cluster; it waits for them rather than running in a
  dearer DC; shortest path, ``fixed_slots`` slots.
* cba: a boundary is communication-bound (CB) when its transfer at the baseline
  allocation (``fixed_slots`` on the shortest path) is exposed under the schedule
  (`exposed_ms`: tx > forward time for GPipe; for the 1F1B family the round trip
  2 (latency + tx) beyond the slowest stage's slack, so propagation latency counts).
  Non-CB boundaries get just enough slots that transfer <= that compute time, CB ones at
  least the baseline (more when their no-stall count is larger) and are set up first,
  on the first of k paths with a fitting block; a CB boundary that cannot get its slots
  degrades down to half and is flagged for an upgrade. The 3 shortest layouts (fibre
  km) are set up and ranked by the analytic iteration model; the others only if those
  fail.
* cba-ilp: the MILP of `testbed.jobs.milp` over all DCs, k paths, candidate slot counts
  and first-fit-disjoint blocks.
* bace-pipe: priority queue, bandwidth-aware pathfinder (only paths on which a block of
  at least the no-stall slot count fits) and a cost-minimising choice among layouts
  (cost per work, cheapest price, every anchor) by the electricity cost of the whole run.
* joint: cba's slot sizing, layouts of cba and bace-pipe scored by normalised
  iteration time + cost, and the fastest pipeline schedule among `JOINT_SCHEDULES`.

Ablations and baselines at their best are the same functions with parameters
(`functools.partial`), registered under their own names: sp-ff-best (cba's paths and
search, fixed slots), cba-no-cb, cba-k1, cba-no-search, delay-first-best,
bace-pipe-fifo, bace-pipe-no-path, bace-pipe-no-cost (docs/jobs.md).

A new policy: a function here, one `PlacementKind` line in PLACEMENTS, its name in
`testbed.spec.models.PLACEMENT_POLICIES`.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from random import Random
from typing import Protocol

from testbed.errors import InputError
from testbed.jobs import milp
from testbed.jobs.cluster import DC, Allocation, Cluster, LinkChoice
from testbed.jobs.model import StageTimes, mean_price_usd_per_kwh
from testbed.jobs.outcome import (
    ILP_TIME_LIMIT,
    NO_BANDWIDTH,
    NO_GPUS,
    NO_SPECTRUM,
    Job,
    Placed,
    Refused,
)
from testbed.jobs.timing import PipeTiming
from testbed.optical import Lightpath, PathInfo
from testbed.optical.spectrum import fitting_starts
from testbed.spec.models import PolicySpec

log = logging.getLogger(__name__)

JOINT_SCHEDULES = ("gpipe", "1f1b", "zb-h1", "geopipe")
CBA_LAYOUTS = 3
ILP_BLOCKS = 2  # cba-ilp: first-fit-disjoint candidate blocks per (route, slots)
BACE_PRICE_WINDOW = True  # rank by the price curve over the run window


Demand = Callable[[int, PathInfo, float], tuple[int, int]]
Setup = Callable[[tuple[int, ...]], tuple[Allocation | None, str]]


class PlannerView(Protocol):
    """What a policy uses of the planner (testbed.jobs.policies.Planner passes itself)."""

    cluster: Cluster
    policy: PolicySpec
    rng: Random
    max_stages_per_dc: int | None
    ilp_stats: list[dict[str, object]]

    def times(self, job: Job, dc: int) -> StageTimes: ...

    def stage_fb(self, job: Job, stage_dcs: Sequence[int]
                 ) -> tuple[list[float], list[float]]: ...

    def fill(self, job: Job, order: Sequence[int]) -> tuple[int, ...] | None: ...

    def nearest_order(self, anchor: int) -> list[int]: ...

    def anchors(self) -> list[int]: ...

    def layouts(self, job: Job, orders: Sequence[Sequence[int]]) -> list[tuple[int, ...]]: ...

    def slots_no_stall(self, job: Job, f_next_ms: float, path: PathInfo) -> int: ...

    def timing(self, job: Job, stage_dcs: Sequence[int], links: Sequence[Lightpath | None],
               schedule: str | None = None) -> PipeTiming: ...

    def run_cost_usd(self, job: Job, stage_dcs: Sequence[int], iteration_ms: float,
                     start_s: float, window: bool = True) -> tuple[float, float]: ...

    def setup(self, job: Job, stage_dcs: Sequence[int], demand: Demand, k: int | None,
              order: Sequence[int] | None = None) -> tuple[Allocation | None, str]: ...

    def best_of(self, job: Job, layouts: Sequence[tuple[int, ...]], setup: Setup,
                score: Callable[[tuple[int, ...], float], float],
                schedules: Sequence[str] = (), exact: bool = False) -> Placed | Refused: ...


def mean_price(dc: DC, now_s: float) -> float:
    """A DC's mean electricity price over the day from now (USD/kWh)."""
    return mean_price_usd_per_kwh(dc.price_usd_per_kwh, dc.price_curve, now_s, 86400.0)


def fill_fixed(planner: PlannerView, job: Job, order: list[int] | None) -> Placed | Refused:
    """Fill DCs in `order`; shortest path, the fixed slot count, first fit."""
    lay = planner.fill(job, order) if order is not None else None
    if lay is None:
        return Refused(NO_GPUS)
    fixed = (planner.policy.fixed_slots, planner.policy.fixed_slots)
    alloc, why = planner.setup(job, lay, lambda b, path, f_next: fixed, k=1)
    if alloc is None:
        return Refused(why)
    return Placed(alloc, planner.timing(job, lay, alloc.lightpaths))


def sp_ff(planner: PlannerView, job: Job, now_s: float) -> Placed | Refused:
    """Anchor = DC with most free GPUs, then nearest DCs; fixed slots, first fit."""
    anchors = planner.anchors()
    return fill_fixed(planner, job, planner.nearest_order(anchors[0]) if anchors else None)


def home_dcs(planner: PlannerView, job: Job, order: Sequence[int]) -> list[int]:
    """The shortest prefix of `order` whose DCs could hold the whole job in an empty
    cluster (total GPUs, at most max_stages_per_dc stages each): cost-first's home."""
    g, left = job.req.gpus_per_stage, job.req.stages
    cap = planner.max_stages_per_dc or left
    out: list[int] = []
    for d in order:
        out.append(d)
        left -= min(left, planner.cluster.dcs[d].gpus // g, cap)
        if not left:
            break
    return out


def cost_first(planner: PlannerView, job: Job, now_s: float) -> Placed | Refused:
    """Rigid and cheap: only the cheapest DCs that could hold the job (its home, by daily
    mean price), waiting for them rather than running anywhere dearer; shortest path,
    fixed slots."""
    dcs = planner.cluster.dcs
    order = sorted(range(len(dcs)), key=lambda d: (mean_price(dcs[d], now_s), d))
    return fill_fixed(planner, job, home_dcs(planner, job, order))


def delay_first(planner: PlannerView, job: Job, now_s: float, *,
                bace_layouts: bool = False) -> Placed | Refused:
    """Every anchor (fastest GPUs first), up to max_slots per boundary; the fastest layout
    wins. bace_layouts: also bace-pipe's cost-ordered layouts (delay-first-best)."""
    dcs = planner.cluster.dcs
    anchors = sorted(planner.anchors(), key=lambda d: (-dcs[d].gpu.peak_tflops,
                                                       -planner.cluster.free[d], d))
    orders = [planner.nearest_order(a) for a in anchors]
    if bace_layouts:
        orders = cost_orders(planner, now_s) + orders
    lays = planner.layouts(job, orders)
    full = planner.policy.max_slots

    def setup(lay: tuple[int, ...]) -> tuple[Allocation | None, str]:
        return planner.setup(job, lay, lambda b, p, f: (full, 1), k=None)

    return planner.best_of(job, lays, setup, lambda lay, it: it, exact=True)


# Schedules whose steady state waits for every micro-batch's round trip over a boundary
# (in-flight micro-batches bounded as in 1F1B): there latency is paid per micro-batch.
ROUND_TRIP_SCHEDULES = ("1f1b", "interleaved-1f1b", "zb-h1")


def exposed_ms(schedule: str, latency_ms: float, tx_ms: float, f_next_ms: float,
               slack_ms: float = 0.0) -> float:
    """Time per micro-batch that a boundary's transfer adds to the pipeline cycle (> 0:
    communication-bound), by the schedule's steady state:

    * round-trip schedules (1F1B family): the next forward waits for the gradient's round
      trip, so the cycle is about c_next + 2 (latency + tx); `slack_ms` is what the slowest
      stage leaves idle (max_s c_s - c_next): exposed = 2 (latency + tx) - slack.
    * forward-wave schedules (GPipe, and the latency-hiding ones): transfers stream, so
      latency is paid once per fill and drain, never per micro-batch: exposed = tx - f_next.
    """
    if schedule in ROUND_TRIP_SCHEDULES:
        return 2.0 * (latency_ms + tx_ms) - slack_ms
    return tx_ms - f_next_ms


def cb_labels(planner: PlannerView, job: Job, stage_dcs: Sequence[int]) -> list[bool]:
    """CB label per boundary: the transfer at the baseline allocation (fixed_slots on the
    shortest path, its propagation + node latency) is exposed (`exposed_ms` > 0) under the
    policy's schedule."""
    f, b = planner.stage_fb(job, stage_dcs)
    comp = [x + y for x, y in zip(f, b, strict=True)]
    sched = planner.policy.schedule
    out = []
    for bnd in range(len(stage_dcs) - 1):
        d1, d2 = stage_dcs[bnd], stage_dcs[bnd + 1]
        if d1 == d2:
            dc = planner.cluster.dcs[d1]
            lat, tx = dc.fabric_latency_ms, 8.0 * job.act_mb / dc.fabric_gbps
        else:
            paths = planner.cluster.paths(d1, d2)
            if not paths:
                out.append(True)
                continue
            lat = planner.cluster.network.latency_ms(paths[0])
            tx = 8.0 * job.act_mb / (planner.policy.fixed_slots * paths[0].gbps_per_slot)
        out.append(exposed_ms(sched, lat, tx, f[bnd + 1], max(comp) - comp[bnd + 1]) > 0.0)
    return out


SIZINGS = ("cb", "uniform", "fixed")


def cba_setup(planner: PlannerView, job: Job, lay: tuple[int, ...], sizing: str = "cb",
              k: int | None = None) -> tuple[Allocation | None, str]:
    """Set a layout up with cba's demand on the k shortest paths (None: all candidates).

    sizing "cb": CB boundaries first, at least the baseline count (their no-stall count
    when larger), degrading to half; non-CB ones just their no-stall count. "uniform"
    (no CB test): every boundary its no-stall count, in order, no degrading. "fixed" (no
    CB awareness at all): every boundary the baseline's fixed_slots.
    """
    fixed = planner.policy.fixed_slots
    if sizing == "fixed":
        return planner.setup(job, lay, lambda b, path, f_next: (fixed, fixed), k=k)
    if sizing == "uniform":
        def even(b: int, path: PathInfo, f_next: float) -> tuple[int, int]:
            n = planner.slots_no_stall(job, f_next, path)
            return n, n

        return planner.setup(job, lay, even, k=k)
    labels = cb_labels(planner, job, lay)
    order = sorted(range(len(labels)), key=lambda b: (not labels[b], b))

    def demand(b: int, path: PathInfo, f_next: float) -> tuple[int, int]:
        n = planner.slots_no_stall(job, f_next, path)
        if labels[b]:
            want = max(n, fixed)
            return want, max(1, want // 2)
        return n, n

    return planner.setup(job, lay, demand, k=k, order=order)


def chain_km(planner: PlannerView, lay: Sequence[int]) -> float:
    """Fibre km between consecutive stages of a layout."""
    dist = planner.cluster.distance_km
    return sum(dist[a][b] for a, b in itertools.pairwise(lay))


def cba(planner: PlannerView, job: Job, now_s: float, *, sizing: str = "cb",
        k: int | None = None, search: bool = True) -> Placed | Refused:
    """Communication-bound-aware slot sizing on the shortest layouts (module docstring).

    The ablations are parameters: sizing (SIZINGS), k (paths per boundary, None = all
    k_paths candidates) and search (False: sp-ff's one layout, most-free anchor + nearest).
    """
    def setup(lay: tuple[int, ...]) -> tuple[Allocation | None, str]:
        return cba_setup(planner, job, lay, sizing, k)

    if not search:
        anchors = planner.anchors()
        lays = planner.layouts(job, [planner.nearest_order(anchors[0])]) if anchors else []
        return planner.best_of(job, lays, setup, lambda lay, est: est)
    lays = planner.layouts(job, [planner.nearest_order(a) for a in planner.anchors()])
    # set up only the CBA_LAYOUTS shortest chains (fibre km between consecutive stages)
    lays = sorted(lays, key=lambda lay: chain_km(planner, lay))
    res = planner.best_of(job, lays[:CBA_LAYOUTS], setup, lambda lay, est: est)
    if isinstance(res, Refused) and len(lays) > CBA_LAYOUTS:  # fall back to the rest
        res = planner.best_of(job, lays[CBA_LAYOUTS:], setup, lambda lay, est: est)
    return res


def bace_setup(planner: PlannerView, job: Job, lay: tuple[int, ...], pathfinder: bool = True
               ) -> tuple[Allocation | None, str]:
    """Set a layout up on paths that carry the transfer without stalling (pathfinder);
    without it, bandwidth-obliviously as the baselines do: fixed_slots on the shortest path."""
    if not pathfinder:
        fixed = planner.policy.fixed_slots
        return planner.setup(job, lay, lambda b, path, f_next: (fixed, fixed), k=1)

    def demand(b: int, path: PathInfo, f_next: float) -> tuple[int, int]:
        n = min(planner.slots_no_stall(job, f_next, path), planner.policy.max_slots)
        return planner.policy.max_slots, n

    alloc, why = planner.setup(job, lay, demand, k=None)
    return alloc, (NO_BANDWIDTH if why == NO_SPECTRUM and pathfinder else why)


def cost_orders(planner: PlannerView, now_s: float) -> list[list[int]]:
    """DCs by electricity price, and by price x watts per TFLOP/s (cost per work)."""
    dcs = planner.cluster.dcs
    idx = range(len(dcs))
    cheap = sorted(idx, key=lambda d: (mean_price(dcs[d], now_s), d))
    eff = sorted(idx, key=lambda d: (mean_price(dcs[d], now_s) * dcs[d].gpu.power_w
                                     / dcs[d].gpu.peak_tflops, d))
    return [eff, cheap]


def bace_pipe(planner: PlannerView, job: Job, now_s: float, *, pathfinder: bool = True,
              allocator: bool = True) -> Placed | Refused:
    """Bandwidth-aware paths and the cheapest layout by the run's electricity cost.
    Ablations: pathfinder=False (bandwidth-oblivious paths), allocator=False (the fastest
    layout instead of the cheapest)."""
    orders = cost_orders(planner, now_s) + [planner.nearest_order(a) for a in planner.anchors()]
    lays = planner.layouts(job, orders)

    def score(lay: tuple[int, ...], est_ms: float) -> float:
        if not allocator:
            return est_ms
        _, usd = planner.run_cost_usd(job, lay, est_ms, now_s, window=BACE_PRICE_WINDOW)
        return usd + 1e-9 * est_ms

    return planner.best_of(job, lays, lambda lay: bace_setup(planner, job, lay, pathfinder),
                           score, exact=True)


def joint(planner: PlannerView, job: Job, now_s: float) -> Placed | Refused:
    """cba's slot sizing, cba and bace-pipe layouts, normalised time + cost, best schedule."""
    orders = cost_orders(planner, now_s) + [planner.nearest_order(a) for a in planner.anchors()]
    lays = planner.layouts(job, orders)
    # reference values for normalisation: the ideal (no network) run on the first layout
    ref_t: list[float] = []
    ref_c: list[float] = []

    def score(lay: tuple[int, ...], est_ms: float) -> float:
        _, usd = planner.run_cost_usd(job, lay, est_ms, now_s)
        if not ref_t:
            ref_t.append(est_ms)
            ref_c.append(max(usd, 1e-12))
        return est_ms / ref_t[0] + usd / ref_c[0]

    return planner.best_of(job, lays, lambda lay: cba_setup(planner, job, lay), score,
                           schedules=JOINT_SCHEDULES, exact=True)


def ilp_instance(planner: PlannerView, job: Job) -> tuple[milp.JointInstance, dict[int, PathInfo]]:
    """The job's MILP: k paths, slot counts {no-stall, fixed}, first-fit-disjoint blocks."""
    cl, net = planner.cluster, planner.cluster.network
    p, g = job.req.stages, job.req.gpus_per_stage
    nd = len(cl.dcs)
    times = [planner.times(job, d) for d in range(nd)]
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
                    counts = {min(planner.slots_no_stall(job, f_next, path),
                                  planner.policy.max_slots), planner.policy.fixed_slots}
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
        options=options, max_stages_per_dc=planner.max_stages_per_dc)
    return inst, path_of


def cba_ilp(planner: PlannerView, job: Job, now_s: float) -> Placed | Refused:
    """The exact MILP of testbed.jobs.milp over DCs, paths, slot counts and blocks."""
    inst, path_of = ilp_instance(planner, job)
    try:
        sol = milp.solve(inst, time_limit_s=planner.policy.ilp_time_limit_s)
    except milp.OutOfTime:  # refused, but not for want of spectrum: said so in jobs.csv
        log.warning("job %s: cba-ilp found no placement within ilp_time_limit_s = %g s",
                    job.req.job_id, planner.policy.ilp_time_limit_s)
        return Refused(ILP_TIME_LIMIT)
    if sol is None:
        return Refused(NO_SPECTRUM)
    planner.ilp_stats.append({"status": sol.status, "gap": sol.gap, "solve_s": sol.solve_s})
    links = [None if o is None else LinkChoice(path_of[id(o)], o.first_slot, o.slots)
             for o in sol.links]
    alloc = planner.cluster.commit(sol.stage_dcs, job.req.gpus_per_stage, links)
    return Placed(alloc, planner.timing(job, sol.stage_dcs, alloc.lightpaths),
                  solver={"status": sol.status, "gap": sol.gap,
                          "objective_ms": sol.objective_ms})



PlaceFn = Callable[[PlannerView, Job, float], Placed | Refused]
QUEUES = ("fifo", "priority")


@dataclass(frozen=True)
class PlacementKind:
    """A named placement policy, with the queue discipline it runs under (``queue``
    admission: "fifo" with head-of-line blocking, or bace-pipe's "priority"; the spec's
    policy.queue overrides it) and whether flagged lightpaths are raised later (upgrade)."""

    name: str
    place: PlaceFn
    description: str
    queue: str = "fifo"
    upgrade: bool = False


PLACEMENTS: dict[str, PlacementKind] = {k.name: k for k in (
    PlacementKind("sp-ff", sp_ff, "shortest path, fixed slots, first fit, nearest DCs"),
    PlacementKind("sp-ff-best", partial(cba, sizing="fixed"),
                  "sp-ff at its best: fixed slots on cba's k paths with cba's layout search"),
    PlacementKind("delay-first", delay_first, "fastest GPUs first, most slots per boundary"),
    PlacementKind("delay-first-best", partial(delay_first, bace_layouts=True),
                  "delay-first at its best: bace-pipe's layouts and priority queue",
                  queue="priority"),
    PlacementKind("cost-first", cost_first, "rigid: only the cheapest DCs that hold the "
                  "job, fixed slots"),
    PlacementKind("cba", cba, "communication-bound-aware slot sizing (CBA)", upgrade=True),
    PlacementKind("cba-no-cb", partial(cba, sizing="uniform"),
                  "cba without the CB test: every boundary its no-stall count"),
    PlacementKind("cba-k1", partial(cba, k=1), "cba on the shortest path only", upgrade=True),
    PlacementKind("cba-no-search", partial(cba, search=False),
                  "cba on sp-ff's single layout (no layout search)", upgrade=True),
    PlacementKind("cba-ilp", cba_ilp, "exact MILP over DCs, paths, slots and blocks"),
    PlacementKind("bace-pipe", bace_pipe, "bandwidth-aware paths, cheapest run (BACE-Pipe)",
                  queue="priority"),
    PlacementKind("bace-pipe-fifo", bace_pipe, "bace-pipe without prioritisation (FIFO)"),
    PlacementKind("bace-pipe-no-path", partial(bace_pipe, pathfinder=False),
                  "bace-pipe without the bandwidth-aware pathfinder", queue="priority"),
    PlacementKind("bace-pipe-no-cost", partial(bace_pipe, allocator=False),
                  "bace-pipe without the cost allocator (fastest layout)", queue="priority"),
    PlacementKind("joint", joint, "cba sizing, time + cost score, best schedule",
                  queue="priority", upgrade=True),
)}


def get_placement(name: str) -> PlacementKind:
    """Look a placement policy up by name; the error lists the valid names."""
    kind = PLACEMENTS.get(name)
    if kind is None:
        raise InputError("policy.placement", f"unknown placement policy {name!r}; valid: "
                         f"{', '.join(PLACEMENTS)}")
    return kind
