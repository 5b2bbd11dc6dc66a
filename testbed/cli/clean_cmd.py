"""`lightpipe clean`: remove what dead emulation runs left (by recorded PIDs and names only)."""

from __future__ import annotations

import argparse

HELP = "remove leftovers of emulation runs that died (recorded processes and namespaces only)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("prefix", nargs="*", metavar="RUN",
                        help="run prefixes to clean (lpXXXX; default: every dead run)")
    parser.add_argument("--force", action="store_true",
                        help="also tear down runs whose owner process is still alive")
    parser.add_argument("--dry-run", action="store_true", help="only list what would go")


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
    runs = [d for d in list_runs() if not args.prefix or d.name in args.prefix]
    orphans = [n for n in orphan_namespaces() if not args.prefix or n in args.prefix]
    if not runs and not orphans:
        emit("clean: nothing to clean")
        return 0
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
