"""How the emulated network's own processes (fibre forwarders, ovs-vswitchd, the SDN
controller) are scheduled; the controller's heavy work leaves the real-time class.

`LIGHTPIPE_EMU_PRIORITY`:
  realtime  (default) SCHED_RR, falling back to nice -10 where that is refused: on a busy
            machine the network elements should not queue behind the workload;
  nice      nice -10, no real-time class (`LIGHTPIPE_FORWARDER_RT=0` says the same);
  inherit   left as started: an emulation that times nothing, run in the background
            beside one that does (`make test`'s root lane, at nice 5), must not take
            the CPU from the measured one.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from typing import Any

log = logging.getLogger(__name__)

ENV = "LIGHTPIPE_EMU_PRIORITY"
CHOICES = ("realtime", "nice", "inherit")
NICE = -10
"""The nice value of the `nice` choice (and of `realtime` where SCHED_RR is refused)."""


def choice() -> str:
    """The configured choice; an unknown value is logged and read as the default."""
    raw = os.environ.get(ENV, "").strip().lower()
    if not raw:
        return "nice" if os.environ.get("LIGHTPIPE_FORWARDER_RT", "1") == "0" else "realtime"
    if raw not in CHOICES:
        log.warning("%s=%r is not one of %s: realtime used", ENV, raw, ", ".join(CHOICES))
        return "realtime"
    return raw


def raise_priority(pid: int, rt_priority: int) -> str:
    """Schedule every thread of process pid (0: the calling thread only; threads it starts
    later inherit it) as choice() says; what it got ('realtime', 'nice' or 'inherit')."""
    how = choice()
    if how == "inherit":
        return how
    if how == "realtime" and _round_robin(pid, rt_priority):
        return how
    _renice(pid, NICE)
    return "nice"


DEVICE_RT_PRIORITY = 2
"""A stand-in accelerator's SCHED_RR priority: under the controller's, switch's and
forwarders'; it sleeps through its ops, so it cannot starve ordinary processes."""
WORKER_NICE = -5
"""A shadow CPU worker's nice: ahead of the machine's ordinary processes (nice 0), behind
the network's fallback (NICE) and its real-time class."""
WORKER_SLICE_NS = 100_000
"""The scheduler slice a CPU worker asks for (EEVDF's per-task slice, Linux >= 6.12): a
task with a short slice preempts a running one when it wakes, instead of waiting for
that one's slice (0.75-3 ms) to end."""
_SCHED_ATTR = "IIQiIQQQ"  # size policy flags nice priority runtime deadline period (v1)
_SCHED_SETATTR = {"x86_64": 314, "aarch64": 274}
_SCHED_GETATTR = {"x86_64": 315, "aarch64": 275}


def in_background() -> bool:
    """Whether this process was started at a positive nice (run in the background, as
    `make test`'s parallel lane at nice 10): its workers are then left as started and
    no CPUs are set apart for it (testbed.emu.cpuset)."""
    return os.getpriority(os.PRIO_PROCESS, 0) > 0


def raise_worker_priority(compute: str) -> dict[str, Any]:
    """The calling thread (a shadow worker before it starts any other thread: those
    inherit it), as choice() says: a stand-in accelerator (compute device) in the
    real-time class at DEVICE_RT_PRIORITY, like the rest of the emulated hardware; a CPU
    worker (compute cpu) in the ordinary class at WORKER_NICE with a WORKER_SLICE_NS slice
    where the kernel takes one, so that its wake-ups at chunk and op deadlines come on
    time beside other processes (a CPU worker beside a spinning process, op overrun mean:
    2.3 ms at nice 0, 0.13-0.15 ms at nice -10 or a 100 us slice; docs/workers.md). Its
    duty bounds the CPU it takes, so it cannot starve them. `inherit`, or a CPU worker
    started at a positive nice (run in the background), is left as started. What it
    got: {"priority": ..., "nice", "slice_us" (None: not taken)}."""
    how = choice()
    if compute == "device":
        return {"priority": raise_priority(0, DEVICE_RT_PRIORITY)}
    if how == "inherit":
        return {"priority": "inherit"}
    started = os.getpriority(os.PRIO_PROCESS, 0)
    if in_background():  # ahead of nothing, or it would take the CPU from what its
        # caller put ahead of it
        return {"priority": "inherit", "nice": started, "slice_us": None}
    nice = min(started, WORKER_NICE)
    got = _fair_slice(nice, WORKER_SLICE_NS)
    if got is None:  # no sched_setattr here: the nice value alone
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, 0, nice)
    return {"priority": "nice", "nice": os.getpriority(os.PRIO_PROCESS, 0),
            "slice_us": None if not got else got / 1000}


def _fair_slice(nice: int, slice_ns: int) -> int | None:
    """sched_setattr(2) on the calling thread: SCHED_OTHER at `nice` asking for a slice of
    slice_ns; the slice the kernel then reports (0: it took the nice but keeps no slice
    of a task's own, before Linux 6.12), None where the call is unknown or refused."""
    import ctypes
    import struct

    machine = os.uname().machine
    if machine not in _SCHED_SETATTR:
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    size = struct.calcsize(_SCHED_ATTR)
    attr = ctypes.create_string_buffer(struct.pack(_SCHED_ATTR, size, 0, 0, nice, 0,
                                                   slice_ns, 0, 0), size)
    if libc.syscall(_SCHED_SETATTR[machine], 0, attr, 0) != 0:
        return None
    back = ctypes.create_string_buffer(size)
    if libc.syscall(_SCHED_GETATTR[machine], 0, back, size, 0) != 0:
        return 0
    runtime = struct.unpack(_SCHED_ATTR, back.raw)[5]
    return int(runtime) if runtime == slice_ns else 0


def thread_ids(pid: int) -> list[int]:
    """The threads of process pid, by ID, for the calls that name one thread (sched_*,
    setpriority); pid 0 is the calling thread alone. OSError where the process is gone."""
    return [0] if pid == 0 else [int(t) for t in os.listdir(f"/proc/{pid}/task")]


def _round_robin(pid: int, rt_priority: int) -> bool:
    """SCHED_RR at rt_priority for every thread of pid (0: the calling thread); whether
    it was allowed. A thread that ends meanwhile is skipped."""
    try:
        for tid in thread_ids(pid):
            with contextlib.suppress(ProcessLookupError):
                os.sched_setscheduler(tid, os.SCHED_RR, os.sched_param(rt_priority))
        return True
    except (OSError, AttributeError):
        return False


def raise_control_priority(pid: int) -> str:
    """The run's SDN controller, as control_choice() says, on every thread of pid (threads
    it starts later inherit it):
      realtime  SCHED_RR at CONTROL_RT_PRIORITY, below the switch (5) and the forwarders
                (10), above every ordinary process: a lightpath set-up hands its work
                between 6-10 of the controller's threads (REST loop, request thread,
                each switch's sender and receiver), and with a busy core each hand-over
                could wait for that core's current slice. Its heavy work (a placement's
                ILP, a routing policy's search) leaves the class for its duration
                (`compute_thread`), so it cannot hold a core from the workload;
      nice      nice NICE (mostly idle, it then gets the CPU when it has work: in a
                software-emulated VM, eight busy workers starved it until its REST API
                answered no request within a minute);
      inherit   left as started.
    What it got ('realtime', 'nice' or 'inherit')."""
    how = control_choice()
    if how == "inherit":
        return "inherit"
    _renice(pid, NICE)  # under realtime: what its compute threads run at
    if how == "realtime" and _round_robin(pid, CONTROL_RT_PRIORITY):
        return "realtime"
    return "nice"


CONTROL_ENV = "LIGHTPIPE_CONTROL_PRIORITY"
CONTROL_CHOICES = ("realtime", "nice", "inherit")
CONTROL_RT_PRIORITY = 2
"""The controller's SCHED_RR priority: under ovs-vswitchd's (5) and the forwarders' (10)."""


def control_choice() -> str:
    """The controller's: `LIGHTPIPE_CONTROL_PRIORITY` (realtime|nice|inherit), else the
    network's choice(). (`make test`'s serial lane sets inherit: its controllers at nice
    -10 would take more of the CPU from the root lane's networks at nice 5.)"""
    raw = os.environ.get(CONTROL_ENV, "").strip().lower()
    if raw in CONTROL_CHOICES:
        return raw
    if raw:
        log.warning("%s=%r is not one of %s: ignored", CONTROL_ENV, raw,
                    ", ".join(CONTROL_CHOICES))
    return choice()


@contextlib.contextmanager
def compute_thread() -> Iterator[None]:
    """Run the body (CPU-heavy work: an ILP, a search) in the ordinary class: a thread in
    SCHED_RR leaves it for the body's duration (at its nice value, set for every thread
    by raise_control_priority) and returns after; threads the body starts inherit the
    ordinary class. A thread already in the ordinary class is left alone."""
    try:
        was, param = os.sched_getscheduler(0), os.sched_getparam(0)
        leave = was in (os.SCHED_RR, os.SCHED_FIFO)
        if leave:
            os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
    except (OSError, AttributeError):
        leave = False
    try:
        yield
    finally:
        if leave:
            with contextlib.suppress(OSError):
                os.sched_setscheduler(0, was, param)


def _renice(pid: int, nice: int) -> None:
    """setpriority on every thread of pid (Linux's PRIO_PROCESS names one thread)."""
    try:
        tids = thread_ids(pid)
    except OSError:
        tids = [pid]
    for tid in tids:
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, tid, nice)
