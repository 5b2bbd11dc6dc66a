"""The controller as seen from `lightpipe`: start its process, call its REST API, stop it.

`start_controller(...)` runs `python -m controllers.launcher` as a child process and
waits until the REST API answers (used by `lightpipe emu`, the tests and the benchmark).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

MAX_KEPT_CONNECTIONS = 32  # past this, the connections of threads that ended are closed
IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "PUT", "DELETE", "OPTIONS"})  # RFC 9110
MAX_ANSWER_BYTES = 256 << 20  # a REST answer longer than this is refused, not read on
# How a kept-alive connection the server closed shows under the next request.
_GONE = (http.client.RemoteDisconnected, http.client.BadStatusLine, ConnectionResetError,
         BrokenPipeError)


@dataclass
class ControllerProcess:
    """A running controller child process."""

    proc: subprocess.Popen[bytes]
    rest_url: str
    of_port: int
    token: str | None
    log_path: Path
    client_netns: str | None = None  # where REST calls must come from (if not here)
    # Default REST time-out; start_controller raises it to its start-up time-out (slow
    # machines, e.g. a software-emulated VM, need more than 10 s for a lightpath set-up).
    request_timeout_s: float = 10.0
    token_file: Path | None = None  # the controller's 0600 token file
    # Kept-alive REST connections, one per (thread, network namespace): a set-up's call
    # then costs no TCP connect, no accept in the server's event loop and no close.
    _conns: dict[tuple[int, int], http.client.HTTPConnection] = field(
        default_factory=dict, repr=False, compare=False)
    _conns_lock: threading.Lock = field(default_factory=threading.Lock, repr=False,
                                        compare=False)

    @property
    def openflow(self) -> str:
        return f"tcp:127.0.0.1:{self.of_port}"

    def request(self, method: str, path: str, body: Any = None,
                timeout_s: float | None = None) -> tuple[int, Any]:
        """One REST call; returns (status, decoded JSON or text)."""
        timeout_s = timeout_s or self.request_timeout_s
        if self.client_netns is None:
            return self._call(method, path, body, timeout_s)
        from testbed.emu.netns import in_netns

        with in_netns(self.client_netns):
            return self._call(method, path, body, timeout_s)

    def _call(self, method: str, path: str, body: Any, timeout_s: float) -> tuple[int, Any]:
        """The call on this thread's kept-alive connection (in the thread's namespace now).

        A connection the server has closed meanwhile (its keep-alive time-out, a refusal
        sent with `Connection: close`) is seen before the request goes and replaced; one
        that fails anyway is closed, and only a call that cannot have changed anything
        (GET, PUT, DELETE: idempotent by HTTP's rules) is sent once more, afresh.
        """
        key = (threading.get_ident(), os.stat("/proc/thread-self/ns/net").st_ino)
        with self._conns_lock:
            conn = self._conns.get(key)
            if conn is None:
                if len(self._conns) >= MAX_KEPT_CONNECTIONS:  # drop those of ended threads
                    alive = {t.ident for t in threading.enumerate()}
                    for k in [k for k in self._conns if k[0] not in alive]:
                        self._conns.pop(k).close()
                conn = self._conns[key] = _connection(self.rest_url, timeout_s)
        reused = conn.sock is not None
        if reused and _dropped(conn):
            conn.close()
            reused = False
        try:
            return _exchange(conn, method, path, body, self.token, timeout_s)
        except _GONE:  # the server dropped the connection under the request
            conn.close()
            if not reused or method.upper() not in IDEMPOTENT_METHODS:
                raise
        except BaseException:  # a time-out, a bad answer: nothing is sent again
            conn.close()
            raise
        try:  # once more, on a new connection
            return _exchange(conn, method, path, body, self.token, timeout_s)
        except BaseException:
            conn.close()
            raise

    def close_connections(self) -> None:
        """Close every kept-alive REST connection (stop does it too)."""
        with self._conns_lock:
            conns, self._conns = list(self._conns.values()), {}
        for conn in conns:
            conn.close()

    def describe(self) -> dict[str, Any]:
        """What network.json records under `controller`."""
        return {"rest_url": self.rest_url, "token": self.token,
                "token_file": str(self.token_file) if self.token_file else None,
                "openflow": f"tcp:127.0.0.1:{self.of_port}", "pid": self.proc.pid,
                "log": str(self.log_path)}

    def stop(self, kill: bool = False) -> None:
        self.close_connections()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def _dropped(conn: http.client.HTTPConnection) -> bool:
    """Whether an idle kept-alive connection was closed by the server (or has bytes
    nobody asked for): readable while no request is out."""
    sock = conn.sock
    if sock is None:
        return True
    poller = select.poll()  # not select(): a process may hold fds past FD_SETSIZE
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(0))


def _exchange(conn: http.client.HTTPConnection, method: str, path: str, body: Any,
              token: str | None, timeout_s: float) -> tuple[int, Any]:
    """One request and its whole answer on `conn` (left open for the next unless the
    server said `Connection: close`)."""
    data = None if body is None else (body if isinstance(body, bytes)
                                      else json.dumps(body).encode())
    headers = {"Connection": "keep-alive"}
    if data is not None:
        headers["Content-Type"] = "application/json"
    if token:
        headers["Authorization"] = f"Bearer {token}"
    conn.timeout = timeout_s
    if conn.sock is not None:
        conn.sock.settimeout(timeout_s)
    conn.request(method, path, body=data, headers=headers)
    resp = conn.getresponse()
    raw, status = resp.read(MAX_ANSWER_BYTES + 1), resp.status
    if len(raw) > MAX_ANSWER_BYTES:
        conn.close()
        raise OSError(f"the controller's answer to {method} {path} is over "
                      f"{MAX_ANSWER_BYTES >> 20} MiB")
    ctype = resp.getheader("Content-Type", "") or ""
    return status, (json.loads(raw) if "json" in ctype else raw.decode())


def _connection(url: str, timeout_s: float) -> http.client.HTTPConnection:
    parts = urlsplit(url)
    return http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port,
                                      timeout=timeout_s)


def rest_call(url: str, method: str, path: str, body: Any = None, token: str | None = None,
              timeout_s: float = 10.0) -> tuple[int, Any]:
    """One REST call on a connection of its own (ControllerProcess.request keeps one)."""
    conn = _connection(url, timeout_s)
    try:
        return _exchange(conn, method, urlsplit(url).path.rstrip("/") + path, body, token,
                         timeout_s)
    finally:
        conn.close()


def _kill(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)


def start_controller(spec: str | Path, db: str | Path, *, of_port: int | None = None,
                     rest_port: int | None = None, rest_host: str = "127.0.0.1",
                     layout: str | Path | None = None, token: str | None = None,
                     log_path: str | Path | None = None, timeout_s: float = 20.0,
                     verbose: int = 1, netns: str | None = None,
                     home_netns: str | None = None,
                     run_state: str | Path | None = None,
                     die_with_parent: bool = False) -> ControllerProcess:
    """Start the controller in a child process; return once GET /health answers.

    netns: namespace the OpenFlow listener goes to (the switches'); home_netns: the
    namespace the child starts in and REST clients use, if the caller's thread has
    moved elsewhere (as EmuNetwork's does). token: the REST bearer token (default: the
    controller generates one); either way it travels in a 0600 file next to `db`, never
    on the command line. of_port / rest_port None: the controller binds any free port
    itself and publishes it (never picked here and released). run_state: the emulation
    run's state directory, whose fibre controls are the only ones a layout may name.
    """
    log_path = Path(log_path or Path(db).with_suffix(".log"))
    address_file = Path(db).with_suffix(".rest.json")
    address_file.unlink(missing_ok=True)
    # REST: the controller binds it (rest_port None -> 0: any free port) and publishes it
    cmd = [sys.executable, "-m", "controllers.launcher", "--spec", str(spec), "--db", str(db),
           "--of-port", str(of_port or 0), "--rest", f"{rest_host}:{rest_port or 0}",
           "--address-file", str(address_file)]
    # A switch's replies come as slowly as everything else: wait in proportion to the
    # start-up time-out (5 s at the default 30 s; ~50 s in a software-emulated VM).
    cmd += ["--switch-timeout-s", f"{max(5.0, timeout_s / 6):.1f}"]
    cmd += ["-v"] * verbose
    if layout:
        cmd += ["--layout", str(layout)]
    if netns:
        cmd += ["--netns", netns]
    if run_state:
        cmd += ["--run-state", str(run_state)]
    env = dict(os.environ)
    if token:
        from controllers.tokenfile import write_secret

        tf = Path(db).with_suffix(".token")
        write_secret(tf, token)
        cmd += ["--token-file", str(tf)]
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    from testbed.metrics.process import for_life, pdeathsig_argv

    def spawn() -> subprocess.Popen[bytes]:
        # In the thread that forks (for_life's, with die_with_parent): a namespace is
        # entered by one thread, and the parent death signal follows the forking thread.
        argv = pdeathsig_argv() + cmd if die_with_parent else cmd
        with open(log_path, "ab") as logf, contextlib.ExitStack() as stack:
            if home_netns:
                from testbed.emu.netns import in_netns

                stack.enter_context(in_netns(home_netns))
            return subprocess.Popen(argv, stdout=logf, stderr=subprocess.STDOUT, env=env,
                                    cwd=root, start_new_session=True)
    proc = for_life(spawn) if die_with_parent else spawn()
    from testbed.emu.priority import raise_control_priority

    raise_control_priority(proc.pid)  # before it starts threads: they inherit it
    deadline = time.monotonic() + timeout_s
    while True:  # the addresses the controller bound (ports given, or any free ones)
        try:
            bound = json.loads(address_file.read_text())
            rest_port = int(bound["port"])
            of_port = int(bound["of_port"])
            token_file = Path(bound["token_file"])
            if not token:  # generated by the controller: its 0600 file
                token = token_file.read_text().strip()
            break
        except (OSError, ValueError, KeyError, TypeError):
            pass
        if proc.poll() is not None:
            raise RuntimeError(f"controller exited with {proc.returncode}: "
                               f"{log_path.read_text()[-2000:]}")
        if time.monotonic() > deadline:
            _kill(proc)
            raise RuntimeError(f"controller did not bind its REST port within "
                               f"{timeout_s:.0f} s (see {log_path})")
        time.sleep(0.02)
    cp = ControllerProcess(proc, f"http://{rest_host}:{rest_port}", of_port, token, log_path,
                           home_netns, request_timeout_s=max(10.0, timeout_s),
                           token_file=token_file)
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
    raise RuntimeError(f"controller did not come up: no answer on {cp.rest_url} within "
                       f"{timeout_s:.0f} s (see {log_path}; emulation.startup_timeout_s "
                       "sets this)")

