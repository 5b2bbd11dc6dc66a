"""Schedule engine benchmarks: timer (1F1B p=16 m=128), greedy (p=8 m=32), CP-SAT (p=4 m=8)."""

from __future__ import annotations

import time

from testbed.schedule import Hop, PipelineProblem, build_schedule, time_schedule


def _best_of(fn, repeats: int) -> float:  # type: ignore[no-untyped-def]
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    wan = PipelineProblem.uniform(16, 128, 10.0, 20.0, latency_ms=5.0, bandwidth_gbps=100.0,
                                  activation_mb=50.0)
    sched = build_schedule("1f1b", wan)
    t = _best_of(lambda: time_schedule(wan, sched), 20)
    print(f"timer 1F1B p=16 m=128 (4096 ops):    {t * 1e3:8.2f} ms  (target < 10 ms)")

    hops = tuple(Hop(20.0 if h == 3 else 0.01, 100.0 if h == 3 else 400.0) for h in range(7))
    p8 = PipelineProblem((10.0,) * 8, (20.0,) * 8, hops, 50.0, 32, memory_cap=8)
    t = _best_of(lambda: build_schedule("crosspipe-greedy", p8), 3)
    print(f"crosspipe-greedy p=8 m=32:           {t * 1e3:8.2f} ms  (target < 1000 ms)")

    hops4 = (Hop(0.01, 400.0), Hop(20.0, 100.0), Hop(0.01, 400.0))
    p4 = PipelineProblem((10.0,) * 4, (20.0,) * 4, hops4, 50.0, 8, memory_cap=4)
    t0 = time.perf_counter()
    opt = build_schedule("crosspipe-opt", p4, time_limit_s=30)
    wall = time.perf_counter() - t0
    it = time_schedule(p4, opt).iteration_time_ms
    print(f"crosspipe-opt p=4 m=8 cap=4:         {wall:8.2f} s   (target < 30 s to optimality)"
          f"  status={opt.info['solver_status']} gap={opt.info['gap']} iteration={it:.2f} ms")
    p4r = p4.with_memory_cap(None)
    t0 = time.perf_counter()
    opt = build_schedule("crosspipe-opt", p4r, time_limit_s=30)
    wall = time.perf_counter() - t0
    print(f"crosspipe-opt p=4 m=8 no cap:        {wall:8.2f} s   status="
          f"{opt.info['solver_status']} gap={opt.info['gap']}")


if __name__ == "__main__":
    main()
