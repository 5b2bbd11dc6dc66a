"""Readiness for tests: poll a condition until it holds, under a generous, scalable deadline."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TypeVar

import pytest

T = TypeVar("T")

SCALE_ENV = "LIGHTPIPE_TEST_TIME_SCALE"
DEFAULT_TIMEOUT_S = 60.0


def time_scale() -> float:
    """The factor every test deadline is multiplied by: LIGHTPIPE_TEST_TIME_SCALE if set,
    else how much slower than the reference machine this one runs Python
    (testbed.envprobe.machine_slowness, >= 1; LIGHTPIPE_TIMEOUT_SCALE overrides it).

    A slower or busier machine (CI under load, a VM under software emulation) gets longer
    deadlines instead of edited tests; a deadline only stops a broken run from hanging."""
    raw = os.environ.get(SCALE_ENV)
    if raw is None:
        from testbed import envprobe

        return max(1.0, envprobe.machine_slowness())
    try:
        scale = float(raw)
    except ValueError:
        raise ValueError(f"{SCALE_ENV}: expected a number, got {raw!r}") from None
    if not scale > 0 or scale == float("inf"):
        raise ValueError(f"{SCALE_ENV}: must be a positive finite number, got {raw!r}")
    return scale


def scaled(seconds: float) -> float:
    """A deadline in seconds, scaled by time_scale()."""
    return seconds * time_scale()


def wait_until(predicate: Callable[[], T], what: str, timeout_s: float = DEFAULT_TIMEOUT_S,
               interval_s: float = 0.05, alive: Callable[[], str | None] | None = None) -> T:
    """Poll predicate() until it returns something truthy and return that.

    `what` names the awaited condition in the failure. `alive`, when given, is asked each
    round and returns a reason (e.g. "the process exited: ...") when waiting is pointless.
    The deadline (timeout_s, scaled) is against a hang only: no test checks wall time."""
    deadline = time.monotonic() + scaled(timeout_s)
    while True:
        got = predicate()
        if got:
            return got
        if alive is not None:
            why = alive()
            if why:
                pytest.fail(f"gave up waiting for {what}: {why}")
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {scaled(timeout_s):.0f} s waiting for {what}")
        time.sleep(interval_s)
