"""Start the controller app with os-ken's AppManager (os-ken 4.x ships no osken-manager).

    python -m controllers.launcher --spec S.yaml [--of-port 6653] [--rest 127.0.0.1:8080]
        [--db FILE] [--layout FILE] [--token-file FILE]

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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="controllers.launcher", description=__doc__)
    p.add_argument("--spec", required=True)
    p.add_argument("--of-host", default="127.0.0.1")
    p.add_argument("--of-port", type=int, default=6653)
    p.add_argument("--rest", default="127.0.0.1:8080", help="REST host:port")
    p.add_argument("--db", default="lightpipe-controller.db")
    p.add_argument("--layout", default=None)
    p.add_argument("--token-file", default=None, help="file holding the REST bearer token")
    p.add_argument("--netns", default=None, help="network namespace (path) to listen for "
                   "switches in; the REST API stays in the launcher's own namespace")
    p.add_argument("--address-file", default=None,
                   help="write the REST address actually bound here (JSON; --rest HOST:0 "
                   "binds any free port)")
    p.add_argument("-v", "--verbose", action="count", default=0)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING - 10 * min(args.verbose, 2),
                        format="controller: %(levelname)s: %(name)s: %(message)s")
    env = os.environ
    env["LIGHTPIPE_CTL_SPEC"] = args.spec
    env["LIGHTPIPE_CTL_DB"] = args.db
    env["LIGHTPIPE_CTL_REST"] = args.rest
    if args.layout:
        env["LIGHTPIPE_CTL_LAYOUT"] = args.layout
    if args.token_file:
        env["LIGHTPIPE_CTL_TOKEN"] = Path(args.token_file).read_text().strip()
    # The REST listener is bound here, by the process that serves it (port 0: any free
    # one, published in --address-file), and in the launcher's own namespace.
    host, _, port = args.rest.rpartition(":")
    rest = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    rest.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    rest.bind((host or "127.0.0.1", int(port)))
    rest.listen(64)
    rest.set_inheritable(True)
    bound_host, bound_port = rest.getsockname()[:2]
    env["LIGHTPIPE_CTL_REST"] = f"{bound_host}:{bound_port}"
    env["LIGHTPIPE_CTL_REST_FD"] = str(rest.detach())
    if args.address_file:
        from testbed.atomicio import atomic_write_json

        atomic_write_json(Path(args.address_file), {"host": bound_host, "port": bound_port})
    if args.netns:
        from testbed.emu.netns import enter_netns

        enter_netns(args.netns)  # this thread and every thread it starts from now on
    _prepare_hub()
    from os_ken import cfg
    from os_ken.base.app_manager import AppManager

    cfg.CONF(args=[], project="os_ken")
    cfg.CONF.set_override("ofp_listen_host", args.of_host)
    cfg.CONF.set_override("ofp_tcp_listen_port", args.of_port)
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
