"""Processes found by their command line, for tests that check what a run left."""

from __future__ import annotations

from pathlib import Path


def pids_with_cmdline(part: bytes) -> list[int]:
    """PIDs of the processes whose command line (NUL-separated) contains part."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if part in (d / "cmdline").read_bytes():
                    out.append(int(d.name))
            except OSError:
                continue
    return out
