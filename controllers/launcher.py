"""Start the controller app with os-ken's AppManager (os-ken 4.x ships no osken-manager).

    python -m controllers.launcher --spec S.yaml [--of-port 6653] [--rest 127.0.0.1:8080]
        [--db FILE] [--layout FILE] [--token-file FILE]

Also `start_controller(...)`: run it as a child process and wait until the REST API
answers (used by `lightpipe emu`, the tests and the benchmark).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
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
    if args.netns:
        host, _, port = args.rest.rpartition(":")
        rest = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        rest.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        rest.bind((host or "127.0.0.1", int(port)))
        rest.listen(64)
        rest.set_inheritable(True)
        env["LIGHTPIPE_CTL_REST_FD"] = str(rest.detach())
        from testbed.emu.netns import enter_netns

        enter_netns(args.netns)  # this thread and every thread it starts from now on
    _prepare_hub()
    from os_ken import cfg
    from os_ken.base.app_manager import AppManager

    cfg.CONF(args=[], project="os_ken")
    cfg.CONF.set_override("ofp_listen_host", args.of_host)
    cfg.CONF.set_override("ofp_tcp_listen_port", args.of_port)
    mgr = AppManager.get_instance()

    def _stop(_sig: int, _frm: object) -> None:
        # os-ken's native hub threads cannot be killed: close our resources, then exit.
        with contextlib.suppress(Exception):
            for app in list(mgr.applications.values()):
                close = getattr(app, "close", None)
                if callable(close):
                    close()
        logging.shutdown()
        os._exit(0)

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    mgr.load_apps([APP])
    contexts = mgr.create_contexts()
    services = mgr.instantiate_apps(**contexts)
    for t in services:
        t.join() if hasattr(t, "join") else t.wait()
    return 0


@dataclass
class ControllerProcess:
    """A running controller child process."""

    proc: subprocess.Popen[bytes]
    rest_url: str
    of_port: int
    token: str | None
    log_path: Path
    client_netns: str | None = None  # where REST calls must come from (if not here)

    @property
    def openflow(self) -> str:
        return f"tcp:127.0.0.1:{self.of_port}"

    def request(self, method: str, path: str, body: Any = None,
                timeout_s: float = 10.0) -> tuple[int, Any]:
        """One REST call; returns (status, decoded JSON or text)."""
        if self.client_netns is None:
            return rest_call(self.rest_url, method, path, body, self.token, timeout_s)
        from testbed.emu.netns import in_netns

        with in_netns(self.client_netns):
            return rest_call(self.rest_url, method, path, body, self.token, timeout_s)

    def describe(self) -> dict[str, Any]:
        """What network.json records under `controller`."""
        return {"rest_url": self.rest_url, "token": self.token,
                "openflow": f"tcp:127.0.0.1:{self.of_port}", "pid": self.proc.pid,
                "log": str(self.log_path)}

    def stop(self, kill: bool = False) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def rest_call(url: str, method: str, path: str, body: Any = None, token: str | None = None,
              timeout_s: float = 10.0) -> tuple[int, Any]:
    data = None if body is None else (body if isinstance(body, bytes)
                                      else json.dumps(body).encode())
    req = urllib.request.Request(url + path, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            raw, status, ctype = resp.read(), resp.status, resp.headers.get("Content-Type", "")
    except urllib.error.HTTPError as exc:
        raw, status, ctype = exc.read(), exc.code, exc.headers.get("Content-Type", "")
    return status, (json.loads(raw) if "json" in ctype else raw.decode())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_controller(spec: str | Path, db: str | Path, *, of_port: int | None = None,
                     rest_port: int | None = None, rest_host: str = "127.0.0.1",
                     layout: str | Path | None = None, token: str | None = None,
                     log_path: str | Path | None = None, timeout_s: float = 20.0,
                     verbose: int = 1, netns: str | None = None,
                     home_netns: str | None = None) -> ControllerProcess:
    """Start the controller in a child process; return once GET /health answers.

    netns: namespace the OpenFlow listener goes to (the switches'); home_netns: the
    namespace the child starts in and REST clients use, if the caller's thread has
    moved elsewhere (as EmuNetwork's does).
    """
    of_port = of_port or free_port()
    rest_port = rest_port or free_port()
    log_path = Path(log_path or Path(db).with_suffix(".log"))
    cmd = [sys.executable, "-m", "controllers.launcher", "--spec", str(spec), "--db", str(db),
           "--of-port", str(of_port), "--rest", f"{rest_host}:{rest_port}"]
    cmd += ["-v"] * verbose
    if layout:
        cmd += ["--layout", str(layout)]
    if netns:
        cmd += ["--netns", netns]
    env = dict(os.environ)
    if token:
        tf = Path(db).with_suffix(".token")
        fd = os.open(tf, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(token)
        cmd += ["--token-file", str(tf)]
    root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    with open(log_path, "ab") as logf, contextlib.ExitStack() as stack:
        if home_netns:
            from testbed.emu.netns import in_netns

            stack.enter_context(in_netns(home_netns))
        proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, env=env,
                                cwd=root, start_new_session=True)
    cp = ControllerProcess(proc, f"http://{rest_host}:{rest_port}", of_port, token, log_path,
                           home_netns)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"controller exited with {proc.returncode}: "
                               f"{log_path.read_text()[-2000:]}")
        try:
            if cp.request("GET", "/health", timeout_s=1.0)[0] == 200:
                return cp
        except OSError:
            pass
        time.sleep(0.05)
    cp.stop(kill=True)
    raise RuntimeError(f"controller did not answer on {cp.rest_url} within {timeout_s:.0f} s")


if __name__ == "__main__":
    sys.exit(main())
