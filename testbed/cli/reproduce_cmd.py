"""`lightpipe reproduce NAME --out DIR`: run one paper reproduction (tables + plots)."""

from __future__ import annotations

import argparse

from testbed.cli.common import add_out_arg, add_quiet_arg, emit, emit_json

HELP = "reproduce a paper's headline effect: crosspipe, geopipe, cba, bace"

# name -> "module:function"; each function is (out_dir: Path, quiet: bool, **opts) -> dict
# and writes its outputs atomically into out_dir.
REPRODUCTIONS: dict[str, str] = {
    "crosspipe": "testbed.schedule.reproduce:crosspipe",
    "geopipe": "testbed.schedule.reproduce:geopipe",
    "cba": "testbed.jobs.reproduce:cba",
    "bace": "testbed.jobs.reproduce:bace",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="NAME", help=", ".join(REPRODUCTIONS))
    add_out_arg(parser)
    add_quiet_arg(parser)
    parser.add_argument("--quick", action="store_true", help="fewer sweep points")
    parser.add_argument("--set", metavar="KEY=VALUE", action="append", default=[],
                        help="override a set-up value (e.g. --set microbatches=16)")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")


def _value(text: str) -> object:
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text.lower(), text)


def resolve(name: str):  # type: ignore[no-untyped-def]
    """The reproduction function for `name`; InputError if unknown or not in this build."""
    import importlib

    from testbed.errors import InputError

    target = REPRODUCTIONS.get(name)
    if target is None:
        raise InputError("NAME", f"unknown reproduction {name!r}; valid: "
                         f"{', '.join(REPRODUCTIONS)}")
    module, func = target.split(":")
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError:
        raise InputError("NAME", f"reproduction {name!r} is not available in this build") \
            from None
    fn = getattr(mod, func, None)
    if fn is None:
        raise InputError("NAME", f"reproduction {name!r} is not available in this build")
    return fn


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from testbed.errors import InputError

    fn = resolve(args.name)
    opts: dict = {}
    for item in args.set:
        key, sep, val = item.partition("=")
        if not sep or not key.strip():
            raise InputError("--set", f"expected KEY=VALUE, got {item!r}")
        opts[key.strip()] = _value(val.strip())
    if args.quick:
        opts["quick"] = True
    try:
        summary = fn(Path(args.out), quiet=args.quiet, **opts)
    except TypeError as exc:  # an option the reproduction does not take
        raise InputError("--set", str(exc)) from None
    if args.json:
        emit_json(summary)
    else:
        emit(f"reproduce {args.name}: wrote {args.out}")
        for key, value in summary.items():
            if isinstance(value, int | float | str):
                emit(f"  {key}: {value}")
    return 0
