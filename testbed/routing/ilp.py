"""Exact routing by integer programming (HiGHS): first the slowest job's bottleneck, then
the number of jobs held to it."""

from __future__ import annotations

import time
from collections import defaultdict

import numpy as np

from testbed.errors import InputError
from testbed.routing.instance import Instance

# Largest model the policy builds (path variables); beyond it the ILP is refused.
MAX_VARIABLES = 50_000


def solve(inst: Instance, *, time_budget_s: float = 10.0,
          hint: list[int] | None = None) -> tuple[list[int], dict]:
    """Stage 1 minimises the worst link congestion (flows / capacity) over unsplittable
    path choices: under max-min filling the slowest flow, and so the slowest job, gets
    min over links of capacity / flows, so this maximises the metric's first component
    exactly. Stage 2 keeps that optimum and minimises the number of jobs with a flow on
    a link that reaches it (the jobs held to the first level). `hint` (a routing, e.g.
    greedy's) is given to HiGHS as a starting solution, so a time-limited run is never
    worse than it. Returns the routing and info (status, proven relative gap of each
    stage, `optimal`, the bottleneck of the solution found)."""
    import highspy

    n = len(inst.flows)
    var: dict[tuple[int, int], int] = {}
    for i in range(n):
        if len(inst.cand_links[i]) > 1:
            for k in range(len(inst.cand_links[i])):
                var[(i, k)] = len(var)
    if len(var) > MAX_VARIABLES:
        raise InputError("policy", f"ilp: {len(var)} path variables exceed the limit of "
                         f"{MAX_VARIABLES}; use greedy, greedy-ls or sa for this size")
    capn = inst.cap / float(inst.cap.max())
    fixed = np.zeros(len(capn))
    on_link: dict[int, list[tuple[int, int]]] = defaultdict(list)  # link -> vars
    for i in range(n):
        cl = inst.cand_links[i]
        if len(cl) == 1:
            np.add.at(fixed, cl[0], 1.0)
        else:
            for k, links in enumerate(cl):
                for e in links.tolist():
                    on_link[e].append((i, k))
    deadline = time.perf_counter() + time_budget_s
    inf = highspy.kHighsInf
    h = highspy.Highs()
    h.silent()
    h.setOptionValue("threads", 1)
    nv = len(var)
    z = nv
    h.addVars(nv + 1, np.zeros(nv + 1), np.r_[np.ones(nv), inf])
    h.changeColsIntegrality(nv, np.arange(nv, dtype=np.int32),
                            np.full(nv, highspy.HighsVarType.kInteger))
    h.changeColCost(z, 1.0)
    for i in range(n):
        if len(inst.cand_links[i]) > 1:
            idx = np.array([var[(i, k)] for k in range(len(inst.cand_links[i]))], dtype=np.int32)
            h.addRow(1.0, 1.0, len(idx), idx, np.ones(len(idx)))
    for e in range(len(capn)):
        if not on_link.get(e) and fixed[e] == 0:
            continue
        idx = [var[v] for v in on_link.get(e, [])] + [z]
        vals = [1.0 / capn[e]] * (len(idx) - 1) + [-1.0]
        h.addRow(-inf, -fixed[e] / capn[e], len(idx), np.array(idx, dtype=np.int32),
                 np.array(vals))
    info: dict = {"variables": nv}
    if hint is not None:
        start = np.zeros(nv + 1)
        for (i, k), c in var.items():
            start[c] = 1.0 if hint[i] == k else 0.0
        start[z] = float(np.max(inst.loads(hint) / capn))
        sol = highspy.HighsSolution()
        sol.col_value = start.tolist()
        sol.value_valid = True
        h.setSolution(sol)
    h.setOptionValue("time_limit", max(0.05, deadline - time.perf_counter()))
    h.run()
    st = h.getModelStatus()
    if h.getInfo().primal_solution_status != 2:  # no feasible point found in time
        raise InputError("policy", f"ilp: no solution within {time_budget_s:g} s "
                         f"({h.modelStatusToString(st)}); raise the time budget or use greedy")
    info["stage1_status"] = h.modelStatusToString(st).lower().replace(" ", "_")
    info["stage1_gap"] = float(h.getInfo().mip_gap) if st != highspy.HighsModelStatus.kOptimal \
        else 0.0
    choice = _choice(inst, var, np.asarray(h.getSolution().col_value))
    load = inst.loads(choice)
    zstar = float(np.max(load / capn))
    info["optimal"] = st == highspy.HighsModelStatus.kOptimal
    info["bottleneck_opt_gbps"] = float(inst.cap.max()) / zstar if zstar > 0 else float("inf")
    left = deadline - time.perf_counter()
    if st == highspy.HighsModelStatus.kOptimal and left > 0.05:
        choice2, st2, gap2 = _stage2(inst, var, on_link, fixed, capn, zstar, choice, left)
        if choice2 is not None and inst.full_key(choice2) >= inst.full_key(choice):
            choice = choice2  # a time-limited stage 2 may end below stage 1's routing
        info["stage2_status"], info["stage2_gap"] = st2, gap2
    info["gap"] = info["stage1_gap"]
    return choice, info


def _choice(inst: Instance, var: dict[tuple[int, int], int], sol: np.ndarray) -> list[int]:
    choice = [0] * len(inst.flows)
    for (i, k), c in var.items():
        if sol[c] > 0.5:
            choice[i] = k
    return choice


def _stage2(inst: Instance, var: dict, on_link: dict, fixed: np.ndarray, capn: np.ndarray,
            zstar: float, start: list[int], time_s: float
            ) -> tuple[list[int] | None, str, float]:
    import highspy

    inf = highspy.kHighsInf
    h = highspy.Highs()
    h.silent()
    h.setOptionValue("threads", 1)
    nv = len(var)
    links = [e for e in range(len(capn)) if on_link.get(e) or fixed[e]]
    # a link can reach the optimum only if zstar x capacity is a whole number of flows
    crit = [e for e in links if abs(zstar * capn[e] - round(zstar * capn[e])) < 1e-6]
    cpos = {e: nv + j for j, e in enumerate(crit)}
    njobs = len(inst.job_names)
    hpos = nv + len(crit)
    ncols = hpos + njobs
    h.addVars(ncols, np.zeros(ncols), np.ones(ncols))
    h.changeColsIntegrality(hpos, np.arange(hpos, dtype=np.int32),
                            np.full(hpos, highspy.HighsVarType.kInteger))
    h.changeColsCost(njobs, np.arange(hpos, ncols, dtype=np.int32), np.ones(njobs))
    for i in range(len(inst.flows)):
        if len(inst.cand_links[i]) > 1:
            idx = np.array([var[(i, k)] for k in range(len(inst.cand_links[i]))], dtype=np.int32)
            h.addRow(1.0, 1.0, len(idx), idx, np.ones(len(idx)))
    for e in links:
        idx = [var[v] for v in on_link.get(e, [])]
        cap_flows = round(zstar * capn[e]) if e in cpos else np.floor(zstar * capn[e] + 1e-9)
        if e in cpos:  # load <= cap_flows - 1 + c_e
            h.addRow(-inf, cap_flows - 1 - fixed[e], len(idx) + 1,
                     np.array([*idx, cpos[e]], dtype=np.int32), np.r_[np.ones(len(idx)), -1.0])
        elif idx:
            h.addRow(-inf, cap_flows - fixed[e], len(idx), np.array(idx, dtype=np.int32),
                     np.ones(len(idx)))
    # h_j >= (flow of j on e) + c_e - 1
    for e in crit:
        per_flow: dict[int, list[int]] = defaultdict(list)
        for i, k in on_link.get(e, []):
            per_flow[i].append(var[(i, k)])
        for i, cols in per_flow.items():
            j = hpos + int(inst.job_of[i])
            h.addRow(-inf, 1.0, len(cols) + 2, np.array([*cols, cpos[e], j], dtype=np.int32),
                     np.r_[np.ones(len(cols)), 1.0, -1.0])
        for i in range(len(inst.flows)):
            if len(inst.cand_links[i]) == 1 and e in inst.cand_links[i][0].tolist():
                h.addRow(-inf, 0.0, 2, np.array([cpos[e], hpos + int(inst.job_of[i])],
                                                dtype=np.int32), np.array([1.0, -1.0]))
    h.setOptionValue("time_limit", max(0.05, time_s))
    h.run()
    st = h.getModelStatus()
    name = h.modelStatusToString(st).lower().replace(" ", "_")
    if h.getInfo().primal_solution_status != 2:
        return None, name, float("inf")
    gap = 0.0 if st == highspy.HighsModelStatus.kOptimal else float(h.getInfo().mip_gap)
    return _choice(inst, var, np.asarray(h.getSolution().col_value)), name, gap
