"""Latency- and bandwidth-aware list scheduling under a per-stage memory cap.

The list scheduler simulates the reference model (testbed.schedule.timer) and, each
time a stage can act, picks its next operation by a priority rule from the ops whose
inputs have arrived. Micro-batches go in order per kind (F0, F1, ...; B0, B1, ...), so
every link stays FIFO in the sender's order and the resulting action lists time to
exactly the simulated schedule. Used by `crosspipe-greedy` and `zb-h1`.

Rules:
- "nondelay": the op that can start earliest; ties go backward (I/B), then F, then W.
- "lookahead": as nondelay, but a stage waits for a backward whose gradient arrives
  before the forward it could start now would end (frees memory sooner, shortens
  the critical path back to stage 0).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from testbed.schedule.model import Action, PipelineProblem, Schedule

_INF = math.inf
RULES = ("nondelay", "lookahead")


def list_schedule(problem: PipelineProblem, *, split_backward: bool = False,
                  caps: Sequence[int | None] | None = None, rule: str = "nondelay",
                  name: str = "list") -> tuple[Schedule, float]:
    """Return (schedule, simulated iteration time in ms)."""
    if rule not in RULES:
        raise ValueError(f"unknown rule {rule!r}; valid: {', '.join(RULES)}")
    p, m = problem.stages, problem.microbatches
    caps = list(problem.caps if caps is None else caps)
    f = list(problem.forward_ms)
    wf = problem.weight_grad_fraction if split_backward else 0.0
    bi = [x * (1.0 - wf) for x in problem.backward_ms]
    bw = [x * wf for x in problem.backward_ms]
    ser = [problem.hop_serialisation_ms(h) for h in range(p - 1)]
    lat = [h.latency_ms for h in problem.hops]
    act = [[_INF] * m for _ in range(p)]
    act[0] = [0.0] * m
    grad = [[_INF] * m for _ in range(p)]
    f_end = [[_INF] * m for _ in range(p)]
    link_f = [0.0] * max(p - 1, 0)
    link_b = [0.0] * max(p - 1, 0)
    nf = [0] * p
    nb = [0] * p
    nw = [0] * p
    held = [0] * p
    free = [0.0] * p
    rows: list[list[Action]] = [[] for _ in range(p)]
    bkind = "I" if split_backward else "B"
    remaining = p * m * (3 if split_backward else 2)

    while remaining:
        best: tuple[float, int, int] | None = None  # (start, prio, stage)
        for s in range(p):
            t = free[s]
            cand_f = _INF
            if nf[s] < m and (caps[s] is None or held[s] < caps[s]):
                r = act[s][nf[s]]
                cand_f = t if t >= r else r
            cand_b = _INF
            j = nb[s]
            if j < nf[s]:
                r = f_end[s][j]
                if s < p - 1:
                    g = grad[s][j]
                    r = g if g > r else r
                cand_b = t if t >= r else r
            cand_w = t if split_backward and nw[s] < nb[s] else _INF
            if rule == "lookahead" and cand_b < _INF and cand_f < cand_b < cand_f + f[s]:
                cand_f = _INF
            for start, prio in ((cand_b, 0), (cand_f, 1), (cand_w, 2)):
                if start < _INF and (best is None or (start, prio) < best[:2]):
                    best = (start, prio, s)
        if best is None:  # cannot happen with caps >= 1; kept as a guard
            raise RuntimeError("list scheduler stalled")
        start, prio, s = best
        remaining -= 1
        if prio == 1:
            j = nf[s]
            end = start + f[s]
            nf[s] += 1
            held[s] += 1
            f_end[s][j] = end
            rows[s].append(Action("F", j))
            if s < p - 1:
                tx = max(end, link_f[s])
                link_f[s] = tx + ser[s]
                act[s + 1][j] = tx + ser[s] + lat[s]
        elif prio == 0:
            j = nb[s]
            end = start + bi[s]
            nb[s] += 1
            if not split_backward:
                held[s] -= 1
            rows[s].append(Action(bkind, j))
            if s > 0:
                tx = max(end, link_b[s - 1])
                link_b[s - 1] = tx + ser[s - 1]
                grad[s - 1][j] = tx + ser[s - 1] + lat[s - 1]
        else:
            j = nw[s]
            end = start + bw[s]
            nw[s] += 1
            held[s] -= 1
            rows[s].append(Action("W", j))
        free[s] = end
    return Schedule(name, tuple(tuple(r) for r in rows), info={"rule": rule}), max(free)


def best_list_schedule(problem: PipelineProblem, *, split_backward: bool = False,
                       caps: Sequence[int | None] | None = None, name: str = "list",
                       rules: Sequence[str] = RULES) -> Schedule:
    """Run each rule and keep the schedule with the shortest iteration."""
    best: tuple[float, Schedule] | None = None
    for rule in rules:
        sched, t = list_schedule(problem, split_backward=split_backward, caps=caps, rule=rule,
                                 name=name)
        if best is None or t < best[0] - 1e-12:
            best = (t, sched)
    assert best is not None
    return best[1]


def zero_bubble_caps(problem: PipelineProblem) -> list[int]:
    """ZB-H1 memory: each stage holds at most what 1F1B holds (p - s), or the cap."""
    p, m = problem.stages, problem.microbatches
    out = []
    for s, cap in enumerate(problem.caps):
        k = min(p - s, m)
        out.append(k if cap is None else min(k, cap))
    return out
