"""Soak (root): many `lightpipe emu` runs in a row; what the machine holds after each.

Each run builds the network, starts the controller and Prometheus, calibrates, verifies,
replays lightpath requests with a fibre cut and repair, and tears everything down. After
each run the counts of namespaces, processes in them, veths, OVS bridges and run state
directories must be back where they were before the first; open files and memory are
printed (their growth from the first run to the last is the leak figure).

Only what the soak's own runs can have made is counted (testbed.emu.census.Scope): the
processes that carry its tag in their environment and the namespaces they live in, names
under its runs' prefixes, run directories in a state root of its own, and the file
descriptors and memory its processes hold. Other users' emulations on the same machine do
not move the counts. `--machine-wide` counts everything, with the machine's file handles
and memory in use: the leak figure for kernel-side growth, on an idle machine.

    sudo .venv/bin/python bench/bench_soak.py --runs 50
    sudo .venv/bin/python bench/bench_soak.py --runs 5 --json soak.json   # what CI runs

Exit 1 if a count did not come back or a run failed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from testbed.emu.census import EXACT, TAG_VAR, Census, Scope, growth, leaks, take  # noqa: E402
from testbed.emu.state import PREFIX_RE  # noqa: E402

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


def one_run(lightpipe: Path, spec: Path, out: Path,
            env: dict[str, str]) -> tuple[int, float, str]:
    t0 = time.monotonic()
    r = subprocess.run([str(lightpipe), "emu", str(spec), "--out", str(out), "--force", "-q"],
                       capture_output=True, text=True, check=False, env=env)
    return r.returncode, time.monotonic() - t0, r.stderr.strip()[-500:]


def run_prefixes(out: Path, state_dir: Path) -> set[str]:
    """The run's name prefix (its network.json), and any run left in our state root."""
    found = {p.name for p in state_dir.iterdir() if PREFIX_RE.fullmatch(p.name)} \
        if state_dir.is_dir() else set()
    try:
        prefix = json.loads((out / "network.json").read_text()).get("prefix")
    except (OSError, ValueError, AttributeError):
        prefix = None
    if isinstance(prefix, str) and PREFIX_RE.fullmatch(prefix):
        found.add(prefix)
    return found


def line(label: str, c: Census, extra: str = "") -> str:
    row = c.as_row()
    return (f"{label:>8} " + " ".join(f"{row[k]:>{max(len(k), 6)}}" for k in COLUMNS)
            + (f"  {extra}" if extra else ""))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--scenario", type=Path, help="a scenario file (default: the soak one)")
    ap.add_argument("--json", type=Path, help="write every census and run here")
    ap.add_argument("--machine-wide", action="store_true",
                    help="count everything on the machine, not only the soak's own runs")
    args = ap.parse_args()
    lightpipe = Path(sys.executable).parent / "lightpipe"
    with tempfile.TemporaryDirectory(prefix="lp-soak-") as tmp:
        spec = args.scenario
        if spec is None:
            spec = Path(tmp) / "soak.yaml"
            spec.write_text(yaml.safe_dump(SOAK_SCENARIO))
        out = Path(tmp) / "out"
        state_dir = Path(tmp) / "state"
        tag = uuid.uuid4().hex
        env = {**os.environ, TAG_VAR: tag, "LIGHTPIPE_STATE_DIR": str(state_dir)}
        prefixes: set[str] = set()

        def census() -> Census:
            if args.machine_wide:
                return take()
            return take(Scope(tag, frozenset(prefixes), state_dir))

        base = census()
        print(f"soak: {args.runs} x lightpipe emu {spec.name}; counting "
              + ("the whole machine" if args.machine_wide else f"only its own runs (tag {tag})"))
        print(" " * 9 + " ".join(f"{k:>{max(len(k), 6)}}" for k in COLUMNS) + "  run")
        print(line("before", base))
        runs = []
        failed = 0
        for i in range(args.runs):
            rc, wall_s, err = one_run(lightpipe, spec, out, env)
            prefixes.update(run_prefixes(out, state_dir))
            after = census()
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
