"""The report's view of a run's network events from the jobs' side: their iteration times."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from testbed.io.bounded import DirReader
from testbed.report import readers
from testbed.report.page import Figure, Section, Table

FAULT_MAX_PANELS = 6
"""(job, event) panels drawn; the rest are in the table and the records."""


def _key(r: dict[str, Any]) -> tuple[str, int, float]:
    return (str(r.get("job")), int(r.get("event", -1)), float(r.get("at_s") or 0.0))


def fault_sections(d: DirReader, backend: str) -> list[Section]:
    """One figure per (job, event) (the first FAULT_MAX_PANELS): each iteration's time at
    its end, relative to the event; the event and its outage marked, the steady
    iteration before and after dashed; then the fault_impact table."""
    summ = readers.read_json(d, "summary.json")
    rows = [r for r in (summ.get("fault_impact") or []) if isinstance(r, dict)] \
        if isinstance(summ, dict) else []
    if not rows:
        return []
    its = readers.read_csv(d, "fault_iterations.csv")
    series: dict[tuple[str, int], list[tuple[float, float, bool]]] = defaultdict(list)
    for it in its:
        try:
            k = (it["job"], int(it["event"]))
        except (KeyError, ValueError):
            continue
        t, v = readers.num(it.get("end_s")), readers.num(it.get("iteration_time_s"))
        if math.isfinite(t) and math.isfinite(v):
            series[k].append((t, v, it.get("redone") == "1"))
    drawn = [r for r in rows if (str(r.get("job")), int(r.get("event", -1))) in series]
    if len(drawn) > FAULT_MAX_PANELS:
        d.skip("fault_iterations.csv", f"{len(drawn)} (job, event) pairs: the first "
               f"{FAULT_MAX_PANELS} drawn, all in the table")
    figs = []
    if drawn:
        figs.append(Figure(_uri(_figure(drawn[:FAULT_MAX_PANELS], series, backend)),
                           "Each job's iteration time through each network event that hit "
                           "it: one point per iteration at the time it completed (time "
                           "between completions, so a stall or a restart lands in the "
                           "iteration it delayed), relative to the event (red line; the "
                           "shaded band is the outage the job saw). Dashed: the steady "
                           "iteration before the event and after it (a detour's longer "
                           "delay). A cross: the job failed there (its collective timed "
                           "out).", alt="iteration time through each network event"))
    table_rows, note = readers.table_rows(d, [_table_row(r) for r in rows],
                                          "summary.json fault_impact")
    tables = [Table(["job", "event", "at (s)", "outage (s)", "steady (s)", "after (s)",
                     "touched", "stall (s)", "recovery (s)", "redone", "lost (iterations)",
                     "survived", "error"], table_rows,
                    "stall: extra time of the touched iterations against the steady one; "
                    "recovery: until iterations are back within 5 % of steady (empty: "
                    "never, e.g. a slower detour or a failed job)." + note)]
    text = (f"{len(rows)} job-event rows ({backend}); model: "
            f"{(summ.get('fault_model') or {}).get('model', 'measured')}"
            if backend == "sim" else f"{len(rows)} job-event rows, measured ({backend}).")
    return [Section(f"{backend}: the jobs through the network events", text, figs, tables)]


def _uri(fig: Any) -> str:
    from testbed.report import figures as F

    return F.data_uri(fig)


def _table_row(r: dict[str, Any]) -> list[Any]:
    return [r.get("job"), f"{r.get('event')} {r.get('kind', '')} {r.get('target', '')}",
            r.get("at_s"), r.get("outage_s"), r.get("steady_iteration_s"),
            r.get("after_iteration_s"), r.get("iterations_touched"), r.get("stall_s"),
            r.get("recovery_s"), r.get("iterations_redone"), r.get("iterations_lost"),
            "yes" if r.get("survived") else "no", str(r.get("error") or "")[:200]]


def _figure(rows: Sequence[dict[str, Any]],
            series: dict[tuple[str, int], list[tuple[float, float, bool]]],
            backend: str) -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(rows)
    cols = min(3, n)
    nrows = math.ceil(n / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(5.2 * cols, 3.9 * nrows), squeeze=False)
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    for ax, r in zip(axes.flat, rows, strict=False):
        at = float(r.get("at_s") or 0.0)
        pts = sorted(series[(str(r.get("job")), int(r.get("event", -1)))])
        xs = [t - at for t, _, _ in pts]
        ys = [v for _, v, _ in pts]
        ax.plot(xs, ys, marker="o", ms=3, lw=1, color="#4c78a8", label="iteration time")
        redo = [(t - at, v) for t, v, red in pts if red]
        if redo:
            ax.plot([a for a, _ in redo], [b for _, b in redo], ls="none", marker="D",
                    ms=6, mfc="none", color="#f58518", label="redone after a restart")
        ax.axvline(0.0, color="#e45756", lw=1.5, label=f"{r.get('kind')} {r.get('target')}")
        out = r.get("outage_s")
        if isinstance(out, int | float) and out > 0:
            ax.axvspan(0.0, out, color="#e45756", alpha=0.15, lw=0,
                       label=f"outage {out:.3g} s")
        for key, style, lab in (("steady_iteration_s", "--", "steady before"),
                                ("after_iteration_s", ":", "steady after")):
            v = r.get(key)
            if isinstance(v, int | float):
                ax.axhline(v, color="grey", ls=style, lw=1, label=f"{lab} {v:.3g} s")
        if not r.get("survived") and isinstance(r.get("failed_at_s"), int | float):
            ax.plot([r["failed_at_s"] - at], [max(ys, default=1.0)], ls="none", marker="X",
                    ms=10, color="black", label="failed")
        if ys and max(ys) > 20 * min(ys):
            ax.set_yscale("log")
        stall = r.get("stall_s")
        ax.set_title(f"{r.get('job')}, event {r.get('event')}: stall "
                     f"{stall:.3g} s" if isinstance(stall, int | float) else
                     f"{r.get('job')}, event {r.get('event')}", fontsize=10)
        ax.set_xlabel("time since the event (s, scenario clock)")
        ax.set_ylabel("iteration time (s)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, loc="upper right")
    fig.suptitle(f"{backend}: iteration time through the network events")
    fig.tight_layout()
    return fig
