"""`lightpipe clean`: remove what dead runs left, and only what LightPipe can prove is its
own: emulation state (recorded PIDs with their start times, namespaces the run holds;
testbed.emu.reaper) and the hidden staging siblings of --out directories (testbed.io.outdir).
`--dry-run` prints every process, namespace and file it would touch, and touches none."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from testbed.emu.reaper import RunPlan
    from testbed.io.outdir import Leftover

HELP = ("remove leftovers of runs that died (their recorded processes and held namespaces; "
        "stale .NAME.*.partial / .NAME.old-PID / .NAME.lightpipe-lock beside output "
        "directories)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("prefix", nargs="*", metavar="RUN",
                        help="run prefixes to clean (lpXXXX; default: every dead run)")
    parser.add_argument("--force", action="store_true",
                        help="also tear down runs whose owner process is still alive")
    parser.add_argument("--dry-run", action="store_true",
                        help="only list every process, namespace and file it would touch")
    parser.add_argument("--dir", action="append", metavar="DIR", default=None,
                        help="clean only the stale staging leftovers beside output "
                        "directories in DIR and its subdirectories, 3 levels down "
                        "(repeatable; without --dir: the current directory, and the "
                        "emulation runs)")
    parser.add_argument("--cluster", metavar="FILE", default=None,
                        help="clean every machine of a cluster file over SSH: its own "
                        "`lightpipe clean` (the file's venv) and the runs' VXLAN tunnel "
                        "devices left in its root namespace (docs/cluster.md)")


def run(args: argparse.Namespace) -> int:
    from testbed.cli.common import emit
    from testbed.emu.reaper import plan_run
    from testbed.emu.state import PREFIX_RE, list_runs
    from testbed.errors import InputError

    for p in args.prefix:
        if not PREFIX_RE.fullmatch(p):
            raise InputError("RUN", f"not a LightPipe run prefix: {p!r} (lp + 4 hex digits)")
    if args.cluster is not None:
        from testbed.cli.cluster_cmd import run_clean

        return run_clean(args)
    emu = not args.dir  # --dir: only the output leftovers there
    stale = [] if args.prefix else stale_outputs(args.dir or ["."], given=bool(args.dir))
    plans = [plan_run(d) for d in (list_runs() if emu else [])
             if not args.prefix or d.name in args.prefix]
    notes = unproven_namespaces(plans, args.prefix) if emu else []
    if not plans and not stale:
        for line in notes:
            emit(line)
        emit("clean: nothing to clean")
        return 0
    clean_outputs(stale, args.dry_run)
    for plan in plans:
        clean_one(plan, args.dry_run, args.force)
    for line in notes:
        emit(line)
    return 0


def clean_one(plan: RunPlan, dry_run: bool, force: bool) -> None:
    """Clean (or list) one emulation run, line by line."""
    from testbed.cli.common import emit

    name = plan.prefix
    if plan.problem is not None:
        emit(f"clean: skipped {plan.state_dir}: {plan.problem}; not touched")
        return
    if plan.live and not force:
        verb = "would keep" if dry_run else "kept"
        emit(f"clean: {verb} {name}: {plan.live_why} (use --force)")
        return
    if dry_run:
        for line in plan.lines(done=False):
            emit(line)
        emit(f"clean: would remove run {name}{' (live, --force)' if plan.live else ''}")
        return
    rep = plan.apply(force=force)
    for line in plan.lines(done=True):
        emit(line)
    if "skipped" in rep:
        emit(f"clean: kept {name}: {rep['skipped']}")
    else:
        emit(f"clean: removed run {name} ({rep.get('killed', 0)} processes)")


def unproven_namespaces(plans: list[RunPlan], prefixes: list[str]) -> list[str]:
    """A note for each `lpXXXX` named namespace no run here proves is LightPipe's: it is
    never touched (someone's `ip netns add lpbeef`, or a run under another state dir)."""
    from testbed.emu.state import PREFIX_RE, state_root

    ns_dir = Path("/run/netns")
    try:
        names = sorted(p.name for p in ns_dir.iterdir())
    except OSError:
        return []
    ours = {p.named[0] for p in plans if p.named is not None}
    return [f"clean: left namespace {n} alone: no run in {state_root()} proves it is "
            "LightPipe's (a run kept under another LIGHTPIPE_STATE_DIR? clean with it set)"
            for n in names if PREFIX_RE.fullmatch(n) and n not in ours
            and (not prefixes or n in prefixes)]


def stale_outputs(dirs: list[str], given: bool = True) -> list[Leftover]:
    """Provable staging leftovers of dead runs under the directories. A --dir that is not
    a directory, belongs to another user, or that others can write (unless sticky, like
    /tmp) is refused (InputError); the implicit current directory is then just skipped."""
    from testbed.errors import InputError
    from testbed.io.outdir import find_leftovers
    from testbed.io.trusted import check_given_dir

    roots = []
    for d in dirs:
        if not Path(d).is_dir():
            if given:
                raise InputError("--dir", f"{d} is not a directory")
            continue
        try:
            check_given_dir(d, "--dir", allow_sticky=True)
        except InputError:
            if given:
                raise
            continue
        roots.append(Path(d))
    return find_leftovers(roots)


def clean_outputs(stale: list[Leftover], dry_run: bool) -> None:
    """Remove (or list) each leftover, saying what, why it is LightPipe's and how big; a
    replaced run whose output directory vanished (a kill inside the fallback swap) is put
    back instead."""
    from testbed.cli.common import emit
    from testbed.io.outdir import remove_leftovers, tree_bytes

    what = {"partial": "staging directory", "old": "replaced run", "lock": "lock file"}
    sizes = {x.path: tree_bytes(x) for x in stale}

    def line(x: Leftover, verb: str, why: bool) -> str:
        owner = f"pid {x.pid} gone" if x.pid else "no live owner"
        proof = f"; {x.why}" if why and x.why else ""
        if x.orphaned_run:
            return (f"clean: {verb} replaced run {x.path} back to {x.target.name} ({owner}"
                    f"{proof})")
        return (f"clean: {verb} {what[x.kind]} {x.path} ({owner}, {sizes[x.path]} bytes"
                f"{proof})")

    if dry_run:  # each with the proof that it is LightPipe's
        for x in stale:
            emit(line(x, "would restore" if x.orphaned_run else "would remove", True))
        return
    for x, done in remove_leftovers(stale):
        if done in ("removed", "restored"):
            emit(line(x, done, False))
        else:
            emit(f"clean: {done}: {x.path}")
