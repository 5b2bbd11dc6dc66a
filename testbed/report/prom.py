"""A run's own Prometheus TSDB as charts: served read-only by a temporary `prometheus`."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from testbed.boundedio import DirReader, copy_tree
from testbed.report.page import Figure

log = logging.getLogger(__name__)

MAX_CHARTS = 8


def find_tsdb(run_dir: Path | DirReader) -> DirReader | None:
    """The run's TSDB directory (prometheus/data holding blocks or a WAL), else None;
    nothing reached through a symbolic link."""
    from testbed.report.readers import open_run

    d = open_run(run_dir)
    cands = ["prometheus/data"] + [f"{n}/prometheus/data" for n in d.names()[:100]
                                   if n != "prometheus" and d.is_dir(n)]
    for rel in cands:
        cand = d.sub(rel, quiet=True)
        if cand is not None and (cand.is_dir("wal") or _has_block(cand)):
            return cand
    return None


def _has_block(tsdb: DirReader) -> bool:
    """Whether a TSDB directory holds a block (a subdirectory with a meta.json)."""
    for name in tsdb.names()[:1000]:
        sub = tsdb.sub(name, quiet=True) if tsdb.is_dir(name) else None
        if sub is not None:
            found = sub.is_file("meta.json")
            sub.close()
            if found:
                return True
    return False


def _serve(tsdb: DirReader, scratch: Path) -> Any:
    """Start a Prometheus with no scrape targets over a copy of the TSDB (regular files
    only, no link followed, at most TREE_MAX_BYTES); the server."""
    from testbed.metrics.prometheus import PrometheusServer

    (scratch / "prometheus").mkdir(mode=0o700)
    copy_tree(tsdb, scratch / "prometheus" / "data", "prometheus/data", skip=("lock",))
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


def _seconds(v: Any) -> float:
    try:
        x = float(v or 0.0)
    except (TypeError, ValueError):
        return 0.0
    return x if 0.0 <= x < 1e11 else 0.0


def prometheus_figures(run_dir: Path | DirReader) -> list[Figure]:
    """Charts of the run's TSDB; [] when there is none or no prometheus binary. The
    temporary copy is removed whatever happens."""
    from testbed.metrics.prometheus import find_binary
    from testbed.report.readers import open_run, read_json

    d = open_run(run_dir)
    tsdb = find_tsdb(d)
    if tsdb is None or find_binary() is None:
        return []
    man = read_json(d, "manifest.json")
    summ = read_json(d, "summary.json")
    man = man if isinstance(man, dict) else {}
    summ = summ if isinstance(summ, dict) else {}
    # (the manifest is written when the run starts, and again with ended_unix_s at its end)
    start = _seconds(man.get("started_unix_s"))
    end = _seconds(man.get("ended_unix_s")) or (
        start + _seconds(summ.get("wall_s")) if start else 0.0)
    if end - start > 90 * 86400:
        start = end = 0.0
    tmp = tempfile.mkdtemp(prefix="lightpipe-report-")
    try:
        return _charts(tsdb, Path(tmp), start, end)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if os.path.lexists(tmp):
            log.warning("could not remove the TSDB copy %s", tmp)


def _charts(tsdb: DirReader, tmp: Path, start: float, end: float) -> list[Figure]:
    """Serve a copy of the TSDB in tmp and chart it between start and end (0: the last
    ten minutes of data); [] when that fails (the reason recorded)."""
    try:
        srv = _serve(tsdb, tmp)
    except Exception as exc:
        log.warning("prometheus series skipped: %s", exc)
        tsdb.skip(".", f"Prometheus series not drawn: {str(exc)[:200]}")
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
