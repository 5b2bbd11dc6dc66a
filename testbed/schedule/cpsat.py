"""`crosspipe-opt`: an exact OR-Tools CP-SAT model of the reference pipeline model.

Variables: start of every F, B (or I and W) of every stage and micro-batch, and the
link-entry time of every activation/gradient transfer; times in integer units of
1/scale ms (default 1 µs). Constraints:
- a stage runs one op at a time (NoOverlap of its op intervals);
- micro-batches go in order per kind on each stage (F0 before F1 ...; B0 before B1),
  which also makes every link FIFO in the sender's order, matching the timer;
- transfers enter the link after their op ends and one serialisation after the
  previous transfer on that direction, and are usable `latency` after leaving;
- B/I(s, j) after F(s, j) and after its gradient arrives, W(s, j) after I(s, j);
- memory cap K: F(s, j) starts no earlier than the end of B (or W) of micro-batch
  j - K on that stage, i.e. at most K activations are held;
- byte budget (`memory` + `budget_bytes`, split backward only): a Cumulative per stage
  whose tasks are [start F, end I) demanding A bytes and [end I, end W) demanding M_W
  bytes (testbed.schedule.memory), capacity = budget - static bytes. It is exact for
  the byte model: ops of a stage are serial, so time order is list order.
Objective: minimise the end of the last operation (the iteration time).

The optimum is over in-order schedules (all schedules this engine generates are
in order). Since a solution's action lists are re-timed exactly, rounding can only
make the reported exact time differ from the objective by a few units.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from math import gcd

from testbed.errors import InputError
from testbed.schedule.memory import MemoryModel
from testbed.schedule.model import Action, PipelineProblem, Schedule
from testbed.schedule.timer import time_schedule

log = logging.getLogger(__name__)

_STATUS = {0: "UNKNOWN", 1: "MODEL_INVALID", 2: "FEASIBLE", 3: "INFEASIBLE", 4: "OPTIMAL"}


def proven_gap(status: object, objective: float, bound: float | None) -> float:
    """The relative gap between a schedule's length and the solver's bound on it: 0.0 only
    when the solver proved it OPTIMAL or its bound meets the schedule, 1.0 when there is
    no bound (nothing proven)."""
    if status == "OPTIMAL":
        return 0.0
    if bound is None or objective <= 0:
        return 1.0
    return min(1.0, max(0.0, (objective - bound) / objective))


def solve(problem: PipelineProblem, *, split_backward: bool = False, time_limit_s: float = 30.0,
          scale: float = 1000.0, hint: Schedule | None = None, workers: int = 2,
          name: str = "crosspipe-opt", memory: MemoryModel | None = None,
          budget_bytes: Sequence[int] | None = None) -> Schedule:
    """Minimise the iteration time; the returned Schedule.info holds solver_status, gap,
    objective_ms, bound_ms and solve_s. With `memory` and `budget_bytes` (split backward
    only) every stage stays within its byte budget."""
    from ortools.sat.python import cp_model

    if time_limit_s <= 0:
        raise InputError("time_limit_s", f"must be > 0, got {time_limit_s}")
    if (memory is None) != (budget_bytes is None):
        raise InputError("budget_bytes", "give both memory and budget_bytes, or neither")
    if budget_bytes is not None and not split_backward:
        raise InputError("budget_bytes", "a byte budget needs split_backward=True (without "
                         "it, pass MemoryModel.microbatch_caps as the problem's memory_cap)")
    p, m = problem.stages, problem.microbatches
    wf = problem.weight_grad_fraction if split_backward else 0.0

    def units(ms: float, minimum: int = 0) -> int:
        return max(minimum, round(ms * scale))

    fd = [units(problem.forward_ms[s], 1) for s in range(p)]
    bd = [units(problem.backward_ms[s] * (1.0 - wf), 1) for s in range(p)]
    wd = [units(problem.backward_ms[s] * wf, 1) for s in range(p)] if split_backward else []
    ser = [units(problem.hop_serialisation_ms(h)) for h in range(p - 1)]
    lat = [units(problem.hops[h].latency_ms) for h in range(p - 1)]

    hint_timing = None
    if hint is not None:
        hint_timing = time_schedule(problem, hint, check_memory_cap=True)
    # Horizon: a valid schedule's length (the hint) or a serial upper bound.
    serial = sum(m * (fd[s] + bd[s] + (wd[s] if split_backward else 0)) for s in range(p)) \
        + m * 2 * sum(ser) + 2 * m * sum(lat)
    horizon = serial
    if hint_timing is not None:
        horizon = min(horizon, units(hint_timing.iteration_time_ms) + 2 * m * p * 3 + 10)

    mdl = cp_model.CpModel()
    sf, sb, sw = {}, {}, {}
    per_stage: list[list] = [[] for _ in range(p)]
    for s in range(p):
        for j in range(m):
            sf[s, j] = mdl.NewIntVar(0, horizon, f"sF{s}_{j}")
            sb[s, j] = mdl.NewIntVar(0, horizon, f"sB{s}_{j}")
            per_stage[s].append(mdl.NewFixedSizeIntervalVar(sf[s, j], fd[s], f"F{s}_{j}"))
            per_stage[s].append(mdl.NewFixedSizeIntervalVar(sb[s, j], bd[s], f"B{s}_{j}"))
            if split_backward:
                sw[s, j] = mdl.NewIntVar(0, horizon, f"sW{s}_{j}")
                per_stage[s].append(mdl.NewFixedSizeIntervalVar(sw[s, j], wd[s], f"W{s}_{j}"))
        mdl.AddNoOverlap(per_stage[s])
    makespan = mdl.NewIntVar(0, horizon, "makespan")
    txf, txb = {}, {}
    for s in range(p):
        cap = problem.caps[s]
        for j in range(m):
            mdl.Add(sb[s, j] >= sf[s, j] + fd[s])
            if j:
                mdl.Add(sf[s, j] >= sf[s, j - 1] + fd[s])
                mdl.Add(sb[s, j] >= sb[s, j - 1] + bd[s])
            if split_backward:
                mdl.Add(sw[s, j] >= sb[s, j] + bd[s])
                if j:
                    mdl.Add(sw[s, j] >= sw[s, j - 1] + wd[s])
                mdl.Add(makespan >= sw[s, j] + wd[s])
            else:
                mdl.Add(makespan >= sb[s, j] + bd[s])
            if cap is not None and j >= cap:
                if split_backward:
                    mdl.Add(sf[s, j] >= sw[s, j - cap] + wd[s])
                else:
                    mdl.Add(sf[s, j] >= sb[s, j - cap] + bd[s])
            if s < p - 1:
                # activation s -> s+1 over hop s; gradient s+1 -> s over hop s
                txf[s, j] = mdl.NewIntVar(0, horizon, f"tf{s}_{j}")
                mdl.Add(txf[s, j] >= sf[s, j] + fd[s])
                if j:
                    mdl.Add(txf[s, j] >= txf[s, j - 1] + ser[s])
                mdl.Add(sf[s + 1, j] >= txf[s, j] + ser[s] + lat[s])
                txb[s, j] = mdl.NewIntVar(0, horizon, f"tb{s}_{j}")
    for s in range(p - 1):
        for j in range(m):
            mdl.Add(txb[s, j] >= sb[s + 1, j] + bd[s + 1])
            if j:
                mdl.Add(txb[s, j] >= txb[s, j - 1] + ser[s])
            mdl.Add(sb[s, j] >= txb[s, j] + ser[s] + lat[s])
    if memory is not None and budget_bytes is not None:
        _byte_budget(mdl, problem, memory, list(budget_bytes), sf, sb, sw, fd, bd, wd, horizon)
    mdl.Minimize(makespan)

    if hint_timing is not None:
        for op in hint_timing.ops:
            a = op.action
            key = (op.stage, a.microbatch)
            var = {"F": sf, "B": sb, "I": sb, "W": sw}[a.kind].get(key)
            if var is not None:
                mdl.AddHint(var, units(op.start_ms))

    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = float(time_limit_s)
    solver.parameters.num_workers = max(1, int(workers))
    # CP-SAT's own Ctrl-C handler is on by default and, when the solve ends, sets SIGINT
    # back to SIG_DFL in the C library under Python's handler: every later Ctrl-C then
    # killed the process (the controller, a held emulation, pytest) without its clean-up.
    solver.parameters.catch_sigint_signal = False
    t0 = time.perf_counter()
    status = solver.Solve(mdl)
    solve_s = time.perf_counter() - t0
    status_name = _STATUS.get(status, str(status))
    info = {"solver_status": status_name, "solve_s": solve_s, "time_limit_s": time_limit_s,
            "scale_per_ms": scale, "split_backward": split_backward}
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        if hint is None:
            raise InputError("memory_cap" if status == cp_model.INFEASIBLE else "time_limit_s",
                             f"CP-SAT found no schedule ({status_name})")
        # No schedule of its own in time: the hint is the answer, and its gap is measured
        # against the solver's bound like any other (never reported as proven).
        assert hint_timing is not None
        obj_ms = hint_timing.iteration_time_ms
        bound_ms = solver.BestObjectiveBound() / scale
        info.update(objective_ms=obj_ms, bound_ms=bound_ms,
                    gap=proven_gap(status_name, obj_ms, bound_ms))
        return Schedule(name, hint.actions, info=info)
    obj = solver.ObjectiveValue()
    bound = solver.BestObjectiveBound()
    info.update(objective_ms=obj / scale, bound_ms=bound / scale,
                gap=proven_gap(status_name, obj, bound))
    rows = []
    bk = "I" if split_backward else "B"
    for s in range(p):
        ops = []
        for j in range(m):
            ops.append((solver.Value(sf[s, j]), 1, Action("F", j)))
            ops.append((solver.Value(sb[s, j]), 0, Action(bk, j)))
            if split_backward:
                ops.append((solver.Value(sw[s, j]), 2, Action("W", j)))
        ops.sort(key=lambda x: (x[0], x[1], x[2].microbatch))
        rows.append(tuple(a for _, _, a in ops))
    sched = Schedule(name, tuple(rows), info=info)
    if hint_timing is not None:
        # Rounding to integer units can in rare cases order ties differently from the
        # exact model; never return something worse than the hint we started from.
        exact = time_schedule(problem, sched).iteration_time_ms
        if exact > hint_timing.iteration_time_ms + 1e-9:
            log.info("CP-SAT solution %.6f ms (exact) worse than hint %.6f ms after rounding",
                     exact, hint_timing.iteration_time_ms)
            return Schedule(name, hint.actions, info=info)
    return sched


def _byte_budget(mdl, problem: PipelineProblem, memory: MemoryModel,  # type: ignore[no-untyped-def]
                 budget_bytes: list[int], sf: dict, sb: dict, sw: dict, fd: list[int],
                 bd: list[int], wd: list[int], horizon: int) -> None:
    """Per stage: held bytes (A from F start to I end, M_W from I end to W end) <= room."""
    p, m = problem.stages, problem.microbatches
    budgets = memory.budgets(budget_bytes)
    for s in range(p):
        mem = memory.stages[s]
        room = budgets[s] - mem.static_bytes
        a, w = mem.activation_bytes, mem.wgrad_bytes
        if room < a:
            raise InputError("budget_bytes", f"stage {s}: the budget leaves {room} bytes for "
                             f"activations, less than one micro-batch ({a})")
        g = gcd(gcd(a, w), room) or 1
        intervals, demands = [], []
        for j in range(m):
            i_end = sb[s, j] + bd[s]
            size_a = mdl.NewIntVar(fd[s], horizon, f"hA{s}_{j}")
            intervals.append(mdl.NewIntervalVar(sf[s, j], size_a, i_end, f"mA{s}_{j}"))
            demands.append(a // g)
            if w:
                size_w = mdl.NewIntVar(wd[s], horizon, f"hW{s}_{j}")
                intervals.append(mdl.NewIntervalVar(i_end, size_w, sw[s, j] + wd[s],
                                                    f"mW{s}_{j}"))
                demands.append(w // g)
        mdl.AddCumulative(intervals, demands, room // g)
        # Redundant, helps propagation: at most `k` micro-batches between F start and I end.
        k = room // a if a else m
        for j in range(k, m):
            mdl.Add(sf[s, j] >= sb[s, j - k] + bd[s])
