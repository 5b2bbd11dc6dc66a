"""The REST API's bearer token: read from a 0600 file, or generated and written to one.

The token never travels on a command line (visible to every user in the process list):
the controller gets the path of a file (`--token-file`), or generates a token and writes
it next to its database, mode 0600, for its clients to read.
"""

from __future__ import annotations

import ipaddress
import os
import secrets
import stat
from pathlib import Path

TOKEN_BYTES = 24
MAX_TOKEN_CHARS = 512


def write_secret(path: Path, text: str) -> None:
    """Write `text` to `path` atomically, mode 0600 from the first byte."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text + "\n")
        os.chmod(tmp, 0o600)  # O_CREAT keeps an existing file's mode
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def read_token(path: Path) -> str:
    """The token in `path`; ValueError (one line) if unreadable, empty, or readable by
    other users."""
    try:
        st = os.stat(path)
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: cannot read the token: {exc}") from None
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ValueError(f"{path}: token file readable by others "
                         f"(mode {stat.S_IMODE(st.st_mode):04o}); chmod 600 it")
    token = text.strip()
    if not token or len(token) > MAX_TOKEN_CHARS or any(c.isspace() for c in token):
        raise ValueError(f"{path}: the token must be one word of 1..{MAX_TOKEN_CHARS} "
                         "characters")
    return token


def new_token_file(path: Path) -> str:
    """Generate a token, write it to `path` (0600) and return it."""
    token = secrets.token_urlsafe(TOKEN_BYTES)
    write_secret(path, token)
    return token


def is_loopback(host: str) -> bool:
    """Whether a listen address is loopback only (127.0.0.0/8, ::1, localhost): anything
    else needs a token file."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
