"""Helpers shared by subcommands: spec argument, --out, --quiet, output to stdout."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from testbed.spec import Scenario, load_scenario


def add_spec_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("spec", metavar="SPEC", help="scenario file (YAML)")


# How each kind of command writes --out (docs/spec.md, "Run records"): a run's records go
# into DIR as they come; a sweep's or reproduction's table is staged and swapped in whole.
STREAMED = ("output directory, written as the run goes: manifest.json says \"running\" "
            "until the end, when summary.json and the finished manifest are put in place")
STAGED = "output directory, built beside DIR and put in place whole at the end"


def add_out_arg(parser: argparse.ArgumentParser, required: bool = True,
                written: str = STREAMED) -> None:
    parser.add_argument("--out", metavar="DIR", required=required, help=written)
    parser.add_argument("--force", action="store_true",
                        help="replace DIR when it already holds a LightPipe run")


def add_quiet_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-q", "--quiet", action="store_true",
                        help="no progress bar or phase lines")


def add_report_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--report", action="store_true",
                        help="also write DIR/report.html (as `lightpipe report DIR` does)")


def add_run_args(parser: argparse.ArgumentParser) -> None:
    """What each command that runs one scenario takes: SPEC, --out DIR (written as the run
    goes) and --force, --quiet, --report."""
    add_spec_arg(parser)
    add_out_arg(parser)
    add_quiet_arg(parser)
    add_report_arg(parser)


def check_out(out: str, force: bool = False) -> None:
    """InputError naming --out (the path as given) when it cannot become a directory, or
    when it holds a LightPipe run and `force` is not given (with it: say what is replaced)."""
    import os

    from testbed.errors import InputError
    from testbed.io.outdir import busy_error, lock_owner

    p = Path(out)
    if p.exists() and not p.is_dir():
        raise InputError("--out", f"{out} exists and is not a directory")
    for d in (p, p / "sim", p / "emu"):  # a live writer is refused, --force or not
        pid = lock_owner(d.resolve())
        if pid is not None:
            raise busy_error(Path(out), pid)
    runs = [d for d in (p, p / "sim", p / "emu") if (d / "manifest.json").is_file()]
    if runs:  # a run, or both backends' runs under sim/ and emu/
        what = "; ".join(describe_run(d) for d in runs)
        if not force:
            raise InputError("--out", f"{out} already holds a LightPipe run ({what}); "
                             "--force replaces it, or choose another --out")
        emit(f"--force: replacing the run in {out} ({what})")
    parent = p.absolute().parent
    try:
        from testbed.io.trusted import make_dirs

        make_dirs(parent)  # (never writable by others, even under umask 000)
    except OSError as exc:
        raise InputError("--out", f"cannot create {out}: {exc.strerror.lower()}") from None
    import tempfile

    try:  # the only reliable test (root, /proc, read-only mounts): make a directory there
        os.rmdir(tempfile.mkdtemp(prefix=f".{p.name}.", suffix=".probe", dir=parent))
    except OSError as exc:
        raise InputError("--out", f"cannot write {out}: {exc.strerror.lower()}") from None


def describe_run(path: Path) -> str:
    """'scenario NAME, COMMAND, written TIME' from a run's manifest.json (best effort; read
    as testbed.runs.rundir reads a run directory: no link followed, bounded)."""
    from testbed.runs.rundir import read_manifest

    m = read_manifest(path)
    if m is None:
        return "unreadable manifest.json"
    import time

    def shown(v: object) -> str:  # (no control characters to the terminal)
        return "".join(c if c.isprintable() else "?" for c in str(v)[:100])

    parts = [f"scenario {shown(m.get('scenario', '?'))}",
             f"backend {shown(m.get('backend', '?'))}"]
    started = m.get("started_unix_s")
    if isinstance(started, (int, float)) and not isinstance(started, bool):
        parts.append("started " + time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)))
    from testbed.runs.rundir import run_status

    status = run_status(path)["status"]
    if status != "finished":
        parts.append(f"{status}, not finished")
    return ", ".join(parts)


def load(args: argparse.Namespace) -> Scenario:
    return load_scenario(args.spec)


def emit(text: str) -> None:
    """Command output (not logging) goes to stdout, with no terminal control characters
    (it may quote files, sockets or replies another user wrote; testbed.io.terminal)."""
    from testbed.io.terminal import safe_text

    text = safe_text(text)
    sys.stdout.write(text if text.endswith("\n") else text + "\n")


def emit_json(data: Any) -> None:
    emit(json.dumps(data, indent=2))


def bounded_number(option: str, value: float, low: float, high: float, *,
                   low_open: bool = False, what: str = "") -> float:
    """`value` when it is a finite number in [low, high] ((low, high] with low_open);
    else InputError naming the option (a number that reaches a timer, a sleep or a loop
    must be bounded: docs/security.md)."""
    from testbed.errors import InputError

    if isinstance(value, float) and not math.isfinite(value):
        raise InputError(option, f"must be a finite number, got {value}")
    shown = f"{value:g}" if isinstance(value, float) else str(value)
    if value < low or (low_open and value == low):
        raise InputError(option, f"must be {'>' if low_open else '>='} {low:g}, got {shown}")
    if value > high:
        raise InputError(option, f"must be at most {high:g}{what}, got {shown}")
    return value
