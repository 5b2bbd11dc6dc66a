"""`lightpipe sweep SPEC --set path=v1,v2 --seeds N --out DIR`: a parameter grid in parallel."""

from __future__ import annotations

import argparse
import os

from testbed.cli.common import add_out_arg, add_quiet_arg, add_spec_arg, emit

HELP = "run a grid of spec values x seeds in parallel (sweep.csv + blocking_vs_load.png)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_spec_arg(parser)
    parser.add_argument("--set", dest="sets", action="append", default=[],
                        metavar="PATH=V1,V2", help="spec field and values, e.g. "
                        "workload.load_erlang=100,200,300 or policy.spectrum=first_fit,best_fit "
                        "(repeatable: the grid is their product)")
    parser.add_argument("--seeds", type=int, default=1, help="seeds per point (workload.seed, "
                        "workload.seed+1, ...)")
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1),
                        help="worker processes (default: 2)")
    parser.add_argument("--metric", default="blocking_ratio", help="metric to plot")
    parser.add_argument("--records", action="store_true",
                        help="also keep each point's run directory (points/NNNN/)")
    add_out_arg(parser)
    add_quiet_arg(parser)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from testbed.atomicio import atomic_write_json, atomic_write_text, staged_dir
    from testbed.errors import InputError
    from testbed.progress import progress
    from testbed.records import write_manifest
    from testbed.sim import sweep
    from testbed.spec import load_scenario

    if args.seeds < 1 or args.seeds > 1000:
        raise InputError("--seeds", f"must be 1..1000, got {args.seeds}")
    if args.jobs < 1:
        raise InputError("--jobs", f"must be >= 1, got {args.jobs}")
    base = load_scenario(args.spec)
    sets = [sweep.parse_set(s) for s in args.sets]
    keys = [k for k, _ in sets]
    if len(set(keys)) != len(keys):
        raise InputError("--set", "the same field is set twice")
    points = sweep.grid_points(base, sets, args.seeds)
    out = Path(args.out)
    with staged_dir(out) as stage:
        records = stage / "points" if args.records else None
        with progress(len(points), "sweep points", args.quiet) as bar:
            rows = sweep.run_sweep(points, args.jobs, records, on_done=bar.advance)
        atomic_write_text(stage / "sweep.csv", sweep.rows_csv(rows))
        agg = sweep.aggregate(rows, keys, args.metric)
        atomic_write_text(stage / "sweep_mean.csv", sweep.rows_csv(agg))
        if agg:
            sweep.plot(agg, keys, args.metric, stage / "blocking_vs_load.png",
                       f"{base.name}: {args.metric} (mean of {args.seeds} seed(s), 95 % CI)")
        atomic_write_json(stage / "sweep.json", {"set": {k: v for k, v in sets},
                                                 "seeds": args.seeds, "points": len(points),
                                                 "metric": args.metric})
        write_manifest(stage, base, "sim", sweep={k: v for k, v in sets}, seeds=args.seeds)
    emit(f"sweep: {len(points)} runs, results in {out}/ (sweep.csv, sweep_mean.csv, "
         "blocking_vs_load.png)")
    for a in agg:
        label = ", ".join(f"{k}={a[k]}" for k in keys) or "base"
        emit(f"  {label}: {args.metric} {a[args.metric]:.6g}")
    return 0
