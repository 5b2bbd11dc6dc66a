"""The controller process's stop handler: closes its apps in the process itself, while a
child forked from it (pyroute2's NetNS does so for each namespace socket) just exits."""

from __future__ import annotations

import os
import signal
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from controllers.launcher import stop_handler


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
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got, status = os.waitpid(pid, os.WNOHANG)
        if got:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.02)
    return None


def test_forked_child_exits_on_sigterm_without_closing_the_apps() -> None:
    app = _Server()
    old = signal.signal(signal.SIGTERM, stop_handler(lambda: [app]))
    pid = os.fork()
    if pid == 0:  # the child: what pyroute2's ChildProcess is when the SIGTERM comes
        try:
            while True:
                time.sleep(0.05)
        finally:
            os._exit(99)
    code: int | None = None
    try:
        signal.signal(signal.SIGTERM, old)
        time.sleep(0.1)
        os.kill(pid, signal.SIGTERM)
        code = _wait_exit(pid, 10.0)
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
    assert app.thread.join(5) is None and not app.thread.is_alive()


def test_sigterm_as_interrupt_forked_child_just_exits() -> None:
    """A child forked inside a run (pyroute2's NetNS helper) and SIGTERMed exits at once,
    instead of raising KeyboardInterrupt and running the run's teardown there."""
    import os
    import signal
    import time

    from testbed.emu.network import sigterm_as_interrupt

    with sigterm_as_interrupt():
        pid = os.fork()
        if pid == 0:  # child: wait to be terminated
            try:
                time.sleep(30)
            finally:
                os._exit(3)  # reached only if SIGTERM raised here
        time.sleep(0.2)
        os.kill(pid, signal.SIGTERM)
        _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 128 + signal.SIGTERM
