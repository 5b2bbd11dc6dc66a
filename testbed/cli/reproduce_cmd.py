"""`lightpipe reproduce NAME --out DIR`: run one paper reproduction (tables + plots)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from testbed.cli.common import STAGED, add_out_arg, add_quiet_arg, add_report_arg, emit_json

HELP = ("reproduce a paper's headline effect: crosspipe, geopipe, cba, bace, routing; "
        "outage: how long an optical outage may be before training notices or fails")

# name -> function (out_dir: Path, quiet: bool, **opts) -> dict; each writes its outputs
# atomically into out_dir. Imported on use: the reproductions pull in the solvers.
REPRODUCTIONS = ("crosspipe", "geopipe", "cba", "bace", "routing", "outage")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="NAME", help=", ".join(REPRODUCTIONS))
    add_out_arg(parser, written=STAGED)
    add_quiet_arg(parser)
    add_report_arg(parser)
    parser.add_argument("--quick", action="store_true", help="fewer sweep points")
    parser.add_argument("--set", metavar="KEY=VALUE", action="append", default=[],
                        help="override a set-up value (e.g. --set microbatches=16)")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")


def _value(text: str) -> object:
    """A --set value: YAML/JSON syntax (16, 0.5, true, [1, 2], {a: 1}), else the string."""
    import yaml

    try:
        return yaml.safe_load(text) if text.strip() else text
    except yaml.YAMLError:
        return text


def options(fn) -> list[str]:  # type: ignore[no-untyped-def]
    """The set-up values a reproduction takes (its keyword parameters)."""
    import inspect

    return [n for n, p in inspect.signature(fn).parameters.items()
            if n not in ("out_dir", "quiet", "quick")
            and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def resolve(name: str) -> Callable[..., dict[str, Any]]:
    """The reproduction function for `name`; InputError if unknown."""
    from testbed.errors import InputError
    from testbed.experiments import outage, placement, routing, schedules

    table: dict[str, Callable[..., dict[str, Any]]] = {
        "crosspipe": schedules.crosspipe, "geopipe": schedules.geopipe,
        "cba": placement.cba, "bace": placement.bace, "routing": routing.routing,
        "outage": outage.outage}
    if name not in table:
        raise InputError("NAME", f"unknown reproduction {name!r}; valid: "
                         f"{', '.join(REPRODUCTIONS)}")
    return table[name]


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from testbed.cli.common import check_out
    from testbed.cli.summary import maybe_report, print_reproduction, write_readme
    from testbed.errors import InputError
    from testbed.spec.suggest import close

    fn = resolve(args.name)
    valid = options(fn)
    opts: dict = {}
    for item in args.set:
        key, sep, val = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise InputError("--set", f"expected KEY=VALUE, got {item!r}")
        if key not in valid:
            hits = close(key, valid)
            hint = f"did you mean {' or '.join(hits)}? " if hits else ""
            raise InputError("--set", f"{args.name} has no set-up value {key!r}; {hint}"
                             f"valid: {', '.join(valid)}")
        opts[key] = _value(val.strip())
    if args.quick:
        opts["quick"] = True
    check_out(args.out, args.force)
    out = Path(args.out)
    try:
        summary = fn(out, quiet=args.quiet, **opts)
    except (TypeError, ValueError) as exc:  # a value of the wrong type
        raise InputError("--set", f"a value does not fit {args.name}: "
                         f"{', '.join(f'{k}={v!r}' for k, v in opts.items())} ({exc})") from None
    write_manifest(out, args.name, opts)
    write_readme(out, f"LightPipe reproduction: {args.name}")
    report = maybe_report(out, args.report)
    if args.json:
        emit_json(summary)
    else:
        print_reproduction(args.name, args.out.rstrip("/"), summary, report)
    return 0


def write_manifest(out, name: str, opts: dict) -> None:  # type: ignore[no-untyped-def]
    """manifest.json of a reproduction: what ran with which options, version, platform."""
    import platform
    import sys
    import time

    from testbed import __version__
    from testbed.io.atomic import atomic_write_json

    atomic_write_json(out / "manifest.json", {
        "schema": 1, "lightpipe_version": __version__, "reproduction": name,
        "backend": "sim", "options": opts, "written_unix_s": round(time.time(), 3),
        "python": sys.version.split()[0], "platform": platform.platform(), "argv": sys.argv})
