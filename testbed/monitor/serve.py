"""Re-serve a finished run's TSDB (`lightpipe monitor serve RUNDIR`), read-only.

Prometheus writes to its data directory even with nothing to scrape (head
compaction, WAL, lock file) and deletes blocks older than its retention, so the run's
`prometheus/data` is copied to a temporary directory and served from there with an
unbounded retention and no scrape targets: the run directory is never modified.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import yaml

from testbed.errors import InputError, RuntimeFailure
from testbed.metrics import process
from testbed.metrics.process import Started
from testbed.metrics.prometheus import find_binary

log = logging.getLogger(__name__)


def run_tsdb(run_dir: Path) -> Path:
    """The run's TSDB directory; InputError naming what is missing."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise InputError("RUNDIR", f"{run_dir} is not a directory")
    data = run_dir / "prometheus" / "data"
    if not data.is_dir() or not any(data.iterdir()):
        raise InputError("RUNDIR", f"{run_dir} has no Prometheus data (prometheus/data): "
                         "only emulation runs record one")
    return data


@contextmanager
def serving(run_dir: Path, port: int = 0, host: str = "127.0.0.1") -> Iterator[Started]:
    """A Prometheus serving a copy of run_dir's TSDB while the block runs."""
    data = run_tsdb(run_dir)
    binary = find_binary("prometheus")
    if binary is None:
        raise RuntimeFailure("prometheus binary not found (apt-get install prometheus)")
    with tempfile.TemporaryDirectory(prefix="lightpipe-serve-") as tmp:
        work = Path(tmp)
        copy = work / "data"
        shutil.copytree(data, copy, ignore=shutil.ignore_patterns("lock"))
        cfg = work / "prometheus.yml"
        cfg.write_text(yaml.safe_dump({"global": {"scrape_interval": "15s"},
                                       "scrape_configs": []}))
        started = process.launch(binary, [f"--config.file={cfg}",
                                          "--storage.tsdb.retention.time=100y"],
                                 copy.resolve(), work / "prometheus.log",
                                 process.port_candidates(port), host=host)
        try:
            yield started
        finally:
            process.stop_pid(started.proc.pid)
