"""A run's own Prometheus TSDB as charts: served read-only by a temporary `prometheus`."""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from testbed.report.page import Figure

log = logging.getLogger(__name__)

MAX_CHARTS = 8


def find_tsdb(run_dir: Path) -> Path | None:
    """The run's TSDB directory (prometheus/data holding blocks or a WAL), else None."""
    for cand in (run_dir / "prometheus" / "data", *run_dir.glob("*/prometheus/data")):
        if cand.is_dir() and ((cand / "wal").is_dir() or any(cand.glob("*/meta.json"))):
            return cand
    return None


def _serve(tsdb: Path, scratch: Path) -> Any:
    """Start a Prometheus with no scrape targets over a copy of the TSDB; the server."""
    from testbed.metrics.prometheus import PrometheusServer

    data = scratch / "prometheus" / "data"
    shutil.copytree(tsdb, data, ignore=shutil.ignore_patterns("lock"))
    srv = PrometheusServer(scratch, retention="100y")
    srv.start(ready_timeout_s=30.0)
    return srv


def series_charts(url: str, start_s: float, end_s: float) -> list[Figure]:
    """One chart per metric name (up to MAX_CHARTS), every series of it a line."""
    from testbed.metrics.query import _get
    from testbed.report import figures as F

    names = [n for n in _get(url, "/api/v1/label/__name__/values", {}, 10.0)
             if not n.startswith(("prometheus_", "go_", "process_", "scrape_", "net_conntrack",
                                  "promhttp_"))]
    names = [n for n in names if n != "up"][:MAX_CHARTS] or ["up"]
    step = max(1.0, (end_s - start_s) / 300.0)
    figs: list[Figure] = []
    for name in names:
        is_counter = name.endswith("_total") or name.endswith("_bytes_total")
        q = f"rate({name}[{max(2, int(3 * step))}s])" if is_counter else name
        data = _get(url, "/api/v1/query_range", {"query": q, "start": f"{start_s:.3f}",
                                                  "end": f"{end_s:.3f}", "step": f"{step:g}"},
                    20.0)
        lines: dict[str, tuple[list[float], list[float]]] = {}
        for s in data.get("result", [])[:12]:
            lab = ",".join(f"{k}={v}" for k, v in s["metric"].items()
                           if k not in ("__name__", "instance", "job")) or name
            lines[lab] = ([float(t) - start_s for t, _ in s["values"]],
                          [float(v) for _, v in s["values"]])
        if not lines:
            continue
        unit = "per second" if is_counter else "value"
        figs.append(Figure(F.data_uri(F.series(lines, "time since the run started (s)",
                                               f"{name} ({unit})", f"Prometheus: {q}")),
                           f"The run's own Prometheus series {name}"
                           + (" as a per-second rate" if is_counter else "")
                           + ", read back from the TSDB the run recorded."))
    return figs


def prometheus_figures(run_dir: Path) -> list[Figure]:
    """Charts of the run's TSDB; [] when there is none or no prometheus binary."""
    from testbed.metrics.prometheus import find_binary
    from testbed.report.readers import read_json

    tsdb = find_tsdb(run_dir)
    if tsdb is None or find_binary() is None:
        return []
    man = read_json(run_dir / "manifest.json") or {}
    summ = read_json(run_dir / "summary.json") or {}
    # (the manifest is written when the run starts, and again with ended_unix_s at its end)
    start = float(man.get("started_unix_s") or 0.0)
    end = float(man.get("ended_unix_s") or 0.0) or (
        start + float(summ.get("wall_s") or 0.0) if start else 0.0)
    with tempfile.TemporaryDirectory(prefix="lightpipe-report-") as tmp:
        try:
            srv = _serve(tsdb, Path(tmp))
        except Exception as exc:
            log.warning("prometheus series skipped: %s", exc)
            return []
        try:
            if not start:
                from testbed.metrics.query import query

                got = query(srv.url, "max(timestamp(up))")
                end = float(got[0]["value"][1]) if got else time.time()
                start = end - 600.0
            return series_charts(srv.url, start, max(end, start + 1.0))
        except Exception as exc:
            log.warning("prometheus series skipped: %s", exc)
            return []
        finally:
            srv.stop()
