"""Runs of the compiled RMSA loop recorded from the kernel before the bit-parallel rewrite
(issue 57: uint8 slot array, request columns drawn by numpy in Python, commit 41c2313),
in tests/data/rmsa_kernel_recorded.json; tests/test_rmsa_kernel.py checks that today's
kernel gives the same summaries and requests.csv bytes. Regenerating the fixture from
newer code would defeat it.

The cases are optical-rl-gym's setting of bench/bench_rmsa.py (NSFNET, kSP-FF, 40 Erlang,
25..100 Gb/s, six formats, one guard slot, holding 10,800 s) at the bench's size
(1,000,000 requests, summary only) and smaller runs with requests.csv, plus grids whose
slot count is not two 64-bit words (64, 65, 130, 320 slots).
"""

from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path
from typing import Any

from testbed.sim import simulate_lightpaths
from testbed.spec import Scenario, parse_scenario

TIMING = ("wall_s", "requests_per_s")

ORLG_MODULATIONS = [  # optical-rl-gym examples/create_topology.py, 12.5 GHz x bits/symbol
    {"name": "BPSK", "reach_km": 100_000, "gbps_per_slot": 12.5},
    {"name": "QPSK", "reach_km": 2000, "gbps_per_slot": 25},
    {"name": "8QAM", "reach_km": 1000, "gbps_per_slot": 37.5},
    {"name": "16QAM", "reach_km": 500, "gbps_per_slot": 50},
    {"name": "32QAM", "reach_km": 250, "gbps_per_slot": 62.5},
    {"name": "64QAM", "reach_km": 125, "gbps_per_slot": 75},
]

# name: (k, slots, seed, requests, load_erlang, policy, requests.csv kept)
CASES: dict[str, tuple[int, int, int, int, float, str, bool]] = {
    "bench_k5_1M": (5, 80, 1, 1_000_000, 40.0, "first_fit", False),
    "bench_k1_1M": (1, 80, 2, 1_000_000, 40.0, "first_fit", False),
    "bench_k5_200k_csv": (5, 80, 3, 200_000, 40.0, "first_fit", True),
    "bench_k1_100k_csv": (1, 80, 4, 100_000, 40.0, "first_fit", True),
    "bench_k5_last_100k_csv": (5, 80, 5, 100_000, 40.0, "last_fit", True),
    "bench_k5_79slots_100k_csv": (5, 79, 6, 100_000, 40.0, "first_fit", True),
    "bench_k5_160E_50k_csv": (5, 80, 7, 50_000, 160.0, "first_fit", True),
    "k3_64slots_csv": (3, 64, 8, 40_000, 40.0, "first_fit", True),
    "k3_65slots_last_csv": (3, 65, 9, 40_000, 40.0, "last_fit", True),
    "k4_130slots_csv": (4, 130, 10, 40_000, 90.0, "first_fit", True),
    "k2_320slots_csv": (2, 320, 11, 40_000, 260.0, "first_fit", True),
    "k5_320slots_last_csv": (5, 320, 12, 40_000, 260.0, "last_fit", True),
}


def case_spec(k: int, slots: int, seed: int, requests: int, load: float,
              policy: str = "first_fit") -> dict[str, Any]:
    """The bench's scenario (bench/bench_rmsa.py runs it too), as a decoded spec."""
    return {
        "name": "rmsa-bench", "topology": {"library": "nsfnet"},
        "optical": {"grid": "flex", "slots": slots, "k_paths": k, "guard_slots": 1,
                    "modulations": ORLG_MODULATIONS},
        "workload": {"kind": "lightpath_requests", "load_erlang": load, "requests": requests,
                     "mean_holding_s": 10800.0, "bitrate_gbps": list(range(25, 101)),
                     "seed": seed},
        "policy": {"spectrum": policy}}


def case_scenario(k: int, slots: int, seed: int, requests: int, load: float,
                  policy: str) -> Scenario:
    return parse_scenario(case_spec(k, slots, seed, requests, load, policy))


def case_digest(name: str) -> dict[str, Any]:
    """The run's summary (timing left out) and, where kept, requests.csv's sha256."""
    k, slots, seed, requests, load, policy, keep = CASES[name]
    sc = case_scenario(k, slots, seed, requests, load, policy)
    digest = None
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "requests.csv" if keep else None
        summary = simulate_lightpaths(sc, path)
        if path is not None:
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
    return {"requests_csv_sha256": digest,
            "summary": {k: v for k, v in summary.items() if k not in TIMING}}
