"""`lightpipe clean`: remove what dead runs left: emulation state (by recorded PIDs and names
only) and the hidden staging siblings of --out directories (testbed.outdir)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from testbed.outdir import Leftover

HELP = ("remove leftovers of runs that died (recorded processes and namespaces; stale "
        ".NAME.*.partial / .NAME.old-PID / .NAME.lock beside output directories)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("prefix", nargs="*", metavar="RUN",
                        help="run prefixes to clean (lpXXXX; default: every dead run)")
    parser.add_argument("--force", action="store_true",
                        help="also tear down runs whose owner process is still alive")
    parser.add_argument("--dry-run", action="store_true", help="only list what would go")
    parser.add_argument("--dir", action="append", metavar="DIR", default=None,
                        help="clean only the stale staging leftovers beside output "
                        "directories in DIR and its subdirectories, 3 levels down "
                        "(repeatable; without --dir: the current directory, and the "
                        "emulation runs)")


def run(args: argparse.Namespace) -> int:
    from testbed.cli.common import emit
    from testbed.emu.state import (
        PREFIX_RE,
        RunState,
        clean_run,
        delete_netns,
        list_runs,
        netns_pids,
        orphan_namespaces,
        run_is_live,
    )
    from testbed.errors import InputError

    for p in args.prefix:
        if not PREFIX_RE.fullmatch(p):
            raise InputError("RUN", f"not a LightPipe run prefix: {p!r} (lp + 4 hex digits)")
    emu = not args.dir  # --dir: only the output leftovers there
    runs = [d for d in list_runs() if emu and (not args.prefix or d.name in args.prefix)]
    orphans = [n for n in orphan_namespaces()
               if emu and (not args.prefix or n in args.prefix)]
    stale = [] if args.prefix else stale_outputs(args.dir or ["."])
    if not runs and not orphans and not stale:
        emit("clean: nothing to clean")
        return 0
    clean_outputs(stale, args.dry_run)
    for d in runs:
        if args.dry_run:  # the same decision clean_run makes
            try:
                st = RunState.load(d)
                live = run_is_live(st)
            except (OSError, ValueError, TypeError):
                live = False
            if live and not args.force:
                emit(f"clean: would keep {d.name}: run is live (pid {st.owner_pid}) "
                     "(use --force)")
            else:
                emit(f"clean: would remove run {d.name}{' (live, --force)' if live else ''}")
            continue
        rep = clean_run(d, force=args.force)
        if "skipped" in rep:
            emit(f"clean: kept {rep['prefix']}: {rep['skipped']} (use --force)")
        else:
            emit(f"clean: removed run {rep['prefix']} ({rep.get('killed', 0)} processes)")
    import contextlib
    import os
    import signal

    for name in orphans:
        if args.dry_run:
            emit(f"clean: would remove namespace {name}")
            continue
        for pid in netns_pids(name):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        delete_netns(name)
        emit(f"clean: removed orphan namespace {name}")
    return 0


def stale_outputs(dirs: list[str]) -> list[Leftover]:
    """Staging leftovers of dead runs under the given directories (InputError for a
    --dir that is not one)."""
    from pathlib import Path

    from testbed.errors import InputError
    from testbed.outdir import find_leftovers

    for d in dirs:
        if not Path(d).is_dir():
            raise InputError("--dir", f"{d} is not a directory")
    return find_leftovers([Path(d) for d in dirs])


def clean_outputs(stale: list[Leftover], dry_run: bool) -> None:
    """Remove (or list) each leftover, saying what and how big; a replaced run whose
    output directory vanished (a kill inside the fallback swap) is put back instead."""
    from testbed.cli.common import emit
    from testbed.outdir import dir_bytes, remove_leftover

    for item in stale:
        shown = str(item.path)
        owner = f"pid {item.pid} gone" if item.pid else "no live owner"
        if item.orphaned_run:
            what = f"replaced run {shown} back to {item.target.name} ({owner})"
            emit(f"clean: {'would restore' if dry_run else 'restored'} {what}")
            if not dry_run:
                remove_leftover(item)
            continue
        size = dir_bytes(item.path)
        what = {"partial": "staging directory", "old": "replaced run",
                "lock": "lock file"}[item.kind]
        emit(f"clean: {'would remove' if dry_run else 'removed'} {what} {shown} "
             f"({owner}, {size} bytes)")
        if not dry_run:
            remove_leftover(item)
