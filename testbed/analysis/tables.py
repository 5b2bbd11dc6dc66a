"""Rows to CSV text: one writer for every record and reproduction table."""

from __future__ import annotations

import csv
import io
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any


def columns_of(rows: Iterable[Mapping[str, Any]]) -> list[str]:
    """Every key of the rows, in first-seen order."""
    cols: dict[str, None] = {}
    for r in rows:
        cols.update(dict.fromkeys(r))
    return list(cols)


def short_float(v: Any) -> Any:
    """Cell format of the reproduction tables: None as empty, floats to 6 significant digits."""
    if v is None:
        return ""
    return f"{v:.6g}" if isinstance(v, float) else v


def rows_to_csv(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None,
                cell: Callable[[Any], Any] | None = None) -> str:
    """CSV text (header + one line per row, '\\n' line ends) of dict rows.

    columns: the header (default: every key, first-seen order); cell: formats each value
    (default: as the csv module writes it).
    """
    cols = list(columns) if columns is not None else columns_of(rows)
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=cols, lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow(r if cell is None else {k: cell(v) for k, v in r.items()})
    return buf.getvalue()
