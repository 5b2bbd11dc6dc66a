"""The machine's CPU load over a run (/proc/stat, /proc/loadavg): busy, steal, load."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class CpuTimes:
    """Aggregate CPU jiffies from /proc/stat's `cpu` line."""

    busy: int
    idle: int
    steal: int

    @property
    def total(self) -> int:
        return self.busy + self.idle + self.steal


def parse_proc_stat(text: str) -> CpuTimes:
    """The `cpu` line: user nice system idle iowait irq softirq steal [guest guest_nice]
    (guest time is already inside user/nice, so it is not added again)."""
    for line in text.splitlines():
        parts = line.split()
        if parts and parts[0] == "cpu":
            v = [int(x) for x in parts[1:9]] + [0] * max(0, 9 - len(parts))
            user, nice, system, idle, iowait, irq, softirq, steal = v[:8]
            return CpuTimes(user + nice + system + irq + softirq, idle + iowait, steal)
    raise ValueError("no 'cpu' line in /proc/stat")


def read_cpu_times() -> CpuTimes | None:
    try:
        with open("/proc/stat") as f:
            return parse_proc_stat(f.read())
    except (OSError, ValueError):
        return None


def idle_cores(first: CpuTimes, last: CpuTimes, cores: int) -> float | None:
    """How many cores' worth of time was idle between two readings (steal is not idle:
    the hypervisor had it); None when no time passed between them."""
    d_total = last.total - first.total
    if d_total <= 0:
        return None
    return cores * max(0, last.idle - first.idle) / d_total


def free_cores(window_s: float = 0.5, cores: int | None = None) -> float | None:
    """The cores this machine has free now: its idle time over the next window_s, in
    cores (a process spinning on one of 2 cores leaves about 1.0); None where /proc/stat
    cannot be read."""
    first = read_cpu_times()
    time.sleep(window_s)
    last = read_cpu_times()
    if first is None or last is None:
        return None
    return idle_cores(first, last, cores or os.cpu_count() or 1)


def read_load1() -> float | None:
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


@dataclass
class HostLoad:
    """Samples over a run: call start(), tick() now and then, and summary() at the end."""

    cores: int = field(default_factory=lambda: os.cpu_count() or 1)
    min_interval_s: float = 1.0
    _first: CpuTimes | None = None
    _last_tick: float = 0.0
    _load1: list[float] = field(default_factory=list)

    def start(self) -> None:
        self._first = read_cpu_times()
        self._last_tick = 0.0
        self._load1.clear()
        self.tick()

    def tick(self) -> None:
        now = time.monotonic()
        if now - self._last_tick < self.min_interval_s:
            return
        self._last_tick = now
        load = read_load1()
        if load is not None:
            self._load1.append(load)

    def summary(self) -> dict[str, Any]:
        """busy/steal shares of all cores' time since start(), load average per core."""
        out: dict[str, Any] = {"cores": self.cores}
        end = read_cpu_times()
        if self._first is not None and end is not None:
            d_total = end.total - self._first.total
            if d_total > 0:
                out["busy_frac"] = round((end.busy - self._first.busy) / d_total, 4)
                out["steal_frac"] = round((end.steal - self._first.steal) / d_total, 4)
        if self._load1:
            out["load1_max"] = round(max(self._load1), 2)
            out["load1_mean"] = round(sum(self._load1) / len(self._load1), 2)
            out["load1_per_core_max"] = round(max(self._load1) / self.cores, 3)
        return out
