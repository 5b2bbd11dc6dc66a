"""Namespaces and run state directories a test session left behind, and the tests that were
running when each was made.

`make test` (scripts/test.sh) snapshots /run/netns and the emulation state root
(/run/lightpipe: a run directory left there, even one holding nothing but a half-written
state file, is a run whose `clean` did not happen) before its lanes start and sets
LIGHTPIPE_TEST_WINDOWS; tests/conftest.py appends one line per test to that file (start,
end, node id: `record_window`). After the lanes, `python -m tests.leaks BEFORE WINDOWS`
names every named namespace (and, with --state-before, run directory) made during the
session and still there, with the tests whose
window holds its creation time (the lanes run at once, so one to three suspects). Nothing is
deleted: a namespace this check cannot prove is a test's may be someone else's.

Exit 0 without leaks; with leaks, 1 if LIGHTPIPE_TEST_STRICT_LEAKS=1 (the stress runs) and
0 otherwise (a warning in `make test`).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

NETNS_DIR = Path("/run/netns")
MAX_WINDOW_LINES = 100_000  # a session has about 1,400 tests


def namespaces(root: Path = NETNS_DIR) -> dict[str, float]:
    """The entries of root and their mtime (epoch s): for a named namespace, when it was
    made (its bind mount's); for a run directory, its last state write."""
    out: dict[str, float] = {}
    try:
        entries = list(os.scandir(root))
    except FileNotFoundError:
        return out
    for e in entries:
        try:
            out[e.name] = e.stat(follow_symlinks=False).st_mtime
        except OSError:
            continue
    return out


def record_window(path: str, nodeid: str, start_s: float, end_s: float) -> None:
    """Append one test's window (epoch seconds) with a single write (O_APPEND)."""
    line = f"{start_s:.3f} {end_s:.3f} {nodeid}\n".encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def read_windows(path: Path) -> list[tuple[float, float, str]]:
    out = []
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return out
    with os.fdopen(fd, encoding="utf-8", errors="replace") as fh:
        for i, line in enumerate(fh):
            if i >= MAX_WINDOW_LINES:
                break
            parts = line.rstrip("\n").split(" ", 2)
            if len(parts) == 3:
                try:
                    out.append((float(parts[0]), float(parts[1]), parts[2]))
                except ValueError:
                    continue
    return out


def suspects(made_s: float, windows: list[tuple[float, float, str]],
             slack_s: float = 1.0) -> list[str]:
    """Tests running when a namespace was made (within slack_s of their window)."""
    return [n for a, b, n in windows if a - slack_s <= made_s <= b + slack_s]


def leaked(before: set[str], windows: list[tuple[float, float, str]],
           now: dict[str, float], kind: str = "namespace") -> list[str]:
    """One line per entry (a namespace, or a `kind`) not in `before` and still present."""
    lines = []
    for name in sorted(set(now) - before):
        made = now[name]
        who = suspects(made, windows) or ["no test was running (a lane's own set-up?)"]
        stamp = time.strftime("%H:%M:%S", time.gmtime(made))
        lines.append(f"{kind} {name} (made {stamp} UTC) left behind; tests running "
                     f"then: {', '.join(who)}")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.leaks", description=__doc__)
    ap.add_argument("before", type=Path, help="the namespace names before the session, "
                    "one per line")
    ap.add_argument("windows", type=Path, help="LIGHTPIPE_TEST_WINDOWS of the session")
    ap.add_argument("--state-before", type=Path, help="the run directories in the state "
                    "root (testbed.emu.state.state_root) before the session, one per line")
    args = ap.parse_args(argv)
    windows = read_windows(args.windows)
    lines = []
    for path, kind, root in ((args.before, "namespace", NETNS_DIR),
                             (args.state_before, "run state directory", None)):
        if path is None:
            continue
        try:
            before = set(path.read_text().split())
        except OSError as exc:
            print(f"leaks: {path}: {exc.strerror}", file=sys.stderr)
            return 2
        if root is None:
            from testbed.emu.state import state_root

            root = state_root()
        lines += leaked(before, windows, namespaces(root), kind)
    for line in lines:
        print(f"leaks: {line}")
    if not lines:
        print("leaks: no namespace or run directory left behind")
        return 0
    return 1 if os.environ.get("LIGHTPIPE_TEST_STRICT_LEAKS") == "1" else 0


if __name__ == "__main__":
    sys.exit(main())
