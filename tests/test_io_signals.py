"""A held run's wait ends on SIGINT even when the kernel gives the signal to another
thread (testbed.io.signals; signal.pause() hung a CI run for 900 s)."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from testbed.io.signals import until_signalled


@pytest.mark.timeout(60)
def test_a_sigint_taken_by_another_thread_ends_the_wait() -> None:
    sent, waiting = threading.Event(), threading.Event()

    def send() -> None:  # started before the main thread blocks SIGINT: it may take it
        if waiting.wait(30):  # only once the main thread is inside pytest.raises
            time.sleep(0.2)
            os.kill(os.getpid(), signal.SIGINT)
            sent.set()

    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})  # as a library left it
    try:
        th = threading.Thread(target=send, daemon=True)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        th.start()
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        t0 = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            waiting.set()
            until_signalled(poll_s=0.1)
        assert time.monotonic() - t0 < 30
        # The handler can run before the sender's next line (the signal is in as kill()
        # returns): so `sent` is read once the sender is done, never while it may still
        # be on its way to setting it (a loaded CI ran the handler first: sent unset).
        th.join(30)
        assert sent.is_set()
        assert signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, set())
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
