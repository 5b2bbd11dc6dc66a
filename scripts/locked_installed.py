"""Exit 0 when this Python environment holds every requirement of a lock file at its exact version.

`make setup` (scripts/setup.sh) asks before running pip: an environment that already holds
what requirements.lock names (a rerun, or the Vagrant box's venv, built from the same lock
with its hashes checked) is left as it is, which saves pip's minutes under software
emulation. Anything else (a version off, a package missing, a line this check does not
read) exits 1 with the first difference, and pip installs from the lock as before.

    python scripts/locked_installed.py requirements.lock [NAME==VERSION ...]
"""

from __future__ import annotations

import re
import sys
from importlib import metadata

PIN_RE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(\[[A-Za-z0-9,._-]+\])?==([^\s;\\]+)")
MAX_LOCK_BYTES = 4 << 20


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def marker_holds(marker: str) -> bool:
    """Whether an environment marker (`python_version < "3.13"`) holds for this Python, as
    pip decides it (pip's own copy of packaging; ValueError when it cannot be read)."""
    try:
        from packaging.markers import InvalidMarker, Marker
    except ImportError:
        from pip._vendor.packaging.markers import InvalidMarker, Marker  # type: ignore
    try:
        return bool(Marker(marker).evaluate({"extra": ""}))
    except InvalidMarker as exc:
        raise ValueError(f"cannot read marker {marker[:80]!r}") from exc


def pins(text: str) -> list[tuple[str, str]]:
    """(name, version) of each requirement line whose marker holds here; ValueError on a line
    it cannot read."""
    out = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", "--hash")):
            continue
        m = PIN_RE.match(line)
        if m is None:
            raise ValueError(f"cannot read lock line {line[:80]!r}")
        if ";" in line:
            marker = line.split(";", 1)[1].split(" \\")[0].rstrip(" \\")
            if not marker_holds(marker):
                continue
        out.append((m.group(1), m.group(3)))
    return out


def first_difference(wanted: list[tuple[str, str]]) -> str | None:
    """None when every (name, version) is installed at that version (a local tag such as
    torch's `+cpu` ignored), else what differs."""
    for name, version in wanted:
        try:
            have = metadata.version(_canonical(name))
        except metadata.PackageNotFoundError:
            return f"{name} is not installed"
        if have.split("+", 1)[0] != version:
            return f"{name} is {have}, the lock says {version}"
    return None


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: locked_installed.py LOCK [NAME==VERSION ...]", file=sys.stderr)
        return 2
    try:
        with open(argv[0], "rb") as fh:
            text = fh.read(MAX_LOCK_BYTES + 1).decode()
        if len(text) > MAX_LOCK_BYTES:
            raise ValueError("the lock is larger than 4 MiB")
        wanted = pins(text) + pins("\n".join(argv[1:]))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        print(f"locked_installed: {exc}", file=sys.stderr)
        return 1
    diff = first_difference(wanted) if wanted else "the lock names nothing"
    if diff is not None:
        print(f"locked_installed: {diff}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
