"""`lightpipe monitor up|down|status|serve`: the long-lived Prometheus, and re-serving runs."""

from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path

HELP = "long-lived Prometheus for emulation runs (up/down/status), re-serve a run's data"


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True,
                           parser_class=type(p))
    for name, text in (("up", "start the long-lived Prometheus (no-op if it runs); "
                              "--foreground runs it until SIGTERM (a systemd service)"),
                       ("down", "stop it (by its PID file, after checking that PID is "
                                "our Prometheus)"),
                       ("status", "is it running, where, which runs are registered")):
        s = sub.add_parser(name, help=text, description=text)
        s.add_argument("--dir", type=Path, default=None,
                       help="state and data directory (default: $LIGHTPIPE_MONITOR_DIR, "
                       "/var/lib/lightpipe/prometheus as root, else "
                       "~/.local/share/lightpipe/prometheus)")
        s.add_argument("--json", action="store_true", help="print the status as JSON")
        if name == "up":
            s.add_argument("--port", type=int, default=9090,
                           help="first port to try (the next ones on conflict; with "
                           "--foreground only this one); default 9090")
            s.add_argument("--listen", default="127.0.0.1",
                           help="IP address to listen on: 127.0.0.1 (default), 0.0.0.0 "
                           "(every interface) or another IP literal")
            s.add_argument("--foreground", action="store_true",
                           help="run Prometheus in the foreground until SIGTERM/SIGINT "
                           "(for systemd): strict port, exit status is Prometheus's")
            s.add_argument("--retention", default="30d", help="TSDB retention (default 30d)")
            s.add_argument("--scrape-interval-s", type=float, default=1.0,
                           help="scrape interval in seconds (default 1)")
    s = sub.add_parser("serve", help="serve a finished run's TSDB read-only until Ctrl-C",
                       description="serve a finished run's TSDB read-only until Ctrl-C")
    s.add_argument("run_dir", type=Path, metavar="RUNDIR")
    s.add_argument("--port", type=int, default=9091, help="first port to try (default 9091)")
    s.add_argument("--listen", default="127.0.0.1",
                   help="IP address to listen on: 127.0.0.1 (default), 0.0.0.0 or another")


def _print_status(st: object, as_json: bool) -> None:
    from testbed.cli.common import emit  # no control characters from the monitor's files

    d = st.as_dict()  # type: ignore[attr-defined]
    if as_json:
        emit(json.dumps(d, indent=1))
        return
    state = f"up at {d['url']} (pid {d['pid']})" if d["running"] else \
        f"down ({d['detail']}; `lightpipe monitor up` starts it)"
    emit(f"prometheus {state}; data in {d['dir']}/data")
    # A run is registered while it runs; its series stay in the data after it ends.
    emit(f"runs being scraped now: {', '.join(d['runs']) if d['runs'] else 'none'}"
         + ("" if d["runs"] or not d["running"] else " (an emulation run registers while "
            "it runs; finished runs stay in the data: `lightpipe grafana check --url "
            f"{d['url']}` lists them)"))


def run(args: argparse.Namespace) -> int:
    from testbed.errors import InputError
    from testbed.monitor.server import Monitor
    from testbed.monitor.trust import check_listen

    if getattr(args, "port", 1) is not None and not 0 <= getattr(args, "port", 1) <= 65535:
        raise InputError("--port", f"{args.port} is not a port number")
    if getattr(args, "listen", None) is not None:
        args.listen = check_listen(args.listen)
    if args.action == "serve":
        return _serve(args)
    mon = Monitor(args.dir)
    if args.action == "up":
        from math import isfinite

        if not (isfinite(args.scrape_interval_s) and 0 < args.scrape_interval_s <= 3600):
            raise InputError("--scrape-interval-s", "must be a number of seconds in (0, "
                             f"3600], got {args.scrape_interval_s}")
        opts = {"scrape_interval_s": args.scrape_interval_s, "retention": args.retention,
                "host": args.listen}
        if args.foreground:
            def ready(st: object) -> None:
                _print_status(st, args.json)
                sys.stdout.flush()

            return mon.foreground(args.port, on_ready=ready, **opts)
        st = mon.up(args.port, **opts)
        _print_status(st, args.json)
        return 0
    if args.action == "down":
        stopped = mon.down()
        print("prometheus stopped" if stopped else "prometheus was not running")
        return 0
    st = mon.status()
    _print_status(st, args.json)
    return 0 if st.running else 1  # down: a runtime failure for scripts (docs/metrics.md)


def _serve(args: argparse.Namespace) -> int:
    from testbed.errors import RuntimeFailure
    from testbed.monitor.serve import serving, window_text

    with serving(args.run_dir, args.port, args.listen) as started:
        try:  # (Ctrl-C right after the line below is printed ends it as well: exit 0)
            signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM = Ctrl-C
            print(f"serving {args.run_dir}/prometheus/data at {started.url} "
                  f"{window_text(args.run_dir)}(Ctrl-C stops)")
            sys.stdout.flush()
            code = started.proc.wait()
        except KeyboardInterrupt:
            return 0
    raise RuntimeFailure(f"prometheus exited with {code} while serving {args.run_dir}")
