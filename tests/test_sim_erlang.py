"""Simulated blocking on one fibre with 1-slot requests matches Erlang B within the CI."""

from __future__ import annotations

import pytest

from testbed.sim import erlang_b, simulate_lightpaths
from testbed.spec import parse_scenario


def one_fibre(load: float, slots: int, requests: int, seed: int, **optical: object) -> dict:
    return {
        "name": "erlang", "topology": {"links": [{"u": "a", "v": "b", "length_km": 100}]},
        "optical": {"slots": slots, "guard_slots": 0, "k_paths": 1, **optical},
        "workload": {"kind": "lightpath_requests", "load_erlang": load, "mean_holding_s": 1.0,
                     "requests": requests, "bitrate_gbps": [50], "seed": seed},
    }


def test_erlang_b_recursion() -> None:
    assert erlang_b(1.0, 1) == pytest.approx(0.5)
    assert erlang_b(2.0, 2) == pytest.approx(2 / 5)  # (A^2/2) / (1 + A + A^2/2)
    assert erlang_b(10.0, 10) == pytest.approx(0.21459, abs=1e-5)
    assert erlang_b(0.0, 3) == 0.0


@pytest.mark.parametrize(("load", "slots"), [(3.0, 4), (8.0, 10), (20.0, 24), (50.0, 60)])
def test_blocking_matches_erlang_b(load: float, slots: int) -> None:
    s = simulate_lightpaths(parse_scenario(one_fibre(load, slots, 40_000, seed=11)))
    lo, hi = s["blocking_ci95"]
    b = erlang_b(load, slots)
    assert lo <= b <= hi, (s["blocking_ratio"], b, lo, hi)
    assert abs(s["blocking_ratio"] - b) < 0.25 * b + 0.005


def test_fixed_grid_rwa_matches_erlang_b() -> None:
    spec = one_fibre(12.0, 16, 40_000, seed=5, grid="fixed", wavelengths=16,
                     gbps_per_wavelength=100)
    spec["optical"].pop("slots")
    spec["workload"]["bitrate_gbps"] = [100]
    s = simulate_lightpaths(parse_scenario(spec))
    lo, hi = s["blocking_ci95"]
    assert lo <= erlang_b(12.0, 16) <= hi


@pytest.mark.parametrize("policy", ["last_fit", "random_fit", "best_fit"])
def test_policy_independent_for_one_slot_requests(policy: str) -> None:
    spec = one_fibre(8.0, 10, 30_000, seed=3)
    spec["policy"] = {"spectrum": policy}
    s = simulate_lightpaths(parse_scenario(spec))
    lo, hi = s["blocking_ci95"]
    assert lo <= erlang_b(8.0, 10) <= hi
