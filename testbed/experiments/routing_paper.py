"""Routing's gain against the paper: greedy vs ECMP with each difference of setting between
our `clos-32x64` case and the paper's evaluation switched on and off (a measured ablation).

Every row of the ablation runs the same seeds; within a seed both policies see the same
fabric, jobs, flows and phase offsets, and the means compared cover the same jobs and
iterations. A row is a `Setting`; `DIFFERENCES` names the fields that differ between
ours and the paper's setting as far as its text says (or, where it is silent, a common
practice: see docs/routing.md, "Against the paper").
"""

from __future__ import annotations

import functools
import math
import random
import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import networkx as nx
import numpy as np

from testbed.errors import InputError
from testbed.routing.flows import Flow, Job, flows_of, jobs_on_clos
from testbed.routing.maxmin import LinkIndex, fill, fill_pairs
from testbed.routing.policies import route
from testbed.routing.topology import clos, hosts, leaf_of

HOP_LATENCY_US = 1.0
BUFFER_BYTES = 1e9
COMPUTE_S = 0.3


@dataclass(frozen=True)
class Setting:
    """One experimental setting of the greedy-vs-ECMP comparison on a 2-layer Clos."""

    spines: int = 32
    leaves: int = 64
    hosts_per_leaf: int = 8       # 32 = every ToR 1:1 (32 hosts down, 32 spines up)
    busy_share: float = 0.5       # share of hosts given to jobs (jobs = share x hosts / size)
    ring_size: int = 16
    block: int = 0                # hosts per leaf per job, ring in leaf order; 0 = random
    qps: int = 1                  # connections (QPs/channels) per ring neighbour, each hashed
    staggered: bool = False       # jobs' communication phases at random offsets (time sim)
    metric: str = "allreduce"     # allreduce | iteration (compute + all-reduce)
    paced: bool = False           # rates: per-connection max-min | one rate per ring
    iterations: int = 3           # recorded iterations per job in the time simulation

    @property
    def jobs(self) -> int:
        return max(1, int(self.busy_share * self.leaves * self.hosts_per_leaf)
                   // self.ring_size)


OURS = Setting()
PAPER_TEXT = "paper text"
# One difference of setting: name, Setting field, its other value, where that value comes
# from ("text": what the paper's text fixes; "open": the text is silent, a common practice)
DIFFERENCES: tuple[tuple[str, str, Any, str, str], ...] = (
    ("fabric 1:1", "hosts_per_leaf", 32, "text",
     "32 hosts per ToR (a 64-port ToR: 32 down to hosts, 32 up to the 32 spines) instead of "
     "8; half the hosts busy as in ours (64 jobs of 16 instead of 16)"),
    ("2 connections per neighbour", "qps", 2, "open",
     "each ring neighbour's data over 2 connections (NCCL channels, each its own QP and "
     "UDP source port), each hashed by ECMP on its own, instead of 1"),
    ("rack-local placement", "block", 4, "open",
     "each job on 4 hosts in each of 4 random ToRs, ring in ToR order (12 of 16 ring "
     "neighbours in the same ToR), instead of 16 hosts drawn at random"),
    ("staggered jobs", "staggered", True, "open",
     "jobs compute (0.3 s) and communicate at their own pace from random phase offsets, "
     "rates re-computed at every phase change, instead of all communicating at once"),
    ("ring-paced rates", "paced", True, "open",
     "a ring moves at one pace, so its connections send at the ring's rate and leave the "
     "rest of their links to others: max-min fair over jobs (each job's rate counted on "
     "every link of its connections) instead of over connections"),
    ("iteration time", "metric", "iteration", "open",
     "compare compute + all-reduce per iteration (what effective GPU utilisation and a "
     "job's completion time follow) instead of the all-reduce alone"),
)


def paper_setting() -> Setting:
    """The paper's setting as far as its text fixes it: the differences marked "text"."""
    return replace(OURS, **{f: v for _n, f, v, src, _d in DIFFERENCES if src == "text"})


def all_on() -> Setting:
    """Every difference switched on."""
    return replace(OURS, **{f: v for _n, f, v, _s, _d in DIFFERENCES})


def ablation_rows(quick: bool = False) -> list[tuple[str, Setting]]:
    """Ours; each difference alone; the paper's text setting and each open difference on
    top of it; all on; all on but one (quick: without the last two groups but all on)."""
    paper = paper_setting()
    rows = [("ours (clos-32x64)", OURS)]
    for n, f, v, _s, _d in DIFFERENCES:
        s = replace(OURS, **{f: v})
        rows.append((f"ours + {n}" + (f" = {PAPER_TEXT}" if s == paper else ""), s))
    if all(s != paper for _n, s in rows):
        rows.append((PAPER_TEXT, paper))
    if not quick:
        opened = [d for d in DIFFERENCES if d[3] == "open"]
        rows += [(f"{PAPER_TEXT} + {n}", replace(paper, **{f: v})) for n, f, v, _s, _d in opened]
        # pairs of open differences on the paper's fabric, its metric (all-reduce) kept
        kept = [d for d in opened if d[1] != "metric"]
        rows += [(f"{PAPER_TEXT} + {a[0]} + {b[0]}", replace(paper, **{a[1]: a[2], b[1]: b[2]}))
                 for i, a in enumerate(kept) for b in kept[i + 1:]]
    rows.append(("all on", all_on()))
    if not quick:
        rows += [(f"all on - {n}", replace(all_on(), **{f: getattr(OURS, f)}))
                 for n, f, _v, _s, _d in DIFFERENCES]
        rows += sweep_rows()
    return rows


SWEEP = "sweep"


def sweep_rows() -> list[tuple[str, Setting]]:
    """Ours with more connections per neighbour, or other placement blocks: how fast the
    gain falls with the two strongest knobs (ours + 2 connections and ours + rack-local
    blocks of 4 are rows of the ablation already)."""
    return ([(f"{SWEEP}: ours, {q} connections per neighbour", replace(OURS, qps=q))
             for q in (3, 4, 8)]
            + [(f"{SWEEP}: ours, rack-local blocks of {b}", replace(OURS, block=b))
               for b in (2, 8)])


def place(graph: nx.DiGraph, s: Setting, seed: int) -> list[Job]:
    """The jobs of a setting: at random (`block` 0, as `reproduce routing` places them) or
    in blocks of `block` hosts on distinct random ToRs, the ring in ToR order."""
    if s.block <= 0:
        return jobs_on_clos(graph, s.jobs, s.ring_size, seed=seed, buffer_bytes=BUFFER_BYTES,
                            compute_s=COMPUTE_S)
    if s.ring_size % s.block:
        raise InputError("block", f"{s.block} does not divide the ring size {s.ring_size}")
    rng = random.Random(seed)
    free: dict[str, list[str]] = {}
    for h in hosts(graph):
        free.setdefault(leaf_of(graph, h), []).append(h)
    jobs = []
    for j in range(s.jobs):
        fit = [leaf for leaf, hs in free.items() if len(hs) >= s.block]
        if len(fit) < s.ring_size // s.block:
            raise InputError("busy_share", f"no room for job {j} in blocks of {s.block}")
        members: list[str] = []
        for leaf in rng.sample(fit, s.ring_size // s.block):
            members += free[leaf][:s.block]
            del free[leaf][:s.block]
        jobs.append(Job(f"j{j}", tuple(members), BUFFER_BYTES, COMPUTE_S))
    return jobs


def split(flows: Sequence[Flow], qps: int) -> list[Flow]:
    """Each flow as `qps` connections carrying an equal share (ids `<flow>.q<k>`, so each
    gets its own source port in ECMP's hash)."""
    if qps <= 1:
        return list(flows)
    return [Flow(f"{f.id}.q{k}", f.job, f.src, f.dst, f.demand_bytes / qps)
            for f in flows for k in range(qps)]


@dataclass
class Routed:
    """One policy's routing of an instance, compiled for rate computations."""

    policy: str
    flows: list[Flow]
    links: list[np.ndarray]
    hops: list[int]
    wall_s: float


def route_both(g: nx.DiGraph, jobs: Sequence[Job], s: Setting, seed: int
               ) -> tuple[Routed, Routed]:
    """ECMP hashes every connection on its own; greedy routes each ring neighbour's
    connections together on one path (host-enforced per neighbour, as the paper's hosts
    pin a flow's path): greedy never gets more freedom than ECMP."""
    base = flows_of(jobs)
    conns = split(base, s.qps)
    idx = LinkIndex(g)
    e = route("ecmp", g, conns, seed=seed)
    gr = route("greedy", g, base, seed=seed)
    parent = {c.id: (c.id.rsplit(".q", 1)[0] if s.qps > 1 else c.id) for c in conns}
    out = []
    for name, paths, wall in (("ecmp", e.paths, e.wall_s),
                              ("greedy", {c.id: gr.paths[parent[c.id]] for c in conns},
                               gr.wall_s)):
        out.append(Routed(name, conns, [idx.links_of(paths[c.id]) for c in conns],
                          [len(paths[c.id]) - 1 for c in conns], wall))
    return out[0], out[1]


def _job_groups(flows: Sequence[Flow]) -> dict[str, list[int]]:
    by: dict[str, list[int]] = {}
    for i, f in enumerate(flows):
        by.setdefault(f.job, []).append(i)
    return by


def paced_fill(cap: np.ndarray, links: Sequence[np.ndarray], group: Sequence[int]
               ) -> np.ndarray:
    """Progressive filling over groups (jobs) instead of connections: every connection
    of a group sends at the group's rate, so a link with c connections of a group carries
    c x its rate; all unfrozen groups grow together and a full link freezes its groups.
    Returns one rate per connection (its group's), Gb/s."""
    n = len(links)
    if n == 0:
        return np.zeros(0)
    g_of = np.asarray(group, dtype=np.int64)
    lens = np.fromiter((len(x) for x in links), dtype=np.int64, count=n)
    pair_link = np.concatenate(links) if lens.sum() else np.zeros(0, dtype=np.int64)
    return paced_fill_pairs(cap, np.repeat(g_of, lens), pair_link, int(g_of.max()) + 1)[g_of]


def paced_fill_pairs(cap: np.ndarray, pair_group: np.ndarray, pair_link: np.ndarray,
                     n_groups: int) -> np.ndarray:
    """paced_fill with the connections' links as (group, link) pairs, one pair per
    connection and link it crosses: one rate per group 0..n_groups-1 (inf: no link).
    That is max-min filling over groups (`maxmin.fill_pairs` with groups for flows): a
    link's load counts a group once per pair, so c connections of a group carry c x its
    rate."""
    return fill_pairs(cap, pair_group, pair_link, n_groups)


def conn_rates(cap: np.ndarray, links: Sequence[np.ndarray], group: Sequence[int],
               paced: bool) -> np.ndarray:
    """Each connection's rate: max-min over connections, or one rate per group."""
    return paced_fill(cap, links, group) if paced else fill(cap, list(links))


def static_times(cap: np.ndarray, r: Routed, jobs: Sequence[Job], paced: bool = False
                 ) -> list[float]:
    """All jobs communicating at once: per job, its slowest connection's bytes / max-min
    rate + 2(n-1) x path latency (what `metric.evaluate` computes), in job order."""
    order = {name: k for k, name in enumerate(dict.fromkeys(f.job for f in r.flows))}
    rates = conn_rates(cap, r.links, [order[f.job] for f in r.flows], paced)
    by = _job_groups(r.flows)
    out = []
    for j in jobs:
        ids = by.get(j.name, [])
        transfer = max((r.flows[i].demand_bytes * 8.0 / (rates[i] * 1e9) for i in ids),
                       default=0.0)
        hops = max((r.hops[i] for i in ids), default=0)
        out.append(transfer + 2 * (len(j.members) - 1) * hops * HOP_LATENCY_US * 1e-6)
    return out


def staggered_times(cap: np.ndarray, r: Routed, jobs: Sequence[Job], iterations: int,
                    seed: int, paced: bool = False) -> list[list[float]]:
    """Jobs alternate compute and ring all-reduce, each from a random phase offset in its
    first iteration; at every phase change the communicating jobs' connections get their
    max-min rates and each job advances at its slowest connection's pace (a ring step
    waits for its slowest neighbour). Every job keeps running until all have recorded
    `iterations` all-reduce times, so the load stays stationary. Per job, its times."""
    by = _job_groups(r.flows)
    rng = random.Random(seed * 104729 + 3)
    n = len(jobs)
    ids = [by.get(j.name, []) for j in jobs]
    # all connections of a job carry the same bytes: a job's progress is a share of them
    demand_b = [max((r.flows[i].demand_bytes * 8.0 for i in ids[k]), default=0.0)
                for k in range(n)]
    latency = [2 * (len(j.members) - 1) * max((r.hops[i] for i in ids[k]), default=0)
               * HOP_LATENCY_US * 1e-6 for k, j in enumerate(jobs)]
    qps = [max(1, len(ids[k]) // len(j.members)) for k, j in enumerate(jobs)]
    # alone on the fabric, each of a host's `qps` connections gets 1/qps of its link
    ideal = [demand_b[k] * qps[k] / (float(cap.max()) * 1e9) for k in range(n)]
    compute = [j.compute_s for j in jobs]
    # state: comm (remaining bits of each connection) or computing until `until`
    until = [rng.uniform(0.0, compute[k] + ideal[k]) for k in range(n)]
    remaining = [0.0] * n
    started = [0.0] * n
    comm = [False] * n
    times: list[list[float]] = [[] for _ in range(n)]
    # The rates depend only on which jobs communicate: each set's max-min is computed once
    # (the sets recur, phase after phase; the same arithmetic, so the same results).
    rates_of: dict[tuple[int, ...], dict[int, float]] = {}
    # each job's (connection, link) pairs, its connections in flow order, made once
    empty = np.zeros(0, dtype=np.int64)
    job_links = [np.concatenate([r.links[i] for i in ids[k]]) if ids[k] else empty
                 for k in range(n)]
    job_conns = [np.repeat(np.arange(len(ids[k]), dtype=np.int64),
                           [len(r.links[i]) for i in ids[k]]) if ids[k] else empty
                 for k in range(n)]
    t = 0.0
    for _guard in range(200 * n * (iterations + 2)):
        if all(len(x) >= iterations for x in times):
            return [x[:iterations] for x in times]
        active = [k for k in range(n) if comm[k]]
        rate = rates_of.get(tuple(active), {}) if active else {}
        if active and not rate:
            pair_link = np.concatenate([job_links[k] for k in active])
            if paced:  # every connection of a job at the job's rate
                per_job = paced_fill_pairs(cap, np.repeat(np.asarray(active, dtype=np.int64),
                                                          [len(job_links[k]) for k in active]),
                                           pair_link, n)
                rate = {k: float(per_job[k]) * 1e9 if ids[k] else float(np.inf)
                        for k in active}
            else:  # max-min over the active jobs' connections, in flow order
                first = np.cumsum([0] + [len(ids[k]) for k in active])
                rates = fill_pairs(cap, np.concatenate(
                    [job_conns[k] + first[j] for j, k in enumerate(active)]), pair_link,
                    int(first[-1]))
                rate = {k: float(rates[first[j]:first[j + 1]].min()) * 1e9
                        for j, k in enumerate(active)}
            rates_of[tuple(active)] = rate
        # next event: a computing job starts its all-reduce, or a communicating one ends
        nxt = [(until[k] if not comm[k] else t + remaining[k] / rate[k], k)
               for k in range(n)]
        t_next, _k = min(nxt)
        dt = t_next - t
        for k in active:
            remaining[k] -= rate[k] * dt
        t = t_next
        for k in range(n):
            if comm[k] and remaining[k] <= 1e-9 * max(1.0, demand_b[k]):
                comm[k] = False
                times[k].append(t - started[k] + latency[k])
                until[k] = t + latency[k] + compute[k]
            elif not comm[k] and until[k] <= t + 1e-15:
                comm[k] = True
                started[k] = t
                remaining[k] = demand_b[k]
    raise RuntimeError("staggered simulation did not converge")


@functools.lru_cache(maxsize=4)
def fabric(spines: int, leaves: int, hosts_per_leaf: int) -> nx.DiGraph:
    """The Clos fabric of these sizes, built once per process and frozen: shared, read
    only (a 32x64 fabric took 55 ms to build, once per seed and setting)."""
    return nx.freeze(clos(spines, leaves, hosts_per_leaf))


def measure(s: Setting, seed: int) -> dict[str, Any]:
    """One seed of one setting: both policies' mean time over the same jobs (and, staggered,
    the same iteration indices) and greedy's change against ECMP."""
    g = fabric(s.spines, s.leaves, s.hosts_per_leaf)
    jobs = place(g, s, seed)
    e, gr = route_both(g, jobs, s, seed)
    cap = LinkIndex(g).capacity_gbps
    out: dict[str, Any] = {"seed": seed, "jobs": len(jobs)}
    for r in (e, gr):
        if s.staggered:
            per_job = staggered_times(cap, r, jobs, s.iterations, seed, s.paced)
        else:
            per_job = [[x] for x in static_times(cap, r, jobs, s.paced)]
        add = [j.compute_s if s.metric == "iteration" else 0.0 for j in jobs]
        vals = [x + add[k] for k, xs in enumerate(per_job) for x in xs]
        out[f"{r.policy}_mean_s"] = statistics.fmean(vals)
        out[f"{r.policy}_wall_s"] = r.wall_s
    out["collided_jobs_ecmp"] = collided_jobs(cap, e)
    out["change_pct"] = (out["greedy_mean_s"] / out["ecmp_mean_s"] - 1) * 100
    return out


def collided_jobs(cap: np.ndarray, r: Routed) -> float:
    """Share of jobs with a connection below its fair host-link share when every job
    communicates at once (a hash collision that slows the ring)."""
    rates = fill(cap, r.links)
    by = _job_groups(r.flows)
    per_host: dict[str, int] = {}
    for f in r.flows:
        per_host[f.src] = per_host.get(f.src, 0) + 1
    hit = 0
    for ids in by.values():
        if any(rates[i] < float(cap.max()) / per_host[r.flows[i].src] - 1e-6 for i in ids):
            hit += 1
    return hit / max(1, len(by))


def t975(df: int) -> float:
    """Student t 0.975 quantile (table, then 1.96 beyond 30 degrees of freedom)."""
    table = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365,
             8: 2.306, 9: 2.262, 10: 2.228, 12: 2.179, 15: 2.131, 19: 2.093, 24: 2.064,
             29: 2.045}
    if df > 30:
        return 1.96
    return table.get(df) or next(v for k, v in sorted(table.items(), reverse=True)
                                 if k <= df)


def summarise_row(name: str, s: Setting, runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Means over seeds with 95 % CIs (Student t), the paired change included."""
    ch = [r["change_pct"] for r in runs]
    ci = (t975(len(ch) - 1) * statistics.stdev(ch) / math.sqrt(len(ch))
          if len(ch) > 1 else 0.0)
    return {"row": name, "seeds": len(runs), "jobs": runs[0]["jobs"] if runs else 0,
            "ecmp_mean_s": statistics.fmean(r["ecmp_mean_s"] for r in runs),
            "greedy_mean_s": statistics.fmean(r["greedy_mean_s"] for r in runs),
            "greedy_vs_ecmp_pct": statistics.fmean(ch), "greedy_vs_ecmp_ci95_pct": ci,
            "greedy_vs_ecmp_min_pct": min(ch), "greedy_vs_ecmp_max_pct": max(ch),
            "ecmp_collided_jobs": statistics.fmean(r["collided_jobs_ecmp"] for r in runs),
            "greedy_wall_ms": statistics.fmean(r["greedy_wall_s"] for r in runs) * 1000,
            "setting": asdict(s)}


def ablation(seeds: int, rows: Sequence[tuple[str, Setting]] | None = None,
             advance: Callable[[], None] | None = None
             ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every row over seeds 1..seeds: (summary rows, per-seed runs); `advance` is called
    after each row."""
    if seeds < 1:
        raise InputError("seeds", f"must be >= 1, got {seeds}")
    summary, runs = [], []
    for name, s in rows if rows is not None else ablation_rows():
        rs = [measure(s, seed) for seed in range(1, seeds + 1)]
        runs += [{"row": name, **r} for r in rs]
        summary.append(summarise_row(name, s, rs))
        if advance is not None:
            advance()
    return summary, runs


PAPER_RANGE_PCT = (-32.0, -18.0)  # greedy vs ECMP in mean communication time, as reported


def _in_range(pct: float) -> str:
    lo, hi = PAPER_RANGE_PCT
    return "yes" if lo <= pct <= hi else ("below" if pct > hi else "beyond")


def effects(summary: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per difference: how many points of greedy-vs-ECMP it moves alone (ours + it - ours)
    and within all the others (all on - (all on - it)), where both rows were run."""
    by = {r["row"].split(" = ")[0]: r["greedy_vs_ecmp_pct"] for r in summary}
    out = []
    for name, _f, _v, src, _d in DIFFERENCES:
        alone = (by[f"ours + {name}"] - by["ours (clos-32x64)"]
                 if f"ours + {name}" in by and "ours (clos-32x64)" in by else None)
        within = (by["all on"] - by[f"all on - {name}"]
                  if f"all on - {name}" in by and "all on" in by else None)
        paper = (by[f"{PAPER_TEXT} + {name}"] - by["ours + fabric 1:1"]
                 if f"{PAPER_TEXT} + {name}" in by and "ours + fabric 1:1" in by else None)
        out.append({"difference": name, "source": src, "alone_pp": alone,
                    "at_paper_fabric_pp": paper, "within_all_pp": within})
    return out


def _pp(v: float | None) -> str:
    return "n/a" if v is None else f"{v:+.1f}"


def markdown(summary: Sequence[dict[str, Any]], seeds: int) -> str:
    """The "Against the paper" section of summary.md."""
    lo, hi = PAPER_RANGE_PCT
    out = ["## Against the paper: which difference of setting moves greedy's gain", "",
           f"Greedy against ECMP, {seeds} seeds per row (the same seeds, hence the same "
           "fabrics, placements and ECMP hash seeds in every row where the setting allows; "
           "within a seed both policies are averaged over the same jobs and iterations). "
           "Change = greedy / ECMP - 1 of the mean time, per seed, then the mean over seeds "
           f"± its 95 % CI (Student t) and the seeds' range. The paper: {lo:+.0f} to {hi:+.0f} "
           "% in mean communication time. ECMP hashes every connection on its own over the "
           "same candidate paths as greedy (one per spine); greedy pins a neighbour's "
           "connections to one path.", "",
           "| difference | source | value here |", "|---|---|---|"]
    for name, field, value, src, desc in DIFFERENCES:
        out.append(f"| {name} | {'paper text' if src == 'text' else 'text silent'} | "
                   f"`{field}` {getattr(OURS, field)!r} -> {value!r}: {desc} |")
    out += ["", "| row | jobs | ECMP mean (s) | greedy mean (s) | greedy vs ECMP ± CI95 "
            "(seeds' range) | ECMP: jobs hit by a collision | in the paper's range |",
            "|---|---|---|---|---|---|---|"]
    in_sweep = False
    for r in summary:
        if r["row"].startswith(f"{SWEEP}:") and not in_sweep:
            in_sweep = True
            out += ["", "Sweep of the two strongest knobs (ours otherwise):", "",
                    "| row | jobs | ECMP mean (s) | greedy mean (s) | greedy vs ECMP ± CI95 "
                    "(seeds' range) | ECMP: jobs hit by a collision | in the paper's range |",
                    "|---|---|---|---|---|---|---|"]
        out.append(f"| {r['row']} | {r['jobs']} | {r['ecmp_mean_s']:.4f} | "
                   f"{r['greedy_mean_s']:.4f} | {r['greedy_vs_ecmp_pct']:+.1f} ± "
                   f"{r['greedy_vs_ecmp_ci95_pct']:.1f} % ({r['greedy_vs_ecmp_min_pct']:+.1f} "
                   f"to {r['greedy_vs_ecmp_max_pct']:+.1f}) | "
                   f"{r['ecmp_collided_jobs'] * 100:.0f} % | "
                   f"{_in_range(r['greedy_vs_ecmp_pct'])} |")
    eff = effects(summary)
    out += ["", "| difference | points moved alone (ours + it - ours) | on the paper's "
            "fabric (paper text + it - paper text) | within the others (all on - all on "
            "without it) |", "|---|---|---|---|"]
    for e in eff:
        out.append(f"| {e['difference']} | {_pp(e['alone_pp'])} | "
                   f"{_pp(e['at_paper_fabric_pp'])} | {_pp(e['within_all_pp'])} |")
    out += ["", "\"ECMP: jobs hit by a collision\": share of jobs with a connection below its "
            "host link's fair share when every job communicates at once. A positive number "
            "of points is a smaller gain for greedy."]
    return "\n".join(out)
