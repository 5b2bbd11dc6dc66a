"""Turn pip-compile's output into LightPipe's lock for Python 3.11-3.13 (run by scripts/lock.sh).

pip-compile resolves for the Python it runs on and drops pyproject's environment markers
(gnpy's `python_version < '3.13'`). This writes each marker back onto its pin, and onto every
pin that only marked pins need (pip-compile's `# via` lines: gnpy's oopt-gnpy-libyang has no
wheel for 3.13 and cannot be built there), so that one lock serves each supported Python and
its pip decides. It drops torch (scripts/install_torch.py installs it) and what only PyPI's
CUDA build of torch pulls in (NVIDIA's libraries, cuda-*, triton), and LightPipe itself.

    python scripts/lock_markers.py RAW_LOCK OUT_LOCK [PYPROJECT]
"""

from __future__ import annotations

import re
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

HEAD = ("# LightPipe's locked Python dependencies: exact versions and sha256 hashes.\n"
        "# Written by `make lock` (scripts/lock.sh); used by `make setup` (scripts/setup.sh).\n"
        "# One lock for Python 3.11, 3.12 and 3.13 (markers decide per Python).\n"
        "# torch==2.13.0 is installed separately (scripts/install_torch.py: a CPU build).\n")
PIN_RE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+?)(?: ; [^\\]*?)?( \\)?$")
DROPPED_RE = re.compile(r"^(torch|nvidia-.*|cuda-.*|triton|lightpipe)$")
ROOT = "lightpipe"


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass
class Entry:
    """One pin of the lock: its first line's parts, the lines after it, who needs it."""

    name: str
    version: str
    continues: bool
    rest: list[str] = field(default_factory=list)
    via: list[str] = field(default_factory=list)


def declared_markers(pyproject: Path) -> dict[str, str]:
    """canonical name -> marker, for each requirement of pyproject that has one."""
    project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
    declared = list(project.get("dependencies", []))
    for extra in project.get("optional-dependencies", {}).values():
        declared += extra
    markers = {}
    for req in declared:
        if ";" in req:
            name = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", req.strip())
            if name is not None:
                markers[canonical(name.group(0))] = req.split(";", 1)[1].strip()
    return markers


def parse(text: str) -> tuple[list[str], list[Entry]]:
    """The lines before the first pin, and every pin with its hash and `# via` lines."""
    head: list[str] = []
    entries: list[Entry] = []
    in_via = False
    for line in text.splitlines(keepends=True):
        m = PIN_RE.match(line.rstrip("\n"))
        if m is not None:
            entries.append(Entry(m.group(1), m.group(2), bool(m.group(3))))
            in_via = False
            continue
        if line.strip().startswith(("lightpipe @", "-e ")):
            continue
        if not entries:
            head.append(line)
            continue
        entries[-1].rest.append(line)
        stripped = line.strip()
        if stripped.startswith("# via"):
            who = stripped[len("# via"):].strip()
            in_via = not who
            if who:
                entries[-1].via.append(who)
        elif in_via and stripped.startswith("#   "):
            entries[-1].via.append(stripped[1:].strip())
        else:
            in_via = False
    return head, entries


def parent_name(via: str) -> str:
    """`lightpipe (pyproject.toml)` -> lightpipe; `-r requirements.in` -> the root."""
    if via.startswith("-"):
        return ROOT
    return canonical(via.split()[0])


def propagate(entries: list[Entry], declared: dict[str, str]) -> dict[str, str]:
    """canonical name -> marker: the declared ones, and every pin whose needers all carry
    one and the same marker (to a fixed point)."""
    marked = {canonical(e.name): declared[canonical(e.name)] for e in entries
              if canonical(e.name) in declared}
    changed = True
    while changed:
        changed = False
        for e in entries:
            key = canonical(e.name)
            if key in marked or key in declared:
                continue
            parents = {parent_name(v) for v in e.via} - {key}
            if not parents:
                continue
            if ROOT in parents:  # a requirement of LightPipe's own, unmarked there
                continue
            kept = {p for p in parents if not DROPPED_RE.match(p)}
            if not kept:
                continue  # (only torch's CUDA libraries need it: dropped with them)
            found = {marked.get(p) for p in kept}
            if len(found) == 1 and None not in found:
                marked[key] = found.pop()
                changed = True
    return marked


def render(entries: list[Entry], markers: dict[str, str]) -> str:
    out = [HEAD]
    for e in entries:
        key = canonical(e.name)
        if DROPPED_RE.match(key):
            continue
        marker = f" ; {markers[key]}" if key in markers else ""
        cont = " \\" if e.continues else ""
        out.append(f"{e.name}=={e.version}{marker}{cont}\n")
        out.extend(line for line in e.rest
                   if not line.startswith(("# WARNING: pip install", "# Consider using")))
    return "".join(out)


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 3):
        print("usage: lock_markers.py RAW_LOCK OUT_LOCK [PYPROJECT]", file=sys.stderr)
        return 2
    raw, dst = Path(argv[0]), Path(argv[1])
    pyproject = Path(argv[2]) if len(argv) == 3 else Path("pyproject.toml")
    _, entries = parse(raw.read_text(encoding="utf-8"))
    markers = propagate(entries, declared_markers(pyproject))
    dst.write_text(render(entries, markers), encoding="utf-8")
    for name in sorted(markers):
        print(f"lock: {name} ; {markers[name]}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
