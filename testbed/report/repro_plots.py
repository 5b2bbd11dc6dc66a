"""Figures of reproductions and sweeps (units matching their tables; cases never joined)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from matplotlib.figure import Figure as MplFigure

from testbed.io.bounded import DirReader
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


UNSPLIT_IDEAL_LABEL = ("1F1B / GPipe with no network delay, (m+p-1)(F+B): not a bound for "
                       "interleaved or split-backward schedules")
SPLIT_BOUND_LABEL = "lower bound, split backward (zb-h1, crosspipe-opt*)"
LEGEND_MAX_LINES = 6
"""Lines of one panel's legend (more are split into panels, small multiples)."""


def _panels_of(labels: Sequence[str], groups: Sequence[tuple[str, Sequence[str]]] | None,
               references: int = 2) -> list[tuple[str, list[str]]]:
    """The labels split into panels: the given groups, else chunks small enough that the
    lines and the reference lines share a legend of at most LEGEND_MAX_LINES."""
    if groups:
        return [(t, [lab for lab in g if lab in labels]) for t, g in groups]
    size = max(1, LEGEND_MAX_LINES - references)
    chunks = [list(labels[i:i + size]) for i in range(0, len(labels), size)] or [[]]
    return [("", c) for c in chunks]


def schedule_figure(rows: Sequence[dict], x: str, labels: Sequence[str], metric: str,
                    title: str, xlabel: str, ideal: float | None = None,
                    marks: dict | None = None, logx: bool = False,
                    groups: Sequence[tuple[str, Sequence[str]]] | None = None) -> Any:
    """One panel per group of schedules (small multiples: at most LEGEND_MAX_LINES legend
    lines each, one shared y scale). Each schedule has its own marker and line style, so
    lines that coincide stay visible. `ideal` (the no-delay time of an unsplit schedule,
    (m+p-1)(F+B)) is labelled as what it is: not a bound for split-backward schedules,
    whose own lower bound (rows' lower_bound_ms) is drawn dotted where the panel has
    one."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    has_split = metric == "iteration_time_ms" and any(
        r.get("split_backward") for r in rows if r["schedule"] in labels)
    refs = int(ideal is not None and metric == "iteration_time_ms") + int(bool(has_split))
    panels = _panels_of(labels, groups, refs)
    fig, axes = plt.subplots(1, len(panels), figsize=(6.2 * len(panels), 5.6), squeeze=False,
                             sharey=True)
    styles = ["-", "--", "-.", ":"]
    markers = "osD^vP*X"
    ylabel = {"iteration_time_ms": "iteration time (ms)",
              "bubble_ratio": "bubble ratio (idle / iteration time)"}.get(
        metric, metric.replace("_", " "))
    for ax, (sub, labs) in zip(axes[0], panels, strict=True):
        split_bound: dict[float, float] = {}
        for i, lab in enumerate(labs):
            pts = sorted((r[x], r[metric]) for r in rows if r["schedule"] == lab)
            if not pts:
                continue
            ax.plot([a for a, _ in pts], [b for _, b in pts], ls=styles[i % len(styles)],
                    marker=markers[labels.index(lab) % len(markers)], ms=7 - 1.2 * i,
                    mfc="none" if i % 2 else None, lw=2.2 - 0.4 * i, label=lab)
            for r in rows:
                if r["schedule"] == lab and metric == "iteration_time_ms" \
                        and r.get("split_backward") and r.get("lower_bound_ms") is not None:
                    split_bound[r[x]] = max(split_bound.get(r[x], 0.0), r["lower_bound_ms"])
        if ideal is not None and metric == "iteration_time_ms":
            ax.axhline(ideal, color="grey", ls="--", lw=1, label=UNSPLIT_IDEAL_LABEL)
        if split_bound:
            xs = sorted(split_bound)
            ax.plot(xs, [split_bound[v] for v in xs], color="black", ls=":", lw=1.2,
                    label=SPLIT_BOUND_LABEL)
        for label, xv in (marks or {}).items():
            if xv is not None:
                ax.axvline(xv, color="black", ls=":", lw=1)
                ax.annotate(label, (xv, 1.0), xycoords=("data", "axes fraction"), fontsize=7,
                            rotation=90, va="top")
        if logx:
            ax.set_xscale("log")
            xs_all = sorted({r[x] for r in rows if r["schedule"] in labs})
            ax.set_xticks(xs_all, [f"{v:g}" for v in xs_all])
            ax.minorticks_off()
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        if sub:
            ax.set_title(sub, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=1,
                  frameon=False)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def schedule_figures(root: DirReader, summ: dict[str, Any], series: bool = True
                     ) -> list[Figure]:
    """crosspipe/geopipe: iteration time per schedule over each sweep (series=True: for a
    directory without the reproduction's own PNGs), and two timelines."""
    from testbed.report.readers import num, read_csv

    name = "crosspipe" if "max_reduction_vs_1f1b_same_memory_pct" in summ else "geopipe"
    rows = read_csv(root, f"{name}.csv") if series else []
    figs: list[Figure] = []
    def cell(v: Any) -> Any:
        if v in ("True", "False"):
            return v == "True"
        x = num(v)
        return v if x != x else x  # (nan: not a number, the text kept)

    for sweep, x, xlabel in (("latency", "latency_ms", "one-way cross-DC latency (ms)"),
                             ("bandwidth", "bandwidth_gbps", "cross-DC bandwidth (Gbit/s)")):
        mine = [{k: cell(v) for k, v in r.items()} for r in rows if r.get("sweep") == sweep]
        scheds = list(dict.fromkeys(str(r["schedule"]) for r in mine))
        if len(scheds) > FIGURE_MAX_LINES:
            root.skip(f"{name}.csv", f"{len(scheds)} schedules: the first "
                      f"{FIGURE_MAX_LINES} drawn")
            scheds = scheds[:FIGURE_MAX_LINES]
        if not scheds:
            continue
        trad = [s for s in scheds if not s.startswith(("crosspipe", "geopipe", "best-at"))]
        groups = [("traditional schedules", trad),
                  (f"{name} schedules", [s for s in scheds if s not in trad])]
        fig = schedule_figure(mine, x, scheds, "iteration_time_ms",
                              f"{name}: iteration time per schedule vs {sweep}", xlabel,
                              summ.get("no_delay_ideal_ms") or None, logx=sweep == "bandwidth",
                              groups=[g for g in groups if g[1]])
        figs.append(Figure(F.data_uri(fig),
                           f"Iteration time of each schedule as the cross-DC {sweep} varies "
                           "(dashed: 1F1B's time with no network delay, a bound for unsplit "
                           "schedules only; dotted: the lower bound of split-backward "
                           "schedules where the records have it). The lower line wins."))
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

            items = list(groups.items())
            chunks = [items[i:i + F.LEGEND_MAX_LINES]
                      for i in range(0, len(items), F.LEGEND_MAX_LINES)] or [[]]
            fig, axes = plt.subplots(1, len(chunks), figsize=(7 * len(chunks), 4),
                                     squeeze=False, sharey=True)
            for c_i, (ax, chunk) in enumerate(zip(axes[0], chunks, strict=True)):
                for i, (label, rs) in enumerate(chunk):
                    pts = sorted((num(r[key]), num(r[metric]), num(r.get(ci_key))
                                  if r.get(ci_key) not in (None, "") else 0.0) for r in rs)
                    pts = pts[::max(1, -(-len(pts) // FIGURE_MAX_POINTS))]
                    ax.errorbar([p[0] for p in pts], [p[1] for p in pts],
                                yerr=[p[2] for p in pts], marker="o", capsize=3, label=label,
                                color=F.PALETTE[(i + c_i * F.LEGEND_MAX_LINES)
                                                % len(F.PALETTE)])
                F.note_if_all_zero(ax, [num(r[metric]) for _l, rs in chunk for r in rs])
                ax.set_xlabel(F.axis_label(key))
                ax.set_ylabel(F.axis_label(metric))
                ax.grid(alpha=0.3)
                if len(chunk) > 1:
                    ax.legend(fontsize=8)
            axes[0][0].set_title(f"{metric} vs {key} (mean over seeds, 95 % CI)")
            if len(chunks) > 1:
                fig.tight_layout()
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
            fig = F.grouped_bars(cats, bars_by, F.axis_label(metric),
                                 f"{metric} per {key} (mean over seeds, 95 % CI)",
                                 f"{key} (category)")
        out.append((fig, f"{metric} for each value of {key}"
                    + (" (a line: the values are numbers)" if numeric else
                       " (bars: the values are categories, not a scale)")
                    + "; whiskers are 95 % confidence intervals over seeds."))
    return out


# ------------------------------------------------------------------ outage reproduction
OUTAGE_SCHEMES = ("none", "restoration", "1+1", "backup")
OUTAGE_LABELS = {"none": "no protection (down until the repair)",
                 "restoration": "controller restoration", "1+1": "1+1 protection",
                 "backup": "pre-planned backup"}


def _sweep_pts(points: Sequence[dict[str, Any]], scheme: str, timeout: float,
               case: str = "sweep", source: str = "sim") -> list[dict[str, Any]]:
    return sorted((p for p in points if p.get("case") == case and p.get("source") == source
                   and p.get("protection") == scheme
                   and (timeout is None or p.get("collective_timeout_s") == timeout)),
                  key=lambda p: p["fault_s"])


def _outage_refs(ax: Any, steady_s: float | None, claim_s: float = 0.1) -> None:
    """The reference marks of a stall-vs-fault panel, labelled on the axes (not in the
    legend): the field trials' ~100 ms, 'noticed' (5 % of an iteration), stall = fault."""
    ax.axvline(claim_s, color="black", ls=":", lw=1)
    ax.annotate("field trials: ~100 ms", (claim_s, 0.98), xycoords=("data", "axes fraction"),
                fontsize=7, rotation=90, va="top", ha="right")
    if steady_s:
        ax.axhline(0.05 * steady_s, color="grey", ls="--", lw=1)
        ax.annotate("noticed: 5 % of an iteration", (0.01, 0.05 * steady_s),
                    xycoords=("axes fraction", "data"), fontsize=7, va="bottom",
                    color="#555555")
    lo, hi = ax.get_xlim()
    ax.plot([lo, hi], [lo, hi], color="#bbbbbb", lw=1, ls="-.", zorder=0)
    ax.annotate("stall = fault length", (hi, hi), fontsize=7, ha="right", va="top",
                color="#888888")


def outage_figure(points: Sequence[dict[str, Any]], summary: dict[str, Any]) -> Any:
    """Stall against fault length, one panel per collective time-out, a line per
    protection scheme; failed points (the job's time-out) as black crosses at the time
    they were lost, emulation points as hollow squares."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from testbed.report.figures import PALETTE

    timeouts = sorted({p["collective_timeout_s"] for p in points
                       if p.get("case") == "sweep" and p.get("source") == "sim"})
    fig, axes = plt.subplots(1, max(1, len(timeouts)), figsize=(4.6 * max(1, len(timeouts)),
                                                                 4.8),
                             squeeze=False, sharey=True)
    steady = summary.get("steady_iteration_s")
    for ax, t in zip(axes[0], timeouts, strict=False):
        ax.set_xscale("log")
        ax.set_yscale("log")
        failed_drawn = False
        for i, scheme in enumerate(OUTAGE_SCHEMES):
            pts = _sweep_pts(points, scheme, t)
            if not pts:
                continue
            ok = [p for p in pts if p["survived"] and p.get("stall_s")]
            ax.plot([p["fault_s"] for p in ok], [p["stall_s"] for p in ok],
                    marker="osD^"[i], ms=6 - i, lw=2.2 - 0.4 * i, ls=("-", "--", "-.", ":")[i],
                    color=PALETTE[i], mfc="none" if i % 2 else None,
                    label=OUTAGE_LABELS[scheme])
            bad = [p for p in pts if not p["survived"]]
            if bad:
                ax.plot([p["fault_s"] for p in bad], [p["stall_s"] or p["failed_after_s"]
                                                      for p in bad],
                        ls="none", marker="X", ms=9, color="black",
                        label=None if failed_drawn else "failed: collective time-out")
                failed_drawn = True
        emu = [p for p in points if p.get("source") == "emu"
               and p.get("collective_timeout_s") in (t, None) and p.get("stall_s")]
        if emu:
            ax.plot([p["fault_s"] for p in emu], [p["stall_s"] for p in emu], ls="none",
                    marker="s", ms=8, mfc="none", mec="#e45756", mew=1.6,
                    label="emulation (measured)")
        ax.set_title(f"collective time-out {t:g} s", fontsize=10)
        ax.set_xlabel("fault length: cut until repair (s, log)")
        ax.grid(True, which="both", alpha=0.3)
        _outage_refs(ax, steady)
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16),
                  frameon=False)
    axes[0][0].set_ylabel("stall: extra time of the touched iterations (s, log)")
    fig.suptitle(f"lightpipe reproduce outage ({summary.get('scenario')}): the job's stall "
                 "through a fibre cut, simulated" + (", with emulation points"
                                                     if any(p.get("source") == "emu"
                                                            for p in points) else ""))
    fig.tight_layout()
    return fig


def outage_ablation_figure(points: Sequence[dict[str, Any]], summary: dict[str, Any]) -> Any:
    """Left: what protection buys (stall at a few fault lengths, per scheme). Middle:
    what the detour costs afterwards (JCT change beyond the stall, per scheme, at the
    longest fault). Right: the transport and fail/retry ablations without protection."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from testbed.report.figures import PALETTE

    sim = [p for p in points if p.get("source") == "sim"]
    tmax = max((p["collective_timeout_s"] for p in sim if p["case"] == "sweep"), default=None)
    faults = sorted({p["fault_s"] for p in sim if p["case"] == "sweep"})
    show = [f for f in faults if f in (0.01, 0.1, 1.0, 10.0, 60.0)] or faults[:5]
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.9))
    ax = axes[0]
    width = 0.8 / len(OUTAGE_SCHEMES)
    for i, scheme in enumerate(OUTAGE_SCHEMES):
        pts = {p["fault_s"]: p for p in _sweep_pts(points, scheme, tmax)}
        xs = [k - 0.4 + width * (i + 0.5) for k in range(len(show))]
        ys = [pts[f]["stall_s"] if f in pts and pts[f]["stall_s"] else 0.0 for f in show]
        ax.bar(xs, ys, width, color=PALETTE[i], label=OUTAGE_LABELS[scheme])
    ax.set_yscale("log")
    ax.set_xticks(range(len(show)), [f"{f:g}" for f in show])
    ax.set_xlabel("fault length (s)")
    ax.set_ylabel("stall (s, log)")
    ax.set_title(f"what protection buys (time-out {tmax:g} s)" if tmax else
                 "what protection buys", fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=7)
    ax = axes[1]
    f_ref = 1.0 if 1.0 in faults else (faults[len(faults) // 2] if faults else None)
    labels, cost, slow, spec = [], [], [], []
    for scheme in OUTAGE_SCHEMES:
        pts = {p["fault_s"]: p for p in _sweep_pts(points, scheme, tmax)}
        p = pts.get(f_ref)
        if p is None:
            continue
        labels.append(scheme)
        cost.append(p.get("detour_cost_s") or 0.0)
        slow.append(p.get("slowdown_after") or 0.0)
        spec.append(p.get("spectrum_utilization") or 0.0)
    bars = ax.bar(labels, cost, color=[PALETTE[OUTAGE_SCHEMES.index(s)] for s in labels])
    for b, sl, sp in zip(bars, slow, spec, strict=True):
        ax.annotate(f"{sl:+.1%}/iter\nspectrum {sp:.3f}", (b.get_x() + b.get_width() / 2,
                                                           b.get_height()),
                    ha="center", va="bottom", fontsize=7)
    ax.set_ylabel("JCT change beyond the stall (s)")
    ax.set_xlabel("protection scheme (above a bar: slowdown per iteration after the "
                  "event,\ntime-averaged share of the slots held)", fontsize=8)
    ax.set_ylim(0, max(cost, default=1.0) * 1.25 or 1.0)
    ax.set_title(f"what the detour costs afterwards (fault {f_ref:g} s)", fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    ax = axes[2]
    ax.set_xscale("log")
    ax.set_yscale("log")
    lines = [("sweep", tmax, "TCP, fail (the sweep)")]
    cases = sorted({p["case"] for p in sim if p["case"] != "sweep"
                    and not p["case"].startswith("1+1-switch")})
    for c in cases:
        t = next(p["collective_timeout_s"] for p in sim if p["case"] == c)
        lines.append((c, t, {"transport-ideal": "ideal transport (resumes at the repair)"}
                      .get(c, f"retry: restart after a {t:g} s time-out")))
    for i, (case, t, label) in enumerate(lines[:5]):
        pts = [p for p in sim if p["case"] == case and p["protection"] == "none"
               and p["collective_timeout_s"] == t and p["survived"] and p.get("stall_s")]
        pts.sort(key=lambda p: p["fault_s"])
        ax.plot([p["fault_s"] for p in pts], [p["stall_s"] for p in pts],
                marker="osD^v"[i], ls=("-", "--", "-.", ":", "-")[i], color=PALETTE[i],
                label=label, mfc="none" if i % 2 else None)
    ax.set_xlabel("fault length, no protection (s, log)")
    ax.set_ylabel("stall (s, log)")
    ax.set_title("transport and fail / retry (failed points left out)", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    _outage_refs(ax, summary.get("steady_iteration_s"))
    ax.legend(fontsize=7)
    fig.suptitle("lightpipe reproduce outage: ablations (simulated)")
    fig.tight_layout()
    return fig
