"""`lightpipe validate SPEC...`: check scenario files; exit 2 on the first bad one."""

from __future__ import annotations

import argparse

from testbed.cli.common import emit
from testbed.errors import InputError

HELP = "validate scenario files"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("specs", nargs="+", metavar="SPEC", help="scenario files (YAML)")


def run(args: argparse.Namespace) -> int:
    from testbed.spec import load_scenario, topology_of

    for path in args.specs:
        sc = load_scenario(path)
        topo = topology_of(sc)
        extra = ""
        try:
            rows = check_trace(sc, set(topo.nodes))
        except InputError as exc:
            raise InputError(exc.path, exc.message, source=path) from None
        if rows is not None:
            extra = f", trace {rows} rows"
        emit(f"{path}: ok ({sc.name}: {topo.name} {len(topo.nodes)} nodes "
             f"{len(topo.fibres)} fibres, {len(sc.dcs)} DCs, workload {sc.workload.kind}"
             f"{extra})")
    return 0


def check_trace(sc, nodes: set[str]) -> int | None:  # type: ignore[no-untyped-def]
    """Read the scenario's trace file (if any) as the run would; the number of rows."""
    trace = getattr(sc.workload, "trace", None)
    if trace is None:
        return None
    if sc.workload.kind == "pp_jobs":
        from testbed.spec.check import model_names
        from testbed.traces import read_job_trace

        jobs = read_job_trace(trace)
        known = model_names(sc.workload)
        for i, job in enumerate(jobs):
            if job.model not in known:
                raise InputError("workload.trace", f"row {i + 2}: unknown model {job.model!r}")
        return len(jobs)
    from testbed.sim.requests import read_request_trace

    return sum(1 for _ in read_request_trace(trace, nodes))
