"""`lightpipe topologies [NAME] [--draw FILE.png]`: list, show or draw bundled topologies."""

from __future__ import annotations

import argparse

from testbed.cli.common import emit, emit_json

HELP = "list the bundled topologies, show one, or draw it"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", nargs="?", help="a topology to show in detail")
    parser.add_argument("--draw", metavar="FILE.png", help="draw NAME to a PNG file")
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def run(args: argparse.Namespace) -> int:
    from testbed.errors import InputError
    from testbed.topologies import library_names, load_library, summary

    if args.draw and not args.name:
        raise InputError("--draw", "needs a topology NAME")
    if not args.name:
        rows = [summary(load_library(n)) for n in library_names()]
        if args.json:
            emit_json(rows)
            return 0
        emit(f"{'name':<10} {'nodes':>5} {'fibres':>6} {'min_km':>7} {'mean_km':>8} "
             f"{'max_km':>7}  source")
        for r in rows:
            emit(f"{r['name']:<10} {r['nodes']:>5} {r['fibres']:>6} {r['min_km']:>7g} "
                 f"{r['mean_km']:>8g} {r['max_km']:>7g}  {_short(str(r['source']))}")
        return 0
    topo = load_library(args.name)
    info = summary(topo)
    if args.draw:
        from testbed.topologies.draw import draw_topology

        draw_topology(topo, args.draw)
        info["drawn_to"] = args.draw
    if args.json:
        info["fibres_list"] = [[f.u, f.v, f.length_km] for f in topo.fibres]
        emit_json(info)
        return 0
    for k, v in info.items():
        emit(f"{k}: {v}")
    emit("fibres (u v length_km):")
    for f in topo.fibres:
        emit(f"  {f.u:>4} {f.v:>4} {f.length_km:g}")
    return 0


def _short(text: str, width: int = 60) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."
