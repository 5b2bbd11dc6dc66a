"""Build DIR/report.html for a run (sim, emu, both), a reproduction or a sweep directory."""

from __future__ import annotations

import logging
from pathlib import Path

from testbed.atomicio import atomic_write_text
from testbed.errors import InputError
from testbed.report import sections
from testbed.report.page import Section, render
from testbed.report.readers import read_json

log = logging.getLogger(__name__)

KINDS = ("sim", "emu", "both", "reproduction", "sweep")


def detect_kind(run_dir: Path) -> str:
    """sim | emu | both | reproduction | sweep; InputError when the directory is none."""
    if not run_dir.is_dir():
        raise InputError("DIR", f"{run_dir} is not a directory")
    if (run_dir / "sweep.json").exists():
        return "sweep"
    summ = read_json(run_dir / "summary.json")
    if isinstance(summ, dict) and ("experiment" in summ or "reproduces" in summ):
        return "reproduction"
    if (run_dir / "sim" / "summary.json").exists() and (run_dir / "emu" / "summary.json").exists():
        return "both"
    man = read_json(run_dir / "manifest.json")
    if isinstance(man, dict) and man.get("backend") in ("sim", "emu"):
        return str(man["backend"])
    if isinstance(summ, dict) and summ.get("backend") in ("sim", "emu"):
        return str(summ["backend"])
    raise InputError("DIR", f"{run_dir} holds no LightPipe run, reproduction or sweep "
                     "(no manifest.json, summary.json or sweep.json)")


def check_finished(path: Path, kind: str) -> None:
    """InputError (one line: its status and partial records) for a run that did not
    finish: a report of a partial run would pass for a whole one."""
    from testbed.rundir import describe_unfinished

    for d in ((path / "sim", path / "emu") if kind == "both" else (path,)):
        why = describe_unfinished(d)
        if why is not None:
            raise InputError("DIR", f"{why}; no report for an unfinished run (its records "
                             "are CSV files with a header: read them directly)")


def build_report(run_dir: str | Path) -> Path:
    """Write run_dir/report.html (self-contained) and return its path."""
    given = str(run_dir)
    path = Path(run_dir)
    kind = detect_kind(path)
    check_finished(path, kind)
    secs: list[Section]
    if kind == "sweep":
        secs = sections.sweep(path)
        title = f"sweep: {path.name}"
    elif kind == "reproduction":
        secs = sections.reproduction(path)
        summ = read_json(path / "summary.json") or {}
        title = f"reproduction: {summ.get('experiment') or summ.get('reproduces', path.name)}"
    elif kind == "both":
        secs = sections.run(path / "sim", "sim") + sections.run(path / "emu", "emu")
        secs += sections.agreement(path)
        title = f"run (sim and emu): {path.name}"
    else:
        secs = sections.run(path, kind)
        title = f"{kind} run: {path.name}"
    scen = sections.scenario_name(path if kind not in ("both",) else path / "sim")
    if scen:
        title = f"{title} ({scen})"
    html = render(title, kind, given, secs)
    return atomic_write_text(path / "report.html", html)
