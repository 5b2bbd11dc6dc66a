"""Unit tests of the optical layer: modulation, bitmaps, fit policies, allocate/release."""

from __future__ import annotations

import random

import pytest

from testbed.optical import (
    DEFAULT_MODULATIONS,
    NO_PATH,
    NO_REACH,
    NO_SPECTRUM,
    OpticalNetwork,
    choose_modulation,
    choose_start,
    fitting_starts,
    free_runs,
    slots_for,
)
from testbed.spec import OpticalSpec
from testbed.topologies import Fibre, Topology, load_library


def line(*lengths_km: float) -> Topology:
    nodes = tuple(str(i) for i in range(len(lengths_km) + 1))
    fibres = tuple(Fibre(nodes[i], nodes[i + 1], km) for i, km in enumerate(lengths_km))
    return Topology("line", nodes, fibres)


def test_modulation_most_efficient_within_reach() -> None:
    table = DEFAULT_MODULATIONS
    assert choose_modulation(400, table).name == "16QAM"  # type: ignore[union-attr]
    assert choose_modulation(500, table).name == "16QAM"  # type: ignore[union-attr]
    assert choose_modulation(500.1, table).name == "8QAM"  # type: ignore[union-attr]
    assert choose_modulation(1999, table).name == "QPSK"  # type: ignore[union-attr]
    assert choose_modulation(4000, table).name == "BPSK"  # type: ignore[union-attr]
    assert choose_modulation(4000.5, table) is None


def test_slots_for() -> None:
    assert slots_for(100, 12.5) == 8
    assert slots_for(100, 37.5) == 3
    assert slots_for(100, 50, guard_slots=1) == 3
    assert slots_for(10, 50) == 1


def test_fitting_starts_and_runs() -> None:
    free = 0b1110_0111_1000  # runs: slots 3-6 (4), 9-11 (3)
    assert free_runs(free) == [(3, 4), (9, 3)]
    assert fitting_starts(free, 3) == (1 << 3) | (1 << 4) | (1 << 9)
    assert fitting_starts(free, 5) == 0
    assert choose_start(free, 3, "first_fit") == 3
    assert choose_start(free, 3, "last_fit") == 9
    assert choose_start(free, 3, "best_fit") == 9
    assert choose_start(free, 4, "best_fit") == 3
    assert choose_start(free, 5, "first_fit") is None
    seen = {choose_start(free, 3, "random_fit", random.Random(i)) for i in range(60)}
    assert seen == {3, 4, 9}
    with pytest.raises(ValueError, match="unknown spectrum policy"):
        choose_start(free, 1, "worst_fit")


def test_fitting_starts_matches_brute_force() -> None:
    rng = random.Random(3)
    for _ in range(300):
        slots = rng.randint(1, 90)
        free = rng.getrandbits(slots)
        n = rng.randint(1, slots)
        want = 0
        for i in range(slots - n + 1):
            if all(free >> j & 1 for j in range(i, i + n)):
                want |= 1 << i
        assert fitting_starts(free, n) == want


def test_candidate_paths_sorted_and_modulated() -> None:
    net = OpticalNetwork(load_library("nsfnet"), OpticalSpec(k_paths=3))
    paths = net.candidate_paths("1", "13")
    assert len(paths) == 3
    assert [p.length_km for p in paths] == sorted(p.length_km for p in paths)
    for p in paths:
        assert p.nodes[0] == "1" and p.nodes[-1] == "13"
        mod = choose_modulation(p.length_km, net.modulations)
        assert p.modulation == (mod.name if mod else None)
    back = net.candidate_paths("13", "1")
    assert [tuple(reversed(p.nodes)) for p in back] == [p.nodes for p in paths]


def test_allocate_release_and_block() -> None:
    net = OpticalNetwork(line(300, 300), OpticalSpec(slots=10, k_paths=1, guard_slots=1))
    lp = net.allocate("0", "2", bitrate_gbps=100)  # 600 km -> 8QAM 37.5 -> 3 + 1 guard
    assert lp is not None
    assert (lp.modulation, lp.n_slots, lp.first_slot) == ("8QAM", 4, 0)
    assert lp.capacity_gbps == pytest.approx(112.5)
    assert lp.latency_ms == pytest.approx(600 * 5 / 1000)
    assert net.occupancy("0", "1")[:5] == [True] * 4 + [False]
    lp2 = net.allocate("0", "1", bitrate_gbps=100)  # 300 km -> 16QAM -> 2 + 1
    assert lp2 is not None and lp2.first_slot == 4 and lp2.n_slots == 3
    assert net.allocate_or_reason("0", "2", bitrate_gbps=200) == NO_SPECTRUM
    net.release(lp)
    assert net.mask("1", "2") == 0 and net.mask("0", "1") == 0b111_0000
    with pytest.raises(KeyError):
        net.release(lp)
    assert net.utilization() == pytest.approx(3 / 20)


def test_reach_and_failures() -> None:
    net = OpticalNetwork(line(3000, 3000), OpticalSpec(slots=8, k_paths=2))
    assert net.allocate_or_reason("0", "2", bitrate_gbps=10) == NO_REACH
    lp = net.allocate("0", "1", bitrate_gbps=25)
    assert lp is not None
    assert net.fail_link("1", "0") == [lp]
    assert net.lightpaths == {}
    assert net.allocate_or_reason("0", "1", bitrate_gbps=25) == NO_PATH
    net.repair_link("0", "1")
    assert net.allocate("0", "1", bitrate_gbps=25) is not None


def test_restoration_uses_other_route() -> None:
    ring = Topology("ring", ("a", "b", "c"), (Fibre("a", "b", 100), Fibre("b", "c", 100),
                                                Fibre("a", "c", 100)))
    net = OpticalNetwork(ring, OpticalSpec(slots=4, k_paths=1))
    lp = net.allocate("a", "b", slots=2)
    assert lp is not None and lp.nodes == ("a", "b")
    (hit,) = net.fail_link("a", "b")
    again = net.allocate(hit.src, hit.dst, slots=hit.n_slots)
    assert again is not None and again.nodes == ("a", "c", "b")


def test_wavelength_loss() -> None:
    net = OpticalNetwork(line(100), OpticalSpec(slots=6, k_paths=1))
    a = net.allocate("0", "1", slots=2)
    b = net.allocate("0", "1", slots=2)
    assert net.block_slots("0", "1", 3, 1) == [b]
    assert net.unavailable("0", "1") == [0, 1, 3]
    c = net.allocate("0", "1", slots=2)
    assert c is not None and c.first_slot == 4
    net.unblock_slots("0", "1", 3, 1)
    assert net.unavailable("0", "1") == [0, 1, 4, 5]
    assert a is not None


def test_per_direction_spectrum() -> None:
    net = OpticalNetwork(line(100), OpticalSpec(slots=2, k_paths=1,
                                                spectrum_sharing="per_direction"))
    assert net.allocate("0", "1", slots=2) is not None
    assert net.allocate("0", "1", slots=1) is None
    assert net.allocate("1", "0", slots=2) is not None


def test_fixed_grid_rwa() -> None:
    spec = OpticalSpec(grid="fixed", wavelengths=4, gbps_per_wavelength=100, guard_slots=2)
    net = OpticalNetwork(line(9000), spec)
    lp = net.allocate("0", "1", bitrate_gbps=100)
    assert lp is not None and (lp.n_slots, lp.modulation, lp.first_slot) == (1, "fixed", 0)
    assert net.allocate("0", "1", bitrate_gbps=250).n_slots == 3  # type: ignore[union-attr]


def test_assign_rejects_busy_block() -> None:
    net = OpticalNetwork(line(100), OpticalSpec(slots=4))
    path = net.candidate_paths("0", "1")[0]
    net.assign(path, 1, 2)
    with pytest.raises(ValueError, match="not free"):
        net.assign(path, 2, 1)
    with pytest.raises(ValueError, match="outside the grid"):
        net.assign(path, 3, 2)


def _state(net: OpticalNetwork) -> tuple[object, ...]:
    """Everything a copy must keep apart: slot bitmaps, cuts, lost slots, live lightpaths."""
    occ, busy, blocked = net.slot_masks()
    return (tuple(occ), tuple(busy), tuple(blocked), net.state_key(), dict(net.lightpaths),
            net.used_slot_fibres, net.paths_version,
            [net.is_failed(f.u, f.v) for f in net.topology.fibres])


def test_copy_is_independent_and_answers_alike() -> None:
    """A copy (to plan on outside the controller's lock) starts equal, numbers lightpaths
    alike, and nothing done to either side shows on the other."""
    ring = load_library("nsfnet")
    net = OpticalNetwork(ring, OpticalSpec(slots=16, k_paths=3))
    rng = random.Random(3)
    held = [net.allocate("1", "9", slots=3), net.allocate("2", "13", bitrate_gbps=100,
                                                          policy="random_fit", rng=rng)]
    assert all(lp is not None for lp in held)
    net.fail_link("9", "10")
    net.block_slots("1", "3", 5, 2)
    before = _state(net)
    cp = net.copy()
    assert _state(cp) == before
    assert cp.candidate_paths("1", "9") == net.candidate_paths("1", "9")
    # the same requests on both get the same answers (and lightpath ids)
    a = net.allocate("6", "13", slots=4, policy="random_fit", rng=random.Random(5))
    b = cp.allocate("6", "13", slots=4, policy="random_fit", rng=random.Random(5))
    assert a == b and a is not None and a.id == b.id  # type: ignore[union-attr]
    net.release(a)  # type: ignore[arg-type]
    assert _state(net) == before != _state(cp)
    # changes on the copy stay there: release, cut, repair, loss, set-up
    cp.release(held[0])  # type: ignore[arg-type]
    cp.fail_link("1", "2")
    cp.repair_link("9", "10")
    cp.unblock_slots("1", "3", 5, 2)
    cp.block_slots("13", "14", 0, 16)
    assert cp.allocate("1", "9", slots=2) is not None
    assert _state(net) == before
    assert held[0] is not None and held[0].id in net.lightpaths
    assert net.is_failed("9", "10") and not net.is_failed("1", "2")
    # ... and changes here do not show in a copy
    cp2 = net.copy()
    net.repair_link("9", "10")
    net.release(held[1])  # type: ignore[arg-type]
    assert cp2.is_failed("9", "10") and held[1].id in cp2.lightpaths  # type: ignore[union-attr]
    assert _state(cp2) == before


def test_copy_refuses_an_attribute_it_has_no_rule_for() -> None:
    net = OpticalNetwork(line(100), OpticalSpec(slots=4))
    net.planner_notes = object()  # type: ignore[attr-defined]
    with pytest.raises(TypeError, match="planner_notes"):
        net.copy()


def test_keep_paths_takes_a_copys_routes_unless_fibres_changed() -> None:
    net = OpticalNetwork(load_library("nsfnet"), OpticalSpec(slots=8, k_paths=3))
    cp = net.copy()
    routes = cp.candidate_paths("1", "14")
    net.keep_paths(cp)
    assert net.candidate_paths("1", "14") is routes  # not computed again
    cp2 = net.copy()
    other = cp2.candidate_paths("2", "12")
    net.fail_link("1", "2")  # routes computed before the cut are stale
    net.keep_paths(cp2)
    fresh = net.candidate_paths("2", "12")
    assert fresh is not other
    assert not any({a, b} == {"1", "2"} for p in fresh for a, b in p.fibres)


def test_apply_event_dispatches_each_network_event() -> None:
    """One dispatch of a scenario's network events (used by the lightpath simulator, the
    job simulator and RMSA-v0): cut and wavelength loss release what they hit, repairs
    hit nothing and give the spectrum back, other kinds are refused."""
    from testbed.spec.models import EventSpec

    net = OpticalNetwork(line(300, 300), OpticalSpec(slots=10, k_paths=1))
    lp = net.allocate("0", "2", slots=2)
    assert lp is not None
    cut = net.apply_event(EventSpec(at_s=1, kind="fiber_cut", link=["0", "1"]))
    assert [x.id for x in cut] == [lp.id]
    assert net.allocate("0", "2", slots=2) is None  # the only route is cut
    assert net.apply_event(EventSpec(at_s=2, kind="fiber_repair", link=["0", "1"])) == []
    lp2 = net.allocate("0", "2", slots=2)
    assert lp2 is not None and lp2.first_slot == 0
    loss = EventSpec(at_s=3, kind="wavelength_loss", link=["1", "2"], first_slot=1, slots=1)
    assert [x.id for x in net.apply_event(loss)] == [lp2.id]
    lp3 = net.allocate("0", "2", slots=2)
    assert lp3 is not None and lp3.first_slot == 2  # slot 1 is out of service
    back = EventSpec(at_s=4, kind="wavelength_repair", link=["1", "2"], first_slot=1, slots=1)
    assert net.apply_event(back) == []
    firsts = [net.allocate("0", "2", slots=1) for _ in range(2)]
    assert [x.first_slot for x in firsts if x is not None] == [0, 1]  # slot 1 is back
    with pytest.raises(ValueError, match="not a network event"):
        net.apply_event(EventSpec(at_s=5, kind="worker_kill", job=0, stage=0))
