"""A stage's process group through network faults: time-outs, fail or retry (issue 58).

torch.distributed's semantics, as the workers use them (docs/workers.md, "Training
through faults"):

* **gloo** (these workers): the process group's time-out (`init_process_group(timeout=)`,
  ProcessGroupGloo's options) bounds every collective; a point-to-point op without its
  own bound waits the gloo context's time-out, the one the group was created with. The
  workers create the group with the long start-up time-out (every stage must have
  imported torch and met), then bound training by the collective time-out: collectives
  through the group's default time-out (`_set_pg_timeout`), each send/recv by
  `work.wait(timeout)`. A wait past it raises `RuntimeError: [...unbound_buffer.cc:78]
  Timed out waiting Nms for recv operation to complete` and gloo signals the error to
  every pair of the context, which closes their connections: the group is dead (the
  peers then see "Connection closed by peer"). Nothing in it can be retried.
* **NCCL** (for comparison; not run here, no GPUs): the same time-out; with
  `TORCH_NCCL_ASYNC_ERROR_HANDLING=1` (the default) the watchdog aborts the communicator
  and ends the process once an op passes it; with `TORCH_NCCL_BLOCKING_WAIT=1` `wait()`
  raises instead. Either way the communicator is aborted (`ncclCommAbort`) and a new one
  must be created: the same shape as gloo's.

So `on_fault: retry` is a restart of the group, as TorchElastic does for the whole
process: destroy the group, meet again through the job's TCPStore (a new key prefix per
attempt), agree on the first iteration not every stage finished, wait the stand-in
reload time (`restart_s`: a real job reloads its checkpoint; shadow workers have none),
and redo that iteration from its start. `fail` lets the error end the worker, whose
record keeps the error text (the launcher's failure reason names it).
"""

from __future__ import annotations

import logging
import os
import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

log = logging.getLogger(__name__)


def is_comm_error(exc: BaseException) -> bool:
    """An error of a collective, a send/recv or the store: what a network fault raises
    (gloo's time-out and closed pairs are RuntimeErrors, torch's DistError subclasses
    too; a store client's time-out is a DistStoreError)."""
    return isinstance(exc, RuntimeError | TimeoutError | ConnectionError)


def set_collective_timeout(timeout_s: float) -> bool:
    """Bound the default group's collectives by timeout_s from now on (ProcessGroupGloo's
    default time-out); False where this torch has no way to (they keep the group's)."""
    try:
        from torch.distributed.distributed_c10d import _set_pg_timeout
    except ImportError:  # pragma: no cover - torch < 2.3
        return False
    _set_pg_timeout(timedelta(seconds=timeout_s))
    return True


class StageGroup:
    """The job's default process group as one stage sees it: joined at start, and joined
    again after a fault (on_fault retry)."""

    def __init__(self, store: Any, rank: int, world: int, *, startup_timeout_s: float,
                 collective_timeout_s: float | None) -> None:
        self.store = store
        self.rank = rank
        self.world = world
        self.startup_timeout_s = startup_timeout_s
        self.collective_timeout_s = collective_timeout_s
        self.attempt = 0
        self.bounded = False  # training collectives bounded by the collective time-out

    def join(self) -> None:
        """Create the group (attempt's own keys in the store) with the start-up time-out:
        a stage may arrive late (start-up, or the far side of an outage)."""
        prefix = dist.PrefixStore(f"lightpipe-attempt{self.attempt}", self.store)
        dist.init_process_group("gloo", store=prefix, rank=self.rank, world_size=self.world,
                                timeout=timedelta(seconds=self.startup_timeout_s))

    def train(self) -> None:
        """From now on, collectives give up after the collective time-out."""
        if self.collective_timeout_s is not None:
            self.bounded = set_collective_timeout(self.collective_timeout_s)

    def describe(self) -> dict[str, Any]:
        """The start record's `collective` part."""
        t = self.collective_timeout_s
        return {"backend": "gloo", "timeout_ms": None if t is None else round(t * 1000),
                "startup_timeout_ms": round(self.startup_timeout_s * 1000),
                "collectives_bounded": self.bounded}

    def leave(self) -> None:
        """Destroy the group (after a fault: its pairs are closed already)."""
        try:
            dist.destroy_process_group()
        except Exception as exc:  # a dead group may complain; it is gone either way
            log.debug("stage %d: destroy_process_group: %s", self.rank, exc)

    def rejoin(self, it: int, started: bool, total: int) -> tuple[int, bool, int]:
        """After a fault in iteration `it` (`started`: its ops had begun here; `total`:
        the iterations this stage plans): leave, meet the other stages in a new group and
        agree where to go on. Returns (resume iteration: the lowest any stage is at,
        redo: some stage had begun it, total: the lowest plan, so that the stages agree
        on the go-on-until count too)."""
        self.leave()
        self.attempt += 1
        self.join()
        pos = torch.tensor([it, total], dtype=torch.int64)
        dist.all_reduce(pos, op=dist.ReduceOp.MIN)
        resume, total = int(pos[0]), int(pos[1])
        begun = torch.tensor([1 if it > resume or (it == resume and started) else 0],
                             dtype=torch.int64)
        dist.all_reduce(begun, op=dist.ReduceOp.MAX)
        self.train()
        return resume, bool(begun.item()), total


def tcp_segments(path: str = "/proc/self/net/snmp") -> list[int] | None:
    """[OutSegs, RetransSegs] of this process's network namespace (the emulated host's:
    the counters nstat reads there, TcpOutSegs and TcpRetransSegs), or None where they
    cannot be read. The worker puts them in its records, so that the fidelity verdict can
    leave a fault's window out of its retransmit bound (testbed.emu.fidelity)."""
    try:
        with open(path, encoding="ascii") as fh:
            tcp = [line.split() for line in fh if line.startswith("Tcp:")]
        names, values = tcp[0], tcp[1]
        return [int(values[names.index("OutSegs")]), int(values[names.index("RetransSegs")])]
    except (OSError, ValueError, IndexError):
        return None


def netns_id() -> str | None:
    """This process's network namespace as `machine:inode` (several stages of one host
    share its counters; inodes repeat across machines)."""
    try:
        return f"{os.uname().nodename}:{os.stat('/proc/self/ns/net').st_ino}"
    except OSError:
        return None


def wait_until(deadline_s: float) -> None:
    """Sleep until time.monotonic() reaches deadline_s."""
    while True:
        left = deadline_s - time.monotonic()
        if left <= 0:
            return
        time.sleep(min(left, 0.5))
