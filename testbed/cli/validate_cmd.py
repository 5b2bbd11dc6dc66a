"""`lightpipe validate SPEC...`: check scenario files; exit 2 on the first bad one."""

from __future__ import annotations

import argparse

from testbed.cli.common import emit

HELP = "validate scenario files"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("specs", nargs="+", metavar="SPEC", help="scenario files (YAML)")


def run(args: argparse.Namespace) -> int:
    from testbed.spec import load_scenario, topology_of

    for path in args.specs:
        sc = load_scenario(path)
        topo = topology_of(sc)
        emit(f"{path}: ok ({sc.name}: {topo.name} {len(topo.nodes)} nodes "
             f"{len(topo.fibres)} fibres, {len(sc.dcs)} DCs, workload {sc.workload.kind})")
    return 0
