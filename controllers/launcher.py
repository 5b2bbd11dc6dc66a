"""Start the controller app with os-ken's AppManager (os-ken 4.x ships no osken-manager).

    python -m controllers.launcher --spec S.yaml [--of-port 6653] [--rest 127.0.0.1:8080]
        [--db FILE] [--layout FILE] [--token-file FILE] [--run-state DIR]
        [--address-file FILE] [--place-timeout-s S] [--max-placements N]

Both listening ports are bound by this process, never picked elsewhere and released:
`--rest HOST:0` and `--of-port 0` take any free port, and the ports actually bound go
into --address-file (JSON: host, port, of_port, token_file). The OpenFlow port is held
by a bound reservation socket (SO_REUSEADDR, not listening) from the moment it is
chosen until os-ken's own listener binds it beside the reservation; a port in use is
refused with exit 2, naming it.

A REST bearer token always: read from --token-file (0600), else generated and written
to DB.token (0600); the path goes into --address-file for the clients. A non-loopback
--rest without --token-file is refused (exit 2).

This is the controller process itself; the `lightpipe` side that starts it as a child
and talks to its REST API is `testbed.orchestrate.ctl_process`.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import socket
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

APP = "controllers.lightpath_app"
REST_BACKLOG = 2048  # the accept queue (a burst of clients is queued, not reset)


def _prepare_hub() -> None:
    # os-ken picks its hub when os_ken.lib.hub is first imported. "native" (threads) is
    # its default and what the app is written for; with eventlet the monkey-patching
    # must happen before anything else imports socket/threading users.
    hub_type = os.environ.setdefault("OSKEN_HUB_TYPE", "native")
    if hub_type == "eventlet":
        import eventlet

        eventlet.monkey_patch()


def stop_handler(apps: Callable[[], Iterable[Any]]) -> Callable[[int, Any], None]:
    """The SIGTERM/SIGINT handler: close every app (REST server, store), then exit.

    Only in this process. A child forked from it inherits the handler: pyroute2's
    `NetNS` forks one to open a netlink socket inside a namespace (the netem caps), then
    SIGTERMs it once it has the socket. If that signal lands before the child's own
    `os._exit`, closing the REST server there waits forever for a serving thread the
    child does not have, and the controller waits for the child (`os.waitpid`) while
    holding the core's lock: `POST /lightpaths` never answers. A forked child just exits.
    """
    owner = os.getpid()

    def _stop(sig: int, _frm: Any) -> None:
        if os.getpid() != owner:
            os._exit(128 + sig)
        # os-ken's native hub threads cannot be killed: close our resources, then exit.
        with contextlib.suppress(Exception):
            for app in apps():
                close = getattr(app, "close", None)
                if callable(close):
                    close()
        logging.shutdown()
        os._exit(0)

    return _stop


def reserve_port(host: str, port: int) -> socket.socket:
    """A bound, non-listening TCP socket holding host:port (port 0: any free one).

    With SO_REUSEADDR on both, Linux lets a second socket bind the same address while
    neither listens, and refuses everyone else: os-ken's listener (which sets
    SO_REUSEADDR) binds and listens beside it; no other process can take the port.
    """
    s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((host, port))
    except OSError:
        s.close()
        raise
    return s


def _refuse(message: str) -> int:
    print(f"controllers.launcher: {message}", file=sys.stderr)
    return 2


Announce = Callable[[str, int, str, int], None]  # (rest host, port, OpenFlow host, port)


def main(argv: list[str] | None = None, announce: Announce | None = None) -> int:
    """Run the controller; `announce` is called once both ports are bound."""
    p = argparse.ArgumentParser(prog="controllers.launcher", description=__doc__,
                                allow_abbrev=False)
    p.add_argument("--spec", required=True)
    p.add_argument("--of-host", default="127.0.0.1")
    p.add_argument("--of-port", type=int, default=6653,
                   help="OpenFlow listen port (0: any free one, see --address-file)")
    p.add_argument("--rest", default="127.0.0.1:8080", help="REST host:port")
    p.add_argument("--db", default="lightpipe-controller.db")
    p.add_argument("--layout", default=None)
    p.add_argument("--token-file", default=None,
                   help="file (mode 0600) holding the REST bearer token; default: a new "
                   "token written to DB's path with suffix .token (0600)")
    p.add_argument("--token", default=None, help=argparse.SUPPRESS)  # gone: see below
    p.add_argument("--run-state", default=None,
                   help="the emulation run's state directory: layout controls must be its "
                   "own fibre sockets/descriptors (without it every control is refused)")
    p.add_argument("--netns", default=None, help="network namespace (path) to listen for "
                   "switches in; the REST API stays in the launcher's own namespace")
    p.add_argument("--address-file", default=None,
                   help="write the addresses actually bound here (JSON: host, port, "
                   "of_port, token_file; --rest HOST:0 and --of-port 0 bind any free port)")
    p.add_argument("--place-timeout-s", type=float, default=None,
                   help="longest a POST /jobs placement may compute before the request gets "
                   "503 and its result is discarded (default: $LIGHTPIPE_CTL_PLACE_TIMEOUT_S, "
                   "else 20)")
    p.add_argument("--max-placements", type=int, default=None,
                   help="POST /jobs placements computing at once; one more gets 503 busy "
                   "(default: $LIGHTPIPE_CTL_MAX_PLACEMENTS, else 4)")
    p.add_argument("--switch-timeout-s", type=float, default=None,
                   help="longest wait for a switch's barrier or table-read reply before it "
                   "is logged (barrier) or its tables are wiped and refilled (read) "
                   "(default: $LIGHTPIPE_CTL_SWITCH_TIMEOUT_S, else 5; raise it on a slow "
                   "machine)")
    p.add_argument("-v", "--verbose", action="count", default=0)
    args = p.parse_args(argv)
    if args.token is not None:
        return _refuse("--token VALUE is no longer accepted (it shows in the process "
                       "list): write the token to a file (chmod 600) and pass "
                       "--token-file FILE")
    from controllers.placing import place_limits_env

    try:
        place_env = place_limits_env(os.environ, args.place_timeout_s, args.max_placements)
    except ValueError as exc:
        return _refuse(str(exc))
    host, _, port = args.rest.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    if not port.isdigit() or int(port) > 65535:
        return _refuse(f"--rest {args.rest!r}: expected HOST:PORT")
    if not 0 <= args.of_port <= 65535:
        return _refuse(f"--of-port {args.of_port}: expected 0..65535")
    from controllers.tokenfile import is_loopback

    if not is_loopback(host) and not args.token_file:
        return _refuse(f"--rest {args.rest}: a REST API on a non-loopback address needs "
                       "--token-file FILE")
    logging.basicConfig(level=logging.WARNING - 10 * min(args.verbose, 2),
                        format="controller: %(levelname)s: %(name)s: %(message)s")
    from controllers.tokenfile import new_token_file, read_token

    if args.token_file:
        token_file = Path(args.token_file).resolve()
        try:
            read_token(token_file)
        except ValueError as exc:
            return _refuse(f"--token-file: {exc}")
    else:
        token_file = Path(args.db).resolve().with_suffix(".token")
        new_token_file(token_file)
    env = os.environ
    env.update(place_env)
    if args.switch_timeout_s is not None:
        if not 0 < args.switch_timeout_s <= 3600:
            return _refuse(f"--switch-timeout-s {args.switch_timeout_s}: expected a number "
                           "of seconds in (0, 3600]")
        env["LIGHTPIPE_CTL_SWITCH_TIMEOUT_S"] = str(args.switch_timeout_s)
    env["LIGHTPIPE_CTL_SPEC"] = args.spec
    env["LIGHTPIPE_CTL_DB"] = args.db
    env["LIGHTPIPE_CTL_TOKEN_FILE"] = str(token_file)
    env.pop("LIGHTPIPE_CTL_RUN_STATE", None)
    if args.run_state:
        env["LIGHTPIPE_CTL_RUN_STATE"] = str(Path(args.run_state).resolve())
    if args.layout:
        env["LIGHTPIPE_CTL_LAYOUT"] = args.layout
    # The REST listener is bound here, by the process that serves it (port 0: any free
    # one, published in --address-file), and in the launcher's own namespace.
    rest = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET,
                         socket.SOCK_STREAM)
    rest.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        rest.bind((host, int(port)))
    except OSError as exc:
        return _refuse(f"--rest {args.rest}: cannot bind: {exc.strerror}")
    rest.listen(REST_BACKLOG)
    rest.set_inheritable(True)
    bound_host, bound_port = rest.getsockname()[:2]
    env["LIGHTPIPE_CTL_REST"] = f"{bound_host}:{bound_port}"
    env["LIGHTPIPE_CTL_REST_FD"] = str(rest.detach())
    if args.netns:
        from testbed.emu.netns import enter_netns

        enter_netns(args.netns)  # this thread and every thread it starts from now on
    try:  # in the namespace the switches connect in; kept open for the process's life
        of_reservation = reserve_port(args.of_host, args.of_port)
    except OSError as exc:
        return _refuse(f"--of-port {args.of_port}: cannot bind the OpenFlow port on "
                       f"{args.of_host}: {exc.strerror}")
    of_port = of_reservation.getsockname()[1]
    if args.address_file:
        from testbed.io.atomic import atomic_write_json

        atomic_write_json(Path(args.address_file), {"host": bound_host, "port": bound_port,
                                                    "of_port": of_port,
                                                    "token_file": str(token_file)})
    if announce is not None:
        announce(str(bound_host), int(bound_port), args.of_host, int(of_port))
    _prepare_hub()
    from os_ken import cfg
    from os_ken.base.app_manager import AppManager

    cfg.CONF(args=[], project="os_ken")
    cfg.CONF.set_override("ofp_listen_host", args.of_host)
    cfg.CONF.set_override("ofp_tcp_listen_port", of_port)
    mgr = AppManager.get_instance()

    _stop = stop_handler(lambda: list(mgr.applications.values()))
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    mgr.load_apps([APP])
    contexts = mgr.create_contexts()
    services = mgr.instantiate_apps(**contexts)
    for t in services:
        t.join() if hasattr(t, "join") else t.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
