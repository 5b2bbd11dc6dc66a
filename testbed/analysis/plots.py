"""Line plots with error bars (headless matplotlib): one helper for every figure of a table."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Series:
    """One line: points (x, y) and, optionally, a 95 % interval half-width per point."""

    label: str
    x: Sequence[Any]
    y: Sequence[float]
    err: Sequence[float] | None = None


@dataclass(frozen=True)
class Panel:
    """One set of axes: its lines, labels, log scales, a reference line and marks."""

    series: Sequence[Series]
    xlabel: str
    ylabel: str
    title: str | None = None
    logx: bool = False
    logy: bool = False
    reference: tuple[float, str] | None = None  # horizontal line (y, label)
    marks: Mapping[str, float | None] = field(default_factory=dict)  # vertical lines


def save_plot(path: Path, panels: Sequence[Panel], *, title: str | None = None,
              panel_size: tuple[float, float] = (6.4, 4.2), dpi: int = 120,
              legend_fontsize: float = 8, marker_size: float | None = None) -> None:
    """Draw the panels side by side into a PNG at `path`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(panel_size[0] * len(panels),
                                                      panel_size[1]), squeeze=False)
    for ax, panel in zip(axes[0], panels, strict=True):
        _draw(ax, panel, marker_size)
        if panel.series or panel.reference:
            ax.legend(fontsize=legend_fontsize)
    if title is not None:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)


def _draw(ax: Any, panel: Panel, marker_size: float | None) -> None:
    for s in panel.series:
        if s.err is None:
            ax.plot(s.x, s.y, marker="o", ms=marker_size, label=s.label)
        else:
            ax.errorbar(s.x, s.y, yerr=s.err, marker="o", capsize=3, label=s.label)
    if panel.reference is not None:
        ax.axhline(panel.reference[0], color="grey", ls="--", lw=1, label=panel.reference[1])
    for label, xv in panel.marks.items():
        if xv is not None:
            ax.axvline(xv, color="black", ls=":", lw=1)
            ax.annotate(label, (xv, ax.get_ylim()[1]), fontsize=7, rotation=90, va="top")
    if panel.logx:
        ax.set_xscale("log")
    if panel.logy:
        ax.set_yscale("log")
    ax.set_xlabel(panel.xlabel)
    ax.set_ylabel(panel.ylabel)
    if panel.title is not None:
        ax.set_title(panel.title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
