"""The live (`lightpipe emu --hold`) network a command acts on: `exec`, `fault`."""

from __future__ import annotations

import argparse


def add_network_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--network", metavar="DIR", default=None,
                        help="output directory of the `lightpipe emu --hold` run "
                             "(default: the only live run)")


def find_network(network_dir: str | None) -> dict[str, object]:
    """network.json of the live run (the given one, or the only one running)."""
    import json
    from pathlib import Path

    from testbed.emu.state import RunState, list_runs, run_is_live
    from testbed.errors import InputError, RuntimeFailure

    if network_dir is not None:
        path = Path(network_dir) / "network.json"
        if not path.is_file():
            raise InputError("--network", f"no network.json in {network_dir}")
        data: dict[str, object] = json.loads(path.read_text())
        return data
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
    data = json.loads((live[0] / "network.json").read_text())
    return data
