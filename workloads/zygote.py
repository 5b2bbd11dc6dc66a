"""A fork server for pipeline workers: PyTorch is imported once, each worker is a fork.

Importing torch costs ~2.5 s of CPU here and ~38 s in a software-emulated VM; a run of
8 workers paid it 8 times, all at once, on 2 cores. The launcher starts one zygote
(`python -m workloads.zygote --control-fd N`), which imports torch and the worker module
and then, per request on its control socket, forks a worker: the child starts a session of
its own, enters the host's network namespace (the setns(2) of `mnexec -a PID`), takes its
log as stdout/stderr, its working directory and environment, and runs
`workloads.worker.main(argv)`. The zygote reaps its children and reports each exit status;
the launcher holds a pidfd of every child (sent with the reply, opened before the child
could be reaped), so a signal can only reach that process, never a reused PID.

Control messages are JSON datagrams (SOCK_SEQPACKET), descriptors as SCM_RIGHTS:
  launcher -> zygote  {"spawn": {"argv": [...], "env": {...}, "cwd": "...",
                       "netns": "/proc/PID/ns/net" | null}}  fds: log, then passed ones;
                      an argv item "@fd:N" becomes the number of the N-th passed fd
  zygote -> launcher  {"ready": pid} once;  {"pid": P} with fds: pidfd, or
                      {"error": "..."};  {"exit": P, "code": C} (C < 0: killed by signal -C)
The zygote exits when the launcher closes its end (or dies: the kernel closes it) and
its last child has exited, so a launcher that crashed leaves no zygote behind its workers.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 1 << 20
MAX_FDS = 8
CLONE_NEWNET = 0x40000000
ENV = "LIGHTPIPE_WORKER_ZYGOTE"
"""0 turns the fork server off: every worker is its own `python -m workloads.worker`."""


def enabled() -> bool:
    return os.environ.get(ENV, "1") != "0"


def netns_of_prefix(prefix: tuple[str, ...]) -> str | bool | None:
    """The network namespace a host's argv prefix enters: None for no prefix (this one),
    '/proc/PID/ns/net' for `mnexec -a PID`; False for any other prefix (not forkable)."""
    if not prefix:
        return None
    if len(prefix) == 3 and Path(prefix[0]).name == "mnexec" and prefix[1] == "-a" \
            and prefix[2].isdigit():
        return f"/proc/{int(prefix[2])}/ns/net"
    return False


# -- the server -----------------------------------------------------------------------------
def _libc() -> Any:
    return ctypes.CDLL(None, use_errno=True)


def _send(sock: socket.socket, msg: dict[str, Any], fds: list[int] | None = None) -> None:
    data = json.dumps(msg).encode()
    if fds:
        socket.send_fds(sock, [data], fds)
    else:
        sock.send(data)


def _child(sock: socket.socket, req: dict[str, Any], fds: list[int]) -> None:
    """In the forked child: become the worker, never return."""
    code = 1
    try:
        os.setsid()
        # (signal dispositions stay a fresh interpreter's, as the zygote is one: SIGPIPE
        # and SIGXFSZ ignored, so a peer that hangs up is an EPIPE error and not a death;
        # the user-path guest's workers died of SIGPIPE while Prometheus timed out scrapes)
        sock.close()
        log_fd, passed = fds[0], fds[1:]
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        os.close(null)
        os.close(log_fd)
        netns = req.get("netns")
        if netns:
            fd = os.open(str(netns), os.O_RDONLY | os.O_CLOEXEC)
            if _libc().setns(fd, CLONE_NEWNET) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"setns {netns}: {os.strerror(err)}")
            os.close(fd)
        os.chdir(str(req["cwd"]))
        os.environ.clear()
        os.environ.update({str(k): str(v) for k, v in req["env"].items()})
        argv = [str(passed[int(a[4:])]) if str(a).startswith("@fd:") else str(a)
                for a in req["argv"]]
        for fd in passed:
            os.set_inheritable(fd, True)
        import workloads.worker as worker

        root = logging.getLogger()
        for h in list(root.handlers):  # the zygote's: the worker configures its own
            root.removeHandler(h)
        worker.T_IMPORT0 = time.monotonic()  # this process's start, as a fresh one's
        sys.argv = ["workloads.worker", *argv]
        code = worker.main(argv)
    except SystemExit as exc:  # argparse
        code = exc.code if isinstance(exc.code, int) else 2
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _status(raw: int) -> int:
    return -os.WTERMSIG(raw) if os.WIFSIGNALED(raw) else os.WEXITSTATUS(raw)


def serve(sock: socket.socket) -> int:
    """Import what workers need, then fork one per request until the launcher hangs up."""
    import torch  # (the import every worker shares)
    import torch.distributed  # noqa: F401

    import workloads.compute  # (and what a worker's run() imports)
    import workloads.executor
    import workloads.metrics
    import workloads.shadow
    import workloads.worker  # noqa: F401

    threads = len(os.listdir("/proc/self/task"))
    if threads > 1:  # a fork copies only the forking thread: say so in the log
        log.warning("zygote: %d threads after the imports", threads)
    children: dict[int, int] = {}  # pid -> pidfd (readable once it exits: reaped at once)
    _send(sock, {"ready": os.getpid()})
    open_ = True
    while open_ or children:
        watched = ([sock] if open_ else []) + list(children.values())
        readable, _, _ = select.select(watched, [], [], 5.0)
        if open_ and sock in readable:
            try:
                data, fds, _flags, _addr = socket.recv_fds(sock, MAX_MESSAGE_BYTES, MAX_FDS)
            except OSError:
                data, fds = b"", []
            if not data:
                open_ = False  # the launcher is gone or done: reap what is left, then exit
                for fd in fds:
                    os.close(fd)
            else:
                _spawn(sock, data, fds, children)
        for pid, pidfd in list(children.items()):
            try:
                got, raw = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                got, raw = pid, 0
            if got == 0:
                continue
            os.close(pidfd)
            del children[pid]
            if open_:
                with contextlib.suppress(OSError):
                    _send(sock, {"exit": pid, "code": _status(raw)})
    return 0


def _spawn(sock: socket.socket, data: bytes, fds: list[int], children: dict[int, int]) -> None:
    try:
        req = json.loads(data)["spawn"]
        if not fds:
            raise ValueError("no log descriptor")
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
    except (ValueError, KeyError, TypeError, OSError) as exc:
        for fd in fds:
            os.close(fd)
        _send(sock, {"error": f"{type(exc).__name__}: {exc}"})
        return
    if pid == 0:
        for other in children.values():  # (the other workers' pidfds)
            os.close(other)
        _child(sock, req, fds)
    for fd in fds:
        os.close(fd)
    pidfd = os.pidfd_open(pid)  # before any waitpid: the PID cannot be reused meanwhile
    children[pid] = pidfd
    _send(sock, {"pid": pid}, [pidfd])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--control-fd", type=int, required=True)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s zygote %(message)s")
    sock = socket.socket(fileno=args.control_fd)
    return serve(sock)


# -- the launcher's side --------------------------------------------------------------------
class Zygote:
    """The launcher's handle on its fork server (started with start(); close() ends it)."""

    def __init__(self, python: str, env: dict[str, str], cwd: Path, log_path: Path,
                 ready_timeout_s: float) -> None:
        self.python, self.env, self.cwd = python, env, cwd
        self.log_path, self.ready_timeout_s = log_path, ready_timeout_s
        self.sock: socket.socket | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.procs: dict[int, ZygoteProc] = {}
        self._exits = 0
        self._lock = threading.RLock()

    def start(self) -> Zygote:
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            with open(self.log_path, "ab") as logf:
                self.proc = subprocess.Popen(
                    [self.python, "-m", "workloads.zygote", "--control-fd", str(theirs.fileno())],
                    stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT,
                    env=self.env, cwd=self.cwd, pass_fds=(theirs.fileno(),),
                    start_new_session=True)
        finally:
            theirs.close()
        self.sock = mine
        msg, _ = self._recv(self.ready_timeout_s)
        if msg is None or "ready" not in msg:
            self.close()
            raise RuntimeError(f"worker zygote did not start (see {self.log_path})")
        log.info("worker zygote pid %d ready", self.proc.pid)
        return self

    def _recv(self, timeout_s: float | None) -> tuple[dict[str, Any] | None, list[int]]:
        assert self.sock is not None
        r, _, _ = select.select([self.sock], [], [], timeout_s)
        if not r:
            return None, []
        try:
            data, fds, _flags, _addr = socket.recv_fds(self.sock, MAX_MESSAGE_BYTES, MAX_FDS)
        except OSError:
            data, fds = b"", []
        if not data:
            self._lost()
            return None, fds
        return json.loads(data), fds

    def _lost(self) -> None:
        """The zygote is gone: what it had not reported is reported as lost (-9)."""
        for p in self.procs.values():
            if p.returncode is None:
                p.returncode = -signal.SIGKILL
                p.close_pidfd()

    def _handle(self, msg: dict[str, Any]) -> None:
        if "exit" in msg:
            p = self.procs.get(int(msg["exit"]))
            if p is not None and p.returncode is None:
                p.returncode = int(msg["code"])
                self._exits += 1
                p.exit_seq = self._exits
                p.close_pidfd()

    def pump(self, timeout_s: float = 0.0) -> None:
        """Read the exit reports waiting (up to timeout_s for the first)."""
        with self._lock:
            if self.sock is None:
                return
            wait: float | None = timeout_s
            while True:
                msg, fds = self._recv(wait)
                for fd in fds:
                    os.close(fd)
                if msg is None:
                    return
                self._handle(msg)
                wait = 0.0

    def spawn(self, argv: list[str], env: dict[str, str], cwd: Path, log_fd: int,
              pass_fds: tuple[int, ...], netns: str | None) -> ZygoteProc:
        """Fork a worker running workloads.worker.main(argv)."""
        with self._lock:
            assert self.sock is not None
            _send(self.sock, {"spawn": {"argv": argv, "env": env, "cwd": str(cwd),
                                        "netns": netns}}, [log_fd, *pass_fds])
            end = time.monotonic() + self.ready_timeout_s
            while True:
                msg, fds = self._recv(max(0.0, end - time.monotonic()))
                if msg is None:
                    for fd in fds:
                        os.close(fd)
                    raise RuntimeError("worker zygote did not answer a spawn request")
                if "pid" in msg and fds:
                    proc = ZygoteProc(self, int(msg["pid"]), fds[0])
                    for fd in fds[1:]:
                        os.close(fd)
                    self.procs[proc.pid] = proc
                    return proc
                for fd in fds:
                    os.close(fd)
                if "error" in msg:
                    raise RuntimeError(f"worker zygote: {msg['error']}")
                self._handle(msg)

    def close(self, timeout_s: float = 10.0) -> None:
        """Hang up; the zygote reaps what is left and exits (killed if it does not)."""
        with self._lock:
            if self.sock is not None:
                self.sock.close()
                self.sock = None
        if self.proc is not None:
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class ZygoteProc:
    """A worker forked by the zygote, with the methods the launcher's supervision uses
    (pid, returncode, poll, wait, send_signal, terminate, kill)."""

    def __init__(self, zygote: Zygote, pid: int, pidfd: int) -> None:
        self.zygote, self.pid, self._pidfd = zygote, pid, pidfd
        self.returncode: int | None = None
        self.exit_seq = 0
        """1, 2, ...: the order in which the zygote reaped its workers (0: running)."""

    def close_pidfd(self) -> None:
        with self.zygote._lock:
            if self._pidfd >= 0:
                os.close(self._pidfd)
                self._pidfd = -1

    def poll(self) -> int | None:
        if self.returncode is None:
            self.zygote.pump()
        return self.returncode

    def exited_unreported(self) -> bool:
        """True when the process has exited (its pidfd is readable) but the zygote has not
        reported its status yet."""
        with self.zygote._lock:  # (see send_signal: no pump closes the pidfd meanwhile)
            if self.returncode is not None or self._pidfd < 0:
                return False
            readable, _, _ = select.select([self._pidfd], [], [], 0)
            return bool(readable)

    def wait(self, timeout: float | None = None) -> int:
        end = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            left = 0.2 if end is None else min(0.2, end - time.monotonic())
            if left <= 0:
                raise subprocess.TimeoutExpired(f"worker {self.pid}", timeout or 0.0)
            self.zygote.pump(left)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        """Signal this process through its pidfd (never a reused PID); nothing once it
        has exited (as subprocess.Popen).

        Checked and sent under the zygote's lock: the launcher's supervision pumps the
        zygote on its own thread while a fault injector's thread signals, and a pump that
        took this worker's exit report in between closed the pidfd, so the send raised
        EBADF (or, its number reused by the next descriptor opened, signalled another
        process)."""
        with self.zygote._lock:
            if self.poll() is not None or self._pidfd < 0:
                return
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self._pidfd, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


if __name__ == "__main__":
    sys.exit(main())
