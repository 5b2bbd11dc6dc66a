"""The long-lived Prometheus (`lightpipe monitor up|down|status`) and run registration.

One Prometheus, its data in a user-chosen directory, scrapes every emulation run that
registers with it: a run writes `targets/run-<run>.json` (file service discovery,
picked up within a second) naming its controller, link exporter, run exporter and
workers, each labelled `run` and `scenario`, and removes the file when it ends.
`up` starts it in the background; `up --foreground` runs it under a supervisor
(systemd) until SIGTERM/SIGINT, on a strict port.

Directory (``--dir``, else ``$LIGHTPIPE_MONITOR_DIR``, else /var/lib/lightpipe/prometheus
for root and ~/.local/share/lightpipe/prometheus otherwise)::

    prometheus.yml  targets/  data/  prometheus.pid  prometheus.log  monitor.json

Trust (docs/security.md): the directory and targets/ are 0750 (data/ 0700) and owned
by the running user whatever the umask, a given one that others can write is refused,
files are written atomically and the log without following links. Prometheus has no
lifecycle API; it is reloaded by SIGHUP and stopped by SIGTERM, each sent only to the
PID that monitor.json recorded, after checking its start time, binary and data
directory. As root it runs as the `prometheus` user where that user exists and can
reach the directory.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import stat
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from testbed.errors import InputError, RuntimeFailure
from testbed.io.atomic import atomic_write_json, atomic_write_text
from testbed.metrics import process
from testbed.metrics.prometheus import check_config_file, find_binary, scrape_config
from testbed.monitor import trust

log = logging.getLogger(__name__)

DEFAULT_PORT = 9090
DEFAULT_RETENTION = "30d"
RUN_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
STOP_TIMEOUT_S = 60.0


def _read_small(path: Path, max_bytes: int = 65536) -> str | None:
    """A small state file of ours: a regular file, not followed if a link."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid not in (os.geteuid(), 0):
            return None
        return fh.read(max_bytes).decode(errors="replace")


def default_dir() -> Path:
    env = os.environ.get("LIGHTPIPE_MONITOR_DIR")
    if env:
        return Path(env)
    if os.geteuid() == 0:
        return Path("/var/lib/lightpipe/prometheus")
    return Path.home() / ".local/share/lightpipe/prometheus"


@dataclass
class MonitorStatus:
    """What `monitor status` reports."""

    dir: Path
    running: bool
    pid: int | None = None
    url: str | None = None
    runs: tuple[str, ...] = ()
    detail: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"dir": str(self.dir), "running": self.running, "pid": self.pid,
                "url": self.url, "runs": list(self.runs), "detail": self.detail}


class Monitor:
    """The long-lived Prometheus whose state lives in `dir`."""

    def __init__(self, dir: Path | str | None = None) -> None:
        self.dir = Path(dir) if dir is not None else default_dir()
        self.targets_dir = self.dir / "targets"
        self.data_dir = self.dir / "data"
        self.config_path = self.dir / "prometheus.yml"
        self.pid_path = self.dir / "prometheus.pid"
        self.log_path = self.dir / "prometheus.log"
        self.info_path = self.dir / "monitor.json"

    # ---- state ------------------------------------------------------------------------
    def _pid(self) -> int | None:
        text = _read_small(self.pid_path)
        try:
            return int(text.strip()) if text else None
        except ValueError:
            return None

    def _info(self) -> dict[str, Any]:
        try:
            return dict(json.loads(_read_small(self.info_path) or ""))
        except (TypeError, ValueError):
            return {}

    def _not_ours(self, pid: int) -> str | None:
        """Why `pid` is not the Prometheus this directory started (None: it is)."""
        info = self._info()
        ticks = info.get("start_ticks") if info.get("pid") == pid else None
        return process.not_ours(pid, self.data_dir, ticks)

    def _registrations(self) -> list[Path]:
        """targets/run-*.json written by this user or root (others' are not trusted)."""
        out = []
        for p in sorted(self.targets_dir.glob("run-*.json")):
            try:
                st = os.lstat(p)
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode) and st.st_uid in (os.geteuid(), 0):
                out.append(p)
            else:
                log.warning("ignoring %s: not a regular file of this user or root", p)
        return out

    def status(self) -> MonitorStatus:
        pid = self._pid()
        runs = tuple(p.stem.removeprefix("run-") for p in self._registrations())
        if pid is None:
            return MonitorStatus(self.dir, False, runs=runs, detail="not started")
        why = self._not_ours(pid)
        if why is not None:
            return MonitorStatus(self.dir, False, pid, runs=runs,
                                 detail=f"stale PID file ({why})")
        url = self._info().get("url")
        if not url or not process.ready(url) or not process.serves_tsdb(url, self.data_dir):
            return MonitorStatus(self.dir, False, pid, url, runs,
                                 f"process {pid} runs but {url} does not answer as ours")
        return MonitorStatus(self.dir, True, pid, url, runs, "ready")

    # ---- preparing the directory ---------------------------------------------------------
    def check_dirs(self) -> None:
        """Refuse a directory (or targets/) that others may write (InputError)."""
        for d in (self.dir, self.targets_dir):
            if d.exists():
                trust.check_dir_stat(d, os.stat(d), "--dir")

    def _prepare(self, scrape_interval_s: float, retention: str, host: str
                 ) -> tuple[str, tuple[int, int] | None, str]:
        """Check the inputs, make the directories and the config; (binary, user, host)."""
        binary = find_binary("prometheus")
        if binary is None:
            raise RuntimeFailure("prometheus binary not found (apt-get install prometheus)")
        if not re.fullmatch(r"\d+[smhdwy]", retention):
            raise InputError("--retention", f"{retention!r} is not a duration like 30d")
        host = trust.check_listen(host)
        trust.make_parents(self.dir)
        user = trust.prometheus_user(self.dir)
        gid = user[1] if user else None
        dmode = 0o2750 if user else 0o750  # setgid: files inherit the server's group
        trust.safe_dir(self.dir, dmode, group=gid)
        trust.safe_dir(self.targets_dir, dmode, "--dir (targets/)", group=gid)
        self._data_dir(user)
        cfg = yaml.safe_dump(scrape_config(self.targets_dir.resolve(), scrape_interval_s),
                             sort_keys=False)
        atomic_write_text(self.config_path, cfg, mode=0o640)
        check_config_file(self.config_path)
        return binary, user, host

    def _data_dir(self, user: tuple[int, int] | None) -> None:
        """data/: 0700, the server's own (the prometheus user's when it runs as that)."""
        owners = {os.geteuid(), 0} | ({user[0]} if user else set())
        try:
            lst = os.lstat(self.data_dir)
        except FileNotFoundError:
            os.mkdir(self.data_dir, 0o700)
            os.chmod(self.data_dir, 0o700)
            lst = os.lstat(self.data_dir)
        if (not stat.S_ISDIR(lst.st_mode) or lst.st_uid not in owners
                or lst.st_mode & 0o022):
            raise InputError("--dir", f"{self.data_dir} is not a directory of this user "
                             "(or a link, or writable by others); refused")
        os.chmod(self.data_dir, 0o700)  # an older one was 0755
        if user:  # every file: blocks written while it ran as root included
            trust.chown_tree(self.data_dir, *user)

    def _record(self, started: process.Started, **extra: Any) -> None:
        pid = started.proc.pid
        process.write_pidfile(self.pid_path, pid)
        atomic_write_json(self.info_path, {
            "url": started.url, "port": started.port, "pid": pid,
            "start_ticks": process.start_ticks(pid), "data_dir": str(self.data_dir.resolve()),
            "listen": process.host_port(started.host, started.port), **extra,
            "started_unix_s": time.time()}, mode=0o640)
        try:
            os.chmod(self.pid_path, 0o644)
        except OSError:
            pass

    # ---- life cycle -------------------------------------------------------------------
    def up(self, port: int = DEFAULT_PORT, *, scrape_interval_s: float = 1.0,
           retention: str = DEFAULT_RETENTION, host: str = "127.0.0.1") -> MonitorStatus:
        """Start the server in the background (or return the running one's status, after
        a reload by SIGHUP if its configuration changed). On a taken port the next
        ones are tried."""
        if self.dir.exists():
            self.check_dirs()
        if self.targets_dir.exists():
            self.prune()
        st = self.status()
        if st.running:
            self._reload_if_changed(st, scrape_interval_s)
            return st
        binary, user, host = self._prepare(scrape_interval_s, retention, host)
        started = process.launch(
            binary, self._args(retention), self.data_dir.resolve(), self.log_path,
            process.port_candidates(port), host=host, user=user)
        self._record(started, scrape_interval_s=scrape_interval_s, retention=retention,
                     user=user[0] if user else os.geteuid())
        return self.status()

    def _args(self, retention: str) -> list[str]:
        # No --web.enable-lifecycle: any local user could POST /-/quit or /-/reload.
        return [f"--config.file={self.config_path.resolve()}",
                f"--storage.tsdb.retention.time={retention}"]

    def _reload_if_changed(self, st: MonitorStatus, scrape_interval_s: float) -> None:
        cfg = yaml.safe_dump(scrape_config(self.targets_dir.resolve(), scrape_interval_s),
                             sort_keys=False)
        if _read_small(self.config_path) == cfg:
            return
        atomic_write_text(self.config_path, cfg, mode=0o640)
        check_config_file(self.config_path)
        assert st.pid is not None
        self.reload(st.pid)

    def reload(self, pid: int | None = None) -> int:
        """SIGHUP (re-read prometheus.yml) to our verified server; its PID."""
        pid = self._pid() if pid is None else pid
        why = "no PID file" if pid is None else self._not_ours(pid)
        if why is not None or pid is None:
            raise RuntimeFailure(f"not reloading: {why}")
        os.kill(pid, signal.SIGHUP)
        log.info("prometheus (pid %d) reloads %s", pid, self.config_path)
        return pid

    def down(self) -> bool:
        """Stop our server (SIGTERM, verified PID); True if one was running. A PID file
        that names another process is removed and RuntimeFailure says why."""
        pid = self._pid()
        if pid is None:
            return False
        why = self._not_ours(pid)
        if why is not None:
            self.pid_path.unlink(missing_ok=True)
            if process.start_ticks(pid) is None:
                return False  # gone: a stale PID file
            raise RuntimeFailure(f"not stopping pid {pid} named by {self.pid_path}: {why}; "
                                 "removed that PID file")
        # The start time verified above goes with the signal (pidfd): no reused PID.
        stopped = process.stop_pid(pid, start=process.start_ticks(pid))
        self.pid_path.unlink(missing_ok=True)
        return stopped

    def foreground(self, port: int = DEFAULT_PORT, *, scrape_interval_s: float = 1.0,
                   retention: str = DEFAULT_RETENTION, host: str = "127.0.0.1",
                   ready_timeout_s: float | None = None,
                   on_ready: Callable[[MonitorStatus], None] | None = None) -> int:
        """Run the server until it exits or SIGTERM/SIGINT stops it (forwarded to it;
        SIGHUP is forwarded too: a reload); its exit status (128+N for signal N).
        The port is strict: a taken one is an InputError naming its holder."""
        if not 1 <= port <= 65535:
            raise InputError("--port", f"{port}: --foreground needs a fixed port (1-65535)")
        if self.dir.exists():
            self.check_dirs()
        st = self.status()
        if st.running:
            raise RuntimeFailure(f"a monitor already runs in {self.dir} (pid {st.pid}, "
                                 f"{st.url}); `lightpipe monitor down --dir {self.dir}` first")
        binary, user, host = self._prepare(scrape_interval_s, retention, host)
        if self.targets_dir.exists():
            self.prune()
        holder = trust.port_holder(host, port)
        if holder is not None:
            raise InputError("--port", f"{process.host_port(host, port)} is taken by "
                             f"{holder}; not trying another port (--foreground)")
        if ready_timeout_s is None:
            from testbed.envprobe import startup_timeout_s

            ready_timeout_s = 4 * startup_timeout_s()
        got: list[int] = []
        proc: subprocess.Popen | None = None

        def forward(signum: int, _frame: object) -> None:
            got.append(signum)
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGHUP if signum == signal.SIGHUP else signal.SIGTERM)

        old = {s: signal.signal(s, forward)
               for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
        try:
            logfd = process.open_log(self.log_path)
            try:
                ids = {} if user is None else {"user": user[0], "group": user[1],
                                               "extra_groups": []}
                argv = [binary, *self._args(retention),
                        f"--storage.tsdb.path={self.data_dir.resolve()}",
                        f"--web.listen-address={process.host_port(host, port)}"]
                proc = subprocess.Popen(argv, stdout=logfd, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, start_new_session=True,
                                        **ids)
            finally:
                os.close(logfd)
            started = process.Started(proc, port, host)
            self._record(started, scrape_interval_s=scrape_interval_s, retention=retention,
                         user=user[0] if user else os.geteuid(), foreground=True,
                         supervisor_pid=os.getpid())
            if got:  # a signal came before the server existed
                proc.terminate()
            if self._wait_ready(proc, started.url, ready_timeout_s, got) and on_ready:
                on_ready(self.status())
            code = proc.wait()  # a signal meanwhile is forwarded by `forward`
        finally:
            if proc is not None and proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(STOP_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    self._kill(proc)
            for s, h in old.items():
                signal.signal(s, h)
            if proc is not None and self._pid() == proc.pid:
                self.pid_path.unlink(missing_ok=True)
        level = logging.INFO if code == 0 else logging.WARNING
        log.log(level, "prometheus (pid %d) exited with %d", proc.pid, code)
        return 128 - code if code < 0 else code

    def _wait_ready(self, proc: subprocess.Popen, url: str, timeout_s: float,
                    got: list[int]) -> bool:
        end = time.monotonic() + timeout_s
        while time.monotonic() < end and not got and proc.poll() is None:
            if process.ready(url) and process.serves_tsdb(url, self.data_dir):
                log.info("prometheus ready at %s (pid %d)", url, proc.pid)
                return True
            time.sleep(0.2)
        if not got and proc.poll() is None:
            log.error("prometheus did not become ready at %s within %.0f s (log: %s)",
                      url, timeout_s, self.log_path)
            proc.terminate()
        return False

    @staticmethod
    def _kill(proc: subprocess.Popen) -> int:
        log.warning("prometheus (pid %d) did not stop within %.0f s: SIGKILL", proc.pid,
                    STOP_TIMEOUT_S)
        proc.kill()
        return proc.wait()

    # ---- runs ---------------------------------------------------------------------------
    def register(self, run_id: str, groups: Iterable[tuple[str, Mapping[str, str]]]) -> Path:
        """Write the run's file_sd targets ([(host:port, labels)]); returns the file."""
        check_run_id(run_id)
        self.check_dirs()
        path = self.targets_dir / f"run-{run_id}.json"
        owner = self.targets_dir / f"run-{run_id}.owner"  # not *.json: Prometheus skips it
        if not os.path.lexists(owner):
            self.prune()
            atomic_write_text(owner, f"{os.getpid()} {process.start_ticks(os.getpid())}\n",
                              mode=0o640)
        atomic_write_text(path, json.dumps([{"targets": [addr], "labels": dict(labels)}
                                            for addr, labels in groups], indent=1),
                          mode=0o640)
        return path

    def unregister(self, run_id: str) -> None:
        check_run_id(run_id)
        (self.targets_dir / f"run-{run_id}.json").unlink(missing_ok=True)
        (self.targets_dir / f"run-{run_id}.owner").unlink(missing_ok=True)

    def prune(self) -> list[str]:
        """Remove registrations whose run process is gone (killed runs); their ids.
        Only files of this user or root are read; others are left alone."""
        gone = []
        for owner in sorted(self.targets_dir.glob("run-*.owner")):
            text = _read_small(owner)
            if text is None:
                continue
            fields = text.split()
            try:
                pid = int(fields[0])
                ticks = int(fields[1]) if len(fields) > 1 and fields[1] != "None" else None
            except (ValueError, IndexError):
                pid, ticks = None, None
            now = process.start_ticks(pid) if pid else None
            if now is None or (ticks is not None and now != ticks):
                run_id = owner.name.removeprefix("run-").removesuffix(".owner")
                (self.targets_dir / f"run-{run_id}.json").unlink(missing_ok=True)
                owner.unlink(missing_ok=True)
                gone.append(run_id)
        return gone


def check_run_id(run_id: str) -> str:
    if not RUN_ID_RE.match(run_id):
        raise InputError("run", f"run id {run_id!r} must be letters, digits, '.', '_' or '-'")
    return run_id


def running_monitor(dir: Path | str | None = None) -> Monitor | None:
    """The long-lived monitor if one is up in `dir` (default dir), else None."""
    mon = Monitor(dir)
    if not os.path.lexists(mon.pid_path):
        return None
    try:
        mon.check_dirs()
    except InputError as exc:
        log.warning("not registering with the monitor in %s: %s", mon.dir, exc)
        return None
    return mon if mon.status().running else None
