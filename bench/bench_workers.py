"""Benchmark: worker start-up time, memory per worker (PSS), concurrent stages per machine.

Runs N shadow workers (N/4 jobs of 4 stages, 1F1B, 40/80 ms ops, no link delay) on
127.0.0.1 for N in a list, and prints for each N: the slowest worker's start-up time
(spawn -> process group joined), mean PSS per worker (from /proc/PID/smaps_rollup,
sampled while running), and the iteration-time error against the schedule timer
(stages fit while the error stays small). Usage:
    .venv/bin/python bench/bench_workers.py [N ...]        (default: 4 8 12 16)
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

from testbed.orchestrate.launch import Host, Launcher
from testbed.orchestrate.results import summarize_job
from testbed.schedule import PipelineProblem, build_schedule, time_schedule
from workloads.plan import shadow_plan


def pss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        return None
    return None


def run(n_workers: int) -> dict[str, float]:
    prob = PipelineProblem.uniform(4, 4, 40.0, 80.0, activation_mb=0.05)
    sched = build_schedule("1f1b", prob)
    sim_s = time_schedule(prob, sched).iteration_time_ms / 1e3
    local = Host("local", "127.0.0.1", "lo")
    plans = [(shadow_plan(f"b{i}", prob, sched, iterations=3, bandwidth_divisor=1,
                          time_factor=1), [local] * 4) for i in range(n_workers // 4)]
    with tempfile.TemporaryDirectory() as tmp, Launcher(Path(tmp)) as launcher:
        launcher.start(plans)
        pss: list[float] = []
        while launcher.poll():
            time.sleep(0.5)
            recs = launcher.records()
            running = all(any(r.get("type") == "iteration" for r in st)
                          for stages in recs.values() for st in stages)
            if running and not pss:
                pss = [v for run_ in launcher.jobs.values() for w in run_.workers
                       if (v := pss_mb(w.proc.pid)) is not None]
        outcome = launcher.outcome()
        errs = []
        for job, stages in launcher.records().items():
            s = summarize_job(job, stages)
            if s.get("emulated_iteration_time_s"):
                errs.append(abs(s["emulated_iteration_time_s"] - sim_s) / sim_s)
    ups = [o["startup_s"] for o in outcome.values() if o["startup_s"] is not None]
    return {"workers": n_workers, "startup_max_s": max(ups) if ups else float("nan"),
            "pss_mb": statistics.mean(pss) if pss else float("nan"),
            "iteration_error": max(errs) if errs else float("nan"),
            "ok": all(o["ok"] for o in outcome.values())}


def main(argv: list[str]) -> int:
    sizes = [int(a) for a in argv] or [4, 8, 12, 16]
    print(f"{'workers':>7} {'start-up max (s)':>17} {'PSS/worker (MB)':>16} "
          f"{'iter. error':>11} ok")
    for n in sizes:
        r = run(n)
        print(f"{r['workers']:>7} {r['startup_max_s']:>17.2f} {r['pss_mb']:>16.0f} "
              f"{100 * r['iteration_error']:>10.1f}% {r['ok']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
