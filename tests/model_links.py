"""Link emulators that keep the emulator's bookkeeping and have no data plane: the
fibres of the delay-calibration and time-factor tests (tests/test_delaycal.py,
tests/test_timefactor.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def model_links(tmp_path: Path, delay: dict[str, float]) -> dict[str, Any]:
    """One model emulator per fibre "uv" of `delay` (its one-way delay, ms): 200 km per ms,
    10 Gb/s, QPSK, no loss."""
    from testbed.emu.links import LinkEmulator
    from testbed.emu.plan import FibrePlan

    class ModelLink(LinkEmulator):  # the emulator's bookkeeping, no data plane
        def set_delay_correction(self, correction_ms: float) -> None:
            self.correction_ms = max(0.0, correction_ms)

        def set_vlan_correction(self, vlan: int, correction_ms: float) -> bool:
            self.vlan_corrections_ms[vlan] = correction_ms
            return True

    return {k: ModelLink(FibrePlan(k[0], k[1], f"r{k[0]}", f"r{k[1]}", k, 200 * d, d, 10.0,
                                   100.0, "QPSK", 0.0), 1, "x0", "x1", {}, tmp_path)
            for k, d in delay.items()}
