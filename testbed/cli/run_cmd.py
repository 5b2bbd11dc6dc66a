"""`lightpipe run SPEC --out DIR`: run on emulation where the machine can, else simulation."""

from __future__ import annotations

import argparse
import logging
from typing import TYPE_CHECKING

from testbed.cli.common import add_run_args, emit

if TYPE_CHECKING:
    from testbed.spec import Scenario

HELP = "run a scenario (emulation where possible, else simulation; --backend to choose)"
log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_run_args(parser)
    parser.add_argument("--backend", default="auto",
                        choices=["auto", "sim", "emu", "both", "cluster"],
                        help="auto: emu if this machine can emulate the scenario, else sim "
                        "(cluster with --cluster); cluster: across machines")
    cl = parser.add_argument_group("across machines (--backend cluster; docs/cluster.md)")
    cl.add_argument("--cluster", metavar="FILE", default=None,
                    help="the cluster file: run as `lightpipe emu SPEC --cluster FILE` does")
    cl.add_argument("--place", action="append", default=[], metavar="DC=MACHINE",
                    help="with --cluster: put a DC (with its ROADM) on a machine")


def choose_backend(requested: str, scenario: Scenario) -> tuple[list[str], str]:
    """Backends to run and a sentence saying why."""
    from testbed.backends import get_backend

    if requested == "both":
        return ["sim", "emu"], "running both backends"
    if requested != "auto":
        return [requested], f"running the {requested} backend (asked for)"
    emu = get_backend("emu")
    ok, reason = emu.available()
    if ok and hasattr(emu, "supports"):
        ok, reason = emu.supports(scenario)
        reason = f"this scenario cannot be emulated here: {reason}" if not ok else reason
    if ok:
        return ["emu"], "running the emulation backend (this machine can emulate)"
    return ["sim"], f"running the simulation backend ({reason or 'emulation unavailable'})"


def cluster_backend_args(args: argparse.Namespace) -> tuple[str, dict[str, object]]:
    """The backend asked for (auto with --cluster: cluster) and the cluster backend's
    own arguments ({} for the others); InputError naming a cluster option out of place."""
    from testbed.errors import InputError

    requested = "cluster" if args.cluster and args.backend == "auto" else args.backend
    if requested != "cluster":
        for opt, given in (("--cluster", args.cluster), ("--place", args.place)):
            if given:
                raise InputError(opt, "only with --backend cluster")
        return requested, {}
    if not args.cluster:
        raise InputError("--cluster", "--backend cluster needs a cluster file (--cluster "
                         "FILE; docs/cluster.md)")
    from testbed.cluster.bringup import UpOptions

    return requested, {"options": UpOptions(cluster_file=args.cluster,
                                            place=tuple(args.place)), "echo": emit}


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from testbed.backends import get_backend
    from testbed.cli.common import check_out
    from testbed.cli.summary import maybe_report, print_run, write_readme
    from testbed.errors import RuntimeFailure
    from testbed.spec import load_scenario

    requested, extra = cluster_backend_args(args)
    scenario = load_scenario(args.spec)
    check_out(args.out, args.force)
    names, why = choose_backend(requested, scenario)
    emit(f"lightpipe: {why}")
    out = Path(args.out)
    shown = args.out.rstrip("/")
    summaries: dict[str, dict] = {}
    import contextlib

    from testbed.io.outdir import out_lock

    with out_lock(out.resolve()) if len(names) > 1 else contextlib.nullcontext():
        for name in names:  # (both: one writer of DIR/sim and DIR/emu from start to end)
            backend = get_backend(name)
            ok, reason = backend.available()
            if not ok:
                raise RuntimeFailure(f"backend {name} unavailable: {reason}")
            target = out / name if len(names) > 1 else out
            summary = backend.run(scenario, target, quiet=args.quiet, **extra)
            summaries[name] = summary
            write_readme(target, f"LightPipe {name} run of {scenario.name}")
            print_run(name, target, f"{shown}/{name}" if len(names) > 1 else shown, summary,
                      scenario, maybe_report(target, args.report and len(names) == 1))
    agreement = summaries.get("emu", {}).get("agreement")
    if agreement and not isinstance(agreement, dict):  # (a dict is in the emu summary)
        _tabulate_agreement(agreement, summaries["emu"].get("agreement_verdict"),
                            out if len(names) > 1 else None)
    if len(names) > 1:
        write_readme(out, f"LightPipe run of {scenario.name} on both backends")
        report = maybe_report(out, args.report)
        emit(f"both: records in {shown}/sim and {shown}/emu")
        from testbed.cli.summary import report_line

        report_line(shown, report)
        if not summaries.get("emu", {}).get("fidelity", {}).get("faithful", True):
            from testbed.cli.summary import fidelity_line

            fidelity_line(summaries["emu"])  # again, last: the emulated figures' caveat
    return 0


def _tabulate_agreement(rows: list[dict], verdict: dict | None, out: object) -> None:
    """Print the simulator-vs-emulator table and its verdict (and write agreement.md when
    both ran)."""
    from pathlib import Path

    from testbed.io.atomic import atomic_write_text
    from testbed.metrics.agreement import markdown_table, verdict_line

    table = markdown_table(rows)
    if verdict:
        table += "\n" + verdict_line(verdict) + "\n"
    emit("agreement (per job: simulated vs emulated iteration time; p10/p90: the spread "
         "of the measured iterations):")
    emit(table.rstrip("\n"))
    if out is not None:
        atomic_write_text(Path(str(out)) / "agreement.md", table)
