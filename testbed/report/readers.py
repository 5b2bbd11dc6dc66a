"""Read a run directory for the report: leniently (a missing or refused file reads as empty),
safely (testbed.io.bounded.DirReader: no links followed, regular files of the directory's
owner only, bounded), and cheaply (caps on rows, table rows and figure points)."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from testbed.io.bounded import RUNDIR_JSON_MAX_BYTES, DirReader

TABLE_MAX_ROWS = 500
"""Rows of one table shown on the page (the rest is in the file itself)."""
FIGURE_MAX_POINTS = 2_000
"""Points of one line of a figure (a longer series is thinned evenly)."""
FIGURE_MAX_BARS = 60
"""Bars of one bar chart; more categories are drawn as a distribution instead."""
FIGURE_MAX_LINES = 12
"""Lines (series, groups) of one figure."""
FIGURE_MAX_SPANS = 5_000
"""Bars of one timeline figure."""
PIPELINE_MAX_OPS = 64 * 1024
"""Stages x micro-batches of a pipeline timeline the report has the engine time."""
MARKDOWN_MAX_FILES = 16
"""A reproduction's Markdown tables shown (its *.md files)."""
TRACE_MAX_BYTES = 32 << 20
"""Largest trace.json read (a Chrome trace of the emulated workers)."""


def open_run(path: str | os.PathLike[str] | DirReader) -> DirReader:
    """A DirReader of the run directory (the same one when given one)."""
    return path if isinstance(path, DirReader) else DirReader.open(Path(path))


def read_json(d: DirReader | str | os.PathLike[str], name: str | None = None) -> Any:
    """The JSON value of d/name (or of the file d), None when absent or refused."""
    if name is None:
        with DirReader.open(Path(d).parent) as parent:
            return read_json(parent, Path(d).name)
    assert isinstance(d, DirReader)
    return d.read_json(name, TRACE_MAX_BYTES if name.endswith("trace.json") else
                       RUNDIR_JSON_MAX_BYTES)


def read_csv(d: DirReader | str | os.PathLike[str],
             name: str | None = None) -> list[dict[str, str]]:
    """A CSV record file's rows (d/name, or the file d): complete lines, at most
    CSV_MAX_ROWS ([] when absent or refused; see DirReader.read_csv)."""
    if name is None:
        with DirReader.open(Path(d).parent) as parent:
            return parent.read_csv(Path(d).name)
    assert isinstance(d, DirReader)
    return d.read_csv(name)


def num(value: Any) -> float:
    """A CSV cell as a float (nan when empty or not a number)."""
    try:
        return float(value)
    except (TypeError, ValueError, OverflowError):
        return math.nan


def table_rows(d: DirReader, rows: Sequence[Any], what: str) -> tuple[list[Any], str]:
    """At most TABLE_MAX_ROWS rows and a note saying how many were left out ('' if none)."""
    if len(rows) <= TABLE_MAX_ROWS:
        return list(rows), ""
    d.skip(what, f"table shows the first {TABLE_MAX_ROWS} of {len(rows)} rows")
    return list(rows[:TABLE_MAX_ROWS]), (f" First {TABLE_MAX_ROWS} of {len(rows)} rows "
                                         f"shown; all are in {what}.")


def thin(xs: Sequence[float], ys: Sequence[float],
         max_points: int = FIGURE_MAX_POINTS) -> tuple[list[float], list[float]]:
    """At most max_points evenly spaced points of a series, its first and last kept."""
    n = min(len(xs), len(ys))
    if n <= max_points:
        return list(xs[:n]), list(ys[:n])
    step = (n - 1) / (max_points - 1)
    idx = sorted({round(i * step) for i in range(max_points)})
    return [xs[i] for i in idx], [ys[i] for i in idx]


def small_pipeline(stages: Any, microbatches: Any) -> bool:
    """Whether a recorded pipeline is small enough to time and draw (PIPELINE_MAX_OPS)."""
    return (isinstance(stages, int) and isinstance(microbatches, int) and stages >= 1
            and microbatches >= 1 and stages * microbatches <= PIPELINE_MAX_OPS)
