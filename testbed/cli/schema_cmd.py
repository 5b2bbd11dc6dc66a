"""`lightpipe schema`: print the JSON Schema of the scenario format (for editors)."""

from __future__ import annotations

import argparse

from testbed.cli.common import emit_json

HELP = "print the scenario JSON Schema"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", metavar="FILE", help="write to FILE instead of stdout")


def run(args: argparse.Namespace) -> int:
    from testbed.io.atomic import atomic_write_json
    from testbed.spec import scenario_json_schema

    schema = scenario_json_schema()
    if args.out:
        atomic_write_json(args.out, schema)
    else:
        emit_json(schema)
    return 0
