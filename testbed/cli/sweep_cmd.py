"""`lightpipe sweep SPEC --set path=v1,v2 --seeds N --out DIR`: a parameter grid in parallel
(local processes, or Ray tasks with --ray-address)."""

from __future__ import annotations

import argparse
import contextlib
import os
import time

from testbed.cli.common import (
    STAGED,
    add_out_arg,
    add_quiet_arg,
    add_report_arg,
    add_spec_arg,
    emit,
)

MAX_JOBS = 256  # --jobs: worker processes (or Ray CPUs) at once
HELP = "run a grid of spec values x seeds in parallel (sweep.csv + METRIC_vs_FIELD.png)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_spec_arg(parser)
    parser.add_argument("--set", dest="sets", action="append", default=[],
                        metavar="PATH=V1,V2", help="spec field and values, e.g. "
                        "workload.load_erlang=100,200,300 or policy.spectrum=first_fit,best_fit "
                        "or a list field workload.bitrate_gbps=[100,400],[400] "
                        "(repeatable: the grid is their product)")
    parser.add_argument("--seeds", type=int, default=1, help="seeds per point (workload.seed, "
                        "workload.seed+1, ...)")
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1),
                        help="worker processes (default: 2); with --ray-address local, the "
                        "CPUs of the Ray instance started for the sweep")
    parser.add_argument("--ray-address", metavar="auto|HOST:PORT|local",
                        help="run the points as Ray tasks: auto (the cluster on this "
                        "machine), HOST:PORT (a head's GCS address, as `ray start --head` "
                        "prints it) or local (start a Ray instance for this sweep); "
                        "needs pip install 'lightpipe[ray]'")
    parser.add_argument("--metric", default="blocking_ratio", help="metric to plot")
    parser.add_argument("--records", action="store_true",
                        help="also keep each point's run directory (points/NNNN/)")
    add_out_arg(parser, written=STAGED)
    add_quiet_arg(parser)
    add_report_arg(parser)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from testbed.analysis.tables import rows_to_csv
    from testbed.errors import InputError
    from testbed.experiments import sweep
    from testbed.io.atomic import atomic_write_json, atomic_write_text, staged_dir
    from testbed.progress import progress, say
    from testbed.runs.records import write_manifest
    from testbed.spec import load_scenario

    if args.seeds < 1 or args.seeds > 1000:
        raise InputError("--seeds", f"must be 1..1000, got {args.seeds}")
    if not 1 <= args.jobs <= MAX_JOBS:  # processes started: bounded like every count
        raise InputError("--jobs", f"must be 1..{MAX_JOBS}, got {args.jobs}")
    if args.ray_address is not None:
        from testbed.experiments import sweep_ray

        # before any work: a bad address or a missing extra is one line, exit 2
        sweep_ray.import_ray(sweep_ray.check_address(args.ray_address))
    base = load_scenario(args.spec)
    from testbed.cli.common import check_out

    sets = [sweep.parse_set(s) for s in args.sets]
    keys = [k for k, _ in sets]
    if len(set(keys)) != len(keys):
        raise InputError("--set", "the same field is set twice")
    points = sweep.grid_points(base, sets, args.seeds)
    check_out(args.out, args.force)
    out = Path(args.out)
    failure: sweep.SweepFailure | None = None
    agg: list[dict] = []
    executor: dict = {"kind": "processes", "jobs": args.jobs}
    t0 = time.monotonic()
    # Joined before anything is written: an unreachable cluster leaves no output behind.
    with _ray_session(args) as runner, staged_dir(out) as stage:
        if runner is not None:
            executor = runner.describe() | {"address": args.ray_address}
            say(f"ray: {executor['nodes']} node(s), {executor['cpus']} CPUs, ready after "
                f"{time.monotonic() - t0:.1f} s", args.quiet)
        records = stage / "points" if args.records else None
        with progress(len(points), "sweep points", args.quiet) as bar:
            try:
                rows = sweep.run_sweep(points, args.jobs, records, on_done=bar.advance,
                                       runner=runner)
            except sweep.SweepFailure as exc:  # keep the finished points, then fail
                failure, rows = exc, exc.rows
        if runner is not None:
            executor["points_by_node"] = runner.placement()
        atomic_write_text(stage / "sweep.csv", rows_to_csv(rows, cell=sweep.cell_text))
        plots: list[str] = []
        if failure is not None:
            atomic_write_text(stage / "failed_points.txt",
                              "".join(f"{msg}\n" for msg, _ in failure.failures))
        else:
            numeric = sorted(k for k, v in (rows[0] if rows else {}).items()
                             if isinstance(v, (int, float)) and not isinstance(v, bool))
            if rows and args.metric not in numeric:
                raise InputError("--metric", f"unknown metric {args.metric!r}; one of: "
                                 + ", ".join(numeric))
            agg = sweep.aggregate(rows, keys, args.metric)
            atomic_write_text(stage / "sweep_mean.csv", rows_to_csv(agg, cell=sweep.cell_text))
        if agg:
            from testbed.report.figures import save
            from testbed.report.repro_plots import sweep_plots

            for key, (fig, _cap) in zip(keys, sweep_plots(agg, keys, args.metric),
                                        strict=True):
                name = f"{args.metric}_vs_{key.split('.')[-1]}.png"
                save(fig, stage / name)
                plots.append(name)
        atomic_write_json(stage / "sweep.json", {"set": {k: v for k, v in sets},
                                                 "seeds": args.seeds, "points": len(points),
                                                 "metric": args.metric})
        write_manifest(stage, base, "sim", sweep={k: v for k, v in sets}, seeds=args.seeds,
                       executor=executor)
    if failure is not None:
        emit(f"sweep: {len(rows)} of {len(points)} runs finished, kept in {out}/sweep.csv; "
             f"failures in {out}/failed_points.txt")
        raise failure
    from testbed.cli.summary import maybe_report, report_line, write_readme

    write_readme(out, f"LightPipe sweep of {base.name}")
    report = maybe_report(out, args.report)
    where = f", Ray tasks at {args.ray_address}" if args.ray_address else ""
    emit(f"sweep: {len(points)} runs of {base.name} (sim backend{where}), records in "
         f"{args.out.rstrip('/')}/ (sweep.csv, sweep_mean.csv, {', '.join(plots)})")
    for a in agg:
        label = ", ".join(f"{k}={a[k]}" for k in keys) or "base"
        emit(f"  {label}: {args.metric} {a[args.metric]:.6g}")
    report_line(args.out.rstrip("/"), report)
    return 0


def _ray_session(args: argparse.Namespace) -> contextlib.AbstractContextManager:
    """The Ray runner for --ray-address (connected, disconnected at the end), else None."""
    if args.ray_address is None:
        return contextlib.nullcontext(None)
    from testbed.experiments import sweep_ray
    from testbed.progress import say

    say("ray: starting a local instance ..." if args.ray_address == "local"
        else f"ray: joining {args.ray_address} ...", args.quiet)
    return sweep_ray.session(args.ray_address, args.jobs)
