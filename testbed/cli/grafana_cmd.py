"""`lightpipe grafana build|check`: generate the dashboards' JSON; run their queries."""

from __future__ import annotations

import argparse
import json
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
                       description="run every dashboard query against a Prometheus: ok "
                       "(data), n/a (empty because the run cannot produce it, with why: "
                       "from its lightpipe_run_info) or EMPTY (empty but expected); then "
                       "one summary line. Exit 0 when nothing expected is empty, else 1")
    c.add_argument("--url", required=True, help="Prometheus URL, e.g. http://127.0.0.1:9090")
    c.add_argument("--run", default=".*", help="run id (regex) to substitute for $run")
    c.add_argument("--since-s", type=float, default=3600.0,
                   help="look back this many seconds (default 3600)")
    for a in (b, c):
        a.add_argument("--dir", type=Path, default=None,
                       help="the grafana/ directory (default: the checkout's)")


def run(args: argparse.Namespace) -> int:
    from testbed.cli.common import emit
    from testbed.io.atomic import atomic_write_text
    from testbed.monitor import dashboards as dash
    from testbed.monitor import producible

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
    runs = _runs(args.url, args.run, args.since_s)
    builtins = dash.builtins_for(runs)
    ok = expected = 0
    cannot: dict[str, list[str]] = {}  # reason -> queries
    for name, d in dash.load_dashboards(gdir).items():
        for q in dash.queries(name, d):
            n = dash.run_query(args.url, q, values, end - args.since_s, end,
                               builtins=builtins)
            where = f"{name}: {q.kind} {q.title}"
            why = None if n else producible.why_none_can(q.expr, runs)
            if n:
                ok += 1
                emit(f"ok    {n:4d}  {where}")
            elif why:
                cannot.setdefault(why, []).append(where)
                emit(f"n/a   {n:4d}  {where}  (this run cannot produce it: {why})")
            else:
                expected += 1
                emit(f"EMPTY {n:4d}  {where}")
    emit(_summary(args.run, runs, ok, expected, cannot))
    return 1 if expected else 0


def _runs(url: str, run: str, since_s: float) -> dict[str, dict[str, str]]:
    """run id -> lightpipe_run_info labels of the runs `run` (a regex) matches."""
    from testbed.metrics.query import query
    from testbed.monitor import producible

    sel = "lightpipe_run_info{run=~" + json.dumps(run) + "}"
    return producible.run_facts(query(url, f"last_over_time({sel}[{int(since_s) + 1}s])"))


def _summary(run: str, runs: dict[str, dict[str, str]], ok: int, expected: int,
             cannot: dict[str, list[str]]) -> str:
    """The one line that says how the check went."""
    n_cannot = sum(len(v) for v in cannot.values())
    who = (f"run {next(iter(runs))}" if len(runs) == 1
           else f"{len(runs)} runs matching --run {run!r}" if runs
           else f"no run matching --run {run!r} (no lightpipe_run_info)")
    parts = [f"{ok} queries with data", f"{expected} empty but expected"
             + (" (FAILED)" if expected else ""),
             f"{n_cannot} empty because {'the run' if len(runs) == 1 else 'the runs'} "
             "cannot produce them"
             + (": " + "; ".join(f"{len(v)} x {k}" for k, v in sorted(cannot.items()))
                if cannot else "")]
    return f"grafana check of {who}: " + ", ".join(parts)
