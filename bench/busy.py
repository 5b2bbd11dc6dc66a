"""One core kept busy beside a benchmark's runs (the benchmarks' `--mode busy`)."""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import os
import signal
from collections.abc import Iterator


def _spin() -> None:
    """Spin until killed; the kernel ends it with its parent (PR_SET_PDEATHSIG), so a
    benchmark killed mid-run leaves no spinner behind."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    if os.getppid() == 1:  # the parent died before the line above
        return
    while True:
        pass


@contextlib.contextmanager
def busy_core(on: bool = True) -> Iterator[None]:
    """While the block runs, one process spins on a core (nothing when `on` is false)."""
    if not on:
        yield
        return
    spinner = multiprocessing.get_context("spawn").Process(target=_spin, daemon=True)
    spinner.start()
    try:
        yield
    finally:
        spinner.kill()
        spinner.join(5)
