"""`lightpipe trace SPEC --out FILE`: write the job trace a pp_jobs scenario generates;
`lightpipe trace FILE --check`: check one; `lightpipe trace import --format F FILE --out
jobs.csv`: map a public cluster trace (Philly, Alibaba PAI, Acme) to one."""

from __future__ import annotations

import argparse

from testbed.cli.common import add_spec_arg, emit

HELP = ("generate a job trace CSV from a pp_jobs scenario, check one with --check, or "
        "import a public cluster trace (trace import --format philly|pai|acme FILE)")
USAGE = ("lightpipe trace SPEC --out FILE.csv\n"
         "       lightpipe trace TRACE.csv --check [--models-from SCENARIO]\n"
         "       lightpipe trace import --format {philly,pai,acme} FILE --out jobs.csv "
         "[import options]")
# Options of the import form only: dest -> option string (refused with the other forms).
IMPORT_ONLY = {"format": "--format", "header": "--header", "pai_jobs": "--pai-jobs",
               "model": "--model", "model_buckets": "--model-buckets", "gpu": "--gpu",
               "schedule": "--schedule", "mfu": "--mfu", "gpus_per_node": "--gpus-per-node",
               "max_stages": "--max-stages", "microbatches": "--microbatches",
               "seconds_per_iteration": "--seconds-per-iteration",
               "fractional": "--fractional", "keep_failed": "--keep-failed",
               "keep_killed": "--keep-killed", "min_gpus": "--min-gpus", "since": "--since",
               "until": "--until", "limit": "--limit", "id_map": "--id-map"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.usage = USAGE
    # `trace import --format F FILE`: FILE comes after an option, which plain argparse
    # (positionals matched in one run) would call unrecognised.
    parser.__class__ = _intermixed(type(parser))
    add_spec_arg(parser)
    parser.add_argument("file", nargs="?", metavar="FILE",
                        help="with `import`: the public trace file (Philly's cluster_job_log, "
                        "PAI's pai_task_table.csv, Acme's trace_seren.csv / trace_kalos.csv)")
    parser.add_argument("--out", metavar="FILE.csv", help="write the trace here")
    parser.add_argument("--check", action="store_true",
                        help="SPEC is a trace CSV: validate it (models included) and print a "
                        "summary")
    parser.add_argument("--models-from", metavar="SCENARIO",
                        help="with --check: also accept the models a scenario defines "
                        "(workload.models)")
    _add_import_arguments(parser)


def _intermixed(base: type[argparse.ArgumentParser]) -> type[argparse.ArgumentParser]:
    """`base` whose parse_known_args takes positionals between options (argparse's
    parse_known_intermixed_args, which calls parse_known_args itself)."""

    class Intermixed(base):  # type: ignore[valid-type,misc]
        _nested = False

        def parse_known_args(self, args=None, namespace=None):  # type: ignore[no-untyped-def]
            if self._nested:
                return super().parse_known_args(args, namespace)
            self._nested = True
            try:
                return self.parse_known_intermixed_args(args, namespace)
            finally:
                self._nested = False

    return Intermixed


def _add_import_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group(
        "import (lightpipe trace import --format F FILE --out jobs.csv; docs/traces.md)")
    g.add_argument("--format", choices=("philly", "pai", "acme"),
                   help="the public trace's format")
    g.add_argument("--header", metavar="FILE.header",
                   help="column names of a headerless CSV (the PAI release's "
                   "pai_task_table.header); default: the file's first line when it names "
                   "the columns, else the release's column order")
    g.add_argument("--pai-jobs", metavar="pai_job_table.csv",
                   help="pai: the job table, for submission times and job status (without "
                   "it: each job's first task launch and the tasks' status)")
    g.add_argument("--model", metavar="NAME",
                   help="one catalogue model for every job (default: by GPU count, "
                   "--model-buckets)")
    g.add_argument("--model-buckets", metavar="N:MODEL,...",
                   help="model by the job's GPUs: the first bound >= its GPUs (default "
                   "8:gpt3-6.7b,32:llama2-13b,128:llama2-70b,inf:gpt3-175b)")
    g.add_argument("--gpus-per-node", type=int, metavar="N",
                   help="GPUs of one server, for stages when the trace gives no node count "
                   "(default 8)")
    g.add_argument("--max-stages", type=int, metavar="N",
                   help="most pipeline stages of a job (default 8)")
    g.add_argument("--microbatches", type=int, metavar="N",
                   help="micro-batches per iteration (default 4 x stages)")
    g.add_argument("--seconds-per-iteration", type=float, metavar="S",
                   help="iterations = run time / S (default: the model's simulated "
                   "iteration time with all stages in one DC)")
    g.add_argument("--gpu", metavar="TYPE",
                   help="GPU type of that simulated iteration time (default h100)")
    g.add_argument("--schedule", metavar="NAME",
                   help="pipeline schedule of that iteration time (default 1f1b)")
    g.add_argument("--mfu", type=float, help="model FLOPs utilisation of it (default 0.4)")
    g.add_argument("--fractional", choices=("ceil", "drop"),
                   help="a fractional GPU count (PAI): round up to whole GPUs (default) or "
                   "drop the job")
    g.add_argument("--keep-failed", action="store_true",
                   help="keep jobs that failed (for their run time); default: dropped")
    g.add_argument("--keep-killed", action="store_true",
                   help="keep jobs killed or cancelled by their user; default: dropped")
    g.add_argument("--min-gpus", type=int, metavar="N",
                   help="drop jobs with fewer GPUs (default 1: only GPU-less jobs)")
    g.add_argument("--since", metavar="TIME",
                   help="only jobs submitted at least TIME after the trace's first "
                   "submission (seconds, or 90m, 6h, 2d); arrivals then count from there")
    g.add_argument("--until", metavar="TIME",
                   help="only jobs submitted before TIME after the trace's first submission")
    g.add_argument("--limit", type=int, metavar="N",
                   help="keep the first N jobs (by submission, after the filters)")
    g.add_argument("--id-map", metavar="FILE.csv",
                   help="also write job_id,source_id (the trace's own job ids)")


def run(args: argparse.Namespace) -> int:
    from testbed.errors import InputError
    from testbed.spec import load_scenario
    from testbed.traces import generate_jobs, read_job_trace, write_job_trace

    if args.spec == "import":
        return _run_import(args)
    given = [opt for dest, opt in IMPORT_ONLY.items() if getattr(args, dest) not in (None, False)]
    if given or args.file is not None:
        what = given[0] if given else f"argument {args.file!r}"
        raise InputError(what, "only with `lightpipe trace import --format F FILE` (a file "
                         "named import: ./import)")
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


def _run_import(args: argparse.Namespace) -> int:
    """`lightpipe trace import`: read, map, self-check, write atomically, say what was
    dropped."""
    import logging

    from testbed.catalog import GPUS, MODELS
    from testbed.cli.common import bounded_number
    from testbed.errors import InputError
    from testbed.schedule.registry import schedule_names
    from testbed.traceimport import DEFAULT_BUCKETS, ImportOptions, import_trace, parse_buckets
    from testbed.traceimport.common import models_used
    from testbed.traces import format_job_trace, parse_job_trace

    if args.check or args.models_from:
        raise InputError("--check", "not with import (check the written file: "
                         "lightpipe trace FILE --check)")
    if not args.format:
        raise InputError("--format", "required with import: philly, pai or acme")
    if not args.file:
        raise InputError("FILE", "required: the public trace file to import")
    if not args.out:
        raise InputError("--out", "required (the job trace CSV to write)")
    if args.pai_jobs and args.format != "pai":
        raise InputError("--pai-jobs", "only with --format pai")
    buckets = parse_buckets(args.model_buckets) if args.model_buckets else DEFAULT_BUCKETS
    opts = ImportOptions(
        model=args.model, buckets=buckets,
        gpus_per_node=int(bounded_number("--gpus-per-node", _int(args.gpus_per_node, 8), 1,
                                         65_536)),
        max_stages=int(bounded_number("--max-stages", _int(args.max_stages, 8), 1, 1024)),
        microbatches=None if args.microbatches is None else int(bounded_number(
            "--microbatches", args.microbatches, 1, 100_000)),
        seconds_per_iteration=None if args.seconds_per_iteration is None else bounded_number(
            "--seconds-per-iteration", args.seconds_per_iteration, 0, 1e7, low_open=True),
        gpu=args.gpu or "h100", schedule=args.schedule or "1f1b",
        mfu=0.4 if args.mfu is None else bounded_number("--mfu", args.mfu, 0, 1,
                                                        low_open=True),
        fractional=args.fractional or "ceil", keep_failed=args.keep_failed,
        keep_killed=args.keep_killed,
        min_gpus=int(bounded_number("--min-gpus", _int(args.min_gpus, 1), 1, 1 << 26)),
        since_s=_duration("--since", args.since), until_s=_duration("--until", args.until),
        limit=None if args.limit is None else int(bounded_number("--limit", args.limit, 1,
                                                                 10_000_000)))
    for name in models_used(opts):
        if name not in MODELS:
            raise InputError("--model" if opts.model else "--model-buckets",
                             f"unknown model {name!r}; known: {', '.join(sorted(MODELS))}")
    if opts.gpu not in GPUS:
        raise InputError("--gpu", f"unknown GPU {opts.gpu!r}; known: {', '.join(GPUS)}")
    if opts.schedule not in schedule_names():
        raise InputError("--schedule", f"unknown schedule {opts.schedule!r}; known: "
                         f"{', '.join(schedule_names())}")
    if opts.since_s is not None and opts.until_s is not None and opts.until_s <= opts.since_s:
        raise InputError("--until", "must be after --since")
    result = import_trace(args.format, args.file, opts, header=args.header,
                          pai_jobs=args.pai_jobs)
    if not result.jobs:
        raise InputError("", f"{args.file}: no job left to write ({result.summary()})")
    text = format_job_trace(result.jobs)
    parse_job_trace(text, origin=args.out)  # what `trace --check` and `sim` will read
    _write(args, text, result.source_ids)
    logging.getLogger(__name__).info("import options: %s", opts)
    emit(f"{args.file}: {result.summary()}")
    emit(f"wrote {len(result.jobs)} jobs to {args.out}")
    return 0


def _write(args: argparse.Namespace, text: str, source_ids: list[str]) -> None:
    import csv
    import io

    from testbed.io.atomic import atomic_write_text

    if args.id_map:
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(("job_id", "source_id"))
        w.writerows(enumerate(source_ids))
        atomic_write_text(args.id_map, buf.getvalue())
    atomic_write_text(args.out, text)


def _int(value: int | None, default: int) -> int:
    return default if value is None else value


_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def _duration(option: str, text: str | None) -> float | None:
    """'3600', '90m', '6h', '2d' -> seconds (at most 1e12)."""
    from testbed.cli.common import bounded_number
    from testbed.errors import InputError

    if text is None:
        return None
    raw = text.strip().lower()
    scale = _UNITS.get(raw[-1:], None)
    try:
        value = float(raw[:-1] if scale else raw) * (scale or 1.0)
    except ValueError:
        raise InputError(option, f"expected seconds or a time like 90m, 6h, 2d, got "
                         f"{text!r}") from None
    return bounded_number(option, value, 0, 1e12)
