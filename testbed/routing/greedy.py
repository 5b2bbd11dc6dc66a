"""The paper's greedy (flows placed one by one on the path keeping the metric highest)
and a bounded local search that improves any routing move by move."""

from __future__ import annotations

import random
import time
from collections.abc import Sequence

import numpy as np

from testbed.routing.instance import Instance


def greedy(inst: Instance, start: Sequence[int | None] | None = None,
           order: Sequence[int] | None = None, rng: random.Random | None = None) -> list[int]:
    """Place every flow without a (valid) start path, one by one, on the candidate whose
    partial routing has the best metric. Flows already routed in `start` keep their path.

    Speed-ups: a candidate whose own links (those not on every candidate) carry no flow
    yet and have the largest capacity is taken at once (the new flow gets the best rate
    it can and constrains no routed flow more than any other choice would: the feasible
    rate set is the largest); among the rest, candidates with the same (load, capacity)
    on their own links are rated once. With `rng`, ties among such free candidates are
    broken at random instead of by candidate order.

    The same choices as `greedy_reference`, with the loads and the own-link tables as
    Python lists: the free candidate is usually among the first few, and a list scan that
    stops there beats numpy's per-call cost on 32-candidate rows. A flow's chosen links
    are its common links and its own links' column entries (no per-flow array is read)."""
    n = len(inst.flows)
    choice: list[int | None] = list(start) if start is not None else [None] * n
    routed = [i for i in range(n) if choice[i] is not None]
    load: list[int] = inst.loads(choice).tolist()
    todo = [i for i in (order if order is not None else range(n)) if choice[i] is None]
    own_links, own_caps, common = inst.rest_tables
    src_leaf, dst_leaf, host_up, host_down = inst.batch_of
    if inst._batch is not None:  # the leaves' rows: links up/down per spine, capacities
        up_rows, down_rows, cap_up_rows, cap_down_rows = inst.fabric._spines.lists
    n_cands, cap = inst.n_cands, inst.cap
    for i in todo:
        pick = 0
        n_cand = n_cands[i]
        a = src_leaf[i]
        if n_cand > 1:
            top = inst.own_cap_max[i]
            free: list[int] = []
            two = a >= 0
            if two:  # a batch flow: its leaves' rows
                b = dst_leaf[i]
                up, down, cap_up, cap_down = up_rows[a], down_rows[b], cap_up_rows[a], \
                    cap_down_rows[b]
            else:
                cols, caps = own_links[i], own_caps[i]
                two = len(cols) == 2
                if two:  # a Clos path: its two spine links
                    (up, down), (cap_up, cap_down) = cols, caps
            if two:
                for k in range(n_cand):
                    if load[up[k]] == 0 and load[down[k]] == 0 and cap_up[k] >= top \
                            and cap_down[k] >= top:
                        free.append(k)
                        if rng is None:
                            break
            else:
                for k in range(n_cand):
                    if all(load[c[k]] == 0 for c in cols) and all(c[k] >= top for c in caps):
                        free.append(k)
                        if rng is None:
                            break
            if free:
                pick = free[0] if rng is None else free[rng.randrange(len(free))]
            else:
                seen: set[tuple] = set()
                best_key: tuple | None = None
                flows = [*routed, i]
                for k in range(n_cand):
                    o = inst.own(i, k).tolist()
                    sig = tuple(load[x] for x in o) + tuple(cap[o].tolist())
                    if sig in seen:
                        continue
                    seen.add(sig)
                    choice[i] = k
                    key = inst.key(flows, inst.rates(flows, choice))
                    if best_key is None or key > best_key:
                        best_key, pick = key, k
        choice[i] = pick
        routed.append(i)
        if a >= 0:  # the candidate's links: its host links, its two spine links
            load[host_up[i]] += 1
            load[host_down[i]] += 1
            load[up_rows[a][pick]] += 1
            load[down_rows[dst_leaf[i]][pick]] += 1
        else:  # those on every candidate, then its own
            for x in common[i]:
                load[x] += 1
            for c in own_links[i]:
                load[c[pick]] += 1
    return [int(c) for c in choice]  # type: ignore[arg-type]


def greedy_reference(inst: Instance, start: Sequence[int | None] | None = None,
                     order: Sequence[int] | None = None, rng: random.Random | None = None
                     ) -> list[int]:
    """`greedy` as first written (numpy rows per flow): the reference the fast loop is
    tested equal to (tests/test_routing_equal.py)."""
    n = len(inst.flows)
    choice: list[int | None] = list(start) if start is not None else [None] * n
    routed = [i for i in range(n) if choice[i] is not None]
    load = inst.loads(choice)
    todo = [i for i in (order if order is not None else range(n)) if choice[i] is None]
    cap = inst.cap
    for i in todo:
        mat = inst.cand_mat[i]
        pick = 0
        if len(mat) > 1:
            own_load = load[mat[:, inst.own_cols[i]]].sum(axis=1)
            free = np.flatnonzero((own_load == 0) & (inst.own_cap[i] >= inst.own_cap_max[i]))
            if free.size:
                pick = int(free[0]) if rng is None else int(free[rng.randrange(free.size)])
            else:
                seen: set[tuple] = set()
                best_key: tuple | None = None
                flows = [*routed, i]
                for k in range(len(mat)):
                    o = inst.own(i, k)
                    sig = tuple(load[o].tolist()) + tuple(cap[o].tolist())
                    if sig in seen:
                        continue
                    seen.add(sig)
                    choice[i] = k
                    key = inst.key(flows, inst.rates(flows, choice))
                    if best_key is None or key > best_key:
                        best_key, pick = key, k
        choice[i] = pick
        routed.append(i)
        load[mat[pick]] += 1
    return [int(c) for c in choice]  # type: ignore[arg-type]


def local_search(inst: Instance, choice: Sequence[int], *, time_budget_s: float = 1.0,
                 max_moves: int | None = None, movable: set[int] | None = None
                 ) -> tuple[list[int], int]:
    """Hill climbing on the metric. A step moves one flow to another candidate path, or,
    when no single move helps, moves a flow of the slowest jobs and then one flow it
    lands on (an ejection chain of two), whenever the whole routing's metric gets strictly
    better. Flows sharing a link with the slowest flows are tried first. Stops at a local
    optimum, at the upper bound (every flow at its host-link fair share), after
    `max_moves` moves or when the time budget is spent. Returns the routing and the
    number of flow moves made."""
    cur = list(choice)
    allf = list(range(len(inst.flows)))
    rates = inst.rates(allf, cur)
    key = inst.key(allf, rates)
    bound = inst.upper_key()
    moves = 0
    deadline = time.perf_counter() + time_budget_s

    def ok(i: int) -> bool:
        return movable is None or i in movable

    def improve(f: int, n: int) -> tuple[tuple, np.ndarray, int] | None:
        """Flow f on each of its other candidates in turn: the first that makes the metric
        strictly better is kept (its key, rates and the n moves made), else f goes back."""
        was = cur[f]
        for k in range(len(inst.cand_links[f])):
            if k == was:
                continue
            cur[f] = k
            r2 = inst.rates(allf, cur)
            k2 = inst.key(allf, r2)
            if k2 > key:
                return k2, r2, n
        cur[f] = was
        return None

    def attempt() -> tuple[tuple, np.ndarray, int] | None:
        order = [i for i in _by_urgency(inst, cur, rates) if ok(i)]
        for i in order:  # single moves
            got = improve(i, 1)
            if got is not None:
                return got
            if time.perf_counter() > deadline:
                return None
        if max_moves is not None and moves + 2 > max_moves:
            return None
        slow = float(rates.min())
        for i in [i for i in order if rates[i] <= slow * (1 + 1e-9)]:  # ejection chains
            old = cur[i]
            for k in range(len(inst.cand_links[i])):
                if k == old:
                    continue
                cur[i] = k
                own = set(inst.own(i, k).tolist())
                for j in order:
                    if j == i or not own.intersection(inst.cand_links[j][cur[j]].tolist()):
                        continue
                    got = improve(j, 2)
                    if got is not None:
                        return got
                cur[i] = old
                if time.perf_counter() > deadline:
                    return None
        return None

    while (max_moves is None or moves < max_moves) and key < bound:
        found = attempt()
        if found is None:
            break
        key, rates, n = found
        moves += n
        if time.perf_counter() > deadline:
            break
    return cur, moves


def _by_urgency(inst: Instance, choice: Sequence[int], rates: np.ndarray) -> list[int]:
    """Flows ordered for moving: those on the links of the slowest flows first (slowest
    first), then the rest by rate."""
    n = len(inst.flows)
    multi = [i for i in range(n) if len(inst.cand_links[i]) > 1]
    if not multi:
        return []
    slow = float(rates.min())
    hot: set[int] = set()
    for i in range(n):
        if rates[i] <= slow * (1 + 1e-9):
            hot.update(inst.cand_links[i][choice[i]].tolist())
    first = [i for i in multi if hot.intersection(inst.cand_links[i][choice[i]].tolist())]
    fs = set(first)
    rest = [i for i in multi if i not in fs]
    return sorted(first, key=lambda i: rates[i]) + sorted(rest, key=lambda i: rates[i])


def least_loaded(inst: Instance, order: Sequence[int] | None = None) -> list[int]:
    """Ablation of greedy without the metric: each flow, in the same order, takes the
    candidate whose busiest own link has the fewest flows per Gb/s after adding it."""
    n = len(inst.flows)
    load = np.zeros(len(inst.cap), dtype=np.int64)
    choice = [0] * n
    for i in order if order is not None else range(n):
        mat = inst.cand_mat[i]
        k = 0
        if len(mat) > 1:
            cong = np.where(inst.own_mask[i], (load[mat] + 1) / inst.cap[mat], 0.0).max(axis=1)
            k = int(np.argmin(cong))
        choice[i] = k
        load[mat[k]] += 1
    return choice


def iterated_local_search(inst: Instance, choice: Sequence[int], *, seed: int,
                          time_budget_s: float = 1.0) -> tuple[list[int], int, int]:
    """Local search, then, while time is left and the upper bound is not reached,
    ruin-and-recreate kicks: take a random part of the movable flows (often those on the
    slowest flows' links) off the network, place them again by greedy in a random order;
    a better result is kept and hill-climbed. Seeded. Returns the routing, the number of kicks
    tried and of kicks that improved."""
    deadline = time.perf_counter() + time_budget_s
    best, _ = local_search(inst, choice, time_budget_s=time_budget_s)
    allf = list(range(len(inst.flows)))
    best_key = inst.key(allf, inst.rates(allf, best))
    bound = inst.upper_key()
    rng = random.Random(seed)
    kicks = gains = 0
    while best_key < bound and time.perf_counter() < deadline:
        rates = inst.rates(allf, best)
        hot = _by_urgency(inst, best, rates)
        if not hot:
            break
        pool = hot[:max(4, len(hot) // 3)] if rng.random() < 0.5 else hot
        ruined = rng.sample(pool, rng.randint(1, len(pool)))
        start: list[int | None] = list(best)
        for i in ruined:
            start[i] = None
        rng.shuffle(ruined)
        cur = greedy(inst, start, order=ruined, rng=rng)
        key = inst.key(allf, inst.rates(allf, cur))
        kicks += 1
        if key > best_key:
            cur, _ = local_search(inst, cur, time_budget_s=max(
                0.0, deadline - time.perf_counter()))
            key = inst.key(allf, inst.rates(allf, cur))
            best, best_key = cur, key
            gains += 1
    return best, kicks, gains
