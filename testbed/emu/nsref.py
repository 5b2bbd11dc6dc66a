"""Held references to a run's network namespaces: bind mounts under its state directory.

A namespace lives while something refers to it; its inode number is then its own, and a
process whose /proc/PID/ns/net has that (device, inode) is inside it. Once the last
reference goes the kernel frees the number and hands it to the next namespace anyone
creates (another user's `unshare -r -n`, say). So a run never kills "every process whose
namespace inode was recorded": it bind-mounts each namespace it makes onto
`<state dir>/ns/<label>`, kills by the identity of those mounts, and unmounts them last.
Only root can make such a mount in the machine's mount namespace, so a mount found there
is proof of a namespace the run made; a symlink or plain file there proves nothing.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import logging
import os
import re
import stat
from pathlib import Path

log = logging.getLogger(__name__)

REF_DIR = "ns"
LABEL_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
MS_BIND = 4096
MNT_DETACH = 2
_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)

Ident = tuple[int, int]  # (st_dev, st_ino) of a namespace


def nsfs_dev() -> int:
    """The device number of the namespace file system (nsfs)."""
    return os.stat("/proc/self/ns/net").st_dev


def ns_ident(path: str | os.PathLike[str]) -> Ident:
    """The identity of the namespace a path names (/proc/PID/ns/net, /run/netns/NAME)."""
    st = os.stat(path)
    return (st.st_dev, st.st_ino)


def ref_ident(path: str | os.PathLike[str]) -> Ident | None:
    """The namespace a held reference holds, or None when `path` is not one (a symlink, a
    plain file, a reference already released)."""
    try:
        st = os.lstat(path)  # the last step crosses a mount point but follows no link
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode) or st.st_dev != nsfs_dev():
        return None
    return (st.st_dev, st.st_ino)


def hold(state_dir: Path, label: str, ns_path: str) -> Ident:
    """Bind-mount the namespace at `ns_path` onto `<state_dir>/ns/<label>`; its identity."""
    if not LABEL_RE.fullmatch(label):
        raise ValueError(f"bad namespace label {label!r}")
    d = Path(state_dir) / REF_DIR
    with contextlib.suppress(FileExistsError):
        os.mkdir(d, 0o700)
    target = d / label
    os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                     | os.O_CLOEXEC, 0o600))
    want = ns_ident(ns_path)
    if _libc.mount(os.fsencode(ns_path), os.fsencode(target), None, MS_BIND, None) != 0:
        err = ctypes.get_errno()
        with contextlib.suppress(OSError):
            os.unlink(target)
        raise OSError(err, f"bind mount of {ns_path}: {os.strerror(err)}", str(target))
    got = ref_ident(target)
    if got != want:  # (the namespace's process died and its PID was reused meanwhile)
        release(target)
        raise OSError(errno.ESRCH, f"{ns_path} changed while being held")
    return got


def held(state_dir: Path) -> dict[str, Ident]:
    """label -> identity of every namespace reference still held under a state dir."""
    d = Path(state_dir) / REF_DIR
    try:
        names = sorted(os.listdir(d))
    except OSError:
        return {}
    out = {}
    for name in names:
        ident = ref_ident(d / name) if LABEL_RE.fullmatch(name) else None
        if ident is not None:
            out[name] = ident
    return out


def release(path: Path) -> bool:
    """Unmount one reference and remove its file; False when it is still mounted."""
    if ref_ident(path) is not None and _libc.umount2(os.fsencode(path), MNT_DETACH) != 0:
        log.warning("cannot unmount %s: %s", path, os.strerror(ctypes.get_errno()))
        return False
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    return True


def release_all(state_dir: Path) -> bool:
    """Release every reference under a state dir; False when one could not be."""
    d = Path(state_dir) / REF_DIR
    ok = all([release(d / label) for label in held(state_dir)])
    with contextlib.suppress(OSError):
        for name in os.listdir(d):  # files left by a hold() killed half-way
            if ref_ident(d / name) is None:
                os.unlink(d / name)
        os.rmdir(d)
    return ok


def pids_in(idents: set[Ident]) -> list[int]:
    """Processes whose network namespace is one of `idents` (never this process)."""
    me = os.getpid()
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            if ns_ident(f"/proc/{entry.name}/ns/net") in idents:
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def guarded(idents: set[Ident]) -> set[Ident]:
    """`idents` less the machine's own namespace (PID 1's), which no run may empty."""
    keep = set(idents)
    with contextlib.suppress(OSError):
        keep.discard(ns_ident("/proc/1/ns/net"))
    return keep
