"""Read a user-named input file, or the members of a run directory, safely: regular files
only, no links followed inside a directory, size and row limits, strict UTF-8."""

from __future__ import annotations

import io
import logging
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from testbed.errors import InputError

log = logging.getLogger(__name__)

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
        return _read_capped(fh, st.st_size, p, field, max_bytes)


def _read_capped(fh: Any, size: int, p: Path, field: str, max_bytes: int) -> bytes:
    """At most max_bytes from an open regular file whose fstat size was `size`."""
    if size > max_bytes:
        raise InputError(field, f"{str(p)!r} is too large ({size} bytes; "
                         f"the limit is {max_bytes} bytes)")
    data: bytes = fh.read(max_bytes + 1)
    if len(data) > max_bytes:  # it grew after the fstat
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
        return _read_capped(fh, st.st_size, p, field, max_bytes)


def _owner_names(uids: tuple[int, ...]) -> list[str]:
    me = os.geteuid()
    return sorted({"root" if u == 0 else "you" if u == me else f"uid {u}" for u in uids})


# ---- reading the members of a directory someone else may own -------------------------
RUNDIR_JSON_MAX_BYTES = 16 * MiB
"""Largest JSON record (manifest.json, summary.json, sweep.json) read from a run directory."""
RUNDIR_TEXT_MAX_BYTES = 1 * MiB
"""Largest text document (a reproduction's *.md) read from a run directory."""
CSV_MAX_BYTES = 64 * MiB
"""Bytes of a CSV record file read from a run directory (the rest is left unread)."""
CSV_MAX_ROWS = 200_000
"""Rows of a CSV record file read from a run directory (the rest is left unread)."""
CSV_MAX_CELLS = 2_000_000
"""Cells (rows x columns) of a CSV record file kept in memory."""
MAX_DIR_ENTRIES = 10_000
"""Names listed from one directory (a listing stops there)."""

_NOFOLLOW = os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISLNK, "a symbolic link"),
                       (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


class Refused(Exception):
    """A member of a directory that is not read: why, in a few words."""


class DirReader:
    """One directory, held open by its fd, whose members are read relative to it.

    A member is opened with O_NOFOLLOW|O_NONBLOCK (never through a symbolic link, never
    blocking on a FIFO), must be a regular file (a subdirectory: a directory) owned by
    the directory's owner or by root, and is read through a byte limit. A file owned by
    root in a directory that root does not own must have one link (no hard link to a
    root file planted by another user). Every member that is refused or cut short is
    recorded in `skipped` (shared with the subdirectories), never silently dropped.
    """

    def __init__(self, fd: int, shown: str, owners: frozenset[int],
                 skipped: list[tuple[str, str]], owner: int) -> None:
        self.fd = fd
        self.shown = shown
        self.owners = owners
        self.owner = owner
        self.skipped = skipped
        self._subs: list[DirReader] = []

    # -- opening --------------------------------------------------------------------
    @classmethod
    def open(cls, path: str | os.PathLike[str], field: str = "DIR") -> DirReader:
        """The directory at path (a symbolic link given here is followed once: it is the
        caller's own argument; nothing inside is). InputError when it is no directory."""
        p = Path(path)
        try:
            fd = os.open(os.path.realpath(p), os.O_RDONLY | os.O_DIRECTORY | _NOFOLLOW)
        except FileNotFoundError:
            raise InputError(field, f"{p} is not a directory (no such directory)") from None
        except NotADirectoryError:
            raise InputError(field, f"{p} is not a directory") from None
        except OSError as exc:
            raise InputError(field, f"cannot read {p}: {exc.strerror}") from None
        st = os.fstat(fd)
        return cls(fd, str(p).rstrip("/") or "/", frozenset({st.st_uid, 0}), [], st.st_uid)

    def close(self) -> None:
        for sub in self._subs:
            sub.close()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> DirReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def where(self, name: str) -> str:
        """The member's path for messages (control characters shown as '?': a name
        chosen by another user reaches a terminal)."""
        return "".join(c if c.isprintable() else "?" for c in f"{self.shown}/{name}")

    def skip(self, name: str, why: str) -> None:
        """Record a member that is not (wholly) read, and log it once."""
        item = (self.where(name), why)
        if item not in self.skipped:
            self.skipped.append(item)
            log.warning("skipped %s: %s", *item)

    def _check(self, st: os.stat_result) -> None:
        if st.st_uid not in self.owners:
            raise Refused(f"owned by uid {st.st_uid}, not by the directory's owner "
                          f"(uid {self.owner}) or root")
        if (stat.S_ISREG(st.st_mode) and st.st_uid != self.owner and st.st_nlink > 1):
            raise Refused(f"a file of uid {st.st_uid} with {st.st_nlink} hard links in a "
                          f"directory of uid {self.owner}")

    def lstat(self, name: str) -> os.stat_result | None:
        """The member's own status (links not followed, in `name` nor on the way to it),
        None when absent."""
        if "/" in name:
            head, _, tail = name.rpartition("/")
            d = self.sub(head, quiet=True)
            if d is None:
                return None
            try:
                return d.lstat(tail)
            finally:
                d.close()
        try:
            return os.stat(name, dir_fd=self.fd, follow_symlinks=False)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            log.info("cannot stat %s: %s", self.where(name), exc.strerror)
            return None

    def has(self, name: str) -> bool:
        """Whether a member of that name is there (of any kind: it may still be refused)."""
        return self.lstat(name) is not None

    def is_file(self, name: str) -> bool:
        st = self.lstat(name)
        return st is not None and stat.S_ISREG(st.st_mode)

    def is_dir(self, name: str) -> bool:
        st = self.lstat(name)
        return st is not None and stat.S_ISDIR(st.st_mode)

    def sub(self, name: str, quiet: bool = False) -> DirReader | None:
        """The subdirectory `name` (components separated by '/', none followed when it is
        a link), None when absent or refused (recorded unless quiet)."""
        parts = [x for x in name.split("/") if x]
        if not parts:
            return None
        cur = self
        for part in parts:
            if part in (".", ".."):
                self.skip(name, "a path outside the directory")
                return None
            try:
                fd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | _NOFOLLOW, dir_fd=cur.fd)
            except FileNotFoundError:
                return None
            except OSError as exc:
                if not quiet:
                    st = cur.lstat(part)
                    if st is not None and stat.S_ISLNK(st.st_mode):
                        cur.skip(part, "a symbolic link: not followed")
                    elif st is not None and not stat.S_ISDIR(st.st_mode):
                        cur.skip(part, f"{_kind(st.st_mode)}, not a directory")
                    else:
                        cur.skip(part, f"cannot open: {exc.strerror or exc}")
                return None
            nxt = DirReader(fd, cur.where(part), self.owners, self.skipped, self.owner)
            cur._subs.append(nxt)
            try:
                nxt._check(os.fstat(fd))
            except Refused as exc:
                if not quiet:
                    cur.skip(part, str(exc))
                return None
            cur = nxt
        return cur

    def names(self, limit: int = MAX_DIR_ENTRIES) -> list[str]:
        """The members' names, sorted (at most `limit`; the cut is recorded)."""
        out: list[str] = []
        try:
            with os.scandir(self.fd) as it:
                for entry in it:
                    if len(out) >= limit:
                        self.skip("*", f"more than {limit} entries: the rest not listed")
                        break
                    out.append(entry.name)
        except OSError as exc:
            self.skip(".", f"cannot list: {exc.strerror}")
        return sorted(out)

    # -- reading --------------------------------------------------------------------
    def open_file(self, name: str) -> int | None:
        """An fd of the regular file `name` passing the checks above; None when absent
        (not recorded) or refused (recorded)."""
        if "/" in name:
            head, _, tail = name.rpartition("/")
            d = self.sub(head)
            return None if d is None else d.open_file(tail)
        try:
            fd = os.open(name, os.O_RDONLY | _NOFOLLOW, dir_fd=self.fd)
        except FileNotFoundError:
            return None
        except OSError as exc:
            st = self.lstat(name)
            if st is not None and stat.S_ISLNK(st.st_mode):
                self.skip(name, "a symbolic link: not followed")
            else:
                self.skip(name, f"cannot open: {exc.strerror or exc}")
            return None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise Refused(f"{_kind(st.st_mode)}, not a regular file")
            self._check(st)
        except Refused as exc:
            os.close(fd)
            self.skip(name, str(exc))
            return None
        return fd

    def read_bytes(self, name: str, max_bytes: int, cut: bool = False) -> bytes | None:
        """The file's bytes; None when absent or refused. Larger than max_bytes: refused,
        or with cut=True its first max_bytes (the cut recorded)."""
        fd = self.open_file(name)
        if fd is None:
            return None
        with os.fdopen(fd, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if size > max_bytes and not cut:
                self.skip(name, f"too large ({size} bytes; the limit is {max_bytes})")
                return None
            data = fh.read(max_bytes + 1)
        if len(data) > max_bytes:
            if not cut:
                self.skip(name, f"too large (the limit is {max_bytes} bytes)")
                return None
            self.skip(name, f"only its first {max_bytes} bytes read (the limit)")
            data = data[:max_bytes]
        return data

    def read_text(self, name: str, max_bytes: int = RUNDIR_TEXT_MAX_BYTES) -> str | None:
        """The file as text (undecodable bytes replaced); None when absent or refused."""
        data = self.read_bytes(name, max_bytes)
        return None if data is None else data.decode("utf-8", errors="replace")

    def read_json(self, name: str, max_bytes: int = RUNDIR_JSON_MAX_BYTES) -> Any:
        """The file's JSON value; None when absent, refused or not JSON (recorded)."""
        import json

        data = self.read_bytes(name, max_bytes)
        if data is None:
            return None
        try:
            return json.loads(data)
        except (ValueError, RecursionError) as exc:
            self.skip(name, f"not JSON: {str(exc)[:80]}")
            return None

    def read_lines(self, name: str, max_bytes: int = CSV_MAX_BYTES) -> Iterator[str] | None:
        """The file's complete lines (a torn last line, as a killed writer leaves, and a
        line cut by the byte limit are dropped), streamed; None when absent or refused."""
        fd = self.open_file(name)
        if fd is None:
            return None
        return self._lines(fd, name, max_bytes)

    def _lines(self, fd: int, name: str, max_bytes: int) -> Iterator[str]:
        import io

        size = os.fstat(fd).st_size
        raw = io.FileIO(fd, "rb", closefd=True)
        text = io.TextIOWrapper(io.BufferedReader(_Capped(raw, max_bytes)), encoding="utf-8",
                                errors="replace", newline="")
        with text:
            prev: str | None = None
            for line in text:
                if prev is not None:
                    yield prev
                prev = line
            if prev is not None and prev.endswith("\n"):
                yield prev
        if size > max_bytes:
            self.skip(name, f"only its first {max_bytes} bytes read (the limit)")

    def read_csv(self, name: str, max_rows: int = CSV_MAX_ROWS,
                 max_bytes: int = CSV_MAX_BYTES,
                 max_cells: int = CSV_MAX_CELLS) -> list[dict[str, str]]:
        """The rows of a CSV file with a header ([] when absent, refused or not CSV), at
        most max_rows rows and max_cells cells; a cut is recorded."""
        import csv

        lines = self.read_lines(name, max_bytes)
        if lines is None:
            return []
        rows: list[dict[str, str]] = []
        cells = 0
        reader = csv.DictReader(lines)
        try:
            for row in reader:
                cells += len(row)
                if len(rows) >= max_rows or cells > max_cells:
                    self.skip(name, f"only its first {len(rows)} rows read (the limit is "
                              f"{max_rows} rows, {max_cells} cells)")
                    break
                rows.append(row)
        except csv.Error as exc:
            self.skip(name, f"not CSV after row {len(rows)}: {str(exc)[:80]}")
        finally:
            close = getattr(lines, "close", None)
            if close is not None:
                close()
        return rows


class _Capped(io.RawIOBase):
    """A raw reader that ends after max_bytes."""

    def __init__(self, raw: io.RawIOBase, max_bytes: int) -> None:
        super().__init__()
        self.raw, self.left = raw, max_bytes

    def readable(self) -> bool:
        return True

    def readinto(self, buf: Any) -> int:
        if self.left <= 0:
            return 0
        view = memoryview(buf)[: self.left]
        n = self.raw.readinto(view) or 0
        self.left -= n
        return n

    def close(self) -> None:
        self.raw.close()
        super().close()


TREE_MAX_BYTES = 1 << 30
"""Bytes copied out of a run directory's tree (a Prometheus TSDB) at most."""
TREE_MAX_FILES = 20_000
"""Files copied out of a run directory's tree at most."""
TREE_MAX_DEPTH = 8
"""Directory levels copied out of a run directory's tree at most."""


def copy_tree(src: DirReader, dst: Path, field: str, max_bytes: int = TREE_MAX_BYTES,
              skip: tuple[str, ...] = (), max_files: int = TREE_MAX_FILES) -> int:
    """Copy src's regular files and subdirectories into the new directory dst (0700,
    files 0600), reading each as DirReader does: no link followed, no FIFO or device,
    only the directory owner's files (what is left out is recorded in src.skipped).
    Names in `skip` are left out silently. InputError (naming field) past max_bytes
    bytes or max_files files, counted as read, not as the files claim; the caller
    removes dst. Returns the bytes copied."""
    os.mkdir(dst, 0o700)
    dst_fd = os.open(dst, os.O_RDONLY | os.O_DIRECTORY | _NOFOLLOW)
    try:
        return _copy_into(src, dst_fd, field, [max_bytes, max_files, max_bytes, max_files],
                          skip, 0)
    finally:
        os.close(dst_fd)


def _copy_into(src: DirReader, dst_fd: int, field: str, left: list[int],
               skip: tuple[str, ...], depth: int) -> int:
    copied = 0
    for name in src.names():
        st = src.lstat(name)
        if name in skip or st is None:
            continue
        if stat.S_ISDIR(st.st_mode):
            if depth + 1 >= TREE_MAX_DEPTH:
                src.skip(name, f"nested more than {TREE_MAX_DEPTH} levels deep: not copied")
                continue
            sub = src.sub(name)
            if sub is None:
                continue
            os.mkdir(name, 0o700, dir_fd=dst_fd)
            fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | _NOFOLLOW, dir_fd=dst_fd)
            try:
                copied += _copy_into(sub, fd, field, left, skip, depth + 1)
            finally:
                os.close(fd)
            continue
        src_fd = src.open_file(name)  # (a link, FIFO or device is refused and recorded)
        if src_fd is None:
            continue
        left[1] -= 1
        if left[1] < 0:
            os.close(src_fd)
            raise InputError(field, f"{src.shown}: the tree holds more than {left[3]} "
                             "files (the copy limit); not copied")
        with os.fdopen(src_fd, "rb") as fin, os.fdopen(os.open(
                name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o600,
                dir_fd=dst_fd), "wb") as fout:
            while block := fin.read(min(1 << 20, left[0] + 1)):
                left[0] -= len(block)
                if left[0] < 0:
                    raise InputError(field, f"{src.where(name)}: the tree holds more than "
                                     f"{left[2]} bytes (the copy limit); not copied")
                fout.write(block)
                copied += len(block)
    return copied
