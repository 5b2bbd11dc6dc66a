"""A run directory holding a real Prometheus TSDB, for the tests of the report's charts."""

from __future__ import annotations

import json
import time
from pathlib import Path

from tests.waiting import scaled


def record_run(run: Path, job: str, labels: dict[str, str], ready: str,
               target: str | None = None) -> None:
    """A Prometheus in `run` scrapes `target` (host:port; None: itself) as `job`, with
    `labels`, until the query `ready` holds, and stops; `run` then has the manifest and
    summary of an emulated run of that time."""
    from testbed.metrics.prometheus import PrometheusServer
    from testbed.metrics.query import wait_for

    start = time.time()
    srv = PrometheusServer(run, scrape_interval_s=1.0)
    srv.start()
    try:
        srv.set_targets(job, [(target or f"127.0.0.1:{srv.port}", labels)])
        wait_for(srv.url, ready, timeout_s=scaled(120))
    finally:
        srv.stop()
    (run / "manifest.json").write_text(json.dumps({"started_unix_s": start, "backend": "emu"}))
    (run / "summary.json").write_text(json.dumps({"wall_s": time.time() - start}))
