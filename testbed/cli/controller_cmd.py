"""`lightpipe controller SPEC`: run the SDN controller (os-ken app, REST API, metrics)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from testbed.cli.common import add_spec_arg
from testbed.errors import InputError

HELP = "run the SDN controller: lightpaths as OpenFlow 1.3 rules, REST API, restoration"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_spec_arg(parser)
    parser.add_argument("--port", type=int, default=6653,
                        help="OpenFlow listen port (default 6653; 0: any free port)")
    parser.add_argument("--of-host", default="127.0.0.1", help="OpenFlow listen address")
    parser.add_argument("--rest-port", type=int, default=8080,
                        help="REST API port on --rest-host (default 8080; 0: any free port)")
    parser.add_argument("--rest-host", default="127.0.0.1",
                        help="REST API address (default 127.0.0.1: local only)")
    parser.add_argument("--token-file", default=None,
                        help="file (chmod 600) holding the bearer token the REST API "
                        "requires; default: a new token written to the database's path "
                        "with suffix .token (0600). Needed for a non-loopback --rest-host")
    parser.add_argument("--token", default=None, help=argparse.SUPPRESS)  # refused
    parser.add_argument("--db", default=None,
                        help="SQLite state file; lightpaths survive a restart (default: "
                        "$XDG_STATE_HOME/lightpipe/controller.db, i.e. "
                        "~/.local/state/lightpipe/controller.db)")
    parser.add_argument("--layout", default=None,
                        help="data-plane layout JSON (else PUT /layout later)")
    parser.add_argument("--place-timeout-s", type=float, default=None,
                        help="longest a POST /jobs placement may compute; then 503 and its "
                        "result is discarded (default: $LIGHTPIPE_CTL_PLACE_TIMEOUT_S, else 20)")
    parser.add_argument("--max-placements", type=int, default=None,
                        help="POST /jobs placements computing at once; one more gets 503 "
                        "busy (default: $LIGHTPIPE_CTL_MAX_PLACEMENTS, else 4)")


def run(args: argparse.Namespace) -> int:
    from testbed.spec import load_scenario

    if args.token is not None:
        raise InputError("--token", "a token on the command line shows in the process "
                         "list: write it to a file (chmod 600) and pass --token-file FILE")
    from controllers.tokenfile import is_loopback

    if not is_loopback(args.rest_host) and not args.token_file:
        raise InputError("--rest-host", f"{args.rest_host} is not a loopback address: give "
                         "--token-file FILE (chmod 600) to expose the REST API")
    if args.token_file:
        from controllers.tokenfile import read_token

        try:
            read_token(Path(args.token_file))
        except ValueError as exc:
            raise InputError("--token-file", str(exc)) from None
    from controllers.placing import place_limits_env

    try:
        place_limits_env(os.environ, args.place_timeout_s, args.max_placements)
    except ValueError as exc:
        field, _, msg = str(exc).partition(": ")
        raise InputError(field, msg) from None
    load_scenario(args.spec)  # bad spec: one line, exit 2, before anything listens
    for name, port in (("--port", args.port), ("--rest-port", args.rest_port)):
        if not 0 <= port <= 65535:
            raise InputError(name, f"port must be 0..65535 (0: any free one), got {port}")
    if args.layout:
        import json

        from pydantic import ValidationError

        from controllers.layout import Layout

        try:
            with open(args.layout, encoding="utf-8") as f:
                Layout.model_validate(json.load(f))
        except (OSError, ValueError, ValidationError) as exc:
            raise InputError("--layout", f"{args.layout}: {str(exc).splitlines()[0]}") from None
    for flag, what, host, port in (("--port", "OpenFlow", args.of_host, args.port),
                                   ("--rest-port", "REST API", args.rest_host, args.rest_port)):
        if port:
            port_free(flag, what, host, port)
    db = args.db or str(default_db())
    token_file = Path(args.token_file or Path(db).resolve().with_suffix(".token"))
    import sys

    from controllers.launcher import main
    from testbed.cli.common import emit

    def announce(rest_host: str, rest_port: int, of_host: str, of_port: int) -> None:
        emit(f"controller: REST API at http://{rest_host}:{rest_port} (bearer token "
             f"in {token_file}{'' if args.token_file else ', new'}), OpenFlow 1.3 on "
             f"tcp:{of_host}:{of_port}, state in {db}; Ctrl-C stops")
        sys.stdout.flush()

    argv = ["--spec", args.spec, "--db", db, "--of-host", args.of_host,
            "--of-port", str(args.port), "--rest", f"{args.rest_host}:{args.rest_port}"]
    if args.token_file:
        argv += ["--token-file", args.token_file]
    if args.layout:
        argv += ["--layout", args.layout]
    if args.place_timeout_s is not None:
        argv += ["--place-timeout-s", repr(args.place_timeout_s)]
    if args.max_placements is not None:
        argv += ["--max-placements", str(args.max_placements)]
    if args.verbose:
        argv += ["-" + "v" * args.verbose]
    return main(argv, announce=announce)


def default_db() -> Path:
    """$XDG_STATE_HOME/lightpipe/controller.db (~/.local/state/...), never the cwd."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local",
                                                            "state")
    d = Path(base) / "lightpipe"
    d.mkdir(parents=True, exist_ok=True)
    return d / "controller.db"


def port_free(flag: str, what: str, host: str, port: int) -> None:
    """InputError naming the flag and port when something already listens there."""
    import errno
    import socket

    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            why = "is in use" if exc.errno == errno.EADDRINUSE else \
                f"cannot be used ({exc.strerror})"
            raise InputError(flag, f"the {what} port {host}:{port} {why}; pick another with "
                             f"{flag}") from None
