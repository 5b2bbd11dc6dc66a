"""`lightpipe doctor`: what this machine can run, one line per check, with each fix."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from testbed.cli.common import emit, emit_json

if TYPE_CHECKING:
    from testbed.doctor import Check, Report

HELP = "what this machine can run: one line per check, the feature it enables, the fix"
MARKS = {"ok": "ok", "warn": "warn", "missing": "MISSING"}
ENABLES_MAX_CHARS = 56


def add_arguments(parser: argparse.ArgumentParser) -> None:
    shown = parser.add_mutually_exclusive_group()
    shown.add_argument("--json", action="store_true",
                       help="one JSON object: checks, simulator_ok, emulation")
    shown.add_argument("--summary", action="store_true",
                       help="short: only what is missing, then the summary line "
                            "(`make setup` ends with it)")


def run(args: argparse.Namespace) -> int:
    from testbed.doctor import diagnose, summary_line

    report = diagnose()
    if args.json:
        emit_json(report.as_dict())
    elif args.summary:
        for check in report.checks:
            if check.status != "ok":
                emit(short_line(check))
        emit(summary_line(report))
    else:
        emit(table(report))
        emit(summary_line(report))
    return 0 if report.simulator_ok else 1


def short_line(check: Check) -> str:
    """'doctor: MISSING torch, for real PyTorch pipeline workers: detail; fix: ...'."""
    return (f"doctor: {MARKS.get(check.status, check.status)} {check.name}, for "
            f"{check.enables}: {check.detail}" + (f"; fix: {check.fix}" if check.fix else ""))


def table(report: Report) -> str:
    """One line per check: status, name, what it enables, detail (and the fix)."""
    name_w = max(len(c.name) for c in report.checks)
    enables_w = min(ENABLES_MAX_CHARS, max(len(c.enables) for c in report.checks))
    lines = []
    for c in report.checks:
        enables = c.enables if len(c.enables) <= enables_w else c.enables[:enables_w - 3] + "..."
        text = c.detail + (f"; fix: {c.fix}" if c.fix else "")
        lines.append(f"{MARKS.get(c.status, c.status):<7} {c.name:<{name_w}}  "
                     f"{enables:<{enables_w}}  {text}")
    return "\n".join(lines)
