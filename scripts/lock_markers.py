"""Merge pip-compile's outputs for Python 3.11, 3.12 and 3.13 into one lock (for lock.sh).

pip-compile resolves for the Python it runs on: gnpy (< 3.13) is in 3.11's output only, and
webob's legacy-cgi (>= 3.13) in 3.13's only. So lock.sh compiles once per Python (each seeded
with the first one's pins, so that a version is the same wherever it can be), and this writes
one lock where every pin that not all of them need carries the marker of the Pythons that do
(`gnpy==3.0.1 ; python_version < '3.13'`); where one Python needs another version, each
version gets its own marker. It drops torch (scripts/install_torch.py installs it), what only
PyPI's CUDA build of torch pulls in (NVIDIA's libraries, cuda-*, triton), and LightPipe.

    python scripts/lock_markers.py OUT_LOCK 3.11=RAW311 [3.12=RAW312 3.13=RAW313]
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

HEAD = ("# LightPipe's locked Python dependencies: exact versions and sha256 hashes.\n"
        "# Written by `make lock` (scripts/lock.sh); used by `make setup` (scripts/setup.sh).\n"
        "# One lock for Python 3.11, 3.12 and 3.13 (markers decide per Python).\n"
        "# torch==2.13.0 is installed separately (scripts/install_torch.py: a CPU build).\n")
PIN_RE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+?)(?: ; [^\\]*?)?( \\)?$")
DROPPED_RE = re.compile(r"^(torch|nvidia-.*|cuda-.*|triton|lightpipe)$")
VERSION_RE = re.compile(r"^3\.\d{1,2}$")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass
class Entry:
    """One pin of a lock: its first line's parts and the lines after it (hashes, `# via`)."""

    name: str
    version: str
    continues: bool
    rest: list[str] = field(default_factory=list)


def parse(text: str) -> list[Entry]:
    """Every pin of a pip-compile output, with its hash and `# via` lines."""
    entries: list[Entry] = []
    for line in text.splitlines(keepends=True):
        m = PIN_RE.match(line.rstrip("\n"))
        if m is not None:
            entries.append(Entry(m.group(1), m.group(2), bool(m.group(3))))
        elif line.strip().startswith(("lightpipe @", "-e ")):
            continue
        elif entries and not line.startswith(("# WARNING: pip install", "# Consider using")):
            entries[-1].rest.append(line)
    return entries


def _key(version: str) -> tuple[int, int]:
    major, minor = version.split(".")
    return int(major), int(minor)


def marker(pythons: set[str], every: list[str]) -> str:
    """The shortest marker for exactly these Pythons among EVERY (sorted); '' for all."""
    if set(every) <= pythons:
        return ""
    chosen = sorted(pythons, key=_key)
    idx = [every.index(p) for p in chosen]
    contiguous = idx == list(range(idx[0], idx[-1] + 1))
    if contiguous and idx[0] == 0:
        return f"python_version < '{every[idx[-1] + 1]}'"
    if contiguous and idx[-1] == len(every) - 1:
        return f"python_version >= '{chosen[0]}'"
    if len(chosen) == 1:
        return f"python_version == '{chosen[0]}'"
    return " or ".join(f"python_version == '{p}'" for p in chosen)


def merge(per_python: dict[str, list[Entry]]) -> str:
    """One lock from each Python's pins (the first Python's order and lines first)."""
    every = sorted(per_python, key=_key)
    # (canonical name, version) -> the Pythons that pin it, and its lines as first seen
    seen: dict[tuple[str, str], tuple[set[str], Entry]] = {}
    order: list[tuple[str, str]] = []
    for py in every:
        for e in per_python[py]:
            key = (canonical(e.name), e.version)
            if DROPPED_RE.match(key[0]):
                continue
            if key not in seen:
                seen[key] = (set(), e)
                order.append(key)
            seen[key][0].add(py)
    order.sort(key=lambda k: k[0])
    out = [HEAD]
    for key in order:
        pythons, e = seen[key]
        m = marker(pythons, every)
        cont = " \\" if e.continues else ""
        out.append(f"{e.name}=={e.version}{' ; ' + m if m else ''}{cont}\n")
        out.extend(e.rest)
    return "".join(out)


def main(argv: list[str]) -> int:
    if len(argv) < 2 or not all("=" in a for a in argv[1:]):
        print("usage: lock_markers.py OUT_LOCK 3.11=RAW [3.12=RAW ...]", file=sys.stderr)
        return 2
    per_python: dict[str, list[Entry]] = {}
    for arg in argv[1:]:
        version, path = arg.split("=", 1)
        if not VERSION_RE.match(version):
            print(f"lock_markers: {version!r}: a Python version as 3.Y", file=sys.stderr)
            return 2
        per_python[version] = parse(Path(path).read_text(encoding="utf-8"))
    text = merge(per_python)
    Path(argv[0]).write_text(text, encoding="utf-8")
    for line in text.splitlines():
        if " ; " in line and not line.startswith("#"):
            pin = line.rstrip(" \\")
            print(f"lock: {pin}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
