"""Fibre cuts and slot-block (wavelength) losses: hit lightpaths re-placed as the simulator does.

The simulator's rule (testbed.sim.engine._apply_event): every hit lightpath is released
first, then they are re-placed in controller-id order with their original request
(bitrate or slot count, spectrum policy; same id and VLAN, `restored` + 1), or dropped
as lost. `Restorer` takes those decisions on the optical state and stores them with the
cut or the fibre's lost slots in one transaction; the core then installs the rules and
moves the emulators' caps (`Moves`). Not thread-safe: the core calls it under its lock.
No os-ken, no emulator import.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from controllers.backups import Backups
from controllers.errors import RequestError
from controllers.lightpaths import LightpathBook
from controllers.metrics import ControllerMetrics
from controllers.rules import LayoutIndex
from controllers.store import LightpathRow, Store
from testbed.optical import OpticalNetwork
from testbed.optical.spectrum import free_runs

log = logging.getLogger("lightpipe.controller")


@dataclass
class Restoration:
    """Outcome of one fibre cut or slot-block loss: what was re-placed, what was lost,
    and how long it took."""

    fibre: tuple[str, str]
    restored: list[int] = field(default_factory=list)
    lost: list[int] = field(default_factory=list)
    seconds: float = 0.0
    block: tuple[int, int] | None = None  # (first_slot, n_slots) of a wavelength loss
    # protected lightpaths re-placed on the backup route their switches already used
    # (None: protection off)
    on_backup: list[int] | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"fibre": list(self.fibre), "restored": self.restored,
                               "lost": self.lost, "restoration_s": self.seconds}
        if self.block is not None:
            out["first_slot"], out["slots"] = self.block
        if self.on_backup is not None:
            out["on_backup"] = self.on_backup
        return out


@dataclass
class Moves:
    """What a restoration changed: every hit lightpath's row as it was (for its caps),
    and the rows of those re-placed (as they are now)."""

    before: dict[int, LightpathRow] = field(default_factory=dict)
    changed: list[LightpathRow] = field(default_factory=list)


def check_fibre(net: OpticalNetwork, u: str, v: str) -> None:
    """RequestError 404 unless u-v is a fibre of the topology."""
    try:
        net.link_id(u, v)
    except KeyError as exc:
        raise RequestError(404, str(exc.args[0])) from None


def check_block(net: OpticalNetwork, u: str, v: str, first_slot: int, n_slots: int) -> None:
    """RequestError 400 unless the slot block lies inside the grid."""
    if n_slots < 1 or first_slot < 0 or first_slot + n_slots > net.slots:
        raise RequestError(400, f"slots {first_slot}..{first_slot + n_slots - 1} are "
                           f"outside fibre {u}-{v}'s grid 0..{net.slots - 1}")


def lost_runs(net: OpticalNetwork, u: str, v: str) -> list[tuple[int, int]]:
    """Fibre u-v's slots out of service as (first_slot, n_slots) runs."""
    mask = 0
    for i in net.lost_slots(u, v):
        mask |= 1 << i
    return free_runs(mask)


def observe(metrics: ControllerMetrics, res: Restoration, what: str) -> None:
    """Count a finished restoration in the metrics and the log."""
    metrics.restoration_seconds.observe(res.seconds)
    metrics.restored.inc(len(res.restored))
    metrics.lost.inc(len(res.lost))
    metrics.restored_on_backup.inc(len(res.on_backup or ()))
    log.info("%s: %d restored, %d lost in %.1f ms", what, len(res.restored),
             len(res.lost), res.seconds * 1e3)


class Restorer:
    """Cuts and repairs fibres and slot blocks on the optical state, re-placing or
    dropping the lightpaths they hit, and stores each change."""

    def __init__(self, net: OpticalNetwork, book: LightpathBook, store: Store,
                 backups: Backups, dc_node: Mapping[str, str], rng: random.Random) -> None:
        """dc_node: lightpath end (DC or node:<id>) -> optical node; rng: the spectrum
        policies' stream (random_fit), shared with the set-ups."""
        self.net = net
        self.book = book
        self.store = store
        self.backups = backups
        self.dc_node = dc_node
        self.rng = rng

    def cut(self, ix: LayoutIndex | None, u: str, v: str) -> tuple[Restoration, Moves | None]:
        """Cut fibre u-v (Moves None: it was cut already, nothing changed)."""
        check_fibre(self.net, u, v)
        res = Restoration((u, v))
        if self.net.is_failed(u, v):
            return res, None
        hit = {lp.id for lp in self.net.fail_link(u, v)}
        self.backups.routes_changed()  # backups crossing the cut need another route
        moves = self._replace(ix, hit, res)
        self.store.save(moves.changed, delete_ids=res.lost, failed=(u, v))
        return res, moves

    def repair(self, u: str, v: str) -> bool:
        """Repair fibre u-v (no lightpath moves back); True if it was cut."""
        check_fibre(self.net, u, v)
        if not self.net.is_failed(u, v):
            return False
        self.net.repair_link(u, v)
        self.store.save([], repaired=(u, v))
        self.backups.routes_changed()
        log.info("fibre %s-%s repaired", u, v)
        return True

    def lose_slots(self, ix: LayoutIndex | None, u: str, v: str, first_slot: int,
                   n_slots: int) -> tuple[Restoration, Moves]:
        """Slots first_slot..+n_slots-1 of fibre u-v go out of service in both directions
        (stored, so a restarted controller keeps them out) until repair_slots."""
        check_fibre(self.net, u, v)
        check_block(self.net, u, v, first_slot, n_slots)
        res = Restoration((u, v), block=(first_slot, n_slots))
        hit = {lp.id for lp in self.net.block_slots(u, v, first_slot, n_slots)}
        moves = self._replace(ix, hit, res)
        self.store.save(moves.changed, delete_ids=res.lost,
                        lost=(u, v, lost_runs(self.net, u, v)))
        return res, moves

    def repair_slots(self, u: str, v: str, first_slot: int, n_slots: int) -> list[int]:
        """The slots are usable again (the lightpaths moved away stay where they are, as in
        the simulator); the fibre's slots still out of service."""
        check_fibre(self.net, u, v)
        check_block(self.net, u, v, first_slot, n_slots)
        self.net.unblock_slots(u, v, first_slot, n_slots)
        self.store.save([], lost=(u, v, lost_runs(self.net, u, v)))
        log.info("fibre %s-%s slots %d..%d repaired", u, v, first_slot,
                 first_slot + n_slots - 1)
        return self.net.lost_slots(u, v)

    def fibre_state(self, u: str, v: str) -> dict[str, Any]:
        """Whether fibre u-v is cut, and its slots out of service."""
        check_fibre(self.net, u, v)
        return {"failed": self.net.is_failed(u, v), "lost_slots": self.net.lost_slots(u, v)}

    def _replace(self, ix: LayoutIndex | None, hit: set[int], res: Restoration) -> Moves:
        """Re-place the hit optical lightpaths (already released by the network) in
        controller-id order with their original request, or drop them."""
        book = self.book
        ids = book.hit_by(hit)
        # the backups the switches held (a cut fibre is on the working route, never on
        # its disjoint backup, so the cut does not change these)
        was = {i: self.backups.held(ix, book.rows[i]) for i in ids}
        if self.backups.on:
            res.on_backup = []
        moves = Moves(before={i: book.rows[i].copy() for i in ids})
        for i in ids:
            row = book.rows[i]
            got = self.net.allocate_or_reason(self.dc_node[row.src_dc],
                                              self.dc_node[row.dst_dc],
                                              bitrate_gbps=row.bitrate_gbps,
                                              slots=row.slots_req, policy=row.policy,
                                              rng=self.rng)
            if isinstance(got, str):
                res.lost.append(i)
                continue
            moves.changed.append(book.move(i, got))
            res.restored.append(i)
            if res.on_backup is not None and was[i] == tuple(got.nodes):
                res.on_backup.append(i)
        for i in res.lost:
            self.backups.forget(i)
            book.pop(i)
        return moves
