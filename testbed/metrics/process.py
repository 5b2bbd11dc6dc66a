"""Start and stop a Prometheus server process: port bound by Prometheus, PID file, checks.

Prometheus binds its listen address itself, so nothing else can take the port between
a probe and the bind. After start the server must answer on that port *and* report our
own TSDB path (`/api/v1/status/flags`): a server already on the port (another user's
Prometheus) is never mistaken for ours. On "address already in use" the next port is
tried.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import logging
import os
import queue
import signal
import stat
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from testbed.errors import InputError, RuntimeFailure
from testbed.io.atomic import atomic_write_text

T = TypeVar("T")

log = logging.getLogger(__name__)

PORT_TRIES = 20


@dataclass
class Started:
    """A running Prometheus: its process, port and URL."""

    proc: subprocess.Popen
    port: int
    host: str = "127.0.0.1"

    @property
    def url(self) -> str:
        return url_for(self.host, self.port)


def host_port(host: str, port: int) -> str:
    """`host:port`, an IPv6 literal in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def url_for(host: str, port: int) -> str:
    """The URL that reaches a server listening on host:port from this machine: the
    address itself, or loopback for a wildcard (0.0.0.0 -> 127.0.0.1, :: -> ::1)."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return f"http://{host_port(host, port)}"
    if ip.is_unspecified:
        ip = ipaddress.ip_address("::1" if ip.version == 6 else "127.0.0.1")
    return f"http://{host_port(str(ip), port)}"


def open_log(path: Path) -> int:
    """Open (truncate) a log file for writing without following a symlink and only if
    it is a regular file (a planted FIFO or device is refused); the fd, mode 0640."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o640)
    except OSError as exc:
        raise RuntimeFailure(f"cannot open log {path} (not followed if a link): "
                             f"{exc.strerror}") from exc
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
        os.close(fd)
        raise RuntimeFailure(f"log {path} is not a regular file of this user; not written")
    os.ftruncate(fd, 0)
    os.set_blocking(fd, True)
    return fd


def http_json(url: str, timeout_s: float = 2.0) -> dict | None:
    """GET url and parse JSON; None when unreachable or not JSON."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as r:
            return json.loads(r.read())
    except (urllib.error.URLError, OSError, ValueError):
        return None


def serves_tsdb(url: str, data_dir: Path) -> bool:
    """Whether the Prometheus at url stores its data in data_dir (it is ours)."""
    body = http_json(f"{url}/api/v1/status/flags")
    if not body or body.get("status") != "success":
        return False
    path = body["data"].get("storage.tsdb.path", "")
    return Path(path).resolve() == Path(data_dir).resolve()


def _read_log(log_path: Path, max_bytes: int = 1 << 20) -> str:
    """The last max_bytes of a log LightPipe wrote (not through a link)."""
    try:
        fd = os.open(log_path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return ""
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return ""
        size = os.fstat(fd).st_size
        fh.seek(max(0, size - max_bytes))
        return fh.read(max_bytes).decode(errors="replace")


def ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/-/ready", timeout=1) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError):
        return False


def _addr_in_use(log_path: Path) -> bool:
    text = _read_log(log_path)
    return "address already in use" in text.lower()


def launch(binary: str, args: Sequence[str], data_dir: Path, log_path: Path,
           ports: Sequence[int], *, host: str = "127.0.0.1",
           ready_timeout_s: float = 30.0, detach: bool = True,
           user: tuple[int, int] | None = None, die_with_parent: bool = False) -> Started:
    """Start `binary args --storage.tsdb.path=data_dir --web.listen-address=host:port`
    on the first port of `ports` it can bind; wait until it is ready and ours.
    user: (uid, gid) to run it as (root only), with no supplementary groups.
    die_with_parent: the kernel sends the server SIGTERM when this process ends, also by
    SIGKILL (`setpriv --pdeathsig`, see pdeathsig_argv); for a server that no run state
    records, so that nothing else would stop it."""
    try:
        ipaddress.ip_address(host)  # "" would bind every interface
    except ValueError:
        raise InputError("--listen", f"{host!r} is not an IP address literal") from None
    ids = {} if user is None else {"user": user[0], "group": user[1], "extra_groups": []}
    last = ""
    for port in ports:
        argv = [binary, *args, f"--storage.tsdb.path={data_dir}",
                f"--web.listen-address={host_port(host, port)}"]

        def spawn(argv: list[str] = argv) -> subprocess.Popen[bytes]:
            logfd = open_log(log_path)
            try:
                return subprocess.Popen([*(pdeathsig_argv() if die_with_parent else []),
                                         *argv], stdout=logfd, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, start_new_session=detach,
                                        **ids)
            finally:
                os.close(logfd)
        proc = for_life(spawn) if die_with_parent else spawn()
        url = url_for(host, port)
        end = time.monotonic() + ready_timeout_s
        while time.monotonic() < end:
            if proc.poll() is not None:
                break
            if ready(url) and serves_tsdb(url, data_dir):
                log.info("prometheus ready at %s (pid %d)", url, proc.pid)
                return Started(proc, port, host)
            time.sleep(0.2)
        if proc.poll() is None:
            stop_pid(proc.pid)
            raise RuntimeFailure(f"prometheus did not become ready on port {port} within "
                                 f"{ready_timeout_s:.0f} s (log: {log_path})")
        proc.wait()
        if _addr_in_use(log_path):
            log.info("port %d in use; trying another", port)
            last = f"port {port} in use"
            continue
        tail = _read_log(log_path).strip().splitlines()[-1:]
        raise RuntimeFailure(f"prometheus exited with {proc.returncode}: "
                             f"{tail[0] if tail else '(no output)'} (log: {log_path})")
    raise RuntimeFailure(f"prometheus found no free port ({last}; tried {len(ports)})")


class _Keeper:
    """A thread that lives as long as the process and forks children for other threads
    (see for_life): their parent death signal then fires only when the process ends."""

    def __init__(self) -> None:
        self.jobs: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]]] = \
            queue.SimpleQueue()
        self.thread = threading.Thread(target=self._loop, name="lightpipe-life-parent",
                                       daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while True:  # never returns: the thread ends with the process
            fn, fut = self.jobs.get()
            if fut.set_running_or_notify_cancel():
                try:
                    fut.set_result(fn())
                except BaseException as exc:  # handed to the caller, who raises it
                    fut.set_exception(exc)

    def call(self, fn: Callable[[], T]) -> T:
        fut: Future[T] = Future()
        self.jobs.put((fn, fut))
        return fut.result()


_keeper: _Keeper | None = None
_keeper_lock = threading.Lock()


def _life_parent() -> bool:
    t = threading.current_thread()
    return t is threading.main_thread() or (_keeper is not None and t is _keeper.thread)


def for_life(fn: Callable[[], T]) -> T:
    """Run fn, which starts a child with pdeathsig_argv(), in a thread that lives as long
    as this process: the calling thread when it is the main one, else a keeper thread
    (made once, never ending). So a server restarted from a worker thread (a fault
    injector's controller or Prometheus restart) still ends with the process, not with
    that thread."""
    global _keeper
    if _life_parent():
        return fn()
    with _keeper_lock:
        if _keeper is None:
            _keeper = _Keeper()
    return _keeper.call(fn)


def pdeathsig_argv(signame: str = "TERM") -> list[str]:
    """The argv prefix that has the kernel signal the program when its parent ends.

    The parent death signal (prctl PR_SET_PDEATHSIG, kept across execve by setpriv of
    util-linux) fires when the *thread* that forked the child ends, so the caller must
    be a thread that lives as long as the process: the main thread, or for_life's keeper
    (fork inside for_life); anything else is refused (ValueError, a programming error).
    A parent killed between the fork and setpriv's prctl (a few milliseconds) leaves the
    child running: recorded state still matters."""
    import shutil

    if not _life_parent():
        raise ValueError("a parent death signal needs a parent thread that lives as long "
                         "as the process (the main thread, or testbed.metrics.process."
                         "for_life)")
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        raise RuntimeFailure("setpriv not found (apt-get install util-linux)")
    return [setpriv, f"--pdeathsig={signame}", "--"]


def port_candidates(first: int | None, tries: int = PORT_TRIES) -> list[int]:
    """first, first+1, ...; or `tries` ephemeral-range ports when first is None/0."""
    if not first:
        import random

        base = random.SystemRandom().randrange(20000, 60000)
        return [base + i for i in range(tries)]
    return [first + i for i in range(tries)]




def is_prometheus(pid: int) -> bool:
    """The process with this PID runs a prometheus binary (not a recycled PID)."""
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
    except OSError:
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
        except OSError:
            return False
        exe = cmd
    return Path(exe).name in ("prometheus", "prometheus (deleted)")


def start_ticks(pid: int) -> int | None:
    """Start time of a process in clock ticks since boot (/proc/PID/stat field 22), or
    None if it is gone: with the PID it names one process for good."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(text.rsplit(")", 1)[1].split()[19])  # fields after the command name


def cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def not_ours(pid: int, data_dir: Path, ticks: int | None) -> str | None:
    """Why process `pid` is not the Prometheus that LightPipe started with data_dir (and
    start time `ticks`, when recorded); None when it is. Never kill or signal a PID
    for which this returns a reason."""
    now = start_ticks(pid)
    if now is None:
        return f"process {pid} is gone"
    if ticks is not None and now != ticks:
        return f"process {pid} started at another time (a reused PID)"
    if not is_prometheus(pid):
        return f"process {pid} is not prometheus ({' '.join(cmdline(pid))[:80]!r})"
    want = f"--storage.tsdb.path={Path(data_dir).resolve()}"
    if want not in cmdline(pid):
        return f"process {pid} is a prometheus with another data directory"
    return None


def stop_pid(pid: int, timeout_s: float = 15.0, start: int | None = None) -> bool:
    """SIGTERM (Prometheus flushes its head), then SIGKILL; True if it was running.

    Both signals go through one pidfd, opened first and checked against `start` (the
    process's start time in clock ticks, when the caller verified one): a PID that is
    reused meanwhile gets nothing."""
    import select

    try:
        pfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return False
    try:
        if start is not None and start_ticks(pid) != start:
            return False  # not the process the caller verified
        try:
            signal.pidfd_send_signal(pfd, signal.SIGTERM)
        except ProcessLookupError:
            return False
        if not select.select([pfd], [], [], max(timeout_s, 0.0))[0]:  # readable: exited
            with contextlib.suppress(ProcessLookupError):  # it ended on its own
                signal.pidfd_send_signal(pfd, signal.SIGKILL)
            select.select([pfd], [], [], 5.0)
        try:  # reap it if it is our child
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        return True
    finally:
        os.close(pfd)


def write_pidfile(path: Path, pid: int) -> None:
    atomic_write_text(path, f"{pid}\n")


def read_pidfile(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None
