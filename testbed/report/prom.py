"""A run's own Prometheus TSDB as charts: served read-only by a temporary `prometheus`."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from testbed.io.bounded import DirReader, copy_tree
from testbed.report.page import Figure
from testbed.runs import rundir

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


LEGEND_MAX_LINES = 6
"""Lines of one chart's legend: the 5 largest series and one line for the others."""
# Charted first, in this order (what a run is about); the rest follow by name.
PRIORITY = ("lightpipe_lightpaths_active", "lightpipe_fibre_slots_used",
            "lightpipe_lightpath_rate_bits_per_second", "lightpipe_fibre_tx_bytes_total",
            "lightpipe_lightpath_requests_total", "lightpipe_lightpaths_lost_total",
            "lightpipe_lightpaths_restored_total", "lightpipe_jobs_active",
            "lightpipe_fibre_queue_drops_total", "lightpipe_fibre_up")
# Not measurements: creation timestamps, histogram internals, constants of the run.
NOT_CHARTED_SUFFIXES = ("_created", "_bucket", "_info", "_start_time_seconds",
                        "_end_time_seconds")
NOT_CHARTED_PREFIXES = ("prometheus_", "go_", "process_", "scrape_", "net_conntrack",
                        "promhttp_")
UNITS = (("_bytes_total", "bytes/s"), ("_packets_total", "packets/s"),
         ("_seconds_total", "s/s"), ("_total", "events/s"), ("_seconds_sum", "s/s"),
         ("_seconds_count", "events/s"), ("_bits_per_second", "bit/s"), ("_seconds", "s"),
         ("_bytes", "bytes"), ("_ratio", "0-1"), ("_up", "1 up, 0 down"))


def unit_of(name: str) -> str:
    """The y axis unit of a series (a counter is charted as its per-second rate)."""
    for suffix, unit in UNITS:
        if name.endswith(suffix):
            return unit
    return "count"


def charted_names(names: list[str]) -> list[str]:
    """The metric names worth a chart, PRIORITY first (no _created timestamps)."""
    keep = [n for n in names if not n.startswith(NOT_CHARTED_PREFIXES)
            and not n.endswith(NOT_CHARTED_SUFFIXES) and n != "up"]
    order = {n: i for i, n in enumerate(PRIORITY)}
    return sorted(keep, key=lambda n: (order.get(n, len(order)), n))


def short_lines(series: list[tuple[dict[str, str], list[float], list[float]]], name: str
                ) -> tuple[dict[str, tuple[list[float], list[float]]], str]:
    """Legend-ready lines: labelled by the labels that differ between the series only
    (those common to all are returned as text for the caption); beyond LEGEND_MAX_LINES
    the largest LEGEND_MAX_LINES - 1 and 'others (N series, mean)'."""
    skip = ("__name__", "instance", "job")
    keys = sorted({k for m, _, _ in series for k in m if k not in skip})
    varying = [k for k in keys if len({m.get(k) for m, _, _ in series}) > 1]
    common = ", ".join(f"{k}={series[0][0].get(k)}" for k in keys if k not in varying
                       and k not in ("run", "scenario"))
    common = f"all of them {common}" if common else ""
    named0 = [(",".join(f"{k}={m.get(k, '')}" for k in varying) or name, xs, ys)
              for m, xs, ys in series]
    zero = [lab for lab, _xs, ys in named0 if not any(v for v in ys if v == v)]
    same: dict[tuple[tuple[float, ...], tuple[float, ...]], list[str]] = {}
    for lab, xs, ys in named0:
        if lab not in zero:
            same.setdefault((tuple(xs), tuple(ys)), []).append(lab)
    named = [(labs[0] + (f" (+{len(labs) - 1} more, same values)" if len(labs) > 1 else ""),
              list(xs), list(ys)) for (xs, ys), labs in same.items()]
    if zero:
        common += ("; " if common else "") + (
            f"zero throughout, left out: {', '.join(zero[:8])}"
            + (f" and {len(zero) - 8} more" if len(zero) > 8 else ""))
    if len(named) > LEGEND_MAX_LINES:
        named.sort(key=lambda t: -max((abs(v) for v in t[2] if v == v), default=0.0))
        top, rest = named[:LEGEND_MAX_LINES - 1], named[LEGEND_MAX_LINES - 1:]
        by_t: dict[float, list[float]] = {}
        for _lab, xs, ys in rest:
            for x, y in zip(xs, ys, strict=False):
                by_t.setdefault(x, []).append(y)
        ts = sorted(by_t)
        top.append((f"others ({len(rest)} series, mean)", ts,
                    [sum(by_t[t]) / len(by_t[t]) for t in ts]))
        named = top
    return {lab: (xs, ys) for lab, xs, ys in named}, common


def series_charts(url: str, start_s: float, end_s: float) -> list[Figure]:
    """series_charts_with_notes without its note."""
    return series_charts_with_notes(url, start_s, end_s)[0]


def series_charts_with_notes(url: str, start_s: float, end_s: float
                             ) -> tuple[list[Figure], str]:
    """One chart per metric name (at most MAX_CHARTS, PRIORITY first) with short legends;
    metrics that are zero throughout and those past the limit are named in the note."""
    from testbed.metrics.query import api_get
    from testbed.report import figures as F

    all_names = list(api_get(url, "/api/v1/label/__name__/values", {}, 10.0))
    names = charted_names(all_names) or (["up"] if "up" in all_names else [])
    step = max(1.0, (end_s - start_s) / 300.0)
    figs: list[Figure] = []
    zero: list[str] = []
    left: list[str] = []
    for name in names:
        if len(figs) >= MAX_CHARTS:
            left.append(name)
            continue
        is_counter = name.endswith(("_total", "_sum", "_count"))
        q = f"rate({name}[{max(2, int(3 * step))}s])" if is_counter else name
        data = api_get(url, "/api/v1/query_range", {"query": q, "start": f"{start_s:.3f}",
                                                  "end": f"{end_s:.3f}", "step": f"{step:g}"},
                    20.0)
        series = [(dict(s["metric"]), [float(t) - start_s for t, _ in s["values"]],
                   [float(v) for _, v in s["values"]]) for s in data.get("result", [])[:200]]
        if not series:
            continue
        if not any(v for _m, _x, ys in series for v in ys if v == v):
            zero.append(name)
            continue
        lines, common = short_lines(series, name)
        unit = unit_of(name)
        short = name.removeprefix("lightpipe_")
        figs.append(Figure(F.data_uri(F.series(
            lines, "time since the run started (s)", f"{short} ({unit})",
            f"{short}" + (" (per-second rate)" if is_counter else ""))),
            f"The run's own Prometheus series {name}"
            + (" as a per-second rate" if is_counter else "")
            + f", {len(series)} series, read back from the TSDB the run recorded"
            + (f"; {common}" if common else "")
            + (f"; the {LEGEND_MAX_LINES - 1} largest drawn, the rest as their mean"
               if any(k.startswith("others (") for k in lines) else "") + "."))
    note = ""
    if zero:
        note += ("Zero throughout the run, so left out of the charts: " + ", ".join(zero)
                 + ". ")
    if left:
        note += (f"Left out (a page shows {MAX_CHARTS} charts; all are in the TSDB, "
                 "`lightpipe monitor serve DIR`): " + ", ".join(left[:40])
                 + (" ..." if len(left) > 40 else "") + ".")
    return figs, note.strip()


def prometheus_figures(run_dir: Path | DirReader) -> list[Figure]:
    """prometheus_charts without its note."""
    return prometheus_charts(run_dir)[0]


def prometheus_charts(run_dir: Path | DirReader) -> tuple[list[Figure], str]:
    """Charts of the run's TSDB and a note (what is zero, what is left out); ([], '')
    when there is none or no prometheus binary. The temporary copy is removed whatever
    happens."""
    from testbed.metrics.prometheus import find_binary
    from testbed.report.readers import open_run

    d = open_run(run_dir)
    tsdb = find_tsdb(d)
    if tsdb is None or find_binary() is None:
        return [], ""
    start, end = rundir.run_window(d)
    tmp = tempfile.mkdtemp(prefix="lightpipe-report-")
    try:
        return _charts(tsdb, Path(tmp), start, end)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if os.path.lexists(tmp):
            log.warning("could not remove the TSDB copy %s", tmp)


def _charts(tsdb: DirReader, tmp: Path, start: float, end: float) -> tuple[list[Figure], str]:
    """Serve a copy of the TSDB in tmp and chart it between start and end (0: the last
    ten minutes of data); [] when that fails (the reason recorded)."""
    try:
        srv = _serve(tsdb, tmp)
    except Exception as exc:
        log.warning("prometheus series skipped: %s", exc)
        tsdb.skip(".", f"Prometheus series not drawn: {str(exc)[:200]}")
        return [], ""
    try:
        if not start:
            from testbed.metrics.query import query

            got = query(srv.url, "max(timestamp(up))")
            end = float(got[0]["value"][1]) if got else time.time()
            start = end - 600.0
        return series_charts_with_notes(srv.url, start, max(end, start + 1.0))
    except Exception as exc:
        log.warning("prometheus series skipped: %s", exc)
        return [], ""
    finally:
        srv.stop()
