"""`lightpipe cluster check|up|down|status --cluster FILE` and `lightpipe clean --cluster
FILE` (run_clean): the arguments, then one call into testbed.cluster each (survey for the
reports, bringup for `up`; docs/cluster.md)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from testbed.cli.common import emit, emit_json

if TYPE_CHECKING:
    from testbed.cluster.bringup import UpOptions

HELP = ("emulation across machines: check a cluster file (placement, tunnels, SSH, tools), "
        "bring a scenario's network up across the machines and take it down")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="cluster_action", metavar="ACTION", required=True)
    check = sub.add_parser("check", help="print where each DC would run, the fibres that "
                           "cross machines with their tunnels, and check every machine "
                           "over SSH (reachable; ip, tc, ovs-vswitchd, ovs-vsctl, mnexec, "
                           "the venv, root or sudo, vxlan)")
    check.add_argument("spec", nargs="?", metavar="SPEC",
                       help="scenario file (YAML) to place; without it only the machines "
                       "are checked")
    check.add_argument("--cluster", metavar="FILE", required=True,
                       help="cluster file (YAML): machines, ssh, venv, tunnel "
                       "(docs/cluster.md)")
    check.add_argument("--place", action="append", default=[], metavar="DC=MACHINE",
                       help="put a DC (with its ROADM) on a machine (repeatable)")
    check.add_argument("--offline", action="store_true",
                       help="placement and tunnels only: do not contact the machines")
    check.add_argument("--prefix", metavar="RUN", default=None,
                       help="run prefix for the tunnel names (lpXXXX; default: a new one)")
    check.add_argument("--json", action="store_true", help="print one JSON document")
    up = sub.add_parser("up", help="bring SPEC's network up across the machines (each "
                        "machine's share over SSH), ping every DC pair, and hold it until "
                        "`cluster down`")
    up.add_argument("spec", metavar="SPEC", help="scenario file (YAML)")
    up.add_argument("--cluster", metavar="FILE", required=True, help="cluster file (YAML)")
    up.add_argument("--out", metavar="DIR", required=True,
                    help="where cluster_run.json and cluster_rtt.json are written")
    up.add_argument("--place", action="append", default=[], metavar="DC=MACHINE",
                    help="put a DC (with its ROADM) on a machine (repeatable)")
    up.add_argument("--prefix", metavar="RUN", default=None,
                    help="run prefix (lpXXXX; default: a new one)")
    up.add_argument("--link-mode", choices=("auto", "userspace", "netem"), default="auto",
                    help="fibre emulators on every machine (as `emu --link-mode`)")
    up.add_argument("--datapath", choices=("auto", "user", "kernel"), default="auto",
                    help="Open vSwitch datapath on every machine")
    up.add_argument("--ready-timeout", type=float, default=600.0, metavar="S",
                    help="how long a machine may take to bring its share up (s)")
    up.add_argument("--no-calibrate", dest="calibrate", action="store_false",
                    help="leave the fibres' delays as planned (default: calibrate them "
                    "across the machines, tunnels included, as `emu` does on one)")
    down = sub.add_parser("down", help="take a run's shares down on every machine (stop, "
                          "then that machine's own `lightpipe clean RUN`)")
    down.add_argument("prefix", metavar="RUN", help="the run prefix `cluster up` printed")
    down.add_argument("--cluster", metavar="FILE", required=True, help="cluster file (YAML)")
    st = sub.add_parser("status", help="list what every machine holds: each run's share, "
                        "its holder alive or not, its processes, hosts and tunnels")
    st.add_argument("--cluster", metavar="FILE", required=True, help="cluster file (YAML)")
    st.add_argument("--json", action="store_true", help="print the record as JSON")
    parser.set_defaults(cluster_action=None)


def run(args: argparse.Namespace) -> int:
    from testbed.cluster import survey
    from testbed.cluster.spec import load_cluster
    from testbed.errors import InputError
    from testbed.spec import load_scenario

    actions = {"up": run_up, "down": run_down, "status": run_status}
    if args.cluster_action in actions:
        return actions[args.cluster_action](args)
    if args.cluster_action != "check":
        raise InputError("ACTION", "expected check, up, down or status")
    cluster = load_cluster(args.cluster)
    scenario = None
    if args.spec:
        survey.check_prefix(args.prefix)
        scenario = load_scenario(args.spec)
    doc, checks = survey.check_doc(cluster, scenario, args.place, args.prefix, args.offline)
    _show(doc, survey.check_lines(doc, checks), args.json)
    return _fail(survey.check_failure(checks))


def _show(doc: dict[str, Any], lines: list[str], as_json: bool) -> None:
    """The record as one JSON document (--json), or its lines."""
    if as_json:
        emit_json(doc)
        return
    for line in lines:
        emit(line)


def _fail(failure: Exception | None) -> int:
    """0, or the failure raised (the CLI makes it one line and exit 1)."""
    if failure is not None:
        raise failure
    return 0


def run_clean(args: argparse.Namespace) -> int:
    """`lightpipe clean --cluster FILE [RUN...] [--dry-run] [--force]`: every machine's
    lines prefixed by its name, then one line per machine; exit 1 naming the first
    machine that was not cleaned (the others were)."""
    from testbed.cluster import survey
    from testbed.cluster.spec import load_cluster
    from testbed.errors import InputError

    if args.dir:
        raise InputError("--dir", "not with --cluster (output directories are cleaned on "
                         "the machine that wrote them)")
    cluster = load_cluster(args.cluster)
    return _fail(survey.clean(cluster, args.prefix, args.dry_run, args.force, emit))


def up_options(args: argparse.Namespace) -> UpOptions:
    """The bring-up options of `cluster up` and `emu --cluster` (checked by the run)."""
    from testbed.cluster.bringup import UpOptions

    return UpOptions(cluster_file=args.cluster, place=tuple(args.place),
                     prefix=getattr(args, "prefix", None),
                     link_mode=args.link_mode or "auto", datapath=args.datapath,
                     ready_timeout_s=args.ready_timeout, calibrate=args.calibrate)


def run_up(args: argparse.Namespace) -> int:
    """`lightpipe cluster up`: plan once, start every machine's share, ping every DC pair,
    probe every lightpath, write DIR/cluster_run.json, DIR/cluster_rtt.json and
    DIR/cluster_probes.json; hold (the shares run on)."""
    from pathlib import Path

    from testbed.cli.common import check_out
    from testbed.cluster.bringup import bring_up
    from testbed.cluster.spec import load_cluster
    from testbed.io.trusted import make_dirs
    from testbed.spec import load_scenario

    opts = up_options(args)
    opts.check()
    cluster = load_cluster(args.cluster)
    scenario = load_scenario(args.spec)
    check_out(args.out)
    up = bring_up(cluster, scenario, opts, lambda: make_dirs(Path(args.out)), emit)
    emit(f"cluster up: holding run {up.plan.prefix}; `lightpipe cluster down --cluster "
         f"{args.cluster} {up.plan.prefix}` takes it down")
    return 0


def run_down(args: argparse.Namespace) -> int:
    """`lightpipe cluster down --cluster FILE RUN`: on every machine, stop the run's share
    and clean it by its prefix; exit 1 naming the first machine where that failed."""
    from testbed.cluster import survey
    from testbed.cluster.spec import load_cluster

    survey.check_prefix(args.prefix, "RUN")
    cluster = load_cluster(args.cluster)
    return _fail(survey.take_down(cluster, args.prefix, emit))


def run_status(args: argparse.Namespace) -> int:
    """`lightpipe cluster status --cluster FILE`: per machine, the shares it holds (as its
    own state records them; a run is listed by every machine that holds part of it); exit
    1 naming the first machine that could not be asked."""
    from testbed.cluster import survey
    from testbed.cluster.spec import load_cluster

    doc, results = survey.status(load_cluster(args.cluster))
    _show(doc, survey.status_lines(doc, results), args.json)
    return _fail(survey.status_failure(results))
