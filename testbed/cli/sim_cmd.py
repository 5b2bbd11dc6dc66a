"""`lightpipe sim SPEC --out DIR`: run a scenario on the simulation backend."""

from __future__ import annotations

import argparse

from testbed.cli.common import add_out_arg, add_quiet_arg, add_spec_arg, emit

HELP = "simulate a scenario (writes manifest.json, summary.json, requests.csv)"

SHOWN = ("requests", "blocked", "blocking_ratio", "blocking_ci95", "bitrate_blocking_ratio",
         "mean_spectrum_utilization", "lightpaths_lost", "lightpaths_restored", "jobs",
         "wall_s", "requests_per_s")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_spec_arg(parser)
    add_out_arg(parser)
    add_quiet_arg(parser)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from testbed.backends.sim import SimBackend
    from testbed.spec import load_scenario

    scenario = load_scenario(args.spec)
    out = Path(args.out)
    summary = SimBackend().run(scenario, out, quiet=args.quiet)
    emit(f"sim: results in {out}/ (summary.json, manifest.json)")
    for key in SHOWN:
        if key in summary:
            emit(f"  {key}: {summary[key]}")
    return 0
