"""Soak (root): many `lightpipe emu` runs in a row; what the machine holds after each.

Each run builds the network, starts the controller and Prometheus, calibrates, verifies,
replays lightpath requests with a fibre cut and repair, and tears everything down. After
each run the counts of namespaces, processes in them, veths, OVS bridges and run state
directories must be back where they were before the first; open files and memory are
printed (their growth from the first run to the last is the leak figure).

    sudo .venv/bin/python bench/bench_soak.py --runs 50
    sudo .venv/bin/python bench/bench_soak.py --runs 5 --json soak.json   # what CI runs

Exit 1 if a count did not come back or a run failed.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from testbed.emu.census import EXACT, Census, growth, leaks, take  # noqa: E402

# Two DCs two fibres apart, one host each; 20 replayed requests and a cut of the first
# fibre (restored over the other route) in 4 s of replay.
SOAK_SCENARIO = {
    "version": 1, "name": "soak",
    "description": "soak: a short emulation run with a fibre cut and repair",
    "topology": {"links": [{"u": "A", "v": "B", "length_km": 200},
                           {"u": "B", "v": "C", "length_km": 200},
                           {"u": "A", "v": "D", "length_km": 300},
                           {"u": "D", "v": "C", "length_km": 300}]},
    "dcs": [{"name": "dc-a", "node": "A", "gpus": 8}, {"name": "dc-c", "node": "C", "gpus": 8}],
    "workload": {"kind": "lightpath_requests", "load_erlang": 4, "mean_holding_s": 1.0,
                 "requests": 200, "bitrate_gbps": [100], "seed": 1},
    "events": [{"at_s": 3.0, "kind": "fiber_cut", "link": ["A", "B"]},
               {"at_s": 8.0, "kind": "fiber_repair", "link": ["A", "B"]}],
    "emulation": {"bandwidth_divisor": 10000, "hosts_per_dc": 1, "max_requests": 20,
                  "replay_s": 4.0},
}
COLUMNS = ("netns", "ns_processes", "processes", "veths", "ovs_bridges", "state_dirs",
           "open_files", "mem_used_mb")


def one_run(lightpipe: Path, spec: Path, out: Path) -> tuple[int, float, str]:
    t0 = time.monotonic()
    r = subprocess.run([str(lightpipe), "emu", str(spec), "--out", str(out), "--force", "-q"],
                       capture_output=True, text=True, check=False)
    return r.returncode, time.monotonic() - t0, r.stderr.strip()[-500:]


def line(label: str, c: Census, extra: str = "") -> str:
    row = c.as_row()
    return (f"{label:>8} " + " ".join(f"{row[k]:>{max(len(k), 6)}}" for k in COLUMNS)
            + (f"  {extra}" if extra else ""))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--scenario", type=Path, help="a scenario file (default: the soak one)")
    ap.add_argument("--json", type=Path, help="write every census and run here")
    args = ap.parse_args()
    lightpipe = Path(sys.executable).parent / "lightpipe"
    with tempfile.TemporaryDirectory(prefix="lp-soak-") as tmp:
        spec = args.scenario
        if spec is None:
            spec = Path(tmp) / "soak.yaml"
            spec.write_text(yaml.safe_dump(SOAK_SCENARIO))
        out = Path(tmp) / "out"
        base = take()
        print(f"soak: {args.runs} x lightpipe emu {spec.name}")
        print(" " * 9 + " ".join(f"{k:>{max(len(k), 6)}}" for k in COLUMNS) + "  run")
        print(line("before", base))
        runs = []
        failed = 0
        for i in range(args.runs):
            rc, wall_s, err = one_run(lightpipe, spec, out)
            after = take()
            lost = leaks(base, after)
            failed += rc != 0 or bool(lost)
            runs.append({"run": i + 1, "rc": rc, "wall_s": round(wall_s, 2),
                         "census": after.as_row(), "leaks": lost,
                         "error": err if rc else ""})
            print(line(f"run {i + 1}", after, f"rc={rc} {wall_s:.1f} s"
                       + (f" LEAK {lost}" if lost else "") + (f" {err}" if rc else "")),
                  flush=True)
        first = Census(**runs[0]["census"]) if runs else base
        last = Census(**runs[-1]["census"]) if runs else base
        g = growth(first, last)
        print(f"growth from run 1 to run {len(runs)}: open_files {g['open_files']:+}, "
              f"mem_used_mb {g['mem_used_mb']:+}, processes {g['processes']:+}; exact "
              f"counts ({', '.join(EXACT)}) back to the start after "
              f"{sum(not r['leaks'] for r in runs)} of {len(runs)} runs; "
              f"{sum(r['rc'] == 0 for r in runs)} runs exited 0")
        if args.json:
            args.json.write_text(json.dumps({"before": base.as_row(), "runs": runs,
                                             "growth_first_to_last": g}, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
