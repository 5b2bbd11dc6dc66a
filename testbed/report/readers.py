"""Read a run directory's records leniently (a missing or broken file reads as empty)."""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path
from typing import Any


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def read_csv(path: Path) -> list[dict[str, str]]:
    """A CSV file's rows; a torn last line (a run killed while writing it) is ignored."""
    from testbed.rundir import complete_text

    try:
        text = complete_text(path)
    except OSError:
        return []
    return list(csv.DictReader(io.StringIO(text, newline="")))


def num(value: Any) -> float:
    """A CSV cell as a float (nan when empty or not a number)."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan
