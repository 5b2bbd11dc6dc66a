"""Read a worker's JSON-lines records safely: no link followed, no FIFO blocked on, a
size bound, and a line cut short by a kill left out."""

from __future__ import annotations

import errno
import json
import os
from typing import Any

from testbed.errors import InputError
from testbed.io.trusted import read_regular

RECORDS_MAX_BYTES = 256 << 20
"""Largest worker record file read (about 150,000 iterations of a 16-op schedule)."""


def read_json_lines(path: str | os.PathLike[str], field: str = "records",
                    cap_bytes: int = RECORDS_MAX_BYTES) -> list[dict[str, Any]]:
    """The JSON objects of a JSON-lines file, in order ([] where it does not exist); a
    line that does not parse (cut short by a kill) or is not an object is left out.
    InputError naming `field` for a link, a non-regular file or one over cap_bytes."""
    try:
        data = read_regular(path, cap_bytes)
    except FileNotFoundError:
        return []
    except ValueError:
        raise InputError(field, f"{os.fspath(path)!r} is larger than {cap_bytes} bytes: "
                         "refused") from None
    except OSError as exc:
        why = "a symbolic link" if exc.errno == errno.ELOOP else exc.strerror
        raise InputError(field, f"cannot read {os.fspath(path)!r}: {why}") from None
    out: list[dict[str, Any]] = []
    for line in data.decode("utf-8", errors="replace").splitlines():
        try:
            r = json.loads(line)
        except ValueError:
            continue
        if isinstance(r, dict):
            out.append(r)
    return out
