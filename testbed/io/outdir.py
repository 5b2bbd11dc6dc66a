"""Output directories of runs: one writer per --out, a swap that never leaves no directory,
and the staging leftovers of killed runs (what `lightpipe clean` removes).

Next to an output directory NAME in its parent live only hidden siblings:
  .NAME.lightpipe-lock       the writer's lock (fcntl.flock); the kernel drops the lock
                             when the writer dies, however it dies. It holds the writer's
                             PID on its first line, then the PIDs of earlier writers whose
                             leftovers are still there
  .NAME.PID.XXXX.partial     a directory being built (staged) by process PID
  .NAME.old-PID              a replaced run on its way out (fallback swap only)
A sibling is LightPipe's, and stale, only when it is owned by the running user, its PID
is listed in NAME's lock file, that lock file is a regular file owned by the running
user that nobody holds, and the PID is dead: a name alone proves nothing (another user's
`.thesis.4000000.v2.partial` in a shared /tmp matches the pattern). Lock files are opened
without following links and without blocking, and must be regular files.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import logging
import os
import re
import shutil
import stat
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from testbed.io.trusted import OPEN_SAFE, dir_problem, make_dirs

log = logging.getLogger(__name__)

SIBLING_RE = re.compile(r"^\.(?P<name>.+?)\.(?:(?:(?P<pid>\d+)\.)?[A-Za-z0-9_]+\.partial"
                        r"|old-(?P<oldpid>\d+)|lightpipe-lock)$")
LOCK_SUFFIX = ".lightpipe-lock"
MAX_PIDS = 16

# The lock this process holds per output directory: flock locks belong to an open file,
# so a second open() + flock() of the same lock in this process would refuse itself.
# key -> [fd, depth, PIDs of dead earlier writers whose leftovers are beside the target]
_held: dict[str, list] = {}  # type: ignore[type-arg]


def lock_path(target: Path) -> Path:
    return target.parent / f".{target.name}{LOCK_SUFFIX}"


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


def _read_pids(fd: int) -> list[int]:
    """The PIDs a lock file lists (first: its last holder)."""
    try:
        text = os.pread(fd, 64 * MAX_PIDS, 0).decode("ascii", "replace")
    except OSError:
        return []
    out = []
    for line in text.splitlines()[:MAX_PIDS]:
        line = line.strip()
        if not line.isdigit():
            break
        out.append(int(line))
    return out


def _read_pid(fd: int) -> int | None:
    pids = _read_pids(fd)
    return pids[0] if pids else None


def _write_pids(fd: int, pids: list[int]) -> None:
    data = "".join(f"{p}\n" for p in dict.fromkeys(pids)).encode()
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)


def _lock_problem(st: os.stat_result) -> str | None:
    """Why an open lock file is not one LightPipe made for the running user."""
    if not stat.S_ISREG(st.st_mode):
        return "is not a regular file"
    if st.st_uid != os.geteuid():
        return f"is owned by uid {st.st_uid}, not by you"
    if st.st_nlink != 1:
        return "has other hard links"
    return None


def open_lock(path: str | os.PathLike[str], flags: int = os.O_RDONLY,
              dir_fd: int | None = None) -> int | None:
    """The fd of a lock file LightPipe made for this user, or None (missing, a link, a
    FIFO or device, someone else's): opening never follows a link and never blocks."""
    try:
        fd = os.open(path, flags | OPEN_SAFE, 0o644, dir_fd=dir_fd)
    except OSError:
        return None
    if _lock_problem(os.fstat(fd)) is not None:
        os.close(fd)
        return None
    return fd


def lock_owner(target: Path) -> int | None:
    """The PID of the live process writing `target` (it holds the lock), else None."""
    target = Path(target).absolute()
    if str(target) in _held:
        return os.getpid()  # (this process: its own staging is not stale to it)
    try:
        fd = os.open(lock_path(target), os.O_RDONLY | OPEN_SAFE)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None  # a FIFO or device planted there is nobody's lock
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


def _leftover_pids(target: Path, pids: list[int]) -> list[int]:
    """Those of `pids` that name a leftover of `target` owned by this user."""
    want = set(pids)
    found: list[int] = []
    with contextlib.suppress(OSError), os.scandir(target.parent) as it:
        for e in it:
            m = SIBLING_RE.match(e.name)
            if m is None or m["name"] != target.name:
                continue
            pid_s = m["pid"] or m["oldpid"]
            if pid_s and int(pid_s) in want and int(pid_s) not in found:
                with contextlib.suppress(OSError):
                    if e.stat(follow_symlinks=False).st_uid == os.geteuid():
                        found.append(int(pid_s))
    return found


@contextlib.contextmanager
def out_lock(target: Path) -> Iterator[None]:
    """Hold `target`'s writer lock for the block; InputError naming the live writer's PID
    when another process holds it, or naming the lock file when it is not a regular file
    of this user's. Re-entrant within one process."""
    from testbed.errors import InputError

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
    make_dirs(path.parent)
    tries = 0
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | OPEN_SAFE, 0o644)
        except OSError as exc:
            raise InputError("--out", f"cannot open the lock file {path}: "
                             f"{exc.strerror.lower()} (a link?)") from None
        why = _lock_problem(os.fstat(fd))
        if why is not None:
            os.close(fd)
            raise InputError("--out", f"the lock file {path} {why}; not used (remove it if "
                             "it is yours, or choose another --out)")
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
            same = os.stat(path, follow_symlinks=False).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    earlier = [p for p in _read_pids(fd) if p != os.getpid()]
    carry = _leftover_pids(target, earlier)  # the proof for what they left beside target
    _write_pids(fd, [os.getpid(), *carry])
    _held[key] = [fd, 1, carry]
    try:
        yield
    finally:
        left = _held.pop(key)[2]
        with contextlib.suppress(OSError):
            if left:  # leftovers we could not remove: keep their proof for `clean`
                _write_pids(fd, left)
            else:
                os.unlink(path)  # while still holding it (see the inode check above)
        os.close(fd)


# ---- the swap -------------------------------------------------------------------------
AT_FDCWD = -100
RENAME_EXCHANGE = 2
RENAME_NOREPLACE = 1


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
    """A hidden sibling of an output directory that LightPipe can prove is its own and
    that no live run owns."""

    path: Path
    kind: str  # "partial" | "old" | "lock"
    target: Path  # the output directory it belongs to
    pid: int | None
    why: str = ""  # the proof, for the listing

    @property
    def orphaned_run(self) -> bool:
        """A replaced run whose output directory vanished (a kill inside the fallback
        swap): restore it rather than delete it."""
        return self.kind == "old" and not os.path.lexists(self.target)


def _siblings(pfd: int) -> dict[str, list[tuple[str, str, int | None]]]:
    """target name -> [(entry name, kind, pid)] of the entries named like siblings."""
    groups: dict[str, list[tuple[str, str, int | None]]] = {}
    with os.scandir(pfd) as it:
        names = sorted(e.name for e in it)
    for name in names:
        m = SIBLING_RE.match(name)
        if m is None:
            continue
        pid_s = m["pid"] or m["oldpid"]
        kind = "lock" if name.endswith(LOCK_SUFFIX) else "old" if m["oldpid"] else "partial"
        groups.setdefault(m["name"], []).append((name, kind, int(pid_s) if pid_s else None))
    return groups


def _own_dir(pfd: int, name: str) -> bool:
    try:
        st = os.stat(name, dir_fd=pfd, follow_symlinks=False)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid()


def _proven(pfd: int, parent: Path, target: str,
            entries: list[tuple[str, str, int | None]], lock_fd: int,
            skip_pid: int | None = None) -> list[Leftover]:
    """The entries of one target that the (unheld, regular, own) lock file proves."""
    pids = _read_pids(lock_fd)
    lock_name = f".{target}{LOCK_SUFFIX}"
    out = []
    for name, kind, pid in entries:
        if kind == "lock" or pid is None or pid not in pids or pid == skip_pid:
            continue
        if pid_alive(pid) or not _own_dir(pfd, name):
            continue
        out.append(Leftover(Path(parent, name), kind, Path(parent, target).absolute(), pid,
                            f"yours, PID {pid} dead and listed in {lock_name}, which no "
                            "live process holds"))
    return out


def _dir_fd(parent: Path) -> int | None:
    """An fd of `parent` when it may be cleaned in: owned by this user or root, and
    writable by nobody else (or sticky, like /tmp: others cannot rename our entries)."""
    try:
        fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None
    if dir_problem(os.fstat(fd), allow_sticky=True) is not None:
        os.close(fd)
        return None
    return fd


def leftovers_in(parent: Path) -> list[Leftover]:
    """Provably LightPipe's stale staging siblings directly in `parent` (see the module
    docstring), then their lock files."""
    pfd = _dir_fd(parent)
    if pfd is None:
        return []
    out: list[Leftover] = []
    locks: list[Leftover] = []
    try:
        for target, entries in _siblings(pfd).items():
            lock_name = f".{target}{LOCK_SUFFIX}"
            if str(Path(parent, target).absolute()) in _held:
                continue  # this process writes it
            lfd = open_lock(lock_name, dir_fd=pfd)
            if lfd is None:
                continue  # no lock of ours: nothing there can be proven ours
            try:
                try:
                    fcntl.flock(lfd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue  # a live writer
                out.extend(_proven(pfd, parent, target, entries, lfd))
                locks.append(Leftover(Path(parent, lock_name), "lock",
                                      Path(parent, target).absolute(), None,
                                      "yours, a regular file no live process holds"))
            finally:
                os.close(lfd)
    except OSError:
        pass
    finally:
        os.close(pfd)
    return out + locks


def remove_stale_siblings(target: Path) -> list[Leftover]:
    """Remove the stale staging leftovers of `target` itself (called by its next writer,
    holding the lock, so that kills never pile them up); a replaced run whose `target`
    is gone is left for `lightpipe clean` to restore. Returns what was removed."""
    target = Path(target).absolute()
    entry = _held.get(str(target))
    if entry is None:
        return []
    pfd = _dir_fd(target.parent)
    if pfd is None:
        return []
    gone: list[Leftover] = []
    try:
        entries = _siblings(pfd).get(target.name, [])
        carry = set(entry[2])
        for x in _proven(pfd, target.parent, target.name, entries, entry[0]):
            if x.pid in carry and not x.orphaned_run:
                with contextlib.suppress(OSError):
                    shutil.rmtree(x.path.name, dir_fd=pfd)
                    gone.append(x)
        left = _leftover_pids(target, list(carry))
        entry[2] = left
        _write_pids(entry[0], [os.getpid(), *left])
    finally:
        os.close(pfd)
    return gone


def find_leftovers(roots: list[Path], depth: int = 3) -> list[Leftover]:
    """Stale siblings in each root and its non-hidden subdirectories, `depth` levels
    down (an --out's parent is where they appear). Directories that others could write
    (not sticky) or that belong to another user are not looked into."""
    seen: set[Path] = set()
    out: list[Leftover] = []

    def walk(d: Path, left: int) -> None:
        real = d.resolve()
        if real in seen or str(real) in ("/proc", "/sys", "/dev"):
            return
        seen.add(real)
        pfd = _dir_fd(d)
        if pfd is None:
            log.info("not looking into %s (another user's, or writable by others)", d)
            return
        os.close(pfd)
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


def remove_leftovers(items: list[Leftover]) -> list[tuple[Leftover, str]]:
    """Remove (or, for an orphaned replaced run, restore) leftovers, each target's while
    holding its lock and after proving each entry again; (item, what was done)."""
    done: list[tuple[Leftover, str]] = []
    groups: dict[Path, list[Leftover]] = {}
    for x in items:
        groups.setdefault(x.target, []).append(x)
    for target, group in groups.items():
        done.extend(_remove_group(target, group))
    return done


def _remove_group(target: Path, group: list[Leftover]) -> list[tuple[Leftover, str]]:
    pfd = _dir_fd(target.parent)
    if pfd is None:
        return [(x, "kept: its directory is no longer trusted") for x in group]
    lock_name = f".{target.name}{LOCK_SUFFIX}"
    done: list[tuple[Leftover, str]] = []
    lfd = open_lock(lock_name, os.O_RDWR, dir_fd=pfd)
    try:
        if lfd is None:
            return [(x, "kept: its lock file is gone or changed") for x in group]
        try:
            fcntl.flock(lfd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return [(x, "kept: a live run took the lock") for x in group]
        entries = _siblings(pfd).get(target.name, [])
        proven = {x.path.name for x in _proven(pfd, target.parent, target.name, entries, lfd)}
        ok = True
        for x in group:
            if x.kind == "lock":
                continue
            if x.path.name not in proven:
                done.append((x, "kept: no longer provably ours"))
                ok = False
                continue
            try:
                if x.orphaned_run:
                    _rename_noreplace(pfd, x.path.name, target.name)
                    done.append((x, "restored"))
                else:
                    shutil.rmtree(x.path.name, dir_fd=pfd)
                    done.append((x, "removed"))
            except OSError as exc:
                done.append((x, f"kept: {exc.strerror or exc}"))
                ok = False
        for x in group:
            if x.kind != "lock":
                continue
            same = os.stat(lock_name, dir_fd=pfd, follow_symlinks=False).st_ino == \
                os.fstat(lfd).st_ino
            if ok and same:
                os.unlink(lock_name, dir_fd=pfd)  # while holding it (see out_lock)
                done.append((x, "removed"))
            else:
                done.append((x, "kept: it still proves leftovers"))
    finally:
        if lfd is not None:
            os.close(lfd)
        os.close(pfd)
    return done


def remove_leftover(item: Leftover) -> str:
    """Remove (or restore) one leftover; what was done."""
    return remove_leftovers([item])[0][1]


def _rename_noreplace(pfd: int, src: str, dst: str) -> None:
    fn = _renameat2()
    if fn is None:
        if os.path.lexists(os.path.join(f"/proc/self/fd/{pfd}", dst)):
            raise FileExistsError(errno.EEXIST, "exists", dst)
        os.rename(src, dst, src_dir_fd=pfd, dst_dir_fd=pfd)
        return
    if fn(pfd, os.fsencode(src), pfd, os.fsencode(dst), RENAME_NOREPLACE) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), dst)


def tree_bytes(item: Leftover) -> int:
    """Bytes of the regular files under a leftover (for the clean report), never
    following a link."""
    try:
        st = os.lstat(item.path)
    except OSError:
        return 0
    if not stat.S_ISDIR(st.st_mode):
        return st.st_size if stat.S_ISREG(st.st_mode) else 0
    total = 0
    for _root, _dirs, files, rootfd in os.fwalk(item.path):
        for f in files:
            with contextlib.suppress(OSError):
                fst = os.stat(f, dir_fd=rootfd, follow_symlinks=False)
                if stat.S_ISREG(fst.st_mode):
                    total += fst.st_size
    return total


def dir_bytes(path: Path) -> int:
    """Bytes of the regular files under path (never following a link)."""
    return tree_bytes(Leftover(Path(path), "partial", Path(path), None))
