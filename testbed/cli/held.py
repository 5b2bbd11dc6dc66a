"""The live (`lightpipe emu --hold`) network a command acts on: `exec`, `fault`."""

from __future__ import annotations

import argparse
import os
from pathlib import Path


def add_network_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--network", metavar="DIR", default=None,
                        help="output directory of the `lightpipe emu --hold` run "
                             "(default: the only live run)")


NETWORK_JSON_MAX_BYTES = 16 << 20
"""Largest network.json read (hosts, lightpaths, calibration of a big emulation)."""


def read_network_json(path: Path, field: str) -> dict[str, object]:
    """A network.json that root or this user wrote: a regular file (no link, no FIFO),
    owned by root or the running user, at most NETWORK_JSON_MAX_BYTES, a JSON object.
    Another user's network.json could send this root command to their own socket or
    process; InputError naming the field."""
    import json

    from testbed.errors import InputError
    from testbed.io.bounded import read_owned_nofollow_bytes

    raw = read_owned_nofollow_bytes(path, field, NETWORK_JSON_MAX_BYTES)
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise InputError(field, f"{str(path)!r} is not JSON") from None
    if not isinstance(data, dict):
        raise InputError(field, f"{str(path)!r} is not a JSON object")
    return data


def find_network(network_dir: str | None) -> dict[str, object]:
    """network.json of the live run (the given one, or the only one running), read with
    read_network_json."""

    from testbed.emu.state import RunState, list_runs, run_is_live
    from testbed.errors import InputError, RuntimeFailure

    if network_dir is not None:
        path = Path(network_dir) / "network.json"
        if not os.path.lexists(path):
            raise InputError("--network", f"no network.json in {network_dir}")
        return read_network_json(path, "--network")
    live = []
    for d in list_runs():
        try:
            st = RunState.load(d)
        except (OSError, ValueError, TypeError):
            continue
        if run_is_live(st) and (d / "network.json").is_file():
            live.append(d)
    if not live:
        raise RuntimeFailure("no live emulated network (start one with lightpipe emu --hold)")
    if len(live) > 1:
        which = ", ".join(p.name for p in live)
        raise InputError("--network", f"{len(live)} live networks ({which}); say which with "
                         "--network DIR")
    return read_network_json(live[0] / "network.json", "network.json")
