"""Benchmarks of the pipeline-job layer: cba placement rate, cba-ilp solve time, simulator.

Run: .venv/bin/python bench/bench_jobs.py [--quick]
Targets (issue 5): cba heuristic >= 1,000 jobs/s placed on NSFNET; the MILP for an
8-stage job on NSFNET under 1 s (median).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from testbed.experiments.placement import cba_scenario
from testbed.jobs import milp
from testbed.jobs.cluster import Cluster
from testbed.jobs.outcome import Placed
from testbed.jobs.placement import ilp_instance
from testbed.jobs.policies import Planner
from testbed.jobs.sim import resolve_jobs, simulate
from testbed.jobs.timing import Timer
from testbed.spec import parse_scenario
from testbed.traces import generate_jobs


def bench_cba_rate(jobs: int) -> None:
    """Place jobs one after another (no departures) and release every 40th: jobs/s."""
    scen = cba_scenario(120.0, "cba", seed=3, jobs=jobs)
    wl = scen.workload
    reqs = resolve_jobs(wl, generate_jobs(wl))
    cluster = Cluster.from_scenario(scen)
    planner = Planner(cluster, scen.policy, Timer(), random.Random(1), wl.max_stages_per_dc)
    live: list = []
    placed = 0
    t0 = time.perf_counter()
    for i, job in enumerate(reqs):
        res = planner.place(job, 0.0)
        if isinstance(res, Placed):
            placed += 1
            live.append((res.alloc, job.req.gpus_per_stage))
        if i % 40 == 39:  # keep the network loaded but not full
            for alloc, g in live[: len(live) // 2]:
                cluster.free_allocation(alloc, g)
            live = live[len(live) // 2:]
    wall = time.perf_counter() - t0
    print(f"cba placement on NSFNET (14 DCs, 80 slots): {jobs} attempts, {placed} placed, "
          f"{jobs / wall:,.0f} jobs/s (target >= 1,000); timer cache "
          f"{planner.timer.hits} hits / {planner.timer.misses} misses")


def bench_sim(jobs: int) -> None:
    for pol in ("sp-ff", "cba", "joint"):
        _, s = simulate(cba_scenario(150.0, pol, seed=1, jobs=jobs))
        print(f"simulate {pol:6s} {jobs} jobs: {s['wall_s']:.2f} s, {s['jobs_per_s']:,.0f} jobs/s, "
              f"blocking {s['blocking_ratio']:.3f}")


def bench_milp(reps: int) -> None:
    """8-stage job on NSFNET with 8 DCs and a random partly used spectrum."""
    times, gaps, sizes = [], [], []
    for rep in range(reps):
        rng = random.Random(rep)
        nodes = rng.sample([str(n) for n in range(1, 15)], 8)
        scen = parse_scenario({
            "name": "milp-bench", "topology": {"library": "nsfnet"},
            "dcs": [{"name": f"d{n}", "node": n, "gpus": 32, "gpu": rng.choice(["h100", "a100"])}
                    for n in nodes],
            "optical": {"slots": 80, "k_paths": 3},
            "workload": {"kind": "pp_jobs", "jobs": 1, "max_stages_per_dc": 2,
                         "mix": [{"model": "gpt3-6.7b", "stages": 8, "gpus_per_stage": 16,
                                  "microbatches": 32}]},
            "policy": {"placement": "cba-ilp", "fixed_slots": 4, "max_slots": 16},
        })
        wl = scen.workload
        cluster = Cluster.from_scenario(scen)
        net = cluster.network
        for _ in range(60):  # background lightpaths
            a, b = rng.sample(list(net.graph.nodes), 2)
            net.allocate(a, b, slots=rng.randint(1, 6))
        planner = Planner(cluster, scen.policy, Timer(), rng, wl.max_stages_per_dc)
        job = resolve_jobs(wl, generate_jobs(wl))[0]
        t0 = time.perf_counter()
        inst, _ = ilp_instance(planner, job)
        sol = milp.solve(inst, time_limit_s=10.0)
        times.append(time.perf_counter() - t0)
        if sol is not None:
            gaps.append(sol.gap)
        sizes.append(sum(len(o) for per in inst.options for o in per.values()))
    print(f"cba-ilp 8 stages on NSFNET (8 DCs, k=3, 80 slots, 60 background lightpaths): "
          f"median {statistics.median(times):.3f} s, max {max(times):.3f} s over {reps} "
          f"(target median < 1 s); max gap {max(gaps, default=float('nan')):.2e}; "
          f"~{statistics.median(sizes):.0f} lightpath options")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    bench_cba_rate(500 if args.quick else 3000)
    bench_milp(3 if args.quick else 9)
    bench_sim(100 if args.quick else 500)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
