"""Simulated annealing on the routing metric (seeded, bounded in moves and time)."""

from __future__ import annotations

import math
import random
import time
from collections.abc import Sequence

import numpy as np

from testbed.routing.instance import Instance


def _score(inst: Instance, rates: np.ndarray) -> float:
    """Scalar stand-in for the lexicographic metric: the slowest job weighs as much as all
    jobs' mean bottleneck together, flows' mean rate breaks ties (Gb/s)."""
    jb = np.full(len(inst.job_names), np.inf)
    np.minimum.at(jb, inst.job_of, rates)
    return float(jb.min() * 2.0 + jb.mean() + 1e-3 * rates.mean())


def anneal(inst: Instance, start: Sequence[int], *, seed: int, time_budget_s: float = 1.0,
           max_moves: int = 20000, t_start: float | None = None, t_end: float = 1e-3
           ) -> tuple[list[int], dict[str, float]]:
    """Random single-flow path changes, accepted if better or with probability
    exp(delta / T), T cooling geometrically from `t_start` (default: 5 % of the largest
    link capacity) to `t_end`; returns the best routing by the metric key seen."""
    rng = random.Random(seed)
    allf = list(range(len(inst.flows)))
    multi = [i for i in allf if len(inst.cand_links[i]) > 1]
    cur = list(start)
    rates = inst.rates(allf, cur)
    score, best_key = _score(inst, rates), inst.key(allf, rates)
    best = list(cur)
    bound = inst.upper_key()
    if not multi or best_key >= bound:
        return best, {"moves": 0, "accepted": 0}
    t0 = float(t_start if t_start is not None else 0.05 * float(inst.cap.max()))
    deadline = time.perf_counter() + time_budget_s
    accepted = steps = 0
    for steps in range(1, max_moves + 1):
        frac = steps / max_moves
        temp = t0 * (t_end / t0) ** frac
        # half the moves touch a flow of the slowest job
        if rng.random() < 0.5:
            slow = int(np.argmin(rates))
            same = [i for i in multi if inst.job_of[i] == inst.job_of[slow]]
            i = rng.choice(same or multi)
        else:
            i = rng.choice(multi)
        old = cur[i]
        k = rng.randrange(len(inst.cand_links[i]) - 1)
        cur[i] = k if k < old else k + 1
        r2 = inst.rates(allf, cur)
        s2 = _score(inst, r2)
        if s2 >= score or rng.random() < math.exp((s2 - score) / temp):
            score, rates = s2, r2
            accepted += 1
            key = inst.key(allf, r2)
            if key > best_key:
                best_key, best = key, list(cur)
                if best_key >= bound:
                    break
        else:
            cur[i] = old
        if time.perf_counter() > deadline:
            break
    return best, {"moves": steps, "accepted": accepted}
