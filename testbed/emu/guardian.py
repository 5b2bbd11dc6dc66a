"""A run's guardian: when the process that owns an emulated network dies without taking
it down (kill -9, an OOM kill, a crash in C), clean what the run left, as `lightpipe
clean` would.

One small process per run, started by `new_state` before the run makes anything (so in
the namespace the owner started in, never inside the run's own). It opens a pidfd on the
owner named in state.json and checks the owner's start time after opening it (a PID
reused before the pidfd was opened is not the owner). Then it waits:

- the owner exits and the run's state directory is still there (the same directory: the
  device and inode new_state made it with, passed to the guardian): it runs the reaper's
  plan for that directory (testbed.emu.reaper: only what the run can prove is its own)
  and writes what it did to `<state root>/<prefix>.guardian.log`;
- the state directory is gone or replaced (the run was taken down, or cleaned): it exits
  and writes nothing. It looks once a second, so a process that brings many networks up
  and down in turn keeps at most one guardian per live network, plus one for a second.

testbed.emu.state.start_guardian starts it; LIGHTPIPE_GUARDIAN=0 starts none (the kill -9
tests of `lightpipe clean` use it: they check what a user's clean finds after a crash). A
guardian that cannot start, or finds no pidfds (kernel < 5.3), leaves the run to
`lightpipe clean`, as before.

    python -m testbed.emu.guardian STATE_DIR DEV:INODE   (started by new_state)
"""

from __future__ import annotations

import os
import re
import select
import sys
import time
from pathlib import Path

POLL_S = 1.0
"""How often the guardian looks whether its run's state directory is still there."""


def _same_dir(path: Path, ident: tuple[int, int]) -> bool:
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return (st.st_dev, st.st_ino) == ident


def wait_for_owner(state_dir: Path, ident: tuple[int, int], poll_s: float = POLL_S) -> bool:
    """Wait for the run's owner to die; True if the run's state directory is still the
    one its owner made (ident: its device and inode then), False if it went first."""
    from testbed.emu.state import RunState, proc_start_ticks

    if not _same_dir(state_dir, ident):
        return False
    st = RunState.load(state_dir)
    try:
        pfd: int | None = os.pidfd_open(st.owner_pid)
    except ProcessLookupError:
        pfd = None  # the owner is already gone
    try:
        if pfd is not None and proc_start_ticks(st.owner_pid) == st.owner_start_ticks:
            poller = select.poll()
            poller.register(pfd, select.POLLIN)
            while not poller.poll(int(poll_s * 1000)):
                if not _same_dir(state_dir, ident):
                    return False
    finally:
        if pfd is not None:
            os.close(pfd)
    # (A write the owner was in when it died left a temporary file: the reaper knows it.)
    return _same_dir(state_dir, ident)


def _log(state_dir: Path, text: str) -> None:
    """Append one line to <state root>/<prefix>.guardian.log (a regular file of this
    user, never through a link; the state root exists: it holds the run)."""
    line = f"{time.strftime('%Y-%m-%dT%H:%M:%S%z')} guardian: {text}\n"
    fd = os.open(state_dir.parent / f"{state_dir.name}.guardian.log",
                 os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    m = re.fullmatch(r"([0-9]{1,20}):([0-9]{1,20})", args[1]) if len(args) == 2 else None
    if m is None:
        sys.stderr.write("usage: python -m testbed.emu.guardian STATE_DIR DEV:INODE\n")
        return 2
    state_dir, dev, ino = Path(args[0]), int(m[1]), int(m[2])
    try:
        if not wait_for_owner(state_dir, (dev, ino)):
            return 0
    except (OSError, ValueError, TypeError):  # no run there (or no pidfds): nothing to do
        return 1
    from testbed.emu.reaper import clean_run

    try:
        report = clean_run(state_dir)
    except Exception as exc:  # (logged below; `lightpipe clean` is still there)
        report = {"prefix": state_dir.name, "error": f"{type(exc).__name__}: {exc}"}
    try:
        _log(state_dir, f"the owner of run {state_dir.name} died without taking it down; "
                        f"cleaned: {report}")
    except OSError:
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
