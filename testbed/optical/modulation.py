"""Modulation formats: the most efficient one a path allows, by reach or (qot: gnpy) by GSNR."""

from __future__ import annotations

import math
from dataclasses import dataclass

from testbed.spec.models import OpticalSpec


@dataclass(frozen=True)
class Modulation:
    """A modulation format: maximum transparent reach and capacity per spectrum slot (and,
    under qot: gnpy, the GSNR it needs)."""

    name: str
    reach_km: float
    gbps_per_slot: float
    required_gsnr_db: float | None = None  # set by modulation_table under qot: gnpy


# Typical flex-grid figures (12.5 GHz slots), as in the RMSA literature and optical-rl-gym.
DEFAULT_MODULATIONS: tuple[Modulation, ...] = (
    Modulation("BPSK", 4000.0, 12.5),
    Modulation("QPSK", 2000.0, 25.0),
    Modulation("8QAM", 1000.0, 37.5),
    Modulation("16QAM", 500.0, 50.0),
)

# Fixed grid: one "format" per wavelength, reach unlimited (RWA ignores impairments).
FIXED_GRID = "fixed"


def modulation_table(optical: OpticalSpec) -> tuple[Modulation, ...]:
    """The spec's modulation table (the default one unless listed), most efficient first."""
    if optical.grid == "fixed":
        assert optical.gbps_per_wavelength is not None
        return (Modulation(FIXED_GRID, math.inf, optical.gbps_per_wavelength),)
    if optical.modulations == "default":
        table = DEFAULT_MODULATIONS
    else:
        table = tuple(Modulation(m.name, m.reach_km, m.gbps_per_slot)
                      for m in optical.modulations)
    if optical.qot == "gnpy":
        from testbed.optical.qot import required_gsnr_db

        given = ({} if optical.modulations == "default" else
                 {m.name: m.required_gsnr_db for m in optical.modulations})
        table = tuple(Modulation(m.name, m.reach_km, m.gbps_per_slot,
                                 required_gsnr_db(m.name, given.get(m.name)))
                      for m in table)
    return tuple(sorted(table, key=lambda m: (-m.gbps_per_slot, m.reach_km)))


def choose_modulation(length_km: float, table: tuple[Modulation, ...]) -> Modulation | None:
    """Most spectrally efficient format whose reach covers length_km (None: out of reach)."""
    best: Modulation | None = None
    for m in table:
        if m.reach_km >= length_km and (best is None or m.gbps_per_slot > best.gbps_per_slot):
            best = m
    return best


def choose_modulation_by_gsnr(gsnr_db: float, table: tuple[Modulation, ...],
                              margin_db: float) -> Modulation | None:
    """Most spectrally efficient format whose required GSNR plus margin_db is at most gsnr_db
    (None: no format holds, the path is unusable). Needs required_gsnr_db on every format."""
    best: Modulation | None = None
    for m in table:
        if m.required_gsnr_db is None:
            raise ValueError(f"format {m.name!r} has no required GSNR")
        if m.required_gsnr_db + margin_db <= gsnr_db and (
                best is None or m.gbps_per_slot > best.gbps_per_slot):
            best = m
    return best


def slots_for(bitrate_gbps: float, gbps_per_slot: float, guard_slots: int = 0) -> int:
    """Slots a demand needs: ceil(bitrate / per-slot rate) + guard slots (at least 1 + guard)."""
    if not bitrate_gbps > 0:
        raise ValueError(f"bitrate must be > 0 Gb/s, got {bitrate_gbps}")
    # The tolerance keeps e.g. 100 / 12.5 = 8.000000000000002 at 8 slots.
    data = max(1, math.ceil(bitrate_gbps / gbps_per_slot - 1e-9))
    return data + guard_slots
