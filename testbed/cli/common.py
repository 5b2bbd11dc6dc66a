"""Helpers shared by subcommands: spec argument, --out, --quiet, output to stdout."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from testbed.spec import Scenario, load_scenario


def add_spec_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("spec", metavar="SPEC", help="scenario file (YAML)")


def add_out_arg(parser: argparse.ArgumentParser, required: bool = True) -> None:
    parser.add_argument("--out", metavar="DIR", required=required,
                        help="output directory (written atomically)")


def add_quiet_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-q", "--quiet", action="store_true",
                        help="no progress bar or phase lines")


def add_report_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--report", action="store_true",
                        help="also write DIR/report.html (as `lightpipe report DIR` does)")


def check_out(out: str) -> None:
    """InputError naming --out (the path as given) when it cannot become a directory."""
    import os
    from pathlib import Path

    from testbed.errors import InputError

    p = Path(out)
    if p.exists() and not p.is_dir():
        raise InputError("--out", f"{out} exists and is not a directory")
    parent = p.absolute().parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError("--out", f"cannot create {out}: {exc.strerror.lower()}") from None
    import tempfile

    try:  # the only reliable test (root, /proc, read-only mounts): make a directory there
        os.rmdir(tempfile.mkdtemp(prefix=f".{p.name}.", suffix=".probe", dir=parent))
    except OSError as exc:
        raise InputError("--out", f"cannot write {out}: {exc.strerror.lower()}") from None


def load(args: argparse.Namespace) -> Scenario:
    return load_scenario(args.spec)


def emit(text: str) -> None:
    """Command output (not logging) goes to stdout."""
    sys.stdout.write(text if text.endswith("\n") else text + "\n")


def emit_json(data: Any) -> None:
    emit(json.dumps(data, indent=2))
