"""Per-lightpath capacity on the fibre emulators: told in parallel while a set-up's rules go in.

For each fibre of a lightpath's route whose layout link names an emulator control, the
lightpath's capacity x the layout's `mbps_per_gbps` goes to a `CapacityChannel`
(`controllers.channels.ForwarderChannel` in the controller process). A failing cap is
logged and counted (`lightpipe_capacity_errors_total`), never raised: traffic flows on
the rules, the cap only shapes it. No os-ken, no emulator import.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from itertools import pairwise
from typing import Protocol

from controllers.metrics import ControllerMetrics
from controllers.rules import LayoutIndex
from controllers.store import LightpathRow

log = logging.getLogger("lightpipe.controller")

CAP_THREADS = 8  # caps of one set-up told at once (a route has at most a few fibres)


class CapacityChannel(Protocol):
    """Tells a fibre emulator a lightpath's capacity (or removes it)."""

    def set_cap(self, control: str, vid: int, rate_mbps: float | None) -> None: ...


class CapTeller:
    """Sets and removes lightpaths' caps through one channel (None: no emulators)."""

    def __init__(self, channel: CapacityChannel | None, metrics: ControllerMetrics) -> None:
        self.channel = channel
        self.metrics = metrics
        self._pool: ThreadPoolExecutor | None = None

    def begin(self, ix: LayoutIndex | None, row: LightpathRow) -> list[Future[None]]:
        """Start setting the lightpath's cap on each fibre of its route, all at once."""
        if self.channel is None or ix is None:
            return []
        controls = [c for u, v in pairwise(row.nodes)
                    if (c := ix.fibre_control.get(frozenset((u, v)))) is not None]
        if not controls:
            return []
        if self._pool is None:
            self._pool = ThreadPoolExecutor(CAP_THREADS, thread_name_prefix="caps")
        rate = row.capacity_gbps * ix.layout.mbps_per_gbps
        return [self._pool.submit(self._one, c, row, rate) for c in controls]

    def end(self, caps: list[Future[None]]) -> None:
        """Wait for the caps `begin` started (counted as the `caps` phase)."""
        t = time.perf_counter()
        for f in caps:
            f.result()
        self.metrics.phase("caps", t)

    def _one(self, control: str, row: LightpathRow, rate: float | None) -> None:
        assert self.channel is not None
        try:
            self.channel.set_cap(control, row.vid, rate)
        except Exception as exc:  # an emulator's cap: logged and counted, never fatal
            self.metrics.capacity_errors.inc()
            log.warning("%s: cannot set lightpath %d capacity: %s", control, row.id, exc)

    def set(self, ix: LayoutIndex | None, row: LightpathRow, on: bool,
            keep: set[frozenset[str]] | None = None) -> None:
        """Set (on) or remove the lightpath's cap on each fibre of its route but `keep`,
        one fibre after the other."""
        if self.channel is None or ix is None:
            return
        rate = row.capacity_gbps * ix.layout.mbps_per_gbps if on else None
        for u, v in pairwise(row.nodes):
            if keep and frozenset((u, v)) in keep:
                continue
            control = ix.fibre_control.get(frozenset((u, v)))
            if control is None:
                continue
            try:
                self.channel.set_cap(control, row.vid, rate)
            except Exception as exc:  # an emulator's cap: logged and counted, never fatal
                self.metrics.capacity_errors.inc()
                log.warning("fibre %s-%s: cannot set lightpath %d capacity: %s", u, v,
                            row.id, exc)
