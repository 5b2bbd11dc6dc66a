"""CPU a run's own processes got, by PID: /proc/PID/stat and each thread's schedstat.

Only processes the run started and recorded (its state's forwarders and switch daemon,
its launcher's workers) are read, each checked against its start time so that a reused
PID is never read as the run's; nothing is looked up by name. Per process:

* cpu_s: utime + stime (/proc/PID/stat, every thread);
* run_s / wait_s: time on a CPU and time runnable but waiting for one, summed over its
  threads (/proc/PID/task/TID/schedstat; needs CONFIG_SCHED_INFO, which every
  distribution kernel has);
* cpu_share = run / (run + wait): of the time it wanted a CPU, the share it had one;
* slices: how many times it was put on a CPU (schedstat's third field), so that
  wait_s / slices is its mean scheduling delay: how long, on average, it waited for a CPU
  each time it became runnable (a woken forwarder's frames wait that long);
* load = cpu_s / wall_s: how much of one core it used;
* worst_wait_per_slice_ms: the largest wait per wake-up over windows of the sampler's
  readings holding at least MIN_WINDOW_SLICES slices (worst_window).

`ProcSampler` reads them every interval_s from a thread while the run lasts (a worker's
last values are its last sample before it exits) and keeps the readings, so that a
process can be judged over a window of its life (a worker from its rendezvous to its
last iteration, without its start-up's imports).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

MAX_READINGS = 4096  # per process; past it every other reading is dropped (thinned)
# A window of readings is judged for its wait per wake-up once it holds this many time
# slices (consecutive readings are merged until it does): fewer are a few wake-ups' noise.
MIN_WINDOW_SLICES = 100

# One thread's schedstat: (run s, wait s, time slices).
Sched = tuple[float, float, int]

CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True)
class ProcTimes:
    """One reading of one process."""

    start_ticks: int
    cpu_s: float
    run_s: float
    wait_s: float
    at_s: float  # time.monotonic() of the reading
    # per thread (TID): (run s, wait s, slices); a thread's figures leave /proc with it
    threads: dict[int, Sched] = field(default_factory=dict, compare=False)
    slices: int = 0


def parse_stat(text: str) -> tuple[int, float, str]:
    """(start time in ticks, utime + stime in s, state letter) of a /proc/PID/stat line
    (the command name, field 2, may hold spaces and parentheses: fields count from the
    last ')')."""
    rest = text.rsplit(")", 1)[1].split()
    return int(rest[19]), (int(rest[11]) + int(rest[12])) / CLK_TCK, rest[0]


def parse_schedstat(text: str) -> Sched:
    """(run s, wait s, slices) of a schedstat line: run ns, wait ns, time slices."""
    run_ns, wait_ns, slices = text.split()[:3]
    return int(run_ns) / 1e9, int(wait_ns) / 1e9, int(slices)


def read_times(pid: int, start_ticks: int | None = None) -> ProcTimes | None:
    """The process's times now; None when it is gone (a zombie too: its threads' counters
    are gone) or is no longer the process that started at start_ticks."""
    try:
        ticks, cpu_s, state = parse_stat(Path(f"/proc/{pid}/stat").read_text())
        if (start_ticks is not None and ticks != start_ticks) or state in ("Z", "X"):
            return None
        threads: dict[int, Sched] = {}
        for task in os.scandir(f"/proc/{pid}/task"):
            try:
                threads[int(task.name)] = parse_schedstat(
                    Path(task.path, "schedstat").read_text())
            except (OSError, ValueError):
                continue  # a thread that just exited
    except (OSError, ValueError, IndexError):
        return None
    return ProcTimes(ticks, cpu_s, sum(t[0] for t in threads.values()),
                     sum(t[1] for t in threads.values()), time.monotonic(), threads,
                     sum(t[2] for t in threads.values()))


def carried(before: dict[int, Sched], now: ProcTimes
            ) -> tuple[ProcTimes, dict[int, Sched]]:
    """`now` with the run and wait of threads that exited since `before` (their last
    figures) kept in its sums, so that they never go down between readings (a thread's
    schedstat goes with it: a worker's run time fell by a gloo thread's when it exited),
    and every thread's figures so far. The reading keeps only the sums (a process keeps
    up to MAX_READINGS of them)."""
    seen = {**before, **now.threads}
    return replace(now, run_s=sum(t[0] for t in seen.values()),
                   wait_s=sum(t[1] for t in seen.values()),
                   slices=sum(t[2] for t in seen.values()), threads={}), seen


def usage(first: ProcTimes, last: ProcTimes) -> dict[str, float | None]:
    """What the process used between two readings."""
    wall = last.at_s - first.at_s
    run = last.run_s - first.run_s
    wait = last.wait_s - first.wait_s
    cpu = last.cpu_s - first.cpu_s
    slices = last.slices - first.slices
    return {"wall_s": round(wall, 3), "cpu_s": round(cpu, 3), "run_s": round(run, 4),
            "wait_s": round(wait, 4),
            "cpu_share": round(run / (run + wait), 4) if run + wait > 0 else None,
            "load": round(cpu / wall, 4) if wall > 0 else None, "slices": slices,
            "wait_per_slice_ms": round(1000 * wait / slices, 4) if slices > 0 else None}


def worst_window(readings: list[ProcTimes]) -> tuple[float, int] | None:
    """The largest mean wait per wake-up (ms) over windows of consecutive readings, each
    merged until it holds MIN_WINDOW_SLICES time slices, and that window's slices; None
    when no window holds that many. A starved episode of a second shows in it, where the
    run's mean would spread it over every other wake-up."""
    worst: tuple[float, int] | None = None
    start = readings[0] if readings else None
    for r in readings[1:]:
        assert start is not None
        slices = r.slices - start.slices
        if slices < MIN_WINDOW_SLICES:
            continue
        got = (1000 * (r.wait_s - start.wait_s) / slices, slices)
        worst = got if worst is None or got > worst else worst
        start = r
    return worst


def own_usage_since(before: ProcTimes | None
                    ) -> tuple[ProcTimes | None, dict[str, float | None]]:
    """This process's reading now, and what it used since `before` (an earlier reading of
    it, threads kept), without a sampler's granularity: a worker reads itself when its
    iterations start and when they end. A thread that exited in between counts for
    nothing (its figures left with it), so the run and wait times are lower bounds that
    never go down."""
    now = read_times(os.getpid())
    if now is None or before is None:
        return now, {}
    zero: Sched = (0.0, 0.0, 0)
    run = sum(t[0] - before.threads.get(tid, zero)[0] for tid, t in now.threads.items())
    wait = sum(t[1] - before.threads.get(tid, zero)[1] for tid, t in now.threads.items())
    slices = sum(t[2] - before.threads.get(tid, zero)[2] for tid, t in now.threads.items())
    first = replace(before, run_s=0.0, wait_s=0.0, slices=0, threads={})
    last = replace(now, run_s=run, wait_s=wait, slices=slices, threads={})
    return now, usage(first, last)


class ProcSampler:
    """Reads the watched processes every interval_s (a daemon thread); records() says
    what each used since it was first read."""

    def __init__(self, interval_s: float = 0.5) -> None:
        self.interval_s = interval_s
        self._procs: dict[int, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def watch(self, pid: int, role: str, name: str = "",
              start_ticks: int | None = None, **meta: Any) -> None:
        """Read `pid` from now on (start_ticks: its identity; default: read now); `meta`
        is kept with it (e.g. where a worker writes its records)."""
        first = read_times(pid, start_ticks)
        if first is None:
            log.debug("process %d (%s %s) is gone: not watched", pid, role, name)
            return
        with self._lock:
            threads = first.threads
            first = replace(first, threads={})
            self._procs[pid] = {"pid": pid, "role": role, "name": name, "meta": meta,
                                "first": first, "readings": [first], "threads": threads}

    def start(self) -> ProcSampler:
        self._thread = threading.Thread(target=self._loop, name="procstat", daemon=True)
        self._thread.start()
        return self

    def sample(self) -> None:
        with self._lock:
            procs = list(self._procs.values())
        for p in procs:
            if p.get("gone"):
                continue
            now = read_times(p["pid"], p["first"].start_ticks)
            if now is None:
                p["gone"] = True
                continue
            now, p["threads"] = carried(p["threads"], now)
            got = p["readings"]
            got.append(now)
            if len(got) > MAX_READINGS:
                p["readings"] = [*got[:-1:2], now]

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def stop(self) -> None:
        """A last reading, then the thread ends."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        self.sample()

    def watched(self) -> list[dict[str, Any]]:
        """pid, role, name and meta of every watched process."""
        with self._lock:
            return [{k: p[k] for k in ("pid", "role", "name", "meta")}
                    for p in self._procs.values()]

    def records(self, windows: dict[int, tuple[float | None, float | None]] | None = None
                ) -> list[dict[str, Any]]:
        """Per watched process: pid, role, name and usage() since it was first read, or
        over its window (pid -> (from, to), time.monotonic() seconds; None: open): the
        smallest span of readings that holds it (a reading apart at most either side)."""
        with self._lock:
            procs = [(p, list(p["readings"])) for p in self._procs.values()]
        out = []
        for p, got in procs:
            t0, t1 = (windows or {}).get(p["pid"], (None, None))
            first = max((r for r in got if t0 is not None and r.at_s <= t0),
                        key=lambda r: r.at_s, default=got[0])
            last = min((r for r in got if t1 is not None and r.at_s >= t1),
                       key=lambda r: r.at_s, default=got[-1])
            if last.at_s <= first.at_s:  # (a window after the last reading)
                first, last = got[0], got[-1]
            rec = {"pid": p["pid"], "role": p["role"], "name": p["name"],
                   **usage(first, last)}
            worst = worst_window([r for r in got if first.at_s <= r.at_s <= last.at_s])
            if worst is not None:
                rec["worst_wait_per_slice_ms"] = round(worst[0], 4)
                rec["worst_window_slices"] = worst[1]
            if (first, last) != (got[0], got[-1]):
                rec["window_s"] = [round(first.at_s, 3), round(last.at_s, 3)]
            out.append(rec)
        return out
