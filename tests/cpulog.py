"""Where make test's CPU goes: with LIGHTPIPE_TEST_CPU_LOG=FILE, one JSON line per test
(its wall time, the CPU of the pytest process and of the children it reaped, its lane)
appended to FILE; `python -m tests.cpulog FILE` sums them (docs/testing.md)."""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

CPU_LOG_VAR = "LIGHTPIPE_TEST_CPU_LOG"
MAX_LOG_BYTES = 64 * 1024 * 1024  # a summary reads no more than this


def _cpu_s(who: int) -> float:
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None
                            ) -> Iterator[None]:
    path = os.environ.get(CPU_LOG_VAR)
    if not path:
        yield
        return
    t0, s0 = time.monotonic(), _cpu_s(resource.RUSAGE_SELF)
    c0 = _cpu_s(resource.RUSAGE_CHILDREN)
    yield
    row = {"test": item.nodeid, "wall_s": round(time.monotonic() - t0, 3),
           "self_s": round(_cpu_s(resource.RUSAGE_SELF) - s0, 3),
           "children_s": round(_cpu_s(resource.RUSAGE_CHILDREN) - c0, 3),
           "lane": os.environ.get("LIGHTPIPE_TEST_LANE", ""),
           "worker": os.environ.get("PYTEST_XDIST_WORKER", "")}
    # one write of one line, O_APPEND: lanes and xdist workers share the file
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    try:
        os.write(fd, (json.dumps(row) + "\n").encode())
    finally:
        os.close(fd)


def summarise(rows: list[dict[str, Any]], top: int) -> str:
    """Per lane: tests, wall and CPU sums; then the `top` tests by CPU, and by module."""
    lanes: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
    mods: dict[str, float] = defaultdict(float)
    for r in rows:
        cpu = r["self_s"] + r["children_s"]
        lane = lanes[r.get("lane") or "?"]
        lane[0] += 1
        lane[1] += r["wall_s"]
        lane[2] += cpu
        mods[r["test"].split("::", 1)[0]] += cpu
    out = ["lane       tests   wall s (sum)    CPU s"]
    out += [f"{k:<10} {int(v[0]):>5} {v[1]:>14.0f} {v[2]:>8.0f}" for k, v in sorted(lanes.items())]
    out.append(f"all        {len(rows):>5} {sum(v[1] for v in lanes.values()):>14.0f} "
               f"{sum(v[2] for v in lanes.values()):>8.0f}")
    out.append(f"\ntop {top} tests by CPU (self + reaped children):")
    ranked = sorted(rows, key=lambda r: -(r["self_s"] + r["children_s"]))[:top]
    out += [f"{r['self_s'] + r['children_s']:8.1f} s CPU {r['wall_s']:8.1f} s wall  "
            f"[{r.get('lane') or '?'}] {r['test']}" for r in ranked]
    out.append(f"\ntop {top} modules by CPU:")
    out += [f"{v:8.1f} s  {k}" for k, v in sorted(mods.items(), key=lambda kv: -kv[1])[:top]]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.cpulog", description=__doc__)
    ap.add_argument("log", type=Path)
    ap.add_argument("--top", type=int, default=30)
    args = ap.parse_args(argv)
    fd = os.open(args.log, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as fh:
        data = fh.read(MAX_LOG_BYTES)
    rows = []
    for line in data.decode(errors="replace").splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue
    print(summarise(rows, args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
