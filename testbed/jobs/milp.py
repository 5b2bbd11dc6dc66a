"""cba-ilp: exact joint choice of DC per stage and lightpath (route, slot block) per boundary.

The instance is plain data (built by ``testbed.jobs.policies`` from the optical layer):
per-stage compute per DC, free GPUs per DC, and for every stage boundary and DC pair a
list of candidate lightpaths (route, first slot, slot count, latency, capacity) that are
free in the current spectrum. The MILP (HiGHS via highspy) minimises the analytic 1F1B
iteration-time model, linear in the choices::

    T = sum_s (f_s + b_s) + 2 * sum_b (lat_b + tx_b) + (m - 1) * C
        + slot_weight_ms * sum_b slots_b * fibres_b
    C >= f_s + b_s  for every stage,   C >= tx_b  for every boundary

with ``tx_b = 8 * activation_mb / capacity_gbps`` ms. Constraints: one DC per stage,
GPU capacity per DC, flow-linking of boundary choices to the stage DCs, and no two
boundaries of the job on one (fibre, slot). ``brute_force`` enumerates the same space.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LinkOption:
    """One way to carry a boundary between two different DCs."""

    route: tuple[str, ...]
    fibres: tuple[int, ...]  # fibre ids (indices into the network's fibre list)
    first_slot: int
    slots: int
    latency_ms: float
    capacity_gbps: float
    modulation: str = ""


@dataclass
class JointInstance:
    """One job's placement problem."""

    dcs: Sequence[str]
    free_gpus: Sequence[int]
    gpus_per_stage: int
    compute_ms: Sequence[Sequence[float]]  # [stage][dc] forward + backward of one micro-batch
    activation_mb: float
    microbatches: int
    fabric_latency_ms: float
    fabric_gbps: float
    # options[b][(d1, d2)] for boundary b (stage b -> b+1), DC indices d1 != d2
    options: Sequence[dict[tuple[int, int], list[LinkOption]]] = field(default_factory=list)
    slot_weight_ms: float = 1e-3
    max_stages_per_dc: int | None = None

    @property
    def stages(self) -> int:
        return len(self.compute_ms)


@dataclass(frozen=True)
class JointSolution:
    """A placement: DC index per stage, LinkOption (or None for same DC) per boundary."""

    stage_dcs: tuple[int, ...]
    links: tuple[LinkOption | None, ...]
    objective_ms: float
    status: str = "optimal"
    gap: float = 0.0
    solve_s: float = 0.0


class OutOfTime(Exception):
    """The time limit passed before any placement was found or proven impossible."""


def tx_ms(activation_mb: float, gbps: float) -> float:
    return 8.0 * activation_mb / gbps


# restarts re-run the costly root cut loop on these small models; measured faster without
HIGHS_OPTIONS: dict[str, object] = {"mip_allow_restart": False}
FIRST_FIT_TIE_MS = 1e-7  # per slot index: among equal choices prefer the lowest block


def option_extra_ms(inst: JointInstance, o: LinkOption) -> float:
    """Spectrum term of a lightpath option: slot_weight x slots x fibres, plus a
    first-fit tie-break (it removes symmetric optima that slow branch and bound)."""
    return inst.slot_weight_ms * o.slots * len(o.fibres) + FIRST_FIT_TIE_MS * o.first_slot


def objective(inst: JointInstance, stage_dcs: Sequence[int],
              links: Sequence[LinkOption | None]) -> float:
    """The model's objective for a complete choice (used by brute force and checks)."""
    comp = [inst.compute_ms[s][d] for s, d in enumerate(stage_dcs)]
    cyc = max(comp)
    total = sum(comp)
    for lk in links:
        if lk is None:
            lat, extra = inst.fabric_latency_ms, 0.0
            tx = tx_ms(inst.activation_mb, inst.fabric_gbps)
        else:
            lat, tx = lk.latency_ms, tx_ms(inst.activation_mb, lk.capacity_gbps)
            extra = option_extra_ms(inst, lk)
        total += 2.0 * (lat + tx) + extra
        cyc = max(cyc, tx)
    return total + (inst.microbatches - 1) * cyc


def _conflict(a: LinkOption, b: LinkOption) -> bool:
    if not set(a.fibres) & set(b.fibres):
        return False
    return a.first_slot < b.first_slot + b.slots and b.first_slot < a.first_slot + a.slots


def brute_force(inst: JointInstance) -> JointSolution | None:
    """Exhaustive optimum over the same choice space (small instances only)."""
    best: JointSolution | None = None
    nd, p, g = len(inst.dcs), inst.stages, inst.gpus_per_stage
    for assign in itertools.product(range(nd), repeat=p):
        if any(assign.count(d) * g > inst.free_gpus[d] for d in range(nd)):
            continue
        cap = inst.max_stages_per_dc
        if cap is not None and any(assign.count(d) > cap for d in range(nd)):
            continue
        choices: list[list[LinkOption | None]] = []
        for b in range(p - 1):
            d1, d2 = assign[b], assign[b + 1]
            if d1 == d2:
                choices.append([None])
            else:
                choices.append(list(inst.options[b].get((d1, d2), [])))
        for links in itertools.product(*choices):
            real = [lk for lk in links if lk is not None]
            if any(_conflict(a, b) for a, b in itertools.combinations(real, 2)):
                continue
            val = objective(inst, assign, links)
            if best is None or val < best.objective_ms - 1e-9:
                best = JointSolution(tuple(assign), tuple(links), val)
    return best


class _Rows:
    def __init__(self) -> None:
        self.lo: list[float] = []
        self.hi: list[float] = []
        self.starts: list[int] = []
        self.idx: list[int] = []
        self.val: list[float] = []

    def add(self, idx: Sequence[int], val: Sequence[float], lo: float, hi: float) -> None:
        self.starts.append(len(self.idx))
        self.idx.extend(idx)
        self.val.extend(val)
        self.lo.append(lo)
        self.hi.append(hi)


def solve(inst: JointInstance, time_limit_s: float = 10.0,
          mip_rel_gap: float = 1e-6) -> JointSolution | None:
    """Solve the MILP exactly with HiGHS; None when infeasible (the job is blocked);
    OutOfTime when `time_limit_s` passed before the first placement was found (not a
    proof that none exists: a loaded machine must not turn into blocked jobs silently).

    The bottleneck term (m - 1) * C is handled by parametric decomposition: C can only
    take one of the finitely many compute or transfer times, so for each candidate level
    c (ascending) the MILP with C fixed to c (every choice slower than c forbidden) is a
    linear-cost MILP; the answer is the best (m - 1) c + L(c). A level is skipped once
    (m - 1) c + L(inf) cannot beat the best found (L is non-increasing in c). Spectrum
    conflicts between the job's own lightpaths are added lazily as clique rows.
    """
    import highspy

    t0 = time.perf_counter()
    nd, p, g, m = len(inst.dcs), inst.stages, inst.gpus_per_stage, inst.microbatches
    inf = highspy.kHighsInf
    cost: list[float] = []
    level: list[float] = []  # the bottleneck time a variable implies (0: none)

    def var(c: float, lvl: float) -> int:
        cost.append(c)
        level.append(lvl)
        return len(cost) - 1

    x = [[var(inst.compute_ms[s][d], inst.compute_ms[s][d]) if inst.free_gpus[d] >= g else -1
          for d in range(nd)] for s in range(p)]
    fab_tx = tx_ms(inst.activation_mb, inst.fabric_gbps)
    fab_cost = 2.0 * (inst.fabric_latency_ms + fab_tx)
    y: list[dict[int, int]] = []
    z: list[list[tuple[int, int, int, LinkOption]]] = []  # (var, d1, d2, option)
    for b in range(p - 1):
        y.append({d: var(fab_cost, fab_tx) for d in range(nd)
                  if x[b][d] >= 0 and x[b + 1][d] >= 0})
        zb = []
        for (d1, d2), opts in inst.options[b].items():
            if x[b][d1] < 0 or x[b + 1][d2] < 0:
                continue
            for o in opts:
                tx = tx_ms(inst.activation_mb, o.capacity_gbps)
                c = 2.0 * (o.latency_ms + tx) + option_extra_ms(inst, o)
                zb.append((var(c, tx), d1, d2, o))
        z.append(zb)

    rows = _Rows()
    for s in range(p):
        ids = [x[s][d] for d in range(nd) if x[s][d] >= 0]
        rows.add(ids, [1.0] * len(ids), 1.0, 1.0)
    for d in range(nd):
        ids = [x[s][d] for s in range(p) if x[s][d] >= 0]
        if ids:
            rows.add(ids, [float(g)] * len(ids), -inf, float(inst.free_gpus[d]))
            if inst.max_stages_per_dc is not None:
                rows.add(ids, [1.0] * len(ids), -inf, float(inst.max_stages_per_dc))
    for d in range(nd):
        # a run of consecutive stages in one DC has at most K_d stages, hence at most
        # (1 - 1/K_d) fabric boundaries per stage there: a valid cut that keeps the LP
        # relaxation from keeping "a fraction of every stage" inside every DC
        k_d = inst.free_gpus[d] // g
        if inst.max_stages_per_dc is not None:
            k_d = min(k_d, inst.max_stages_per_dc)
        ys = [y[b][d] for b in range(p - 1) if d in y[b]]
        xs = [x[s][d] for s in range(p) if x[s][d] >= 0]
        if ys and k_d >= 1:
            rows.add(ys + xs, [1.0] * len(ys) + [-(1.0 - 1.0 / k_d)] * len(xs), -inf, 0.0)
    cover: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for b in range(p - 1):
        for d in range(nd):
            out = [v for v, d1, _, _ in z[b] if d1 == d]
            inn = [v for v, _, d2, _ in z[b] if d2 == d]
            same = [y[b][d]] if d in y[b] else []
            if x[b][d] >= 0:
                ids = same + out + [x[b][d]]
                rows.add(ids, [1.0] * (len(ids) - 1) + [-1.0], 0.0, 0.0)
            if x[b + 1][d] >= 0:
                ids = same + inn + [x[b + 1][d]]
                rows.add(ids, [1.0] * (len(ids) - 1) + [-1.0], 0.0, 0.0)
        for v, _, _, o in z[b]:
            for e in o.fibres:
                for t in range(o.first_slot, o.first_slot + o.slots):
                    cover.setdefault((e, t), []).append((b, v))

    h = highspy.Highs()
    h.silent()
    h.setOptionValue("mip_rel_gap", float(mip_rel_gap))
    h.setOptionValue("threads", 1)
    for key, val in HIGHS_OPTIONS.items():
        h.setOptionValue(key, val)
    n = len(cost)
    cols = np.arange(n, dtype=np.int32)
    h.addVars(n, np.zeros(n), np.ones(n))
    h.changeColsCost(n, cols, np.array(cost, dtype=float))
    h.changeColsIntegrality(n, cols, np.full(n, highspy.HighsVarType.kInteger))
    h.addRows(len(rows.lo), np.array(rows.lo), np.array(rows.hi), len(rows.idx),
              np.array(rows.starts, dtype=np.int32), np.array(rows.idx, dtype=np.int32),
              np.array(rows.val, dtype=float))
    option_of = {v: (b, o) for b in range(p - 1) for v, _, _, o in z[b]}
    added: set[tuple[int, int]] = set()
    lv = np.array(level)

    def run(cap: float) -> tuple[float, np.ndarray, str, float] | None:
        """min linear cost with every choice of level > cap forbidden (lazy conflicts);
        None when infeasible; OutOfTime when the time ran out first."""
        h.changeColsBounds(n, cols, np.zeros(n), (lv <= cap + 1e-12).astype(float))
        while True:
            left = time_limit_s - (time.perf_counter() - t0)
            if left <= 0:
                raise OutOfTime
            h.setOptionValue("time_limit", float(left))
            h.run()
            status = h.getModelStatus()
            info = h.getInfo()
            if status == highspy.HighsModelStatus.kInfeasible:
                return None
            if info.primal_solution_status == 0:  # no feasible point: proven or not
                if status == highspy.HighsModelStatus.kTimeLimit:
                    raise OutOfTime
                return None
            sol = np.asarray(h.getSolution().col_value)
            chosen = [option_of[v] for v in option_of if sol[v] > 0.5]
            bad: set[tuple[int, int]] = set()
            for (b1, o1), (b2, o2) in itertools.combinations(chosen, 2):
                if b1 != b2 and _conflict(o1, o2):
                    shared = set(o1.fibres) & set(o2.fibres)
                    lo = max(o1.first_slot, o2.first_slot)
                    hi = min(o1.first_slot + o1.slots, o2.first_slot + o2.slots)
                    bad |= {(e, t) for e in shared for t in range(lo, hi)}
            bad -= added
            optimal = status == highspy.HighsModelStatus.kOptimal
            if not bad:
                gap = 0.0 if optimal else float(info.mip_gap)
                state = "optimal" if optimal else \
                    h.modelStatusToString(status).lower().replace(" ", "_")
                return float(info.objective_function_value), sol, state, gap
            if not optimal:
                raise OutOfTime  # with a conflicting incumbent
            for cell in sorted(bad):
                ids = [v for _, v in cover[cell]]
                h.addRow(-inf, 1.0, len(ids), np.array(ids, dtype=np.int32), np.ones(len(ids)))
                added.add(cell)

    levels = sorted({lvl for lvl in level})
    base = run(levels[-1]) if levels else None
    if base is None:
        return None
    best: tuple[float, np.ndarray, str, float] | None = None
    best_total = float("inf")
    states, gaps = [base[2]], [base[3]]
    solves = 1
    # the smallest feasible cap is at least the slowest stage's fastest DC
    floor = max(min(inst.compute_ms[s][d] for d in range(nd) if x[s][d] >= 0)
                for s in range(p))
    for c in levels:
        if c < floor - 1e-12:
            continue
        if (m - 1) * c + base[0] >= best_total - 1e-9:
            break
        if time.perf_counter() - t0 > time_limit_s:
            states.append("time_limit")
            break
        try:
            got = base if c == levels[-1] else run(c)
        except OutOfTime:
            states.append("time_limit")
            break
        solves += 1
        if got is None:
            continue
        states.append(got[2])
        gaps.append(got[3])
        total = (m - 1) * c + got[0]
        if total < best_total - 1e-9:
            best_total, best = total, got
    if best is None:
        return None
    sol = best[1]
    elapsed = time.perf_counter() - t0
    stage_dcs = tuple(max((d for d in range(nd) if x[s][d] >= 0), key=lambda d: sol[x[s][d]])
                      for s in range(p))
    links: list[LinkOption | None] = []
    for b in range(p - 1):
        d1, d2 = stage_dcs[b], stage_dcs[b + 1]
        if d1 == d2:
            links.append(None)
            continue
        picked = [o for v, e1, e2, o in z[b] if e1 == d1 and e2 == d2 and sol[v] > 0.5]
        links.append(picked[0])
    state = "optimal" if all(st == "optimal" for st in states) else \
        next(st for st in states if st != "optimal")
    log.debug("cba-ilp: %d solves, %d conflict rows, %.3f s", solves, len(added), elapsed)
    return JointSolution(stage_dcs, tuple(links), objective(inst, stage_dcs, links),
                         status=state, gap=max([0.0, *gaps]), solve_s=elapsed)
