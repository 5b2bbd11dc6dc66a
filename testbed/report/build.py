"""Build DIR/report.html for a run (sim, emu, both), a reproduction or a sweep directory."""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
from pathlib import Path

from testbed.errors import InputError
from testbed.io.bounded import DirReader
from testbed.report import sections
from testbed.report.page import Section, Table, render
from testbed.report.readers import read_json, table_rows

log = logging.getLogger(__name__)

KINDS = ("sim", "emu", "both", "reproduction", "sweep")


def detect_kind(d: DirReader) -> str:
    """sim | emu | both | reproduction | sweep; InputError when the directory is none."""
    if d.has("sweep.json"):
        return "sweep"
    summ = read_json(d, "summary.json")
    if isinstance(summ, dict) and ("experiment" in summ or "reproduces" in summ):
        return "reproduction"
    if d.has("sim") and d.has("emu") and (d.has("sim/summary.json")
                                          or d.has("emu/summary.json")):
        return "both"  # (a side that cannot be read is said on the page)
    man = read_json(d, "manifest.json")
    if isinstance(man, dict) and man.get("backend") in ("sim", "emu"):
        return str(man["backend"])
    if isinstance(summ, dict) and summ.get("backend") in ("sim", "emu"):
        return str(summ["backend"])
    refused = "; ".join(f"{p}: {why}" for p, why in d.skipped)
    raise InputError("DIR", f"{d.shown} holds no LightPipe run, reproduction or sweep "
                     "(no manifest.json, summary.json or sweep.json"
                     + (f" that could be read; skipped: {refused}" if refused else "")
                     + ")")


def check_finished(d: DirReader, kind: str) -> None:
    """InputError (one line: its status and partial records) for a run that did not
    finish: a report of a partial run would pass for a whole one."""
    from testbed.runs.rundir import describe_unfinished

    for sub in ((d.sub("sim"), d.sub("emu")) if kind == "both" else (d,)):
        why = describe_unfinished(sub) if sub is not None else None
        if why is not None:
            raise InputError("DIR", f"{why}; no report for an unfinished run (its records "
                             "are CSV files with a header: read them directly)")


def skipped_section(d: DirReader) -> list[Section]:
    """The inputs refused or cut short, said on the page (they are logged too)."""
    if not d.skipped:
        return []
    rows, note = table_rows(d, list(d.skipped), "the log")
    return [Section("skipped inputs", "These inputs of the directory were not read, or not "
                    "wholly, so the figures and tables below leave them out. A run "
                    "directory's files are read only when they are regular files (no "
                    "symbolic links, FIFOs or devices) owned by the directory's owner or "
                    "root, within size and row limits.",
                    tables=[Table(["input", "why"], rows, note.strip())])]


def build_report(run_dir: str | Path) -> Path:
    """Write run_dir/report.html (self-contained) and return its path. Every input is
    read relative to the directory opened once (testbed.io.bounded.DirReader); the page
    is written into that same directory."""
    return build_report_with_skips(run_dir)[0]


def build_report_with_skips(run_dir: str | Path) -> tuple[Path, list[tuple[str, str]]]:
    """build_report, and the inputs it skipped (path, why)."""
    given = str(run_dir)
    path = Path(run_dir)
    with DirReader.open(path) as d:
        if path.is_symlink():
            log.info("report: %s is a symbolic link to %s; reading that directory", path,
                     os.path.realpath(path))
        kind = detect_kind(d)
        check_finished(d, kind)
        secs: list[Section]
        if kind == "sweep":
            secs = sections.sweep(d)
            title = f"sweep: {path.name}"
        elif kind == "reproduction":
            secs = sections.reproduction(d)
            summ = read_json(d, "summary.json") or {}
            name = summ.get("experiment") or summ.get("reproduces", path.name)
            title = f"reproduction: {str(name)[:200]}"
        elif kind == "both":
            heads: list[Section] = []
            bodies: list[Section] = []
            tails: list[Section] = []
            for sub in ("sim", "emu"):
                sd = d.sub(sub)  # (a link is refused and recorded)
                if sd is not None:
                    head, body, tail = sections.run_parts(sd, sub)
                    heads += head
                    bodies += body
                    tails += tail
            secs = heads + sections.agreement(d) + bodies + tails
            title = f"run (sim and emu): {path.name}"
        else:
            secs = sections.run(d, kind)
            title = f"{kind} run: {path.name}"
        sd = d.sub("sim") if kind == "both" else d
        scen = sections.scenario_name(sd) if sd is not None else ""
        if scen:
            title = f"{title} ({scen})"
        html = render(title, kind, given, skipped_section(d) + secs)
        return write_into(d, "report.html", html), list(d.skipped)


def write_into(d: DirReader, name: str, text: str) -> Path:
    """Write d/name atomically relative to the directory's fd (the directory read, not
    whatever its path names by now): a new file, then a rename over `name`."""
    data = text.encode("utf-8")
    tmp = f".{name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o644, dir_fd=d.fd)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.rename(tmp, name, src_dir_fd=d.fd, dst_dir_fd=d.fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=d.fd)
        raise
    return Path(d.shown) / name
