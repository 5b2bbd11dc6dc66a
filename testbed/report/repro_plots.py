"""Figures of reproductions and sweeps (units matching their tables; cases never joined)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from matplotlib.figure import Figure as MplFigure

from testbed.boundedio import DirReader
from testbed.report import figures as F
from testbed.report.page import Figure
from testbed.report.readers import FIGURE_MAX_BARS, FIGURE_MAX_LINES, FIGURE_MAX_POINTS

SWEEP_MAX_FIGURES = 8
"""Swept fields drawn (one figure each)."""

# experiment -> panels (key, axis label with unit, scale): the same units as summary.md
PANELS: dict[str, list[tuple[str, str, float]]] = {
    "cba": [("common_iteration_time", "mean iteration time,\njobs every policy ran (s)", 1.0),
            ("common_iteration_time_vs_sp-ff", "iteration time vs sp-ff,\njobs both ran (%)",
             100.0),
            ("blocking_ratio", "blocking ratio (blocked / arrived)", 1.0)],
    "bace": [("common_mean_jct_s", "mean JCT, jobs every policy ran (h)", 1 / 3600.0),
             ("total_cost_usd", "electricity cost (k$)", 1e-3)],
}
TITLES = {"cba": "CBA vs sp-ff on NSFNET (80 slots, cross-domain jobs): mean ± 95 % CI",
          "bace": "BACE-Pipe vs delay-first / cost-first, six regions: mean ± 95 % CI"}


def reproduction_figure(experiment: str, rows: Sequence[dict[str, Any]]) -> MplFigure:
    """The reproduction's policy comparison (see PANELS)."""
    panels = PANELS[experiment]
    fig = F.policy_panels(rows, panels, TITLES[experiment])
    if experiment == "cba":
        fig.axes[1].axhline(0.0, color="grey", lw=1, ls=":")
    return fig


def schedule_figures(root: DirReader, summ: dict[str, Any]) -> list[Figure]:
    """crosspipe/geopipe: iteration time per schedule over each sweep, and two timelines."""
    from testbed.report.readers import num, read_csv

    name = "crosspipe" if "max_reduction_vs_1f1b_same_memory_pct" in summ else "geopipe"
    rows = read_csv(root, f"{name}.csv")
    figs: list[Figure] = []
    for sweep, x, xlabel in (("latency", "latency_ms", "one-way cross-DC latency (ms)"),
                             ("bandwidth", "bandwidth_gbps", "cross-DC bandwidth (Gbit/s)")):
        mine = [r for r in rows if r.get("sweep") == sweep]
        lines = {}
        scheds = list(dict.fromkeys(r["schedule"] for r in mine))
        if len(scheds) > FIGURE_MAX_LINES:
            root.skip(f"{name}.csv", f"{len(scheds)} schedules: the first "
                      f"{FIGURE_MAX_LINES} drawn")
        for sched in scheds[:FIGURE_MAX_LINES]:
            pts = sorted((num(r[x]), num(r["iteration_time_ms"])) for r in mine
                         if r["schedule"] == sched)
            lines[sched] = ([p[0] for p in pts], [p[1] for p in pts])
        if lines:
            fig = F.series(lines, xlabel, "iteration time (ms)",
                           f"{name}: iteration time per schedule vs {sweep}")
            if sweep == "bandwidth":
                fig.axes[0].set_xscale("log")
            ideal = summ.get("no_delay_ideal_ms")
            if ideal:
                fig.axes[0].axhline(ideal, color="grey", ls="--", lw=1)
                fig.axes[0].annotate("no-delay ideal", (fig.axes[0].get_xlim()[0], ideal),
                                     fontsize=8, va="bottom")
            figs.append(Figure(F.data_uri(fig),
                               f"Iteration time of each schedule as the cross-DC {sweep} "
                               "varies (one line per schedule; dashed: the no-delay ideal). "
                               "The lower line wins; the gap to the dashed line is what the "
                               "DC cut costs."))
    figs += _timelines(name, summ)
    return figs


def _timelines(name: str, summ: dict[str, Any]) -> list[Figure]:
    from testbed.schedule.model import Hop, PipelineProblem
    from testbed.schedule.registry import build_schedule
    from testbed.schedule.timer import time_schedule

    s = summ.get("setup") or {}
    try:
        p, m = int(s["stages"]), int(s["microbatches"])
        cut = int(s["cut_after_stage"])
        intra = s.get("intra_dc_hop") or {"latency_ms": 0.005, "bandwidth_gbps": 400.0}
        bw = float(s.get("latency_sweep_bandwidth_gbps", 100.0))
    except (KeyError, TypeError, ValueError, OverflowError):
        return []
    from testbed.report.readers import small_pipeline

    if not small_pipeline(p, m):
        return []  # (not a reproduction's set-up: too large to draw)
    lat = 25.0
    hops = tuple(Hop(lat, bw) if h == cut else Hop(intra["latency_ms"], intra["bandwidth_gbps"])
                 for h in range(p - 1))
    prob = PipelineProblem((float(s["forward_ms"]),) * p, (float(s["backward_ms"]),) * p, hops,
                           float(s["activation_mb"]), m)
    other = ("crosspipe-greedy", {}) if name == "crosspipe" else \
        ("geopipe", {"buffer_microbatches": (s.get("buffers_microbatches") or [None])[-1]})
    out = []
    for sched, opts in (("1f1b", {}), other):
        t = time_schedule(prob, build_schedule(sched, prob, **{k: v for k, v in opts.items()
                                                               if v is not None}),
                          check_memory_cap=False)
        out.append(Figure(F.data_uri(F.gantt(
            t, f"{sched}: {p} stages, {m} micro-batches, {lat:g} ms / {bw:g} Gbit/s cut after "
               f"stage {cut}: {t.iteration_time_ms:.0f} ms, bubble {t.bubble_ratio:.0%}")),
            f"One iteration of {sched} timed by the schedule engine with a {lat:g} ms cross-DC "
            "hop. White is idle: compare the white area of the two timelines to see the "
            "bubble the cross-DC schedule removes."))
    return out


def sweep_figures(root: DirReader, meta: dict[str, Any]) -> list:  # type: ignore[type-arg]
    """One figure per swept field: a line over numeric values, bars over categorical ones
    (at most SWEEP_MAX_FIGURES fields, FIGURE_MAX_LINES lines, FIGURE_MAX_BARS categories)."""
    from testbed.report.page import Section
    from testbed.report.readers import read_csv

    agg = read_csv(root, "sweep_mean.csv")
    metric = str(meta.get("metric", "blocking_ratio"))
    keys = [str(k) for k in (meta.get("set") if isinstance(meta.get("set"), dict) else {})]
    if len(keys) > SWEEP_MAX_FIGURES:
        root.skip("sweep.json", f"{len(keys)} swept fields: the first {SWEEP_MAX_FIGURES} "
                  "drawn")
    figs = [Figure(F.data_uri(fig), cap)
            for fig, cap in sweep_plots(agg, keys[:SWEEP_MAX_FIGURES], metric, root)]
    return [Section("figures", "", figs)]


def _show(v: Any) -> str:
    """A swept value as the user wrote it (lists in brackets)."""
    if isinstance(v, list | tuple):
        return "[" + ", ".join(str(x) for x in v) + "]"
    return str(v)


def _is_number(v: Any) -> bool:
    try:
        float(v)
        return True
    except (TypeError, ValueError):
        return False


def sweep_plots(agg: Sequence[dict[str, Any]], keys: Sequence[str],
                metric: str, root: DirReader | None = None) -> list[tuple[MplFigure, str]]:
    """(figure, caption) per swept key; other keys' values are separate lines, never joined.
    At most FIGURE_MAX_LINES lines and FIGURE_MAX_BARS categories (cuts noted in root)."""
    from testbed.report.readers import num

    out = []
    ci_key = f"{metric}_ci95_half" if any(f"{metric}_ci95_half" in r for r in agg) \
        else f"{metric}_ci95"
    for key in keys or [""]:
        if not key:
            continue
        others = [k for k in keys if k != key]
        groups: dict[str, list[dict[str, Any]]] = {}
        for r in agg:
            label = ", ".join(f"{k.split('.')[-1]}={_show(r[k])}" for k in others) or metric
            groups.setdefault(label, []).append(r)
        if len(groups) > FIGURE_MAX_LINES:
            if root is not None:
                root.skip("sweep_mean.csv", f"{key}: {len(groups)} lines, the first "
                          f"{FIGURE_MAX_LINES} drawn")
            groups = dict(list(groups.items())[:FIGURE_MAX_LINES])
        numeric = all(_is_number(r[key]) for r in agg)
        if numeric:
            import matplotlib.pyplot as plt

            fig, ax = plt.subplots(figsize=(7, 4))
            for i, (label, rs) in enumerate(groups.items()):
                pts = sorted((num(r[key]), num(r[metric]), num(r.get(ci_key)) if r.get(ci_key)
                              not in (None, "") else 0.0) for r in rs)
                pts = pts[::max(1, -(-len(pts) // FIGURE_MAX_POINTS))]
                ax.errorbar([p[0] for p in pts], [p[1] for p in pts], yerr=[p[2] for p in pts],
                            marker="o", capsize=3, label=label,
                            color=F.PALETTE[i % len(F.PALETTE)])
            ax.set_xlabel(key)
            ax.set_ylabel(metric)
            ax.grid(alpha=0.3)
            if len(groups) > 1:
                ax.legend(fontsize=8)
            ax.set_title(f"{metric} vs {key} (mean over seeds, 95 % CI)")
        else:
            cats = list(dict.fromkeys(_show(r[key]) for r in agg))
            if len(cats) > FIGURE_MAX_BARS:
                if root is not None:
                    root.skip("sweep_mean.csv", f"{key}: {len(cats)} categories, the first "
                              f"{FIGURE_MAX_BARS} drawn")
                cats = cats[:FIGURE_MAX_BARS]
            bars_by: dict[str, tuple[list[float], list[float]]] = {}
            for label, rs in groups.items():
                by_cat = {_show(r[key]): r for r in rs}
                bars_by[label] = (
                    [num(by_cat[c][metric]) if c in by_cat else 0.0 for c in cats],
                    [num(by_cat[c].get(ci_key)) if c in by_cat and by_cat[c].get(ci_key)
                     not in (None, "") else 0.0 for c in cats])
            fig = F.grouped_bars(cats, bars_by, metric,
                                 f"{metric} per {key} (mean over seeds, 95 % CI)", key)
        out.append((fig, f"{metric} for each value of {key}"
                    + (" (a line: the values are numbers)" if numeric else
                       " (bars: the values are categories, not a scale)")
                    + "; whiskers are 95 % confidence intervals over seeds."))
    return out
