"""Compute burst: how far workers' timed ops miss their deadlines under the run's load.

    python -m testbed.emu.loadprobe --op-ms 4 --seconds 1.5 --duty 0.5   # one worker: JSON
    python -m testbed.emu.loadprobe --op-ms 4 --compute device            # a device stand-in

A stand-in for a pipeline stage's compute (workloads/compute.py: with compute cpu, chunks
of about CHUNK_MS paced as a worker's, testbed.emu.pacing; with compute device, sleep to
the deadline with the least timer slack), without torch so that it starts in a fraction
of a second. `burst()` starts one per worker stage side by side (while the caller keeps
the network busy) and returns the mean (and p50/p90/max) of |end - deadline| over all
their ops: what a time factor must make small next to the jobs' ops
(testbed.emu.timefactor).
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

CHUNK_MS = 0.25


def _work(n: int) -> int:
    x = 0
    for i in range(n):
        x ^= i * 2654435761 & 0xFFFF
    return x


def _calibrate(chunk_s: float) -> int:
    """Loop count of _work that takes about chunk_s (the fastest of a few tries)."""
    n = 1000
    best = math.inf
    for _ in range(5):
        t0 = time.perf_counter()
        _work(n)
        best = min(best, time.perf_counter() - t0)
    return max(1, round(n * chunk_s / best))


def run_device_ops(op_s: float, seconds: float) -> list[float]:
    """A device stand-in's ops (workloads.compute.DeviceStandIn: sleep to the deadline)
    back to back for `seconds`; each op's end - deadline (s)."""
    from testbed.emu.slack import set_timer_slack_ns, sleep_until

    set_timer_slack_ns(1)
    misses = []
    stop = time.perf_counter() + seconds
    while time.perf_counter() < stop:
        misses.append(sleep_until(time.perf_counter() + op_s))
    return misses


def run_ops(op_s: float, seconds: float, duty: float) -> list[float]:
    """Ops of op_s back to back for `seconds`, paced as a shadow CPU worker's
    (testbed.emu.pacing.paced_op); each op's |end - deadline| (s)."""
    from testbed.emu.pacing import paced_op
    from testbed.emu.slack import set_timer_slack_ns

    chunk_s = CHUNK_MS / 1000
    n = _calibrate(chunk_s)
    if duty < 1:
        set_timer_slack_ns(1)  # as workloads.compute.Burner below duty 1
    misses = []
    stop = time.perf_counter() + seconds
    while time.perf_counter() < stop:
        end = time.perf_counter() + op_s
        paced_op(lambda: _work(n), op_s, chunk_s, duty)
        misses.append(abs(time.perf_counter() - end))
    return misses


def burst(workers: int, op_ms: float, seconds: float = 1.5, duty: float = 1.0,
          python: str = sys.executable, compute: str = "cpu",
          cpus: Sequence[int] | None = None) -> dict[str, Any]:
    """`workers` processes running ops side by side (on `cpus`, the CPU workers' cores of
    testbed.emu.cpuset, where given); mean/p50/p90/max of their misses (ms)."""
    argv = [python, "-m", "testbed.emu.loadprobe", "--op-ms", f"{op_ms:g}", "--seconds",
            f"{seconds:g}", "--duty", f"{duty:g}", "--compute", compute]
    if cpus:
        argv += ["--cpus", ",".join(str(int(c)) for c in cpus)]
    procs = [subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
             for _ in range(max(1, workers))]
    misses: list[float] = []
    priority: dict[str, Any] = {}
    for p in procs:
        out, _ = p.communicate(timeout=seconds + 60)
        if p.returncode == 0 and out.strip():
            got = json.loads(out)
            misses += got["misses_ms"]
            priority = got.get("priority") or priority
    misses.sort()
    if not misses:
        return {"workers": workers, "op_ms": op_ms, "ops": 0}

    def q(x: float) -> float:
        return misses[min(len(misses) - 1, max(0, math.ceil(x * len(misses)) - 1))]

    return {"workers": workers, "op_ms": op_ms, "duty": duty, "compute": compute,
            "priority": priority, "ops": len(misses),
            "miss_mean_ms": round(sum(misses) / len(misses), 4),
            "miss_p50_ms": round(q(0.5), 4), "miss_p90_ms": round(q(0.9), 4),
            "miss_max_ms": round(misses[-1], 4)}


def main(argv: list[str] | None = None) -> int:
    from testbed.emu.cpuset import cpu_list

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--op-ms", type=float, required=True)
    ap.add_argument("--seconds", type=float, default=1.5)
    ap.add_argument("--duty", type=float, default=1.0)
    ap.add_argument("--compute", choices=("cpu", "device"), default="cpu")
    ap.add_argument("--cpus", type=cpu_list, default=None,
                    help="run on these CPUs (comma-separated numbers)")
    a = ap.parse_args(argv)
    if not (0 < a.op_ms <= 60_000 and 0 < a.seconds <= 60 and 0 < a.duty <= 1):
        ap.error("--op-ms in (0, 60000], --seconds in (0, 60], --duty in (0, 1]")
    from testbed.emu.cpuset import pin
    from testbed.emu.priority import raise_worker_priority

    if a.cpus and not pin(0, a.cpus):
        ap.error(f"--cpus {','.join(map(str, a.cpus))}: not CPUs this process may run on")

    got = raise_worker_priority(a.compute)  # scheduled as the stage it stands for
    misses = (run_device_ops(a.op_ms / 1000, a.seconds) if a.compute == "device"
              else run_ops(a.op_ms / 1000, a.seconds, a.duty))
    json.dump({"misses_ms": [round(m * 1000, 4) for m in misses], "priority": got},
              sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
