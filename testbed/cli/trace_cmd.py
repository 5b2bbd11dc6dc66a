"""`lightpipe trace SPEC --out FILE`: write the job trace a pp_jobs scenario generates."""

from __future__ import annotations

import argparse

from testbed.cli.common import add_spec_arg, emit

HELP = "generate a job trace CSV from a pp_jobs scenario (or check one with --check)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_spec_arg(parser)
    parser.add_argument("--out", metavar="FILE.csv", help="write the trace here")
    parser.add_argument("--check", action="store_true",
                        help="SPEC is a trace CSV: validate it and print a summary")


def run(args: argparse.Namespace) -> int:
    from testbed.errors import InputError
    from testbed.spec import load_scenario
    from testbed.traces import generate_jobs, read_job_trace, write_job_trace

    if args.check:
        jobs = read_job_trace(args.spec)
        span = jobs[-1].arrival_s - jobs[0].arrival_s
        emit(f"{args.spec}: ok ({len(jobs)} jobs over {span:g} s)")
        return 0
    if not args.out:
        raise InputError("--out", "required (the trace file to write)")
    sc = load_scenario(args.spec)
    if sc.workload.kind != "pp_jobs":
        raise InputError("workload.kind", f"trace generation needs pp_jobs, got {sc.workload.kind}")
    jobs = generate_jobs(sc.workload)
    write_job_trace(jobs, args.out)
    emit(f"wrote {len(jobs)} jobs to {args.out}")
    return 0
