"""The report's figures (matplotlib, headless): each returns a Figure; `data_uri` inlines it."""

from __future__ import annotations

import base64
import io
import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.figure import Figure

PALETTE = ("#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#b279a2", "#ff9da6",
           "#9d755d", "#bab0ac", "#eeca3b")
plt.rcParams.update({"font.size": 10, "axes.titlesize": 11, "axes.labelsize": 10,
                     "legend.fontsize": 9, "svg.fonttype": "none"})

LEGEND_MAX_LINES = 6
"""Lines of one legend: beyond it the largest LEGEND_MAX_LINES - 1 and one 'others' line,
or small multiples (panels of at most this many)."""
# name suffix -> unit (LightPipe puts units in names: length_km, rate_gbps, delay_ms)
_SUFFIX_UNITS = (("_ms", "ms"), ("_s", "s"), ("_gbps", "Gbit/s"), ("_km", "km"),
                 ("_erlang", "Erlang"), ("_usd", "USD"), ("_kwh", "kWh"), ("_mb", "MB"),
                 ("_gb", "GB"), ("_pct", "%"), ("_ratio", "0-1"), ("_bytes", "bytes"))
_NAME_UNITS = {"blocking_ratio": "blocked / requested", "bubble_ratio": "idle / iteration time",
               "bitrate_blocking_ratio": "blocked / requested Gbit/s",
               "mean_spectrum_utilization": "occupied / all slots",
               "spectrum_utilization": "occupied / all slots", "gpu_utilization": "0-1",
               "seed": "index", "slots": "slots", "requests": "requests", "jobs": "jobs",
               "k_paths": "paths", "stages": "stages", "microbatches": "micro-batches"}


def axis_label(name: str) -> str:
    """A field name as an axis label with its unit: 'workload.load_erlang' ->
    'workload.load_erlang (Erlang)'; a name with no known unit says '(value)'."""
    leaf = name.split(".")[-1]
    if leaf in _NAME_UNITS:
        return f"{name} ({_NAME_UNITS[leaf]})"
    for suffix, unit in _SUFFIX_UNITS:
        if leaf.endswith(suffix):
            return f"{name} ({unit})"
    return f"{name} (value)"


def top_and_others(groups: Mapping[str, Sequence[float]], size: Any = len,
                   merge: str = "all") -> dict[str, list[float]]:
    """At most LEGEND_MAX_LINES groups: the largest by `size`, the rest as one
    'others (N groups)' group of all their values."""
    if len(groups) <= LEGEND_MAX_LINES:
        return {k: list(v) for k, v in groups.items()}
    ranked = sorted(groups, key=lambda k: -size(groups[k]))
    keep = ranked[:LEGEND_MAX_LINES - 1]
    rest = ranked[LEGEND_MAX_LINES - 1:]
    out = {k: list(groups[k]) for k in groups if k in keep}
    out[f"others ({len(rest)} groups)"] = [v for k in rest for v in groups[k]]
    return out


def note_if_all_zero(ax: Any, values: Iterable[float]) -> bool:
    """Write 'every value is 0' across an axes whose data are all zero; whether it did."""
    vals = [v for v in values if isinstance(v, int | float) and math.isfinite(v)]
    if vals and not any(vals):
        ax.text(0.5, 0.5, "every value is 0", transform=ax.transAxes, ha="center",
                va="center", fontsize=11, color="#a33",
                bbox={"facecolor": "white", "edgecolor": "#a33"})
        return True
    return False


def data_uri(fig: Figure, fmt: str = "svg", dpi: int = 110) -> str:
    """The figure as a data: URI (SVG text or PNG), closing the figure."""
    buf = io.BytesIO()
    try:
        fig.savefig(buf, format=fmt, dpi=dpi, bbox_inches="tight")
    finally:
        plt.close(fig)
    mime = "image/svg+xml" if fmt == "svg" else "image/png"
    return f"data:{mime};base64,{base64.b64encode(buf.getvalue()).decode('ascii')}"


def save(fig: Figure, path: Any, dpi: int = 110) -> None:
    """Write the figure as PNG to path atomically, closing it."""
    from testbed.io.atomic import atomic_write_bytes

    buf = io.BytesIO()
    try:
        fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    finally:
        plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())


# ------------------------------------------------------------------ topology and spectrum
def topology_map(graph: Any, dcs: Mapping[str, str], usage: Mapping[frozenset, float],
                 usage_label: str, cuts: Iterable[frozenset] = (), title: str = "") -> Figure:
    """Nodes (DCs highlighted, named), fibres grey, fibres in use drawn wider by `usage`,
    cut fibres red dashed. Node positions never overlap (layout.spread_layout)."""
    import networkx as nx

    from testbed.topologies.layout import spread_layout

    pos = spread_layout(graph)
    fig, ax = plt.subplots(figsize=(8.5, 5.8))
    top = max(usage.values(), default=0.0) or 1.0
    cutset = set(cuts)
    for u, v in graph.edges:
        key = frozenset((u, v))
        (x0, y0), (x1, y1) = pos[u], pos[v]
        ax.plot([x0, x1], [y0, y1], color="#cccccc", lw=1.2, zorder=1)
        val = usage.get(key, 0.0)
        if val > 0:
            ax.plot([x0, x1], [y0, y1], color=PALETTE[0], lw=1.0 + 9.0 * val / top,
                    alpha=0.75, zorder=2, solid_capstyle="round")
        if key in cutset:
            ax.plot([x0, x1], [y0, y1], color="#d62728", lw=2.0, ls="--", zorder=3)
    dc_nodes = [n for n in graph.nodes if n in dcs]
    other = [n for n in graph.nodes if n not in dcs]
    nx.draw_networkx_nodes(graph, pos, nodelist=other, node_color="#dddddd",
                           edgecolors="#666666", node_size=330, ax=ax)
    nx.draw_networkx_nodes(graph, pos, nodelist=dc_nodes, node_color=PALETTE[1],
                           edgecolors="#333333", node_size=520, ax=ax)
    nx.draw_networkx_labels(graph, pos, font_size=8, ax=ax)
    for n in dc_nodes:
        x, y = pos[n]
        ax.annotate(dcs[n], (x, y), xytext=(0, 14), textcoords="offset points",
                    ha="center", fontsize=8, color="#8a4b00", weight="bold")
    handles = [plt.Line2D([], [], color="#cccccc", lw=1.2, label="fibre"),
               plt.Line2D([], [], color=PALETTE[0], lw=6, alpha=0.75,
                          label=f"in use (width: {usage_label}, max {top:.3g})"),
               plt.Line2D([], [], marker="o", ls="", color=PALETTE[1], markersize=10,
                          label="datacentre")]
    if cutset:
        handles.append(plt.Line2D([], [], color="#d62728", ls="--", lw=2, label="fibre cut"))
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=2,
              fontsize=8, frameon=False)
    ax.set_title(title)
    ax.axis("off")
    ax.margins(0.08)
    return fig


def spectrum_heatmap(grid: Sequence[Sequence[float]], row_labels: Sequence[str],
                     xlabel: str, extent_x: tuple[float, float] | None, title: str,
                     cbar_label: str, height_in: float | None = None,
                     ylabel: str = "") -> Figure:
    """Rows (fibres, or slots) x columns (slots, or time) of occupancy in [0, 1]."""
    import numpy as np

    arr = np.asarray(grid, dtype=float)
    fig, ax = plt.subplots(figsize=(9, height_in or 0.22 * max(len(row_labels), 8) + 1.6))
    ext = None
    if extent_x is not None:
        ext = (extent_x[0], extent_x[1], len(row_labels) - 0.5, -0.5)
    im = ax.imshow(arr, aspect="auto", interpolation="nearest", cmap="viridis", vmin=0,
                   vmax=max(1.0, float(arr.max()) if arr.size else 1.0), extent=ext)
    shown = [i for i, lab in enumerate(row_labels) if lab]
    ax.set_yticks(shown, [row_labels[i] for i in shown], fontsize=7)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    fig.colorbar(im, ax=ax, label=cbar_label, fraction=0.03)
    return fig


# ------------------------------------------------------------------ pipeline timeline
_OP_COLOURS = {"F": "#4c78a8", "B": "#e45756", "I": "#e45756", "W": "#f58518"}


def _engine_bars(ax: Any, timing: Any) -> int:
    """Draw the engine's ops and transfers on ax; return the number of stages."""
    stages = max((o.stage for o in timing.ops), default=-1) + 1
    for o in timing.ops:
        ax.barh(o.stage, o.end_ms - o.start_ms, left=o.start_ms, height=0.5,
                color=_OP_COLOURS.get(o.action.kind, "#888888"), edgecolor="white", lw=0.3)
    for t in timing.transfers:
        ax.barh(t.src - 0.36, max(t.leave_ms - t.start_ms, 1e-3), left=t.start_ms, height=0.14,
                color="#54a24b", lw=0)
        ax.barh(t.dst + 0.36, max(t.arrive_ms - t.leave_ms, 1e-3), left=t.leave_ms,
                height=0.14, color="#b279a2", lw=0)
    ax.set_yticks(range(stages), [f"stage {s}" for s in range(stages)])
    ax.invert_yaxis()
    return stages


def _engine_legend() -> list[Any]:
    from matplotlib.patches import Patch

    return [Patch(color="#4c78a8", label="forward"), Patch(color="#e45756", label="backward"),
            Patch(color="#54a24b", label="send (serialisation)"),
            Patch(color="#b279a2", label="receive (in flight)"),
            Patch(facecolor="white", edgecolor="#999999", label="idle")]


def gantt(timing: Any, title: str) -> Figure:
    """Per stage: compute (F forward, B backward), send and receive bars on the hop, idle
    left white. Times in ms from the schedule engine's exact timer."""
    stages = max((o.stage for o in timing.ops), default=-1) + 1
    fig, ax = plt.subplots(figsize=(10, 0.75 * stages + 1.6))
    _engine_bars(ax, timing)
    ax.set_xlabel("time within one iteration (ms)")
    ax.set_title(title)
    ax.legend(handles=_engine_legend(), loc="upper center", bbox_to_anchor=(0.5, -0.18),
              ncol=5, fontsize=8)
    return fig


_SPAN_COLOURS = {"forward": "#4c78a8", "backward": "#e45756", "wait (idle)": "#bbbbbb"}


def gantt_side_by_side(timing: Any, spans: Sequence[tuple[int, str, float, float]],
                       title: str, left_title: str, right_title: str) -> Figure:
    """The engine's timeline (left) and the workers' measured one (right), one row per
    stage, both in ms from the iteration's start on one shared time axis scale."""
    from matplotlib.patches import Patch

    stages = max(max((o.stage for o in timing.ops), default=-1),
                 max((s[0] for s in spans), default=-1)) + 1
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 0.6 * stages + 2.0), sharex=True,
                                      sharey=True)
    _engine_bars(left, timing)
    kinds = list(dict.fromkeys(s[1] for s in spans))
    colours = {k: _SPAN_COLOURS.get(k, PALETTE[(i + 2) % len(PALETTE)])
               for i, k in enumerate(kinds)}
    for stage, kind, start, end in spans:
        right.barh(stage, max(end - start, 1e-3), left=start, height=0.5 if kind in (
            "forward", "backward") else 0.3, color=colours[kind], edgecolor="white", lw=0.3)
    right.tick_params(labelleft=True)
    for ax, sub in ((left, left_title), (right, right_title)):
        ax.set_xlabel("time within one iteration (ms)")
        ax.set_title(sub, fontsize=10)
        ax.grid(alpha=0.3, axis="x")
    handles = _engine_legend()[:4] + [Patch(color=colours[k], label=f"measured {k}")
                                      for k in kinds if k not in ("forward", "backward")]
    fig.suptitle(title)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    fig.legend(handles=handles, loc="lower center", ncol=min(len(handles), 6), fontsize=8,
               frameon=False)
    return fig


def worker_gantt(spans: Sequence[tuple[str, str, float, float]], title: str) -> Figure:
    """Measured spans (row label, kind, start s, end s) of the emulated workers."""
    from matplotlib.patches import Patch

    rows = list(dict.fromkeys(s[0] for s in spans))
    kinds = list(dict.fromkeys(s[1] for s in spans))
    colours = {k: PALETTE[i % len(PALETTE)] for i, k in enumerate(kinds)}
    fig, ax = plt.subplots(figsize=(10, 0.5 * len(rows) + 1.6))
    for label, kind, start, end in spans:
        ax.barh(rows.index(label), max(end - start, 1e-4), left=start, height=0.6,
                color=colours[kind], lw=0)
    ax.set_yticks(range(len(rows)), rows, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("time since the first span (s)")
    ax.set_title(title)
    ax.legend(handles=[Patch(color=colours[k], label=k) for k in kinds], fontsize=8,
              loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=min(len(kinds), 5))
    return fig


# ------------------------------------------------------------------ distributions, series
def histograms(groups: Mapping[str, Sequence[float]], xlabel: str, title: str,
               ylabel: str = "jobs") -> Figure:
    """One step histogram per group on shared bins (groups never share a line)."""
    fig, ax = plt.subplots(figsize=(7.5, 4))
    groups = top_and_others(groups)
    values = [v for vs in groups.values() for v in vs if math.isfinite(v)]
    if values:
        lo, hi = min(values), max(values)
        bins = 30 if hi > lo else 1
        for i, (name, vs) in enumerate(groups.items()):
            ax.hist([v for v in vs if math.isfinite(v)], bins=bins, range=(lo, hi or 1.0),
                    histtype="step", lw=1.8, color=PALETTE[i % len(PALETTE)],
                    label=f"{name} (n={len(vs)})")
        ax.legend()
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    return fig


def series(lines: Mapping[str, tuple[Sequence[float], Sequence[float]]], xlabel: str,
           ylabel: str, title: str, step: bool = False) -> Figure:
    """One line per named series (x, y): at most 2 x FIGURE_MAX_LINES lines of at most
    FIGURE_MAX_POINTS points each (longer series thinned evenly)."""
    from testbed.report.readers import FIGURE_MAX_LINES, thin

    fig, ax = plt.subplots(figsize=(7.5, 3.6))
    items = list(itertools.islice(lines.items(), FIGURE_MAX_LINES * 2))
    if len(items) > LEGEND_MAX_LINES:
        items.sort(key=lambda kv: -max((abs(v) for v in kv[1][1] if v == v), default=0.0))
        rest = items[LEGEND_MAX_LINES - 1:]
        by_x: dict[float, list[float]] = {}
        for _n, (xs_r, ys_r) in rest:
            for x, y in zip(xs_r, ys_r, strict=False):
                by_x.setdefault(x, []).append(y)
        xs_o = sorted(by_x)
        others = (f"others ({len(rest)} lines, mean)",
                  (xs_o, [sum(by_x[x]) / len(by_x[x]) for x in xs_o]))
        items = [*items[:LEGEND_MAX_LINES - 1], others]
    for i, (name, (xs0, ys0)) in enumerate(items):
        xs, ys = thin(xs0, ys0)  # (a few thousand points per line at most)
        kw: dict[str, Any] = {"color": PALETTE[i % len(PALETTE)], "label": name, "lw": 1.5}
        if len(xs) <= 30:
            kw["marker"] = "os^vDPX*"[i % 8]
            kw["ms"] = 4
        if step:
            ax.step(xs, ys, where="post", **kw)
        else:
            ax.plot(xs, ys, **kw)
    if len(items) > 2:  # (below the axes: a legend never covers the lines)
        ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=2,
                  frameon=False)
    elif len(items) > 1:
        ax.legend(fontsize=8)
    note_if_all_zero(ax, [v for _n, (_x, ys) in items for v in ys])
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    return fig


def bars(labels: Sequence[str], values: Sequence[float], errors: Sequence[float] | None,
         ylabel: str, title: str, xlabel: str = "") -> Figure:
    """A bar per category with optional 95 % CI whiskers (categorical x: no line)."""
    fig, ax = plt.subplots(figsize=(max(5.0, 0.9 * len(labels) + 2), 3.8))
    ax.bar(range(len(labels)), values, yerr=errors, capsize=4, color=PALETTE[0])
    note_if_all_zero(ax, values)
    ax.set_xticks(range(len(labels)), labels, rotation=20 if len(labels) > 4 else 0,
                  ha="right" if len(labels) > 4 else "center")
    ax.set_ylabel(ylabel)
    ax.set_xlabel(xlabel)
    ax.set_title(title)
    ax.grid(alpha=0.3, axis="y")
    return fig


def grouped_bars(categories: Sequence[str], groups: Mapping[str, tuple[Sequence[float],
                                                                        Sequence[float]]],
                 ylabel: str, title: str, xlabel: str) -> Figure:
    """Categories on x; one bar colour per group (with 95 % CI whiskers), legend below."""
    import numpy as np

    items = list(groups.items())
    chunks = [items[i:i + LEGEND_MAX_LINES] for i in range(0, len(items), LEGEND_MAX_LINES)] \
        or [[]]
    n_max = max(max(len(c) for c in chunks), 1)
    fig, axes = plt.subplots(len(chunks), 1, squeeze=False, sharey=True, figsize=(
        max(6.0, 1.2 * len(categories) * max(1, n_max / 2) + 2), 4.2 * len(chunks)))
    x = np.arange(len(categories))
    for ax, chunk in zip(axes[:, 0], chunks, strict=True):
        n = max(len(chunk), 1)
        width = 0.8 / n
        for i, (label, (vals, errs)) in enumerate(chunk):
            ax.bar(x - 0.4 + width * (i + 0.5), vals, width, yerr=errs, capsize=3,
                   color=PALETTE[(i + LEGEND_MAX_LINES * chunks.index(chunk)) % len(PALETTE)],
                   label=label)
        note_if_all_zero(ax, [v for _l, (vals, _e) in chunk for v in vals])
        ax.set_xticks(x, categories)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3, axis="y")
        if n > 1:
            ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16),
                      ncol=min(n, 2))
    axes[0, 0].set_title(title)
    if len(chunks) > 1:
        fig.tight_layout()
    return fig


# ------------------------------------------------------------------ policy comparisons
def policy_panels(rows: Sequence[Mapping[str, Any]], metrics: Sequence[tuple[str, str, float]],
                  title: str, x_key: str = "mean_interarrival_s",
                  x_of: Any = None, xlabel: str = "arrival rate (jobs / hour)") -> Figure:
    """One panel per metric (key, axis label with unit, scale); per policy a line over the
    load sweep with 95 % CI bars. Rows of another `case` (e.g. the small MILP case) are
    drawn as separate unconnected markers, never joined to the sweep's lines."""
    x_of = x_of or (lambda v: 3600.0 / v)
    fig, axes = plt.subplots(1, len(metrics), figsize=(4.6 * len(metrics), 4.3), squeeze=False)
    cases = list(dict.fromkeys(r.get("case") or "" for r in rows))
    policies = list(dict.fromkeys(r["policy"] for r in rows))
    colour = {p: PALETTE[i % len(PALETTE)] for i, p in enumerate(policies)}
    for ax, (key, label, scale) in zip(axes[0], metrics, strict=True):
        for case in cases:
            for i, pol in enumerate(policies):
                if key.endswith(f"_vs_{pol}"):
                    continue  # the baseline against itself is the 0 line
                dodge = 1.0 + 0.015 * (i - (len(policies) - 1) / 2)  # coincident policies
                pts = sorted((x_of(r[x_key]) * dodge, r[key] * scale,
                              (r.get(f"{key}_ci95") or 0) * scale)
                             for r in rows if r["policy"] == pol and (r.get("case") or "") == case
                             and isinstance(r.get(key), int | float)
                             and not math.isnan(r[key]))
                if not pts:
                    continue
                if case:
                    ax.errorbar([p[0] for p in pts], [p[1] for p in pts],
                                yerr=[p[2] for p in pts], ls="none", marker="D", ms=7,
                                mfc="white", capsize=3, color=colour[pol], mew=1.5,
                                label=f"{pol} ({case} case)")
                else:
                    ax.errorbar([p[0] for p in pts], [p[1] for p in pts],
                                yerr=[p[2] for p in pts], marker="o", capsize=3,
                                color=colour[pol], label=pol)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    seen: dict[str, Any] = {}
    for ax in axes[0]:
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            seen.setdefault(lab, h)
    # A policy drawn both on the sweep and in a separate case needs one legend line, not
    # two: its colour names it, one hollow-marker line names the case.
    for case in [c for c in cases if c]:
        twins = [lab for lab in seen if lab.endswith(f" ({case} case)")
                 and lab.removesuffix(f" ({case} case)") in seen]
        if twins:
            for lab in twins:
                del seen[lab]
            seen[f"hollow: {case} case (colour: policy)"] = plt.Line2D(
                [], [], ls="none", marker="D", ms=7, mfc="white", mec="#555555", mew=1.5)
    fig.suptitle(title)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    fig.legend(list(seen.values()), list(seen), loc="lower center", ncol=min(len(seen), 6),
               fontsize=9, frameon=False)
    return fig
