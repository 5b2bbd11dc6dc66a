"""How the emulated network's own processes (fibre forwarders, ovs-vswitchd, the SDN
controller) are scheduled.

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
    if how == "realtime":
        try:
            tids = [0] if pid == 0 else [int(t) for t in os.listdir(f"/proc/{pid}/task")]
            for tid in tids:
                os.sched_setscheduler(tid, os.SCHED_RR, os.sched_param(rt_priority))
            return how
        except (OSError, AttributeError):
            pass
    _renice(pid, NICE)
    return "nice"


def raise_control_priority(pid: int) -> str:
    """The run's SDN controller: nice NICE for every thread of pid (threads it starts later
    inherit it) unless choice() is `inherit`; never the real-time class (a placement's ILP
    may take seconds of CPU). Mostly idle, it then gets the CPU when it has work: in a
    software-emulated VM, eight busy workers starved it until its REST API answered no
    request within a minute and a fibre cut waited for it. What it got ('nice' or
    'inherit')."""
    if control_choice() == "inherit":
        return "inherit"
    _renice(pid, NICE)
    return "nice"


CONTROL_ENV = "LIGHTPIPE_CONTROL_PRIORITY"


def control_choice() -> str:
    """The controller's: `LIGHTPIPE_CONTROL_PRIORITY` (nice|inherit), else `inherit` where
    choice() is, else `nice`. (`make test`'s serial lane sets inherit: its controllers at
    nice -10 would take more of the CPU from the root lane's networks at nice 5.)"""
    raw = os.environ.get(CONTROL_ENV, "").strip().lower()
    if raw in ("nice", "inherit"):
        return raw
    if raw:
        log.warning("%s=%r is not one of nice, inherit: ignored", CONTROL_ENV, raw)
    return "inherit" if choice() == "inherit" else "nice"


def _renice(pid: int, nice: int) -> None:
    """setpriority on every thread of pid (Linux's PRIO_PROCESS names one thread)."""
    try:
        tids = [pid] if pid == 0 else [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        tids = [pid]
    for tid in tids:
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, tid, nice)
