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
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import yaml

from testbed.errors import InputError, RuntimeFailure
from testbed.io.bounded import DirReader, copy_tree
from testbed.metrics import process
from testbed.metrics.process import Started
from testbed.metrics.prometheus import find_binary

log = logging.getLogger(__name__)


def run_tsdb(d: DirReader) -> DirReader:
    """The TSDB directory of the run directory d (no link followed: see DirReader);
    InputError naming what is missing or refused."""
    data = d.sub("prometheus/data")
    if data is None or not data.names():  # (a limit would record a "skipped" cut)
        why = "; ".join(f"{p}: {w}" for p, w in d.skipped)
        raise InputError("RUNDIR", f"{d.shown} has no Prometheus data (prometheus/data"
                         + (f"; skipped {why}" if why else "") + "): only emulation runs "
                         "record one")
    return data


def window_text(run_dir: Path) -> str:
    """'(data of START to END UTC) ' from the run's manifest, '' when unknown: an
    instant query evaluated now finds nothing older than 5 minutes, so a reader of a
    finished run needs its time range (Grafana's time picker, the API's time=)."""
    from testbed.runs.rundir import run_window

    try:
        with DirReader.open(Path(run_dir), "RUNDIR") as d:
            start, end = run_window(d)
    except (InputError, OSError):
        return ""
    if not start:
        return ""
    fmt = "%Y-%m-%dT%H:%M:%SZ"
    return (f"(data of {time.strftime(fmt, time.gmtime(start))} to "
            f"{time.strftime(fmt, time.gmtime(end))}) ")


@contextmanager
def serving(run_dir: Path, port: int = 0, host: str = "127.0.0.1") -> Iterator[Started]:
    """A Prometheus serving a copy of run_dir's TSDB while the block runs. The copy holds
    regular files only (no link followed, at most TREE_MAX_BYTES) and is removed
    whatever happens."""
    binary = find_binary("prometheus")
    if binary is None:
        raise RuntimeFailure("prometheus binary not found (apt-get install prometheus)")
    with DirReader.open(Path(run_dir), "RUNDIR") as d:
        data = run_tsdb(d)
        tmp = tempfile.mkdtemp(prefix="lightpipe-serve-")
        try:
            work = Path(tmp)
            copy = work / "data"
            copy_tree(data, copy, "RUNDIR", skip=("lock",))
            for where, why in data.skipped:
                log.warning("monitor serve: %s not copied: %s", where, why)
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
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
