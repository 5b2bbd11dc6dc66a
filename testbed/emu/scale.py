"""Scale: the one conversion between real units and emulated ones (rate, delay, bytes, time).

An emulated link runs at the real rate / `bandwidth_divisor` and with the real delay x
`time_factor`; compute times are stretched by `time_factor` too, and a transfer carries
real bytes x `time_factor` / `bandwidth_divisor`, so serialisation stretches by the same
factor. Emulated time / `time_factor` is then directly comparable with the simulator's.
Made once per run from `emulation` (`Scale.of`), carried by the emulation plan and
passed to whoever converts. `time_factor: auto` starts at `time_factor_min` (default
AUTO_START_FACTOR); the run then
measures and picks the factor (testbed.emu.timefactor, testbed.orchestrate.timescale) and
every later reader gets the chosen number (`with_time_factor`, and the records).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from testbed.errors import InputError, RuntimeFailure

# The spec's bounds (testbed/spec/models.py, EmulationSpec), not imported from it: a worker
# imports Scale and should not pay for pydantic (tests/test_scale.py checks they agree).
MAX_BANDWIDTH_DIVISOR = 1e9
MAX_TIME_FACTOR = 1e6
AUTO = "auto"              # emulation.time_factor: chosen by the run from measurements
AUTO_START_FACTOR = 1.0    # what an auto factor is until the run has chosen


@dataclass(frozen=True)
class Scale:
    """Real <-> emulated conversion factors of one run."""

    bandwidth_divisor: float = 1.0
    time_factor: float = 1.0

    def __post_init__(self) -> None:
        if not self.bandwidth_divisor >= 1:
            raise InputError("bandwidth_divisor", f"must be >= 1, got {self.bandwidth_divisor}")
        if not self.time_factor > 0:
            raise InputError("time_factor", f"must be > 0, got {self.time_factor}")

    @classmethod
    def of(cls, emulation: Any) -> Scale:
        """The scale of a scenario's `emulation` section (1:1 when it has none)."""
        if emulation is None:
            return cls()
        factor = emulation.time_factor
        if factor == AUTO:  # the run starts at the floor and chooses from there
            factor = float(getattr(emulation, "time_factor_min", AUTO_START_FACTOR))
        return cls(emulation.bandwidth_divisor, factor)

    @staticmethod
    def is_auto(emulation: Any) -> bool:
        """Whether a scenario's `emulation` leaves the time factor to the run."""
        return emulation is not None and emulation.time_factor == AUTO

    def with_time_factor(self, time_factor: float) -> Scale:
        """This scale at another time factor (the one an auto run chose)."""
        return Scale(self.bandwidth_divisor, float(time_factor))

    @classmethod
    def of_record(cls, record: Mapping[str, Any], where: str) -> Scale:
        """The scale a record holds (network.json, summary.json's worker_jobs rows: what
        as_record() wrote; 1 where a factor is absent). A factor that is not a finite
        number within the spec's bounds raises RuntimeFailure naming `where`."""
        got = {}
        for key, lo_ok, hi in (("bandwidth_divisor", lambda x: x >= 1, MAX_BANDWIDTH_DIVISOR),
                               ("time_factor", lambda x: x > 0, MAX_TIME_FACTOR)):
            v = record.get(key)
            if v is None:
                v = 1.0
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not (
                    math.isfinite(v) and lo_ok(v) and v <= hi):
                raise RuntimeFailure(f"{where}: {key} {v!r} is not a number within the "
                                     "spec's bounds")
            got[key] = float(v)
        return cls(**got)

    # real -> emulated
    def rate_mbps(self, real_gbps: float) -> float:
        """Emulated rate (Mbit/s) of a real capacity in Gbit/s."""
        return real_gbps * 1000.0 / self.bandwidth_divisor

    @property
    def mbps_per_gbps(self) -> float:
        """Emulated Mbit/s per real Gbit/s."""
        return 1000.0 / self.bandwidth_divisor

    def delay_ms(self, real_ms: float) -> float:
        """Emulated delay (or compute time) of a real one."""
        return real_ms * self.time_factor

    def emulated_s(self, real_s: float) -> float:
        """Emulated (wall-clock) seconds of real seconds."""
        return real_s * self.time_factor

    def transfer_bytes(self, real_bytes: float) -> int:
        """Bytes an emulated transfer carries for `real_bytes` (at least 1)."""
        return max(1, round(real_bytes * self.time_factor / self.bandwidth_divisor))

    def divisor_needed(self, rate_mbps: float, max_rate_mbps: float) -> int:
        """Smallest bandwidth_divisor that brings an emulated rate down to max_rate_mbps."""
        return math.ceil(rate_mbps * self.bandwidth_divisor / max_rate_mbps)

    # emulated -> real
    def real_ms(self, emulated_ms: float) -> float:
        """Real delay (or time) of an emulated one."""
        return emulated_ms / self.time_factor

    def real_s(self, emulated_s: float) -> float:
        """Real seconds of emulated seconds."""
        return emulated_s / self.time_factor

    def real_gbps_of_mbps(self, emulated_mbps: float) -> float:
        """Real capacity (Gbit/s) of an emulated rate."""
        return emulated_mbps * self.bandwidth_divisor / 1000.0

    def as_record(self) -> dict[str, float]:
        """The two factors as summary/manifest/network.json record them."""
        return {"bandwidth_divisor": self.bandwidth_divisor, "time_factor": self.time_factor}
