"""Benchmark the README's full paper reproductions, exactly as the README runs them.

Run: .venv/bin/python bench/bench_reproduce.py [--only routing,cba] [--seeds N]
        [--out runs/bench/reproduce.json]

Each `lightpipe reproduce NAME --out DIR` of the README (crosspipe, geopipe, cba, bace,
routing; their default sizes: 20 seeds for routing, 5 for cba and bace) runs in a scratch
directory, one after another. Per reproduction: wall time, CPU time (user + system of the
command and everything it started), peak memory, and the headline lines the command
printed. `make test` runs the same commands with one seed (`tests/test_readme.py`: every
case at its full size, once); the many-seed runs and their cost are measured here, not in
the suite. `--seeds N` passes `--set seeds=N` to the reproductions that take seeds.
Printed, and written atomically as JSON to --out with the load average and the machine's
measured slowness (docs/testing.md "Where the time goes").
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from testbed.io.atomic import atomic_write_json

ROOT = Path(__file__).resolve().parents[1]
NAMES = ("crosspipe", "geopipe", "cba", "bace", "routing")
SEEDED = ("cba", "bace", "routing")  # the reproductions with a `seeds` set-up value


def run_one(name: str, seeds: int | None, scratch: Path) -> dict[str, object]:
    """One reproduction as the README runs it: its measured cost and what it printed."""
    cmd = [str(ROOT / ".venv" / "bin" / "lightpipe"), "reproduce", name,
           "--out", str(scratch / name)]
    if seeds is not None and name in SEEDED:
        cmd += ["--set", f"seeds={seeds}"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
    wall_s = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    out = proc.stdout.splitlines()
    return {"name": name, "command": " ".join(cmd[1:]), "exit": proc.returncode,
            "wall_s": round(wall_s, 2), "cpu_s": round(cpu_s, 2),
            # ru_maxrss of the children: the largest one so far (KiB on Linux)
            "max_rss_mib": round(after.ru_maxrss / 1024, 1),
            "headline": [line.strip() for line in out if " vs " in line][:6],
            "error": proc.stderr.strip().splitlines()[-1] if proc.returncode else None}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default=",".join(NAMES),
                    help=f"comma-separated subset of {', '.join(NAMES)}")
    ap.add_argument("--seeds", type=int, help="--set seeds=N for cba, bace and routing")
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "bench" / "reproduce.json")
    args = ap.parse_args()
    names = [n.strip() for n in args.only.split(",") if n.strip()]
    bad = [n for n in names if n not in NAMES]
    if bad or not names:
        print(f"bench_reproduce: --only: unknown {bad or 'empty'}; valid: {', '.join(NAMES)}",
              file=sys.stderr)
        return 2
    if args.seeds is not None and args.seeds < 1:
        print(f"bench_reproduce: --seeds: must be >= 1, got {args.seeds}", file=sys.stderr)
        return 2
    from testbed.envprobe import machine_slowness

    rows = []
    with tempfile.TemporaryDirectory(prefix="lightpipe-bench-repro-") as tmp:
        for name in names:
            row = run_one(name, args.seeds, Path(tmp))
            rows.append(row)
            print(f"{name:10s} exit {row['exit']}  wall {row['wall_s']:8.1f} s  "
                  f"CPU {row['cpu_s']:8.1f} s  peak {row['max_rss_mib']:7.1f} MiB", flush=True)
            for line in row["headline"]:  # type: ignore[union-attr]
                print(f"           {line}")
            if row["error"]:
                print(f"           error: {row['error']}")
    record = {"bench": "reproduce", "seeds": args.seeds, "rows": rows,
              "load_average_1m": round(os.getloadavg()[0], 2),
              "machine_slowness": round(machine_slowness(), 2),
              "unix_s": round(time.time(), 1)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(args.out, record)
    print(f"written: {args.out}")
    return 1 if any(r["exit"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
