"""Pure tests of the emulators' per-lightpath caps (controllers/caps.py, through the core and
alone): every fibre with a control gets the capacity, removal, `keep`, errors counted."""

from __future__ import annotations

from pathlib import Path

import pytest

from controllers.caps import CapTeller
from controllers.core import ControllerCore
from controllers.layout import default_layout
from controllers.metrics import ControllerMetrics
from controllers.rules import LayoutIndex
from controllers.store import LightpathRow
from tests.test_controller_core import Caps, make_core, small_scenario


@pytest.fixture
def core(tmp_path: Path) -> ControllerCore:
    return make_core(tmp_path)


def test_capacity_told_to_fibre_emulators(core: ControllerCore) -> None:
    lp = core.request("dc-a", "dc-c", bitrate_gbps=100)
    caps = core.capacity.calls  # type: ignore[union-attr]
    assert ("/tmp/ab.sock", lp["vid"], lp["capacity_gbps"]) in caps
    core.delete(lp["id"])
    assert ("/tmp/ab.sock", lp["vid"], None) in caps


class Failing:
    def set_cap(self, control: str, vid: int, rate_mbps: float | None) -> None:
        raise OSError(f"{control}: no such socket")


def _ix() -> LayoutIndex:
    sc = small_scenario()
    controls = {("A", "B"): "/tmp/ab.sock", ("B", "C"): "/tmp/bc.sock"}
    return LayoutIndex.build(default_layout(sc, controls=controls))


def _row(nodes: list[str], capacity_gbps: float = 100.0) -> LightpathRow:
    return LightpathRow(id=3, vid=7, src_dc="dc-a", dst_dc="dc-c", src_host=None,
                        dst_host=None, bitrate_gbps=None, slots_req=2, policy="first_fit",
                        nodes=nodes, first_slot=0, n_slots=2, modulation="QPSK",
                        capacity_gbps=capacity_gbps, job_id=None, created_s=0.0)


def test_begin_tells_every_controlled_fibre_at_once() -> None:
    ix = _ix()
    caps = Caps()
    m = ControllerMetrics()
    teller = CapTeller(caps, m)
    futures = teller.begin(ix, _row(["A", "B", "C"]))
    teller.end(futures)
    rate = 100.0 * ix.layout.mbps_per_gbps
    assert sorted(caps.calls) == [("/tmp/ab.sock", 7, rate), ("/tmp/bc.sock", 7, rate)]
    assert teller.begin(ix, _row(["A", "D", "C"])) == []  # no emulator control there
    assert teller.begin(None, _row(["A", "B", "C"])) == []  # no layout
    assert CapTeller(None, m).begin(ix, _row(["A", "B", "C"])) == []  # no channel
    assert 'lightpipe_controller_phase_seconds_total{phase="caps"}' in m.exposition().decode()


def test_set_removes_and_keeps() -> None:
    ix = _ix()
    caps = Caps()
    teller = CapTeller(caps, ControllerMetrics())
    teller.set(ix, _row(["A", "B", "C"]), on=False, keep={frozenset(("B", "C"))})
    assert caps.calls == [("/tmp/ab.sock", 7, None)]
    teller.set(ix, _row(["C", "B"], 50.0), on=True)
    assert caps.calls[-1] == ("/tmp/bc.sock", 7, 50.0 * ix.layout.mbps_per_gbps)


def test_a_failing_emulator_is_counted_never_raised() -> None:
    ix = _ix()
    m = ControllerMetrics()
    teller = CapTeller(Failing(), m)
    teller.end(teller.begin(ix, _row(["A", "B", "C"])))
    teller.set(ix, _row(["A", "B"]), on=False)
    assert "lightpipe_capacity_errors_total 3.0" in m.exposition().decode()
