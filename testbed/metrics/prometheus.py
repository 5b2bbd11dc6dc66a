"""Runs the Debian/Ubuntu `prometheus` binary by hand for one run, data in the run dir.

The scrape config is generated, checked with `promtool check config`, and uses file
service discovery (`targets/*.json`), so targets (workers, link emulators, the
controller) can be added while the server runs; Prometheus picks file changes up
within about a second. The server listens on 127.0.0.1 only (on a port it binds
itself, testbed.metrics.process), has no lifecycle API and is stopped by its PID.
"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path

import yaml

from testbed.errors import InputError, RuntimeFailure
from testbed.io.atomic import atomic_write_text

log = logging.getLogger(__name__)


def find_binary(name: str = "prometheus") -> str | None:
    return shutil.which(name)


def scrape_config(targets_dir: Path, scrape_interval_s: float = 1.0) -> dict:
    """The prometheus.yml content: one file_sd job reading targets_dir/*.json."""
    interval = f"{max(1, round(scrape_interval_s * 1000))}ms"
    return {
        "global": {"scrape_interval": interval, "evaluation_interval": interval,
                   "scrape_timeout": interval},
        "scrape_configs": [{
            "job_name": "lightpipe",
            "honor_labels": True,
            "file_sd_configs": [{"files": [str(targets_dir / "*.json")],
                                 "refresh_interval": "1s"}],
        }],
    }


def check_config_file(path: Path) -> None:
    """Validate a prometheus.yml with promtool; raise RuntimeFailure with its message."""
    promtool = find_binary("promtool")
    if promtool is None:
        raise RuntimeFailure("promtool not found (install the prometheus package)")
    res = subprocess.run([promtool, "check", "config", str(path)],
                         capture_output=True, text=True, timeout=60)
    if res.returncode != 0:
        raise RuntimeFailure(f"promtool rejected {path}: {(res.stderr or res.stdout).strip()}")


class PrometheusServer:
    """One Prometheus server for one run; a context manager."""

    def __init__(self, run_dir: Path, *, port: int | None = None,
                 scrape_interval_s: float = 1.0, binary: str | None = None,
                 retention: str = "15d", die_with_parent: bool = False) -> None:
        self.dir = Path(run_dir) / "prometheus"
        self.targets_dir = self.dir / "targets"
        self.data_dir = self.dir / "data"
        self.config_path = self.dir / "prometheus.yml"
        self.port = port
        self.scrape_interval_s = scrape_interval_s
        self.binary = binary or find_binary("prometheus")
        self.retention = retention
        self.die_with_parent = die_with_parent  # see testbed.metrics.process.launch
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def write_config(self) -> Path:
        self.targets_dir.mkdir(parents=True, exist_ok=True)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        cfg = scrape_config(self.targets_dir.resolve(), self.scrape_interval_s)
        atomic_write_text(self.config_path, yaml.safe_dump(cfg, sort_keys=False))
        return self.config_path

    def check_config(self) -> None:
        """Validate the config with promtool; raise RuntimeFailure with its message."""
        check_config_file(self.config_path)

    def set_targets(self, group: str, targets: Iterable[tuple[str, Mapping[str, str]]]) -> None:
        """Write (replace) one target group file: [(host:port, labels), ...]."""
        if not group.replace("-", "").replace("_", "").isalnum():
            raise InputError("group", f"target group name {group!r} must be alphanumeric")
        entries = [{"targets": [addr], "labels": dict(labels)} for addr, labels in targets]
        self.targets_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.targets_dir / f"{group}.json", json.dumps(entries, indent=1))

    def start(self, ready_timeout_s: float | None = None) -> str:
        """Write and check the config, start the server, wait until ready; return its URL.

        Prometheus binds its port itself (the given one, or a random free one; on a
        conflict the next is tried) and must answer with this run's TSDB path.
        ready_timeout_s: default 30 s scaled with the machine (testbed.envprobe)."""
        from testbed.metrics.process import launch, port_candidates

        if ready_timeout_s is None:
            from testbed.envprobe import startup_timeout_s

            ready_timeout_s = startup_timeout_s()
        if self.binary is None:
            raise RuntimeFailure("prometheus binary not found (apt-get install prometheus)")
        self.write_config()
        self.check_config()
        # No --web.enable-lifecycle: any local user could POST /-/quit or /-/reload.
        started = launch(self.binary, [f"--config.file={self.config_path}",
                                       f"--storage.tsdb.retention.time={self.retention}"],
                         self.data_dir.resolve(), self.dir / "prometheus.log",
                         port_candidates(self.port), ready_timeout_s=ready_timeout_s,
                         die_with_parent=self.die_with_parent)
        self.proc, self.port = started.proc, started.port
        return self.url

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the server by its PID (SIGTERM, then SIGKILL)."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def __enter__(self) -> PrometheusServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
