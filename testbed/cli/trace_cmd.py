"""`lightpipe trace SPEC --out FILE`: write the job trace a pp_jobs scenario generates."""

from __future__ import annotations

import argparse

from testbed.cli.common import add_spec_arg, emit

HELP = "generate a job trace CSV from a pp_jobs scenario (or check one with --check)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_spec_arg(parser)
    parser.add_argument("--out", metavar="FILE.csv", help="write the trace here")
    parser.add_argument("--check", action="store_true",
                        help="SPEC is a trace CSV: validate it (models included) and print a "
                        "summary")
    parser.add_argument("--models-from", metavar="SCENARIO",
                        help="with --check: also accept the models a scenario defines "
                        "(workload.models)")


def run(args: argparse.Namespace) -> int:
    from testbed.errors import InputError
    from testbed.spec import load_scenario
    from testbed.traces import generate_jobs, read_job_trace, write_job_trace

    if args.check:
        jobs = read_job_trace(args.spec)
        _check_models(jobs, args.models_from)
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


def _check_models(jobs, models_from: str | None) -> None:  # type: ignore[no-untyped-def]
    """Reject a model `sim` would reject: not in the catalogue (nor in --models-from)."""
    from testbed.catalog import MODELS
    from testbed.errors import InputError
    from testbed.spec.suggest import close

    known = set(MODELS)
    if models_from:
        from testbed.spec import load_scenario

        wl = load_scenario(models_from).workload
        known |= {m.name for m in getattr(wl, "models", [])}
    for i, job in enumerate(jobs):
        if job.model not in known:
            hits = close(job.model, sorted(known))
            hint = f"did you mean {' or '.join(hits)}? " if hits else ""
            raise InputError("model", f"row {i + 2}: unknown model {job.model!r}; {hint}"
                             f"known: {', '.join(sorted(known))} (a scenario's own models: "
                             "--models-from SCENARIO)")
