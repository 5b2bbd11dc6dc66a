"""numba's njit for the gym kernels, with a pure-Python fallback (LIGHTPIPE_GYM_KERNEL=0)."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

try:
    import numba
except ImportError:  # optional: the kernels then run as plain Python (slow, same results)
    numba = None

ENV_FLAG = "LIGHTPIPE_GYM_KERNEL"  # "0": run the kernels as plain Python


def compiled() -> bool:
    """True when the kernels are compiled (numba installed and not turned off)."""
    return numba is not None and os.environ.get(ENV_FLAG, "1") != "0"


COMPILED = compiled()


def jit() -> Callable[[Any], Any]:
    """Decorator: numba.njit(cache=True, nogil=True) when compiled(), else the function
    itself. Without a writable cache directory, compiled in each process."""

    def wrap(fn: Any) -> Any:
        if not COMPILED:
            return fn
        assert numba is not None
        try:
            return numba.njit(cache=True, nogil=True)(fn)
        except RuntimeError as exc:  # numba: "cannot cache function ...: no locator"
            log.info("gym kernel: no numba cache (%s); compiling in this process", exc)
            return numba.njit(nogil=True)(fn)

    return wrap
