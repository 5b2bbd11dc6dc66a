"""`lightpipe grafana build|check`: generate the dashboards' JSON; run their queries."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

HELP = "Grafana dashboards: build the JSON from grafana/lightpipe_dashboards.py, check queries"


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True,
                           parser_class=type(p))
    b = sub.add_parser("build", help="write grafana/dashboards/*.json",
                       description="write grafana/dashboards/*.json from the code")
    b.add_argument("--check", action="store_true",
                   help="write nothing; exit 1 if a committed file is out of date")
    c = sub.add_parser("check", help="run every panel, variable and annotation query "
                       "against a Prometheus and list those without data",
                       description="run every dashboard query against a Prometheus")
    c.add_argument("--url", required=True, help="Prometheus URL, e.g. http://127.0.0.1:9090")
    c.add_argument("--run", default=".*", help="run id (regex) to substitute for $run")
    c.add_argument("--since-s", type=float, default=3600.0,
                   help="look back this many seconds (default 3600)")
    for a in (b, c):
        a.add_argument("--dir", type=Path, default=None,
                       help="the grafana/ directory (default: the checkout's)")


def run(args: argparse.Namespace) -> int:
    from testbed.atomicio import atomic_write_text
    from testbed.cli.common import emit
    from testbed.monitor import dashboards as dash

    gdir = args.dir or dash.grafana_dir()
    if args.action == "build":
        if args.check:
            bad = dash.stale(gdir)
            if bad:
                sys.stderr.write(f"lightpipe: error: out of date: {', '.join(bad)} "
                                 "(run `lightpipe grafana build`)\n")
                return 1
            emit("grafana/dashboards is up to date")
            return 0
        (gdir / "dashboards").mkdir(parents=True, exist_ok=True)
        for name, text in dash.build(gdir).items():
            atomic_write_text(gdir / "dashboards" / name, text)
            emit(f"wrote {gdir / 'dashboards' / name}")
        return 0
    from testbed.cli.common import bounded_number

    bounded_number("--since-s", args.since_s, 0.0, 366 * 86_400.0, low_open=True)
    end = time.time()
    values = {"run": args.run}
    empty = 0
    for name, d in dash.load_dashboards(gdir).items():
        for q in dash.queries(name, d):
            n = dash.run_query(args.url, q, values, end - args.since_s, end)
            empty += n == 0
            emit(f"{'ok   ' if n else 'EMPTY'} {n:4d}  {name}: {q.kind} {q.title}")
    return 1 if empty else 0
