"""Directories and files LightPipe trusts: the ones it makes are private, the ones it is
given are checked, files it opens there are regular files opened without links, and the
Unix sockets it serves are private and checked as its own before use."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

from testbed.errors import InputError

# Open flags for a file in a directory others may write: never follow a planted symlink,
# never block on a planted FIFO or device.
OPEN_SAFE = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def trusted_owner(uid: int) -> bool:
    """The running user or root."""
    return uid in (os.geteuid(), 0)


def dir_problem(st: os.stat_result, allow_sticky: bool) -> str | None:
    """Why a directory with this stat may not be trusted (None: it may)."""
    if not stat.S_ISDIR(st.st_mode):
        return "is not a directory"
    if not trusted_owner(st.st_uid):
        return f"is owned by uid {st.st_uid}, not by you (uid {os.geteuid()}) or root"
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o022:
        if allow_sticky and mode & stat.S_ISVTX:
            return None  # a shared /tmp: others cannot rename or delete our entries
        who = "world" if mode & 0o002 else "group"
        return f"is {who}-writable (mode {mode:04o})"
    return None


def check_given_dir(path: str | os.PathLike[str], field: str,
                    allow_sticky: bool = True) -> None:
    """InputError (exit 2) naming `field` when a directory LightPipe was given is not one,
    is writable by others (a sticky shared /tmp is accepted where allow_sticky), or is
    owned by someone other than the running user or root."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise InputError(field, f"{path}: {exc.strerror.lower()}") from None
    why = dir_problem(st, allow_sticky)
    if why is not None:
        raise InputError(field, f"{path} {why}; not used")


def make_private_dir(path: str | os.PathLike[str], field: str, mode: int = 0o700) -> Path:
    """Make `path` (and missing parents) with `mode`, owned by the running user; an
    existing one is checked as a given directory (never a symlink at the last step)."""
    p = Path(path)
    missing = []
    q = p
    while not os.path.lexists(q):
        missing.append(q)
        q = q.parent
    for d in reversed(missing):
        try:
            os.mkdir(d, mode)
        except FileExistsError:
            pass
        else:
            os.chmod(d, mode)  # (mkdir's mode is cut by the umask; never widened)
    if p.is_symlink():
        raise InputError(field, f"{p} is a symbolic link; not used")
    check_given_dir(p, field, allow_sticky=False)
    return p


def make_dirs(path: str | os.PathLike[str], mode: int = 0o755) -> Path:
    """mkdir -p, each directory it makes at `mode` less the umask and never writable by
    group or others (not even under umask 000); existing ones are left as they are."""
    p = Path(path)
    missing = []
    q = p
    while not q.is_dir():
        missing.append(q)
        if q.parent == q:
            break
        q = q.parent
    mask = os.umask(0)
    os.umask(mask)
    for d in reversed(missing):
        try:
            os.mkdir(d, 0o700)
        except FileExistsError:
            continue
        os.chmod(d, mode & ~mask & ~0o022)
    return p


def open_regular(path: str | os.PathLike[str], flags: int = os.O_RDONLY,
                 dir_fd: int | None = None, owner_uid: int | None = None,
                 mode: int = 0o600) -> int:
    """os.open without following a link or blocking; the fd of a regular file (owned by
    `owner_uid` where given) or OSError (ELOOP, or EINVAL naming what it is)."""
    fd = os.open(path, flags | OPEN_SAFE, mode, dir_fd=dir_fd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(22, "not a regular file", str(path))
        if owner_uid is not None and st.st_uid != owner_uid:
            raise OSError(1, f"owned by uid {st.st_uid}, not {owner_uid}", str(path))
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_regular(path: str | os.PathLike[str], cap_bytes: int,
                 owner_uid: int | None = None) -> bytes:
    """A regular file's first `cap_bytes` bytes (OSError as open_regular; ValueError when
    it is larger)."""
    fd = open_regular(path, owner_uid=owner_uid)
    chunks: list[bytes] = []
    got = 0
    try:
        while got <= cap_bytes:
            chunk = os.read(fd, cap_bytes + 1 - got)
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > cap_bytes:
        raise ValueError(f"{path} is larger than {cap_bytes} bytes")
    return data


def own_socket(path: str | os.PathLike[str]) -> bool | None:
    """Whether path is a Unix socket owned by this user (not through a link); None when
    nothing is there."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    return stat.S_ISSOCK(st.st_mode) and st.st_uid == os.geteuid()


def bind_private_socket(sock: Any, path: str | os.PathLike[str]) -> None:
    """Bind a Unix socket at path with mode 0600 (umask 0177 around the bind: no moment
    at which others may connect)."""
    old = os.umask(0o177)
    try:
        sock.bind(str(path))
    finally:
        os.umask(old)
