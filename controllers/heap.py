"""The controller process's heap: long-lived objects moved out of the cyclic GC's reach.

A full (generation 2) collection walks every tracked object. In the controller process
that is os-ken, FastAPI, pydantic, networkx, the scenario and the layout's rule caches:
one such pause took 64-88 ms here, paid by whichever lightpath request happened to
trigger it (bench/bench_controller.py: the set-up p99 of 90-112 ms at 40 lightpaths was
that one request). After start-up and after each layout is adopted, `settle()` collects
once and then freezes what survived (`gc.freeze`, as pre-forking servers do): later
collections scan only what requests create. Frozen objects are still freed by reference
counting when dropped (an old layout's rules); only cyclic garbage among them stays.
"""

from __future__ import annotations

import gc
import logging
import time

log = logging.getLogger(__name__)


def settle(what: str) -> float:
    """Collect, then freeze the survivors; seconds it took (logged)."""
    t0 = time.perf_counter()
    gc.collect()
    gc.freeze()
    dt = time.perf_counter() - t0
    log.info("heap settled after %s: %d objects frozen in %.1f ms", what,
             gc.get_freeze_count(), dt * 1e3)
    return dt
