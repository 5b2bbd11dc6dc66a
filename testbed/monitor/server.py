"""The long-lived Prometheus (`lightpipe monitor up|down|status`) and run registration.

One Prometheus, its data in a user-chosen directory, scrapes every emulation run that
registers with it: a run writes `targets/run-<run>.json` (file service discovery,
picked up within a second) naming its controller, link exporter, run exporter and
workers, each labelled `run` and `scenario`, and removes the file when it ends.

Directory (``--dir``, else ``$LIGHTPIPE_MONITOR_DIR``, else /var/lib/lightpipe/prometheus
for root and ~/.local/share/lightpipe/prometheus otherwise)::

    prometheus.yml  targets/  data/  prometheus.pid  prometheus.log  monitor.json
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from testbed.atomicio import atomic_write_json, atomic_write_text
from testbed.errors import InputError, RuntimeFailure
from testbed.metrics import process
from testbed.metrics.prometheus import find_binary, scrape_config

log = logging.getLogger(__name__)

DEFAULT_PORT = 9090
DEFAULT_RETENTION = "30d"
RUN_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


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

    # ---- life cycle -------------------------------------------------------------------
    def status(self) -> MonitorStatus:
        pid = process.read_pidfile(self.pid_path)
        runs = tuple(sorted(p.stem.removeprefix("run-")
                            for p in self.targets_dir.glob("run-*.json")))
        if pid is None:
            return MonitorStatus(self.dir, False, runs=runs, detail="not started")
        if not (process.pid_alive(pid) and process.is_prometheus(pid)):
            return MonitorStatus(self.dir, False, pid, runs=runs,
                                 detail=f"stale PID file (process {pid} is gone)")
        info = self._info()
        url = info.get("url")
        if not url or not process.ready(url) or not process.serves_tsdb(url, self.data_dir):
            return MonitorStatus(self.dir, False, pid, url, runs,
                                 f"process {pid} runs but {url} does not answer as ours")
        return MonitorStatus(self.dir, True, pid, url, runs, "ready")

    def _info(self) -> dict[str, Any]:
        try:
            return dict(json.loads(self.info_path.read_text()))
        except (OSError, ValueError):
            return {}

    def up(self, port: int = DEFAULT_PORT, *, scrape_interval_s: float = 1.0,
           retention: str = DEFAULT_RETENTION, host: str = "127.0.0.1") -> MonitorStatus:
        """Start the server (or return the running one's status)."""
        if self.targets_dir.exists():
            self.prune()
        st = self.status()
        if st.running:
            return st
        binary = find_binary("prometheus")
        if binary is None:
            raise RuntimeFailure("prometheus binary not found (apt-get install prometheus)")
        if not re.fullmatch(r"\d+[smhdwy]", retention):
            raise InputError("--retention", f"{retention!r} is not a duration like 30d")
        if host not in ("127.0.0.1", "0.0.0.0", "localhost"):
            raise InputError("--listen", f"{host!r}: use 127.0.0.1 or 0.0.0.0")
        for d in (self.targets_dir, self.data_dir):
            d.mkdir(parents=True, exist_ok=True)
        cfg = scrape_config(self.targets_dir.resolve(), scrape_interval_s)
        atomic_write_text(self.config_path, yaml.safe_dump(cfg, sort_keys=False))
        from testbed.metrics.prometheus import check_config_file

        check_config_file(self.config_path)
        started = process.launch(
            binary, [f"--config.file={self.config_path}",
                     f"--storage.tsdb.retention.time={retention}", "--web.enable-lifecycle"],
            self.data_dir.resolve(), self.log_path, process.port_candidates(port), host=host)
        process.write_pidfile(self.pid_path, started.proc.pid)
        atomic_write_json(self.info_path, {
            "url": started.url, "port": started.port, "pid": started.proc.pid,
            "data_dir": str(self.data_dir.resolve()), "listen": f"{host}:{started.port}",
            "scrape_interval_s": scrape_interval_s, "retention": retention,
            "started_unix_s": time.time()})
        return self.status()

    def down(self) -> bool:
        """Stop the server by its PID file; True if one was running."""
        pid = process.read_pidfile(self.pid_path)
        stopped = False
        if pid is not None and process.pid_alive(pid) and process.is_prometheus(pid):
            stopped = process.stop_pid(pid)
        self.pid_path.unlink(missing_ok=True)
        return stopped

    # ---- runs ---------------------------------------------------------------------------
    def register(self, run_id: str, groups: Iterable[tuple[str, Mapping[str, str]]]) -> Path:
        """Write the run's file_sd targets ([(host:port, labels)]); returns the file."""
        check_run_id(run_id)
        self.targets_dir.mkdir(parents=True, exist_ok=True)
        path = self.targets_dir / f"run-{run_id}.json"
        owner = self.targets_dir / f"run-{run_id}.owner"  # not *.json: Prometheus skips it
        if not owner.exists():
            self.prune()
            atomic_write_text(owner, f"{os.getpid()}\n")
        atomic_write_text(path, json.dumps([{"targets": [addr], "labels": dict(labels)}
                                            for addr, labels in groups], indent=1))
        return path

    def unregister(self, run_id: str) -> None:
        check_run_id(run_id)
        (self.targets_dir / f"run-{run_id}.json").unlink(missing_ok=True)
        (self.targets_dir / f"run-{run_id}.owner").unlink(missing_ok=True)

    def prune(self) -> list[str]:
        """Remove registrations whose run process is gone (killed runs); their ids."""
        gone = []
        for owner in self.targets_dir.glob("run-*.owner"):
            pid = process.read_pidfile(owner)
            if pid is None or not process.pid_alive(pid):
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
    if not mon.pid_path.exists():
        return None
    return mon if mon.status().running else None
