"""CPU isolation, as Mininet-HiFi isolates CPU: the emulated network and the CPU workers apart.

On a 2-core machine the user-space switch (one thread doing every bridge's forwarding,
in the real-time class) took 56 % of a core through a calib-bandwidth run whatever the
time factor or bandwidth divisor, and a CPU worker that woke on its core waited behind
it: ops 5-7 % long at factor 20. With the network's processes (ovs-vswitchd, the fibre
forwarders, the SDN controller) on one set of cores and the CPU workers on the others,
a worker competes only with ordinary processes there, which its scheduling puts behind
it (testbed.emu.priority.raise_worker_priority).

`LIGHTPIPE_CPU_ISOLATION`: `auto` (default) splits when the run has CPU workers on this
machine, at least 2 CPUs are allowed to it and the network runs as `realtime` or `nice`
(testbed.emu.priority.choice; `inherit`, the background emulations of `make test`, is
left as started, and so is a run started at a positive nice); `off` never does.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

ENV = "LIGHTPIPE_CPU_ISOLATION"
CHOICES = ("auto", "off")
# The run state's process roles that are the emulated network (testbed.emu.state).
NETWORK_ROLES = ("forwarder", "ovs-vswitchd", "controller")
MAX_CPUS = 4096


@dataclass(frozen=True)
class Split:
    """The cores of the network's processes and of the CPU workers (disjoint)."""

    network: tuple[int, ...]
    workers: tuple[int, ...]

    def as_record(self, pinned: int = 0) -> dict[str, Any]:
        return {"network_cpus": list(self.network), "worker_cpus": list(self.workers),
                "network_processes": pinned}


def cpu_list(text: str) -> tuple[int, ...]:
    """A `--cpus` argument (a worker's, the load probe's): comma-separated CPU numbers."""
    import argparse

    try:
        cpus = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of CPU numbers: {text[:40]!r}") from None
    if not cpus or any(not 0 <= c < MAX_CPUS for c in cpus):
        raise argparse.ArgumentTypeError(f"CPU numbers are 0..{MAX_CPUS - 1}: {text[:40]!r}")
    return cpus


def choice() -> str:
    """The configured choice; an unknown value is logged and read as `auto`."""
    raw = os.environ.get(ENV, "").strip().lower()
    if raw and raw not in CHOICES:
        log.warning("%s=%r is not one of %s: auto used", ENV, raw[:20], ", ".join(CHOICES))
        return "auto"
    return raw or "auto"


def split(cpus: Iterable[int]) -> Split | None:
    """The allowed CPUs split in two: the highest-numbered half (at least one) for the
    network, the rest for the workers; None with fewer than 2."""
    ordered = sorted(set(cpus))
    if len(ordered) < 2:
        return None
    k = max(1, len(ordered) // 2)
    return Split(network=tuple(ordered[-k:]), workers=tuple(ordered[:-k]))


def wanted(cpu_workers: bool) -> Split | None:
    """The split for a run (module docstring), or None when it is not to be made."""
    from testbed.emu import priority

    if not cpu_workers or choice() == "off" or priority.choice() == "inherit":
        return None
    if priority.in_background():  # a run in the background: left as it is
        return None
    return split(os.sched_getaffinity(0))


def pin(pid: int, cpus: Sequence[int]) -> bool:
    """Every thread of pid (0: the calling thread only) on `cpus` (threads it starts
    later inherit it); whether any was. A thread that ends meanwhile is skipped."""
    from testbed.emu.priority import thread_ids

    try:
        tids = thread_ids(pid)
    except OSError:
        return False
    done = False
    for tid in tids:
        with contextlib.suppress(OSError):
            os.sched_setaffinity(tid, set(cpus))
            done = True
    return done


def isolate_network(state: Any, cpus: Sequence[int]) -> int:
    """Pin the run's network processes (the run state's records of NETWORK_ROLES, each
    checked to be the process recorded: PID and start time) on `cpus`; how many."""
    from testbed.emu.state import alive

    n = 0
    for rec in list(getattr(state, "procs", ()) or ()):
        if rec.role in NETWORK_ROLES and alive(rec) and pin(rec.pid, cpus):
            n += 1
    return n
