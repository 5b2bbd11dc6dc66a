"""Benchmark one sweep grid run by local processes and as Ray tasks: wall time, same rows.

    .venv/bin/python bench/bench_sweep_ray.py [--loads 10,20,40] [--seeds 4]
        [--requests 20000] [--jobs 2] [--ray-address HOST:PORT] [--repeat 2]

Runs `lightpipe sweep scenarios/quickstart.yaml` over loads x seeds three ways, each
`--repeat` times: local processes (`--jobs`), `--ray-address local` (a Ray instance
started and stopped by the sweep: its start-up counts), and, with --ray-address, on an
already running cluster (joining it is all the overhead). Prints each command's wall time
and its "sweep points" phase (the points alone), and checks that every table has the
local rows (timing columns left out).
"""

from __future__ import annotations

import argparse
import csv
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "scenarios" / "quickstart.yaml"
TIMING = {"wall_s", "requests_per_s"}
CLI = "import sys; from testbed.cli.main import main; sys.exit(main(sys.argv[1:]))"


def rows(path: Path) -> list[dict[str, str]]:
    with path.open() as fh:
        return [{k: v for k, v in r.items() if k not in TIMING} for r in csv.DictReader(fh)]


def run(args: argparse.Namespace, out: Path, extra: list[str]) -> tuple[float, float]:
    """(command wall s, points phase s) of one sweep."""
    cmd = [sys.executable, "-c", CLI, "sweep", str(SPEC),
           "--set", f"workload.load_erlang={args.loads}",
           "--set", f"workload.requests={args.requests}", "--seeds", str(args.seeds),
           "--jobs", str(args.jobs), "--out", str(out), "--force", *extra]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, check=False)
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        sys.exit(f"bench: {' '.join(extra) or 'local'} failed: {proc.stderr.strip()}")
    m = re.search(r"sweep points: done in ([0-9.]+) s", proc.stderr)
    return wall, float(m.group(1)) if m else float("nan")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--loads", default="10,20,40")
    p.add_argument("--seeds", type=int, default=4)
    p.add_argument("--requests", type=int, default=20000)
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--ray-address", help="a running cluster's GCS address, also timed")
    p.add_argument("--repeat", type=int, default=2)
    args = p.parse_args()
    modes = [("local processes", []), ("ray local (started)", ["--ray-address", "local"])]
    if args.ray_address:
        modes.append((f"ray {args.ray_address} (joined)", ["--ray-address", args.ray_address]))
    points = len(args.loads.split(",")) * args.seeds
    print(f"grid: {points} points (loads {args.loads} x {args.seeds} seeds, "
          f"{args.requests} requests each), --jobs {args.jobs}")
    with tempfile.TemporaryDirectory() as tmp:
        reference: list[dict[str, str]] | None = None
        for name, extra in modes:
            walls, phases = [], []
            for i in range(args.repeat):
                out = Path(tmp) / f"{modes.index((name, extra))}-{i}"
                wall, phase = run(args, out, extra)
                walls.append(wall)
                phases.append(phase)
                table = rows(out / "sweep.csv")
                reference = table if reference is None else reference
                if table != reference:
                    sys.exit(f"bench: {name}: rows differ from the local run")
            print(f"{name:32s} command {statistics.median(walls):6.1f} s   points "
                  f"{statistics.median(phases):6.1f} s   (median of {args.repeat}; "
                  f"all {', '.join(f'{w:.1f}' for w in walls)} s)")
    print("rows: identical in every run (timing columns left out)")


if __name__ == "__main__":
    main()
