"""`lightpipe report DIR [--open]`: write DIR/report.html, one self-contained page of figures."""

from __future__ import annotations

import argparse

from testbed.cli.common import emit

HELP = "write DIR/report.html for a run, reproduction or sweep directory (--open to view)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dir", metavar="DIR", help="a run (sim, emu, both), reproduction or "
                        "sweep output directory")
    parser.add_argument("--open", action="store_true", help="open the page in a web browser")


def run(args: argparse.Namespace) -> int:
    from testbed.report.build import build_report_with_skips

    path, skipped = build_report_with_skips(args.dir)
    shown = f"{args.dir.rstrip('/')}/report.html"
    emit(f"report: {shown}")
    if skipped:
        emit(f"report: {len(skipped)} input(s) skipped (listed at the top of the page)")
    if args.open:
        import webbrowser

        if not webbrowser.open(path.resolve().as_uri()):
            emit("report: no web browser found here; open the file above in one")
    return 0
