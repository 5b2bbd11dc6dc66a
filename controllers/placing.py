"""Bounded job placements: a time limit and a concurrency limit around POST /jobs planning.

`JobService.place` plans a job on a snapshot of the cluster outside the core's lock and
commits the result under it (controllers/jobs.py). `PlaceRunner.run` bounds that work:

* at most `max_concurrent` placements compute at once (a semaphore, never waited on):
  one more gets 503 `busy` at once, so slow requests cannot pile up threads;
* the request waits at most `timeout_s` for its placement, then gets 503 `timeout`;
  the placement is marked cancelled under the core's lock, so its late result is
  discarded (never committed). A placement that already committed under the lock when
  the limit passed is answered normally (committed is committed).

The planning runs in its own daemon thread, which holds its concurrency slot until it
ends, even after a time-out: an abandoned computation still counts against the limit.

Settings: `LIGHTPIPE_CTL_PLACE_TIMEOUT_S` (default 20 s), `LIGHTPIPE_CTL_MAX_PLACEMENTS`
(default 4), read by the controller app (`PlaceLimits.from_env`); `lightpipe controller
--place-timeout-s/--max-placements` set them.
"""

from __future__ import annotations

import itertools
import logging
import math
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from controllers.errors import RequestError
from controllers.metrics import ControllerMetrics

log = logging.getLogger("lightpipe.controller.jobs")

ENV_TIMEOUT = "LIGHTPIPE_CTL_PLACE_TIMEOUT_S"
ENV_MAX = "LIGHTPIPE_CTL_MAX_PLACEMENTS"
DEFAULT_TIMEOUT_S = 20.0
DEFAULT_MAX_CONCURRENT = 4
MAX_TIMEOUT_S = 24 * 3600.0
MAX_CONCURRENT = 64
# Plans on a fresh snapshot after the state changed under the previous one, then 409.
DEFAULT_ATTEMPTS = 3


@dataclass(frozen=True)
class PlaceLimits:
    """How long one POST /jobs may compute, how many may compute at once, how many
    times a placement is planned again after a conflicting change."""

    timeout_s: float = DEFAULT_TIMEOUT_S
    max_concurrent: int = DEFAULT_MAX_CONCURRENT
    attempts: int = DEFAULT_ATTEMPTS

    def __post_init__(self) -> None:
        if not (math.isfinite(self.timeout_s) and 0 < self.timeout_s <= MAX_TIMEOUT_S):
            raise ValueError(f"place timeout_s must be in (0, {MAX_TIMEOUT_S:g}] s, got "
                             f"{self.timeout_s!r}")
        if not 1 <= self.max_concurrent <= MAX_CONCURRENT:
            raise ValueError(f"max_concurrent placements must be 1..{MAX_CONCURRENT}, got "
                             f"{self.max_concurrent!r}")
        if not 1 <= self.attempts <= 100:
            raise ValueError(f"place attempts must be 1..100, got {self.attempts!r}")

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> PlaceLimits:
        """The limits from LIGHTPIPE_CTL_PLACE_TIMEOUT_S / LIGHTPIPE_CTL_MAX_PLACEMENTS
        (defaults where unset or empty); ValueError naming the variable if bad."""
        timeout_s, max_conc = DEFAULT_TIMEOUT_S, DEFAULT_MAX_CONCURRENT
        raw = env.get(ENV_TIMEOUT, "").strip()
        if raw:
            try:
                timeout_s = float(raw)
            except ValueError:
                raise ValueError(f"{ENV_TIMEOUT}: {raw[:40]!r} is not a number of seconds") \
                    from None
        raw_n = env.get(ENV_MAX, "").strip()
        if raw_n:
            if not raw_n.isdigit() or len(raw_n) > 3:
                raise ValueError(f"{ENV_MAX}: {raw_n[:40]!r} is not a whole number 1.."
                                 f"{MAX_CONCURRENT}")
            max_conc = int(raw_n)
        try:
            return cls(timeout_s, max_conc)
        except ValueError as exc:
            name = ENV_TIMEOUT if "timeout" in str(exc) else ENV_MAX
            raise ValueError(f"{name}: {exc}") from None


def place_limits_env(env: Mapping[str, str], timeout_s: float | None = None,
                     max_placements: int | None = None) -> dict[str, str]:
    """The controller's environment entries for the command-line options (--place-
    timeout-s, --max-placements; None: keep the environment's); ValueError naming the
    option, or the variable, that is out of range."""
    out = {ENV_TIMEOUT: env.get(ENV_TIMEOUT, ""), ENV_MAX: env.get(ENV_MAX, "")}
    for flag, name, value in (("--place-timeout-s", ENV_TIMEOUT, timeout_s),
                              ("--max-placements", ENV_MAX, max_placements)):
        if value is None:
            continue
        try:
            PlaceLimits(**{"timeout_s" if name == ENV_TIMEOUT else "max_concurrent": value})
        except ValueError as exc:
            raise ValueError(f"{flag}: {exc}") from None
        out[name] = repr(float(value)) if name == ENV_TIMEOUT else str(int(value))
    PlaceLimits.from_env(out)
    return {k: v for k, v in out.items() if v}


class Cancelled(Exception):
    """The request gave up on this placement (time limit): nothing may be committed."""


@dataclass
class Ticket:
    """One POST /jobs placement as its request and its planning thread share it.

    `cancelled` and `final` change only under the core's lock: the planning thread
    commits (or refuses) only if not cancelled and then sets `final`; the request thread
    cancels only if not final. So a result is either committed and answered, or
    discarded and answered 503, never both.
    """

    deadline: float  # time.monotonic() by which the request answers
    done: threading.Event = field(default_factory=threading.Event)
    result: dict[str, Any] | None = None
    error: BaseException | None = None
    cancelled: bool = False
    final: bool = False

    def remaining_s(self) -> float:
        return self.deadline - time.monotonic()

    def check(self) -> None:
        """Raise Cancelled if the request gave up (call under the core's lock)."""
        if self.cancelled:
            raise Cancelled


class PlaceRunner:
    """Runs placements in their own threads under PlaceLimits (503 busy / timeout)."""

    def __init__(self, limits: PlaceLimits, lock: threading.RLock,
                 metrics: ControllerMetrics) -> None:
        self.limits = limits
        self.lock = lock
        self.metrics = metrics
        self._slots = threading.BoundedSemaphore(limits.max_concurrent)
        self._ids = itertools.count(1)

    def run(self, work: Callable[[Ticket], dict[str, Any]]) -> dict[str, Any]:
        """work(ticket) in a thread of its own; its result or error, or RequestError 503
        when the limits say no. `work` must take the lock, call ticket.check() and set
        ticket.final before it commits or refuses."""
        lim = self.limits
        if not self._slots.acquire(blocking=False):
            self.metrics.job_unavailable.labels(reason="busy").inc()
            raise RequestError(503, f"busy: {lim.max_concurrent} job placements are "
                               f"computing (the limit, {ENV_MAX}); try again later",
                               reason="busy")
        ticket = Ticket(deadline=time.monotonic() + lim.timeout_s)
        try:
            thread = threading.Thread(target=self._work, args=(work, ticket), daemon=True,
                                      name=f"lightpipe-place-{next(self._ids)}")
            thread.start()
        except BaseException:
            self._slots.release()
            raise
        if not ticket.done.wait(max(0.0, ticket.remaining_s())):
            with self.lock:
                if not ticket.final:
                    ticket.cancelled = True
            if ticket.cancelled:
                self.metrics.job_unavailable.labels(reason="timeout").inc()
                log.warning("job placement over the %g s limit: answered 503, its result "
                            "will be discarded", lim.timeout_s)
                raise RequestError(503, f"placement not done within the limit of "
                                   f"{lim.timeout_s:g} s ({ENV_TIMEOUT}); nothing was placed",
                                   reason="timeout")
            ticket.done.wait()  # it decided under the lock just before: its answer stands
        if ticket.error is not None:
            raise ticket.error
        assert ticket.result is not None
        return ticket.result

    def _work(self, work: Callable[[Ticket], dict[str, Any]], ticket: Ticket) -> None:
        from testbed.emu.priority import compute_thread

        try:
            with compute_thread():  # an ILP may take seconds of CPU: not in SCHED_RR
                ticket.result = work(ticket)
        except Cancelled:
            log.info("a cancelled job placement ended; its result was discarded")
        except BaseException as exc:  # handed to the request thread
            ticket.error = exc
        finally:
            self._slots.release()
            ticket.done.set()
