"""What `lightpipe clean` does to one dead run, limited to what it can prove is the run's.

Proofs, and nothing else: a recorded process whose PID *and* start time still match; a
process inside a namespace that the run holds by a bind mount under its state directory
(testbed.emu.nsref); the run's named namespace when /run/netns/<name> is that same held
namespace (or, for state written before references were held, when it is still mounted
with the inode the run recorded: the mount itself keeps that number from being reused).
A run directory not owned by the running user, or writable by others, is left alone.
The plan is made first: `--dry-run` prints it, a real clean prints the same lines.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from testbed.emu.nsref import REF_DIR, Ident, guarded, held, ns_ident, pids_in
from testbed.emu.state import (
    RunState,
    alive,
    delete_netns,
    kill_in,
    kill_in_held,
    kill_procs,
    proc_start_ticks,
    release_held,
    run_is_live,
    state_writers,
)


def command_of(pid: int, cap: int = 100) -> str:
    """A process's command line for a listing: printable characters only, capped."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            raw = fh.read(4 * cap)
    except OSError:
        return "?"
    text = raw.replace(b"\0", b" ").decode("utf-8", "replace").strip()
    text = "".join(c if c.isprintable() else "?" for c in text)
    return (text[:cap] + "...") if len(text) > cap else (text or "?")


def dir_problem(d: Path) -> str | None:
    """Why a run directory is not provably ours (None: it is)."""
    try:
        st = os.lstat(d)
    except OSError as exc:
        return exc.strerror.lower()
    if not stat.S_ISDIR(st.st_mode):
        return "not a directory (a link?)"
    if st.st_uid != os.geteuid():
        return f"owned by uid {st.st_uid}, not by you"
    if stat.S_IMODE(st.st_mode) & 0o022:
        return f"writable by others (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


@dataclass
class RunPlan:
    """Everything one clean of one run would touch, each with why it is the run's."""

    state_dir: Path
    state: RunState | None = None
    state_error: str | None = None
    problem: str | None = None           # the directory itself is not provably ours
    live: bool = False
    procs: list[tuple[int, str, str]] = field(default_factory=list)  # pid, command, why
    refs: dict[str, Ident] = field(default_factory=dict)
    named: tuple[str, str] | None = None  # (netns name, why it is the run's)
    legacy_named: Ident | None = None     # a named netns proven by its mount (old state)
    writer: int | None = None             # no state yet: the live process writing it

    @property
    def live_why(self) -> str:
        """Why the run counts as live (for a plan with live set)."""
        if self.state is not None:
            return f"run is live (pid {self.state.owner_pid})"
        return f"its first state is still being written by pid {self.writer}"

    @property
    def prefix(self) -> str:
        return self.state.prefix if self.state is not None else self.state_dir.name

    def lines(self, done: bool) -> list[str]:
        """One line per thing touched: 'would VERB' (dry run) or 'VERBed'."""
        def say(verb: str, past: str) -> str:
            return past if done else f"would {verb}"

        p, out = self.prefix, []
        for pid, cmd, why in self.procs:
            out.append(f"clean: {say('kill', 'killed')} process {pid} ({cmd}) of run {p}: "
                       f"{why}")
        if self.named is not None:
            out.append(f"clean: {say('delete', 'deleted')} namespace {self.named[0]} of "
                       f"run {p}: {self.named[1]}")
        for label in self.refs:
            out.append(f"clean: {say('release', 'released')} namespace reference "
                       f"{self.state_dir / REF_DIR / label}")
        out.append(f"clean: {say('remove', 'removed')} state directory {self.state_dir}")
        return out

    def apply(self, force: bool = False) -> dict[str, Any]:
        """Do what the plan says (a fresh look at each process at the time of the kill);
        the report: prefix, killed, netns, or skipped."""
        if self.problem is not None:
            return {"prefix": self.prefix, "skipped": f"{self.state_dir} {self.problem}"}
        if self.live and not force:
            return {"prefix": self.prefix, "skipped": self.live_why}
        killed = 0
        if self.state is not None:
            killed += kill_procs(list(reversed(self.state.procs)))
        killed += kill_in_held(self.state_dir)
        if self.legacy_named is not None:
            killed += kill_in({self.legacy_named})
        if self.named is not None:
            delete_netns(self.named[0])
        report: dict[str, Any] = {"prefix": self.prefix, "killed": killed,
                                  "netns": self.named[0] if self.named else None}
        if self.state_error is not None:
            report["state"] = f"unreadable ({self.state_error})"
        if not release_held(self.state_dir):
            report["skipped"] = "a namespace reference could not be unmounted; state kept"
            return report
        shutil.rmtree(self.state_dir, ignore_errors=True)
        return report


def plan_run(state_dir: Path) -> RunPlan:
    """What cleaning this run directory would touch, and why each is the run's."""
    plan = RunPlan(Path(state_dir))
    plan.problem = dir_problem(plan.state_dir)
    if plan.problem is not None:
        return plan
    try:
        plan.state = RunState.load(plan.state_dir)
    except (OSError, ValueError, TypeError) as exc:
        plan.state_error = str(exc)
    st = plan.state
    if st is None:
        # Killed in its first write, or still in it: the writer's PID is in the temporary
        # file's name. A PID alive now keeps the run (a reused one only delays its clean).
        for pid in state_writers(plan.state_dir):
            if proc_start_ticks(pid) is not None:
                plan.live, plan.writer = True, pid
                break
    else:
        plan.live = run_is_live(st)
        for rec in st.procs:
            if alive(rec):
                plan.procs.append((rec.pid, command_of(rec.pid),
                                   f"recorded as {rec.role or 'process'}, PID and start "
                                   "time match"))
    plan.refs = held(plan.state_dir)
    by_ident = {ident: label for label, ident in plan.refs.items()}
    recorded = {p[0] for p in plan.procs}
    idents = guarded(set(by_ident))
    for pid in pids_in(idents):
        if pid in recorded:
            continue
        with contextlib.suppress(OSError):
            label = by_ident[ns_ident(f"/proc/{pid}/ns/net")]
            plan.procs.append((pid, command_of(pid), f"inside the run's namespace {label} "
                               f"(held by {plan.state_dir / REF_DIR / label})"))
    _plan_named(plan, by_ident, recorded)
    return plan


def _plan_named(plan: RunPlan, by_ident: dict[Ident, str], recorded: set[int]) -> None:
    """The run's named namespace, when it is provably the run's."""
    st = plan.state
    name = st.netns if st is not None and st.netns else None
    if name is None or not Path("/run/netns", name).exists():
        return
    try:
        ident = ns_ident(Path("/run/netns", name))
    except OSError:
        return
    if ident in by_ident:
        plan.named = (name, f"it is the namespace held by "
                            f"{plan.state_dir / REF_DIR / by_ident[ident]}")
        return
    assert st is not None
    if not st.held and st.ns_inodes and ident[1] == st.ns_inodes[0]:
        # State from before held references: /run/netns/<name> is still mounted with the
        # inode the run recorded when it made it; that mount has kept the number its own.
        plan.named = (name, "still mounted with the inode the run recorded (older state)")
        plan.legacy_named = ident
        for pid in pids_in(guarded({ident})):
            if pid not in recorded:
                plan.procs.append((pid, command_of(pid), f"inside the run's namespace {name}"))


def clean_run(state_dir: Path, force: bool = False) -> dict[str, Any]:
    """Remove one run's leftovers. Refuses a live run unless force."""
    return plan_run(Path(state_dir)).apply(force=force)
