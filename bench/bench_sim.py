"""Benchmark: first-fit RMSA on NSFNET (80 slots, k = 3) near 1 % blocking.

Prints requests/s (with requests.csv streamed to disk, as `lightpipe sim` does) and the
peak RSS of a fresh process for growing request counts, to show memory stays flat.
Run: .venv/bin/python bench/bench_sim.py [--requests 100000] [--quick]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

from testbed.sim import simulate_lightpaths
from testbed.spec import Scenario, parse_scenario


def scenario(load_erlang: float, requests: int, seed: int = 1) -> Scenario:
    return parse_scenario({
        "name": "bench", "topology": {"library": "nsfnet"},
        "optical": {"grid": "flex", "slots": 80, "k_paths": 3, "guard_slots": 0},
        "workload": {"kind": "lightpath_requests", "load_erlang": load_erlang,
                     "mean_holding_s": 1.0, "requests": requests,
                     "bitrate_gbps": [100, 200, 400], "seed": seed},
        "policy": {"spectrum": "first_fit"},
    })


def find_load(target: float = 0.01, requests: int = 20_000) -> float:
    """Load (Erlang) whose blocking is near target, by bisection on short runs."""
    lo, hi = 1.0, 200.0
    for _ in range(12):
        mid = (lo + hi) / 2
        b = simulate_lightpaths(scenario(mid, requests))["blocking_ratio"]
        lo, hi = (mid, hi) if b < target else (lo, mid)
    return round((lo + hi) / 2, 2)


def child(load: float, requests: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        s = simulate_lightpaths(scenario(load, requests), Path(tmp) / "requests.csv")
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"requests": s["requests"], "blocking_ratio": s["blocking_ratio"],
                      "requests_per_s": s["requests_per_s"], "peak_rss_mib": round(rss_mib, 1)}))


def run_child(load: float, requests: int) -> dict[str, float]:
    out = subprocess.run([sys.executable, __file__, "--child", str(load), str(requests)],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--load", type=float, default=None, help="skip the load search")
    ap.add_argument("--quick", action="store_true", help="fewer sizes for the memory table")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(float(args.child[0]), int(args.child[1]))
        return
    load = args.load if args.load is not None else find_load()
    print(f"NSFNET, 80 slots, k=3, first-fit, bitrates 100/200/400 Gb/s, load {load} Erlang")
    main_run = run_child(load, args.requests)
    print(f"{args.requests} requests: blocking {main_run['blocking_ratio']:.4f}, "
          f"{main_run['requests_per_s']:.0f} requests/s (one core, requests.csv streamed), "
          f"peak RSS {main_run['peak_rss_mib']} MiB")
    sizes = [25_000, 100_000, 400_000] if args.quick else [25_000, 100_000, 400_000, 1_600_000]
    print(f"{'requests':>10} {'requests/s':>11} {'peak RSS MiB':>13}")
    for n in sizes:
        r = run_child(load, n)
        print(f"{n:>10} {r['requests_per_s']:>11.0f} {r['peak_rss_mib']:>13}")


if __name__ == "__main__":
    main()
