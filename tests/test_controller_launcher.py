"""The controller process's stop handler: closes its apps in the process itself, while a
child forked from it (pyroute2's NetNS does so for each namespace socket) just exits."""

from __future__ import annotations

import os
import signal
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from controllers.launcher import stop_handler
from tests.waiting import scaled


class _Server:
    """A real HTTP server on its own thread; close() = shutdown(), like the REST API's."""

    def __init__(self) -> None:
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()  # waits for serve_forever's thread: none in a forked child
        self.server.server_close()


def _wait_exit(pid: int, timeout_s: float) -> int | None:
    deadline = time.monotonic() + scaled(timeout_s)
    while time.monotonic() < deadline:
        got, status = os.waitpid(pid, os.WNOHANG)
        if got:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.02)
    return None


def test_forked_child_exits_on_sigterm_without_closing_the_apps() -> None:
    app = _Server()
    old = signal.signal(signal.SIGTERM, stop_handler(lambda: [app]))
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: what pyroute2's ChildProcess is when the SIGTERM comes
        try:
            os.close(ready_r)
            os.write(ready_w, b"1")  # in its loop now (readiness by a pipe, not a sleep)
            while True:
                time.sleep(0.05)
        finally:
            os._exit(99)
    code: int | None = None
    try:
        signal.signal(signal.SIGTERM, old)
        os.close(ready_w)
        assert os.read(ready_r, 1) == b"1"
        os.kill(pid, signal.SIGTERM)
        # a hang (None) is the failure: the deadline only bounds it
        code = _wait_exit(pid, 60.0)
        # 128 + SIGTERM: the handler saw it was not the controller itself and exited.
        # None: it ran the controller's close-down and hung in server.shutdown() (the
        # in-VM "POST /lightpaths never answers").
        assert code == 128 + signal.SIGTERM, code
    finally:
        signal.signal(signal.SIGTERM, old)
        if code is None:  # still there (hung): ours to end
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        app.close()
    os.close(ready_r)
    app.thread.join(scaled(60))
    assert not app.thread.is_alive()


def test_sigterm_as_interrupt_forked_child_just_exits() -> None:
    """A child forked inside a run (pyroute2's NetNS helper) and SIGTERMed exits at once,
    instead of raising KeyboardInterrupt and running the run's teardown there."""
    import os
    import signal
    import time

    from testbed.emu.network import sigterm_as_interrupt

    with sigterm_as_interrupt():
        ready_r, ready_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # child: wait to be terminated
            try:
                os.close(ready_r)
                os.write(ready_w, b"1")  # inside the try now
                time.sleep(scaled(300))
            finally:
                os._exit(3)  # reached only if SIGTERM raised here
        os.close(ready_w)
        assert os.read(ready_r, 1) == b"1"
        os.close(ready_r)
        os.kill(pid, signal.SIGTERM)
        _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 128 + signal.SIGTERM


def test_reserved_port_is_held_until_the_listener_binds_beside_it() -> None:
    """--of-port 0: the launcher binds a reservation socket; nobody else can take the port
    (a plain bind fails, and so does a listener with SO_REUSEADDR once os-ken listens),
    while os-ken's own listener (SO_REUSEADDR) binds and accepts beside it."""
    import socket

    from controllers.launcher import reserve_port

    held = reserve_port("127.0.0.1", 0)
    port = held.getsockname()[1]
    try:
        with socket.socket() as other:
            try:
                other.bind(("127.0.0.1", port))
                raise AssertionError("a plain bind took the reserved port")
            except OSError:
                pass
        with socket.socket() as listener:  # what os-ken's hub.listen does
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind(("127.0.0.1", port))
            listener.listen(5)
            with socket.create_connection(("127.0.0.1", port), timeout=5):
                conn, _ = listener.accept()
                conn.close()
            with socket.socket() as late:
                late.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    late.bind(("127.0.0.1", port))
                    late.listen(1)
                    raise AssertionError("a second listener took the port")
                except OSError:
                    pass
    finally:
        held.close()


def test_launcher_refuses_a_taken_openflow_port(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A port something listens on: exit 2 and a line naming the flag and port, at once
    (not a controller that hangs without a listener)."""
    import socket
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        taken = s.getsockname()[1]
        r = subprocess.run([sys.executable, "-m", "controllers.launcher", "--spec",
                            str(root / "scenarios" / "quickstart.yaml"), "--db",
                            str(tmp_path / "c.db"), "--rest", "127.0.0.1:0", "--of-port",
                            str(taken), "--address-file", str(tmp_path / "addr.json")],
                           capture_output=True, text=True, timeout=60, cwd=root)
    assert r.returncode == 2, r.stderr
    assert f"--of-port {taken}: cannot bind" in r.stderr and "in use" in r.stderr, r.stderr
    assert not (tmp_path / "addr.json").exists()
