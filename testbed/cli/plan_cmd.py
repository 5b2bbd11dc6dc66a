"""`lightpipe plan SPEC --out PLAN.json`: the static view with every lightpath."""

from __future__ import annotations

import argparse

from testbed.cli.common import add_spec_arg, emit

HELP = "static plan: all requests/jobs at once, no departures, every lightpath (JSON)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_spec_arg(parser)
    parser.add_argument("--out", metavar="PLAN.json", required=True,
                        help="plan file to write (atomically)")


def run(args: argparse.Namespace) -> int:
    from testbed.io.atomic import atomic_write_json
    from testbed.runs.records import manifest
    from testbed.sim.plan import plan
    from testbed.spec import load_scenario

    scenario = load_scenario(args.spec)
    result = plan(scenario)
    meta = manifest(scenario, "plan")
    result["manifest"] = {k: meta[k] for k in ("lightpipe_version", "spec_sha256", "seed",
                                               "backend")}
    atomic_write_json(args.out, result)
    emit(f"plan: {args.out}")
    for key in ("requests", "accepted", "blocked", "blocking_ratio", "jobs", "lightpaths",
                "spectrum_utilization"):
        value = result.get(key)
        if isinstance(value, (list, dict)):
            emit(f"  {key}: {len(value)}")
        elif value is not None:
            emit(f"  {key}: {value}")
    return 0
