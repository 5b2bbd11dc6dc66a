"""Timer slack: a fixed-bucket histogram of how late a process woke against its deadline,
and setting a thread's own slack (prctl).

Cheap enough for the forwarder's event loop (one bisect and two additions per timed
wake-up); its counts travel in the forwarder's stats and Prometheus metrics, and the
fidelity verdict (testbed.emu.fidelity) reads quantiles back from them.
"""

from __future__ import annotations

import bisect
import ctypes
import ctypes.util
import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)
PR_SET_TIMERSLACK = 29  # prctl(2); PR_GET_TIMERSLACK is 30

# Upper bounds (seconds) of the buckets; a last, unbounded bucket follows.
BOUNDS_S = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1)


@dataclass
class SlackHistogram:
    """Counts of wake-up lateness (s) per bucket of BOUNDS_S (+ one beyond), their sum
    and the largest seen."""

    counts: list[int] = field(default_factory=lambda: [0] * (len(BOUNDS_S) + 1))
    sum_s: float = 0.0
    max_s: float = 0.0

    def observe(self, late_s: float) -> None:
        late_s = max(0.0, late_s)  # early (EARLY_S) counts as on time
        self.counts[bisect.bisect_left(BOUNDS_S, late_s)] += 1
        self.sum_s += late_s
        if late_s > self.max_s:
            self.max_s = late_s

    def as_record(self) -> dict[str, Any]:
        """{"bounds_s", "counts", "sum_s", "max_s"}: what stats() and records carry."""
        return {"bounds_s": list(BOUNDS_S), "counts": list(self.counts),
                "sum_s": self.sum_s, "max_s": self.max_s}


def merge(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Several histograms' records (same bounds) as one."""
    counts = [0] * (len(BOUNDS_S) + 1)
    total, worst = 0.0, 0.0
    for r in records:
        if list(r.get("bounds_s", ())) != list(BOUNDS_S):
            raise ValueError("timer slack histograms with other bucket bounds")
        for i, c in enumerate(r["counts"]):
            counts[i] += int(c)
        total += float(r.get("sum_s", 0.0))
        worst = max(worst, float(r.get("max_s", 0.0)))
    return {"bounds_s": list(BOUNDS_S), "counts": counts, "sum_s": total, "max_s": worst}


def quantile_s(record: Mapping[str, Any], q: float) -> float | None:
    """The q-quantile (0..1) of a histogram record: the upper bound of the bucket it falls
    in (an over-estimate by at most one bucket; the beyond bucket gives max_s). None when
    empty."""
    counts = [int(c) for c in record["counts"]]
    n = sum(counts)
    if n == 0:
        return None
    rank = max(1, math.ceil(q * n))
    seen = 0
    bounds = list(record["bounds_s"])
    for i, c in enumerate(counts):
        seen += c
        if seen >= rank:
            return float(bounds[i]) if i < len(bounds) else float(record.get("max_s", math.inf))
    return float(record.get("max_s", math.inf))


def set_timer_slack_ns(ns: int) -> int:
    """This thread's timer slack (prctl PR_SET_TIMERSLACK; threads it starts inherit it);
    the slack in effect afterwards (-1 where prctl is not available)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        if libc.prctl(PR_SET_TIMERSLACK, ctypes.c_ulong(ns), 0, 0, 0) != 0:
            log.warning("timer slack not set: errno %d", ctypes.get_errno())
        return int(libc.prctl(PR_SET_TIMERSLACK + 1, 0, 0, 0, 0))  # PR_GET_TIMERSLACK
    except (OSError, AttributeError):
        return -1


def sleep_until(end_s: float) -> float:
    """Sleep until time.perf_counter() reaches end_s (a device stand-in's op deadline:
    workloads.compute.DeviceStandIn, testbed.emu.loadprobe); how late it woke (s)."""
    while (left := end_s - time.perf_counter()) > 0:
        time.sleep(left)
    return time.perf_counter() - end_s
