"""Start and stop a Prometheus server process: port bound by Prometheus, PID file, checks.

Prometheus binds its listen address itself, so nothing else can take the port between
a probe and the bind. After start the server must answer on that port *and* report our
own TSDB path (`/api/v1/status/flags`): a server already on the port (another user's
Prometheus) is never mistaken for ours. On "address already in use" the next port is
tried.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from testbed.atomicio import atomic_write_text
from testbed.errors import RuntimeFailure
from testbed.outdir import pid_alive

log = logging.getLogger(__name__)

PORT_TRIES = 20


@dataclass
class Started:
    """A running Prometheus: its process, port and URL."""

    proc: subprocess.Popen
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


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


def ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/-/ready", timeout=1) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError):
        return False


def _addr_in_use(log_path: Path) -> bool:
    text = log_path.read_text(errors="replace") if log_path.exists() else ""
    return "address already in use" in text.lower()


def launch(binary: str, args: Sequence[str], data_dir: Path, log_path: Path,
           ports: Sequence[int], *, host: str = "127.0.0.1",
           ready_timeout_s: float = 30.0, detach: bool = True) -> Started:
    """Start `binary args --storage.tsdb.path=data_dir --web.listen-address=host:port`
    on the first port of `ports` it can bind; wait until it is ready and ours."""
    last = ""
    for port in ports:
        argv = [binary, *args, f"--storage.tsdb.path={data_dir}",
                f"--web.listen-address={host}:{port}"]
        with open(log_path, "wb") as logf:
            proc = subprocess.Popen(argv, stdout=logf, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=detach)
        url = f"http://127.0.0.1:{port}"
        end = time.monotonic() + ready_timeout_s
        while time.monotonic() < end:
            if proc.poll() is not None:
                break
            if ready(url) and serves_tsdb(url, data_dir):
                log.info("prometheus ready at %s (pid %d)", url, proc.pid)
                return Started(proc, port)
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
        tail = log_path.read_text(errors="replace").strip().splitlines()[-1:]
        raise RuntimeFailure(f"prometheus exited with {proc.returncode}: "
                             f"{tail[0] if tail else '(no output)'} (log: {log_path})")
    raise RuntimeFailure(f"prometheus found no free port ({last}; tried {len(ports)})")


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
    return Path(exe).name.startswith("prometheus")


def stop_pid(pid: int, timeout_s: float = 15.0) -> bool:
    """SIGTERM (Prometheus flushes its head), then SIGKILL; True if it was running."""
    if not pid_alive(pid):
        return False
    os.kill(pid, signal.SIGTERM)
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        try:  # reap if it is our child
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return True
        except ChildProcessError:
            pass
        if not pid_alive(pid):
            return True
        time.sleep(0.1)
    os.kill(pid, signal.SIGKILL)
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass
    return True


def write_pidfile(path: Path, pid: int) -> None:
    atomic_write_text(path, f"{pid}\n")


def read_pidfile(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None
