"""Agreement between the simulator and the emulator: per job, predicted vs measured time."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any


def relative_error(simulated: float, emulated: float) -> float:
    """|emulated - simulated| / simulated."""
    if not simulated > 0:
        raise ValueError(f"simulated iteration time must be > 0, got {simulated}")
    return abs(emulated - simulated) / simulated


def agreement_rows(simulated_s: Mapping[str, float],
                   emulated_s: Mapping[str, float | None]) -> list[dict[str, Any]]:
    """One row per job in simulated_s: job, both iteration times (s), relative error.

    A job without an emulated time (its workers failed) gets None for the emulated
    time and the error, so the table still lists it.
    """
    rows = []
    for job, sim in simulated_s.items():
        emu = emulated_s.get(job)
        ok = emu is not None and math.isfinite(emu)
        rows.append({"job": job, "simulated_iteration_time_s": sim,
                     "emulated_iteration_time_s": emu if ok else None,
                     "relative_error": relative_error(sim, emu) if ok else None})  # type: ignore[arg-type]
    return rows


def markdown_table(rows: Sequence[Mapping[str, Any]], title_cols: Sequence[str] = ()) -> str:
    """The agreement rows as a Markdown table (extra leading columns from title_cols)."""
    cols = [*title_cols, "job", "simulated_iteration_time_s", "emulated_iteration_time_s",
            "relative_error"]
    head = ["job" if c == "job" else c.replace("_iteration_time_s", " (s)")
            .replace("relative_error", "rel. error") for c in cols]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        cells = []
        for c in cols:
            v = r.get(c)
            if v is None:
                cells.append("-")
            elif c == "relative_error":
                cells.append(f"{100 * v:.1f} %")
            elif isinstance(v, float):
                cells.append(f"{v:.4f}")
            else:
                cells.append(str(v))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
