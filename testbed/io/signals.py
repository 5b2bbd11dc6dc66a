"""Wait in the main thread until SIGINT or SIGTERM ends the wait (a held run's end)."""

from __future__ import annotations

import signal
import time
from typing import NoReturn

POLL_S = 0.5


def until_signalled(poll_s: float = POLL_S) -> NoReturn:
    """Block until a signal's Python handler raises (KeyboardInterrupt for SIGINT, or what
    the caller's SIGTERM handler raises); never returns otherwise.

    Not signal.pause(): it waits for a signal delivered to this thread, after the call.
    A signal the kernel gave another thread (one a library had blocked here), or one that
    came between the last check and the call, left it waiting for ever: a held run's
    SIGINT from its own on_hold hook hung the CI for 900 s. So SIGINT and SIGTERM are
    unblocked in this thread, and the wait wakes every poll_s, when Python runs the
    handler of a signal that was caught elsewhere."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
    while True:
        time.sleep(poll_s)
