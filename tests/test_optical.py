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
