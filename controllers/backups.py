"""Protection state: each working route's backup, whose switches hold it, and deferred installs.

With protection on, every lightpath between two ROADMs gets the shortest fibre-disjoint
backup route over the layout's fibres that are not cut (`controllers.protection`), cached
per working route until the layout, a cut or a repair changes what is usable. A new
lightpath's protection may follow its set-up (`delay_s`): it is pending until the timer
(restarted by every further set-up, 1 s at most after the first pending one) installs
all pending ones at once. Not thread-safe: the core calls it under its lock. No os-ken,
no emulator import.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from controllers.protection import backup_route
from controllers.rules import LayoutIndex
from controllers.store import LightpathRow
from testbed.optical import OpticalNetwork

MAX_POSTPONE_S = 1.0  # a steady stream of set-ups postpones the pending ones this long at most


class Backups:
    """Backup routes, the lightpaths whose protection is pending, and its timer."""

    def __init__(self, net: OpticalNetwork, on: bool = False, delay_s: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """on: protection on; delay_s: a new lightpath's protection is installed this long
        after its set-up (None: within the set-up); clock: for the 1 s postponement cap."""
        self.net = net
        self.on = on
        self.delay_s = delay_s
        self.clock = clock
        self.pending: set[int] = set()  # set up, protection not installed yet
        self._routes: dict[tuple[str, ...], tuple[str, ...] | None] = {}
        self._timer: threading.Timer | None = None
        self._since = 0.0  # when the oldest pending protection was asked for

    def backup(self, ix: LayoutIndex | None,
               nodes: list[str] | tuple[str, ...]) -> tuple[str, ...] | None:
        """The backup route of a working route (protection on, a layout, one exists):
        the shortest fibre-disjoint route over the layout's fibres that are not cut."""
        if not self.on or ix is None:
            return None
        key = tuple(nodes)
        if key not in self._routes:
            net = self.net
            self._routes[key] = backup_route(
                net.graph, key, lambda u, v: (u, v) in ix.fibre_port and not net.is_failed(u, v))
        return self._routes[key]

    def held(self, ix: LayoutIndex | None, row: LightpathRow) -> tuple[str, ...] | None:
        """The backup the switches hold for the lightpath (None while it is pending)."""
        return None if row.id in self.pending else self.backup(ix, row.nodes)

    def routes_changed(self) -> None:
        """The usable fibres changed (layout, cut, repair): backups are computed afresh."""
        self._routes.clear()

    def defer(self, lp_id: int) -> bool:
        """A new lightpath: its protection follows later if so configured (True then)."""
        if self.on and self.delay_s is not None:
            self.pending.add(lp_id)
            return True
        return False

    def forget(self, lp_id: int) -> None:
        self.pending.discard(lp_id)

    def take_pending(self) -> bool:
        """Mark every pending protection installed; True if there was any."""
        if not self.pending:
            return False
        self.pending.clear()
        return True

    def schedule(self, install: Callable[[], None]) -> None:
        """(Re)start the timer that calls `install` (which takes the core's lock and
        installs the pending protections): `delay_s` after this call, unless the oldest
        pending one has waited MAX_POSTPONE_S already."""
        now = self.clock()
        timer = self._timer
        if timer is not None and timer.is_alive():
            if now - self._since >= MAX_POSTPONE_S:
                return  # a steady stream of set-ups: do not postpone any more
            timer.cancel()
        else:
            self._since = now
        assert self.delay_s is not None
        self._timer = threading.Timer(self.delay_s, install)
        self._timer.daemon = True
        self._timer.start()

    def view(self, ix: LayoutIndex | None, row: LightpathRow) -> dict[str, Any]:
        """The view's protection keys: `backup` (route or None), `protected` (whether the
        switches hold it); nothing with protection off."""
        if not self.on:
            return {}
        backup = self.backup(ix, row.nodes)
        return {"backup": None if backup is None else list(backup),
                "protected": self.held(ix, row) is not None}
