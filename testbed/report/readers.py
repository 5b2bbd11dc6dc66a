"""Read a run directory's records leniently (a missing or broken file reads as empty)."""

from __future__ import annotations

import csv
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
    try:
        with path.open(newline="") as fh:
            return list(csv.DictReader(fh))
    except OSError:
        return []


def num(value: Any) -> float:
    """A CSV cell as a float (nan when empty or not a number)."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan
