"""`lightpipe sim SPEC --out DIR`: run a scenario on the simulation backend."""

from __future__ import annotations

import argparse

from testbed.cli.common import add_run_args

HELP = "simulate a scenario (writes manifest.json, summary.json, requests.csv or jobs.csv)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_run_args(parser)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from testbed.backends.sim import SimBackend
    from testbed.cli.common import check_out
    from testbed.cli.summary import maybe_report, print_run, write_readme
    from testbed.spec import load_scenario

    scenario = load_scenario(args.spec)
    check_out(args.out, args.force)
    out = Path(args.out)
    summary = SimBackend().run(scenario, out, quiet=args.quiet)
    write_readme(out, f"LightPipe sim run of {scenario.name}")
    print_run("sim", out, args.out.rstrip("/"), summary, scenario,
              maybe_report(out, args.report))
    return 0
