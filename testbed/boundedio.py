"""Read a user-named input file safely: regular files only, a size limit, strict UTF-8."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from testbed.errors import InputError

MiB = 1 << 20
SPEC_MAX_BYTES = 1 * MiB
"""Largest scenario file accepted (checked before parsing)."""
TOPOLOGY_MAX_BYTES = 16 * MiB
"""Largest topology CSV accepted."""
TRACE_MAX_BYTES = 256 * MiB
"""Largest trace CSV accepted."""


def check_regular(path: str | Path, field: str) -> Path:
    """Refuse what is not a regular file (a FIFO, a device, a directory) before opening it."""
    p = Path(path)
    try:
        st = os.stat(p)
    except FileNotFoundError:
        raise InputError(field, f"{str(p)!r}: no such file") from None
    except OSError as exc:
        raise InputError(field, f"cannot read {str(p)!r}: {exc.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
        raise InputError(field, f"{str(p)!r} is {kind}")
    return p


def read_bounded_bytes(path: str | Path, field: str, max_bytes: int) -> bytes:
    """The bytes of a regular file of at most max_bytes (refused before reading more)."""
    p = check_regular(path, field)
    try:
        # O_NONBLOCK: a FIFO swapped in after the stat must not block the open.
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise InputError(field, f"cannot read {str(p)!r}: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise InputError(field, f"{str(p)!r} is not a regular file")
        if st.st_size > max_bytes:
            raise InputError(field, f"{str(p)!r} is too large ({st.st_size} bytes; "
                             f"the limit is {max_bytes} bytes)")
        data = fh.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise InputError(field, f"{str(p)!r} is too large (the limit is {max_bytes} bytes)")
    return data


def read_bounded_text(path: str | Path, field: str, max_bytes: int) -> str:
    """read_bounded_bytes decoded as strict UTF-8, with a one-line error otherwise."""
    data = read_bounded_bytes(path, field, max_bytes)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        bad = data[exc.start:exc.start + 1].hex()
        raise InputError(field, f"{str(path)!r} is not UTF-8 text (byte 0x{bad} at "
                         f"offset {exc.start})") from None


def read_owned_nofollow_bytes(path: str | Path, field: str, max_bytes: int,
                              owners: tuple[int, ...] | None = None) -> bytes:
    """The bytes of a regular file of at most max_bytes, opened without following a
    symbolic link at its last component or blocking on a FIFO (O_NOFOLLOW|O_NONBLOCK),
    and owned by one of `owners` (default: this process's user or root); InputError
    naming the field otherwise. For files that another user could have planted."""
    import errno

    p = Path(path)
    allowed = (0, os.geteuid()) if owners is None else owners
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(p, flags)
    except FileNotFoundError:
        raise InputError(field, f"{str(p)!r}: no such file") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise InputError(field, f"{str(p)!r} is a symbolic link: refused") from None
        raise InputError(field, f"cannot read {str(p)!r}: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode):
            kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
            raise InputError(field, f"{str(p)!r} is {kind}: refused")
        if st.st_uid not in allowed:
            raise InputError(field, f"{str(p)!r} is owned by uid {st.st_uid}, not by "
                             f"{' or '.join(_owner_names(allowed))}: refused")
        if st.st_size > max_bytes:
            raise InputError(field, f"{str(p)!r} is too large ({st.st_size} bytes; "
                             f"the limit is {max_bytes} bytes)")
        data = fh.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise InputError(field, f"{str(p)!r} is too large (the limit is {max_bytes} bytes)")
    return data


def _owner_names(uids: tuple[int, ...]) -> list[str]:
    me = os.geteuid()
    return sorted({"root" if u == 0 else "you" if u == me else f"uid {u}" for u in uids})
