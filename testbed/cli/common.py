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
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bar")


def load(args: argparse.Namespace) -> Scenario:
    return load_scenario(args.spec)


def emit(text: str) -> None:
    """Command output (not logging) goes to stdout."""
    sys.stdout.write(text if text.endswith("\n") else text + "\n")


def emit_json(data: Any) -> None:
    emit(json.dumps(data, indent=2))
