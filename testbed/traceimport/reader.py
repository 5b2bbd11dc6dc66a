"""Streamed, bounded reading of a public trace file: no link followed, a byte and row cap,
strict UTF-8, and errors that name the file, row and column."""

from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from testbed.errors import InputError

GiB = 1 << 30
IMPORT_MAX_BYTES = 4 * GiB
"""Largest public trace file read (the Alibaba task table is ~0.2 GiB, Philly's job log
~0.1 GiB, Acme's Seren trace ~0.1 GiB; read as a stream, never whole)."""
IMPORT_MAX_ROWS = 50_000_000
"""Most rows (CSV records, Philly jobs) read from one file."""
MAX_LINE_BYTES = 1 << 20
"""Longest CSV line read (a public trace's rows are a few hundred bytes)."""
JSON_MAX_OBJECT_CHARS = 16 << 20
"""Largest single Philly job object (its attempts included)."""
_CHUNK = 1 << 20


def clip(text: str, limit: int = 40) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


def bad(origin: str, where: str, column: str, message: str) -> InputError:
    """The one-line error for a bad value: `FILE: row N: COLUMN: message`."""
    col = f"{column}: " if column else ""
    return InputError("", f"{origin}: {where}: {col}{message}")


class _Capped(io.RawIOBase):
    """A raw reader over an fd that refuses to go past max_bytes."""

    def __init__(self, fd: int, origin: str, max_bytes: int) -> None:
        super().__init__()
        self.fd, self.origin, self.left, self.max_bytes = fd, origin, max_bytes, max_bytes

    def readable(self) -> bool:
        return True

    def readinto(self, buf: Any) -> int:
        view = memoryview(buf)
        n = os.readv(self.fd, [view[: min(len(view), self.left + 1)]])
        self.left -= n
        if self.left < 0:
            raise InputError("", f"{self.origin}: larger than {self.max_bytes} bytes "
                             "(the import limit); not read")
        return n

    def close(self) -> None:
        if not self.closed:
            os.close(self.fd)
        super().close()


def _open_raw(path: str | Path, max_bytes: int) -> _Capped:
    """A regular file opened without following a symbolic link or blocking on a FIFO,
    refused past max_bytes."""
    import errno

    from testbed.io.trusted import open_regular

    origin = str(path)
    try:
        fd = open_regular(path)
    except FileNotFoundError:
        raise InputError("", f"{origin}: no such file") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise InputError("", f"{origin} is a symbolic link: refused (name the file "
                             "itself)") from None
        raise InputError("", f"{origin}: cannot read: {exc.strerror}") from None
    size = os.fstat(fd).st_size
    if size > max_bytes:
        os.close(fd)
        raise InputError("", f"{origin} is too large ({size} bytes; the limit is "
                         f"{max_bytes} bytes)")
    return _Capped(fd, origin, max_bytes)


@contextmanager
def open_text(path: str | Path, max_bytes: int = IMPORT_MAX_BYTES) -> Iterator[io.TextIOBase]:
    """The file as a text stream (strict UTF-8, a BOM skipped); see _open_raw."""
    raw = _open_raw(path, max_bytes)
    text = io.TextIOWrapper(io.BufferedReader(raw, _CHUNK), encoding="utf-8-sig",
                            errors="strict", newline="")
    with text:
        yield text


def _text_lines(path: str | Path, max_bytes: int = IMPORT_MAX_BYTES) -> Iterator[str]:
    """The file's lines (endings kept), each decoded as strict UTF-8 on its own so that a
    bad byte is reported at its row; a line longer than MAX_LINE_BYTES is refused."""
    origin = str(path)
    with io.BufferedReader(_open_raw(path, max_bytes), _CHUNK) as fh:
        line_no = 0
        while line := fh.readline(MAX_LINE_BYTES + 1):
            line_no += 1
            if len(line) > MAX_LINE_BYTES:
                raise InputError("", f"{origin}: row {line_no}: longer than "
                                 f"{MAX_LINE_BYTES} bytes")
            try:
                text = line.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise InputError("", f"{origin}: row {line_no}: not UTF-8 text (byte "
                                 f"0x{line[exc.start:exc.start + 1].hex()})") from None
            yield text.removeprefix("\ufeff") if line_no == 1 else text


def _decode_error(origin: str, where: str, exc: UnicodeDecodeError) -> InputError:
    return InputError("", f"{origin}: {where}: not UTF-8 text (byte "
                      f"0x{exc.object[exc.start:exc.start + 1].hex()})")


def csv_records(path: str | Path, columns: Sequence[str], required: Sequence[str],
                header: Sequence[str] | None = None,
                max_rows: int = IMPORT_MAX_ROWS) -> Iterator[tuple[str, dict[str, str]]]:
    """(\"row N\", {column: value}) for each record of a CSV file, streamed.

    The columns are the file's first line when it names every `required` column, else
    `header` when given (a release's separate .header file), else `columns` (the
    release's order) for a headerless file. Rows are numbered as lines of a plain CSV
    (the header is row 1); a row with fewer cells than the columns is an error."""
    origin = str(path)
    lines = _text_lines(path)
    try:
        reader = csv.reader(lines)
        row_no = 0
        names: list[str] | None = None
        try:
            for cells in reader:
                row_no += 1
                if names is None:
                    names = _columns(origin, cells, columns, required, header)
                    if names is cells:
                        continue
                if not cells or (len(cells) == 1 and not cells[0].strip()):
                    continue  # a blank line
                if row_no > max_rows:
                    raise InputError("", f"{origin}: more than {max_rows} rows (the import "
                                     "limit)")
                if len(cells) < len(names):
                    raise bad(origin, f"row {row_no}", names[len(cells)],
                              f"missing (the row has {len(cells)} of {len(names)} columns)")
                yield f"row {row_no}", dict(zip(names, cells, strict=False))
        except csv.Error as exc:
            raise InputError("", f"{origin}: row {row_no + 1}: bad CSV: {exc}") from None
        if names is None:
            raise InputError("", f"{origin}: empty file (no rows)")
    finally:
        lines.close()


def _columns(origin: str, first: list[str], columns: Sequence[str], required: Sequence[str],
             header: Sequence[str] | None) -> list[str]:
    """The column names: the first line's (returned as the same list), or the header's."""
    stripped = [c.strip() for c in first]
    if all(c in stripped for c in required):
        first[:] = stripped
        return first
    names = list(header if header is not None else columns)
    missing = [c for c in required if c not in names]
    if missing:
        raise InputError("", f"{origin}: missing column {missing[0]!r} (the header names "
                         f"{','.join(names)})")
    if header is None and any(c in stripped for c in required):
        # A header line that lacks a column: not a headerless data row.
        gone = [c for c in required if c not in stripped]
        raise InputError("", f"{origin}: row 1: missing column {gone[0]!r} (needed: "
                         f"{','.join(required)})")
    return names


def read_header_file(path: str | Path) -> list[str]:
    """The column names of a release's .header file (one CSV line)."""
    origin = str(path)
    with open_text(path, max_bytes=64 << 10) as text:
        try:
            first = next(csv.reader(text), None)
        except (csv.Error, UnicodeDecodeError) as exc:
            raise InputError("", f"{origin}: not a CSV header line: {exc}") from None
    names = [c.strip() for c in (first or [])]
    if not names or not all(names):
        raise InputError("", f"{origin}: not a header (expected one line of column names)")
    return names


def json_objects(path: str | Path, max_rows: int = IMPORT_MAX_ROWS
                 ) -> Iterator[tuple[str, Any]]:
    """(\"line L (job N)\", value) for each element of a top-level JSON array (or of a
    stream of JSON values, one per line), decoded one element at a time."""
    origin = str(path)
    decoder = json.JSONDecoder()
    with open_text(path) as text:
        buf, pos, line, eof, count, opened = "", 0, 1, False, 0, False

        def more() -> bool:
            nonlocal buf, pos, eof
            if eof:
                return False
            try:
                chunk = text.read(_CHUNK)
            except UnicodeDecodeError as exc:
                raise _decode_error(origin, f"near line {line}", exc) from None
            if not chunk:
                eof = True
                return False
            buf = buf[pos:] + chunk
            pos = 0
            return True

        while True:
            # Skip whitespace and the array's punctuation, counting lines.
            while True:
                while pos < len(buf) and buf[pos] in " \t\r\n,[]":
                    if buf[pos] == "\n":
                        line += 1
                    elif buf[pos] == "[":
                        if opened:
                            raise InputError("", f"{origin}: line {line}: expected a job "
                                             "object, got a nested array")
                        opened = True
                    pos += 1
                if pos < len(buf) or not more():
                    break
            if pos >= len(buf):
                break
            count += 1
            where = f"line {line} (job {count})"
            if count > max_rows:
                raise InputError("", f"{origin}: more than {max_rows} jobs (the import "
                                 "limit)")
            while True:
                try:
                    value, end = decoder.raw_decode(buf, pos)
                except json.JSONDecodeError as exc:
                    if len(buf) - pos > JSON_MAX_OBJECT_CHARS:
                        raise InputError("", f"{origin}: {where}: a job larger than "
                                         f"{JSON_MAX_OBJECT_CHARS} characters") from None
                    if more():
                        continue
                    at = line + buf.count("\n", pos, exc.pos)
                    raise InputError("", f"{origin}: line {at} (job {count}): bad JSON: "
                                     f"{exc.msg}") from None
                except (RecursionError, ValueError) as exc:
                    raise InputError("", f"{origin}: {where}: bad JSON: "
                                     f"{clip(str(exc), 80)}") from None
                break
            line += buf.count("\n", pos, end)
            pos = end
            yield where, value
