"""Output directories of runs: one writer per --out, a swap that never leaves no directory,
and the staging leftovers of killed runs (what `lightpipe clean` removes).

Next to an output directory NAME in its parent live only hidden siblings:
  .NAME.lightpipe-lock       the writer's lock (fcntl.flock, holds its PID); the kernel
                             drops the lock when the writer dies, however it dies
  .NAME.PID.XXXX.partial     a directory being built (staged) by process PID
  .NAME.old-PID              a replaced run on its way out (fallback swap only)
A sibling is stale when nobody holds NAME's lock and its PID (when named) is dead.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import re
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

SIBLING_RE = re.compile(r"^\.(?P<name>.+?)\.(?:(?:(?P<pid>\d+)\.)?[A-Za-z0-9_]+\.partial"
                        r"|old-(?P<oldpid>\d+)|lightpipe-lock)$")

# The lock this process holds per output directory: flock locks belong to an open file,
# so a second open() + flock() of the same lock in this process would refuse itself.
_held: dict[str, list[int]] = {}


def lock_path(target: Path) -> Path:
    return target.parent / f".{target.name}.lightpipe-lock"


def pid_alive(pid: int) -> bool:
    """Whether a process with this PID exists (ours or another user's)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def lock_owner(target: Path) -> int | None:
    """The PID of the live process writing `target` (it holds the lock), else None."""
    target = Path(target).absolute()
    if str(target) in _held:
        return os.getpid()  # (this process: its own staging is not stale to it)
    try:
        fd = os.open(lock_path(target), os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _read_pid(fd) or -1
        return None
    finally:
        os.close(fd)


def busy_error(target: Path, pid: int | None) -> Exception:
    from testbed.errors import InputError

    who = f"pid {pid}" if pid and pid > 0 else "pid unknown"
    return InputError("--out", f"{target} is being written by a live run ({who}); wait "
                      "for it to end or choose another --out")


@contextlib.contextmanager
def out_lock(target: Path) -> Iterator[None]:
    """Hold `target`'s writer lock for the block; InputError naming the live writer's PID
    when another process holds it. Re-entrant within one process."""
    target = Path(target).absolute()
    key = str(target)
    if key in _held:
        _held[key][1] += 1
        try:
            yield
        finally:
            _held[key][1] -= 1
        return
    path = lock_path(target)
    path.parent.mkdir(parents=True, exist_ok=True)
    tries = 0
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = _read_pid(fd)
            os.close(fd)
            tries += 1
            if tries < 4:  # a lock_owner() probe holds it for microseconds: ask again
                time.sleep(0.02)
                continue
            raise busy_error(target, pid) from None
        # Its last holder may have unlinked the file between our open() and flock():
        # then a third process can lock a new file of the same name. Lock the one on disk.
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    _held[key] = [fd, 1]
    try:
        yield
    finally:
        del _held[key]
        with contextlib.suppress(OSError):
            os.unlink(path)  # while still holding it (see the inode check above)
        os.close(fd)


# ---- the swap -------------------------------------------------------------------------
AT_FDCWD = -100
RENAME_EXCHANGE = 2


def _renameat2() -> Callable[..., int] | None:
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p,
                   ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn  # type: ignore[no-any-return]


def exchange(a: Path, b: Path) -> bool:
    """Swap two existing paths in one step (Linux renameat2 RENAME_EXCHANGE); False where
    libc, the kernel or the file system cannot (the caller falls back)."""
    fn = _renameat2()
    if fn is None:
        return False
    if fn(AT_FDCWD, os.fsencode(a), AT_FDCWD, os.fsencode(b), RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.EPERM):
        return False
    raise OSError(err, os.strerror(err), str(b))


def install_dir(new: Path, target: Path, *, use_exchange: bool = True,
                between: Callable[[], None] | None = None) -> Path | None:
    """Put the directory `new` at `target`. Returns where the previous run at `target`
    now is (for the caller to remove, or to put back), or None when there was none.

    With RENAME_EXCHANGE, `target` names a whole directory at every instant. The fallback
    (two renames) moves the old run to `.NAME.old-PID` first; an exception between the
    two puts it back, and a kill there leaves it at `.NAME.old-PID`, which
    `lightpipe clean` (recover_orphans) renames back. `between` is a test hook.
    """
    new, target = Path(new), Path(target)
    if not target.exists() or _empty_dir(target):
        os.replace(new, target)  # onto nothing, or onto an empty directory
        return None
    if use_exchange and exchange(new, target):
        if between is not None:
            between()
        return new  # `new` now names the previous run
    old = target.parent / f".{target.name}.old-{os.getpid()}"
    os.replace(target, old)
    try:
        if between is not None:
            between()
        os.replace(new, target)
    except BaseException:
        if not target.exists():
            os.replace(old, target)
        raise
    return old


def _empty_dir(path: Path) -> bool:
    if not path.is_dir() or path.is_symlink():
        return False
    with os.scandir(path) as it:
        return next(it, None) is None


def put_back(previous: Path | None, target: Path) -> None:
    """Undo install_dir: remove what is at `target` and restore `previous` (or nothing)."""
    if previous is None:
        shutil.rmtree(target, ignore_errors=True)
        return
    if exchange(previous, target):
        shutil.rmtree(previous, ignore_errors=True)
        return
    shutil.rmtree(target, ignore_errors=True)
    os.replace(previous, target)


# ---- leftovers ------------------------------------------------------------------------
@dataclass(frozen=True)
class Leftover:
    """A hidden sibling of an output directory that no live run owns."""

    path: Path
    kind: str  # "partial" | "old" | "lock"
    target: Path  # the output directory it belongs to
    pid: int | None

    @property
    def orphaned_run(self) -> bool:
        """A replaced run whose output directory vanished (a kill inside the fallback
        swap): restore it rather than delete it."""
        return self.kind == "old" and not self.target.exists()


def leftovers_in(parent: Path) -> list[Leftover]:
    """Stale staging siblings directly in `parent` (owner dead and lock not held)."""
    out: list[Leftover] = []
    try:
        entries = sorted(os.scandir(parent), key=lambda e: e.name)
    except OSError:
        return out
    for e in entries:
        m = SIBLING_RE.match(e.name)
        if m is None:
            continue
        target = Path(parent, m["name"]).absolute()
        pid_s = m["pid"] or m["oldpid"]
        pid = int(pid_s) if pid_s else None
        kind = "lock" if e.name.endswith(".lightpipe-lock") else "old" if m["oldpid"] else "partial"
        if kind != "lock" and not e.is_dir(follow_symlinks=False):
            continue
        if lock_owner(target) not in (None, os.getpid()):
            continue
        if pid is not None and kind != "lock" and pid_alive(pid):
            continue  # named after a live process (this one, or a version without the lock)
        out.append(Leftover(Path(e.path), kind, target, pid))
    return out


def remove_stale_siblings(target: Path) -> list[Leftover]:
    """Remove the stale staging leftovers of `target` itself (called by its next writer,
    holding the lock, so that kills never pile them up); a replaced run whose `target`
    is gone is left for `lightpipe clean` to restore. Returns what was removed."""
    target = Path(target).absolute()
    gone = [x for x in leftovers_in(target.parent)
            if x.target == target and x.kind != "lock" and not x.orphaned_run]
    for x in gone:
        remove_leftover(x)
    return gone


def find_leftovers(roots: list[Path], depth: int = 3) -> list[Leftover]:
    """Stale siblings in each root and its non-hidden subdirectories, `depth` levels
    down (an --out's parent is where they appear)."""
    seen: set[Path] = set()
    out: list[Leftover] = []

    def walk(d: Path, left: int) -> None:
        real = d.resolve()
        if real in seen or str(real) in ("/proc", "/sys", "/dev"):
            return
        seen.add(real)
        out.extend(leftovers_in(d))
        if left <= 0:
            return
        try:
            subs = sorted(e.path for e in os.scandir(d)
                          if e.is_dir(follow_symlinks=False) and not e.name.startswith("."))
        except OSError:
            return
        for s in subs:
            walk(Path(s), left - 1)

    for r in roots:
        walk(Path(r), depth)
    return out


def remove_leftover(item: Leftover) -> str:
    """Remove (or, for an orphaned replaced run, restore) one leftover; what was done."""
    if item.orphaned_run:
        os.replace(item.path, item.target)
        return "restored"
    if item.kind == "lock":
        with contextlib.suppress(FileNotFoundError):
            item.path.unlink()
    else:
        shutil.rmtree(item.path, ignore_errors=True)
    return "removed"


def dir_bytes(path: Path) -> int:
    """Bytes of the regular files under path (a leftover's size, for the clean report)."""
    if path.is_file():
        return path.stat().st_size
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, f)).st_size
    return total
