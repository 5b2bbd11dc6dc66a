"""The faster RMSA hot paths give identical results: request streams, spectrum choices and
whole simulator runs (requests.csv byte for byte, summary) equal the code before the speed
work, recorded in tests/data/rmsa_speed_equal.json, on several seeds, loads, k and policies.

The fixture was written by the code of commit 1413546 (before the speed work) running
run_digest/stream_digest below; regenerating it from newer code would defeat it.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Iterator
from itertools import islice
from pathlib import Path
from typing import Any

import networkx as nx
import pytest

from testbed.optical.paths import k_shortest_paths
from testbed.optical.spectrum import POLICIES, choose_start, fitting_starts, free_runs
from testbed.sim import simulate_lightpaths
from testbed.sim.requests import poisson_requests
from testbed.spec import Scenario, parse_scenario
from testbed.spec.models import LightpathRequestsWorkload
from testbed.topologies import load_library
from tests.rmsa_kernel_cases import ORLG_MODULATIONS

FIXTURE = Path(__file__).parent / "data" / "rmsa_speed_equal.json"
TIMING = ("wall_s", "requests_per_s")  # measured, differ run to run

# optical-rl-gym's RMSA setting (bench/bench_rmsa.py): its 6-format table (ORLG_MODULATIONS),
# 1 guard slot, bitrates uniform on the integers 25..100 Gb/s.
ORLG_BITRATES = list(range(25, 101))


def scenario(k: int = 3, load: float = 40.0, policy: str = "first_fit", seed: int = 1,
             requests: int = 6000, orlg: bool = False, grid: str = "flex",
             sharing: str = "shared", events: bool = False, trace: str | None = None
             ) -> Scenario:
    optical: dict[str, Any] = {"grid": grid, "k_paths": k, "spectrum_sharing": sharing}
    if grid == "fixed":
        optical.update(wavelengths=40, gbps_per_wavelength=100)
    elif orlg:
        optical.update(slots=80, guard_slots=1, modulations=ORLG_MODULATIONS)
    else:
        optical.update(slots=80, guard_slots=0)
    spec: dict[str, Any] = {
        "name": "eq", "topology": {"library": "nsfnet"}, "optical": optical,
        "workload": {"kind": "lightpath_requests", "load_erlang": load, "requests": requests,
                     "mean_holding_s": 1.0, "seed": seed,
                     "bitrate_gbps": ORLG_BITRATES if orlg else [100, 200, 400]},
        "policy": {"spectrum": policy},
    }
    if trace is not None:
        spec["workload"] = {"kind": "lightpath_requests", "trace": trace}
    if events:
        spec["events"] = [
            {"at_s": 30.0, "kind": "fiber_cut", "link": ["9", "10"]},
            {"at_s": 60.0, "kind": "wavelength_loss", "link": ["1", "2"], "first_slot": 0,
             "slots": 20},
            {"at_s": 80.0, "kind": "fiber_repair", "link": ["9", "10"]},
            {"at_s": 90.0, "kind": "wavelength_repair", "link": ["1", "2"], "first_slot": 0,
             "slots": 20},
        ]
    return parse_scenario(spec)


# Whole runs recorded from the code before the speed work (see rmsa_speed_equal.json).
CASES: dict[str, dict[str, Any]] = {
    "orlg_k5_40E_s1": {"k": 5, "orlg": True, "seed": 1, "requests": 20_000},
    "orlg_k5_40E_s2": {"k": 5, "orlg": True, "seed": 2, "requests": 20_000},
    "orlg_k1_40E_s1": {"k": 1, "orlg": True, "seed": 1, "requests": 20_000},
    "orlg_k1_40E_s3": {"k": 1, "orlg": True, "seed": 3, "requests": 20_000},
    "orlg_k5_120E_s1": {"k": 5, "orlg": True, "load": 120.0, "seed": 1},
    "orlg_k2_60E_s4": {"k": 2, "orlg": True, "load": 60.0, "seed": 4},
    "k3_10E_first": {"k": 3, "load": 10.0, "seed": 5},
    "k3_25E_last": {"k": 3, "load": 25.0, "policy": "last_fit", "seed": 6},
    "k3_25E_random": {"k": 3, "load": 25.0, "policy": "random_fit", "seed": 7},
    "k3_25E_best": {"k": 3, "load": 25.0, "policy": "best_fit", "seed": 8},
    "k5_fixed_first": {"k": 5, "load": 60.0, "grid": "fixed", "seed": 9},
    "k3_per_direction": {"k": 3, "load": 30.0, "sharing": "per_direction", "seed": 10},
    "k3_events_first": {"k": 3, "load": 20.0, "events": True, "seed": 11},
    "k3_events_random": {"k": 3, "load": 20.0, "events": True, "policy": "random_fit",
                         "seed": 12},
    "orlg_k5_trace": {"k": 5, "orlg": True, "trace_seed": 13},  # a request trace CSV
}

# Request streams recorded from the code before the speed work.
STREAMS: dict[str, dict[str, Any]] = {
    "orlg_s1": {"orlg": True, "seed": 1, "requests": 50_000},
    "default_s9": {"seed": 9, "requests": 50_000, "load": 3.5},
    "one_bitrate": {"seed": 123456789, "requests": 20_000, "load": 700.0},
}


def run_digest(**kw: Any) -> dict[str, Any]:
    """sha256 of requests.csv and the summary (timing fields left out) of one run."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        trace_seed = kw.pop("trace_seed", None)
        if trace_seed is not None:  # 8,000 requests of the reference generator, as a trace
            wl, nodes = _stream_workload(**kw, seed=trace_seed, requests=8000, load=60.0)
            trace = Path(tmp) / "trace.csv"
            trace.write_text("id,arrival_s,holding_s,src,dst,bitrate_gbps\n" + "".join(
                f"{r[0]},{r[1]!r},{r[2]!r},{r[3]},{r[4]},{r[5]}\n"
                for r in ref_poisson_requests(wl, nodes)))
            kw["trace"] = str(trace)
        csv_path = Path(tmp) / "requests.csv"
        summary = simulate_lightpaths(scenario(**kw), csv_path)
        digest = hashlib.sha256(csv_path.read_bytes()).hexdigest()
    return {"requests_csv_sha256": digest,
            "summary": {k: v for k, v in summary.items() if k not in TIMING}}


def _stream_workload(**kw: Any) -> tuple[LightpathRequestsWorkload, list[str]]:
    sc = scenario(**kw)
    wl = sc.workload
    assert isinstance(wl, LightpathRequestsWorkload)
    if kw.get("seed") == 123456789:
        wl = wl.model_copy(update={"bitrate_gbps": [40.0]})
    return wl, [str(i) for i in range(1, 15)]


def stream_digest(**kw: Any) -> dict[str, Any]:
    """sha256 over the repr of every request tuple, and the last request."""
    wl, nodes = _stream_workload(**kw)
    h = hashlib.sha256()
    last: tuple[Any, ...] = ()
    for req in poisson_requests(wl, nodes):
        h.update(repr(req).encode())
        last = req
    return {"sha256": h.hexdigest(), "last": repr(last)}


@pytest.fixture(scope="module")
def recorded() -> dict[str, Any]:
    return json.loads(FIXTURE.read_text())


def test_fixture_covers_every_case(recorded: dict[str, Any]) -> None:
    assert set(recorded["runs"]) == set(CASES)
    assert set(recorded["streams"]) == set(STREAMS)


@pytest.mark.parametrize("name", sorted(CASES))
def test_run_equals_recorded(name: str, recorded: dict[str, Any]) -> None:
    got = run_digest(**CASES[name])
    want = recorded["runs"][name]
    assert got["summary"] == want["summary"]
    assert got["requests_csv_sha256"] == want["requests_csv_sha256"]


@pytest.mark.parametrize("name", sorted(STREAMS))
def test_stream_equals_recorded(name: str, recorded: dict[str, Any]) -> None:
    assert stream_digest(**STREAMS[name]) == recorded["streams"][name]


# ---- reference implementations: the code before the speed work, kept verbatim in effect --
def ref_poisson_requests(workload: LightpathRequestsWorkload, endpoints: list[str],
                         rng: random.Random | None = None
                         ) -> Iterator[tuple[int, float, float, str, str, float]]:
    rng = rng or random.Random(workload.seed)
    hold = workload.mean_holding_s
    rate = workload.load_erlang / hold
    n = len(endpoints)
    bitrates = list(workload.bitrate_gbps)
    t = 0.0
    for rid in range(workload.requests):
        t += rng.expovariate(rate)
        i = int(rng.random() * n)
        j = int(rng.random() * (n - 1))
        if j >= i:
            j += 1
        yield (rid, t, rng.expovariate(1.0 / hold), endpoints[i], endpoints[j],
               bitrates[int(rng.random() * len(bitrates))])


def ref_choose_start(free: int, n_slots: int, policy: str,
                     rng: random.Random | None = None) -> int | None:
    """Slot-by-slot scan (no bit tricks): what every policy means."""
    slots = free.bit_length()
    starts = [i for i in range(max(0, slots - n_slots + 1))
              if all(free >> (i + d) & 1 for d in range(n_slots))]
    if not starts:
        return None
    if policy == "first_fit":
        return starts[0]
    if policy == "last_fit":
        return starts[-1]
    if policy == "random_fit":
        assert rng is not None
        return starts[rng.randrange(len(starts))]
    runs = []
    i = 0
    while i < slots:
        if free >> i & 1:
            j = i
            while j < slots and free >> j & 1:
                j += 1
            runs.append((i, j - i))
            i = j
        else:
            i += 1
    fit = [r for r in runs if r[1] >= n_slots]
    return min(fit, key=lambda r: (r[1], r[0]))[0]


@pytest.mark.parametrize("name", sorted(STREAMS))
def test_stream_equals_reference(name: str) -> None:
    wl, nodes = _stream_workload(**STREAMS[name])
    wl = wl.model_copy(update={"requests": 7_777})  # not a multiple of any batch size
    assert list(poisson_requests(wl, nodes)) == list(ref_poisson_requests(wl, nodes))
    rng_a, rng_b = random.Random(5), random.Random(5)
    assert list(poisson_requests(wl, nodes, rng_a)) == list(ref_poisson_requests(wl, nodes,
                                                                               rng_b))
    assert rng_a.random() == rng_b.random()  # the caller's rng is left in the same state


def test_given_rng_shared_between_requests() -> None:
    """A caller's rng may be drawn from between requests: same requests and draws as before."""
    wl, nodes = _stream_workload(orlg=True, seed=3, requests=5000)
    rng_a, rng_b = random.Random(8), random.Random(8)
    got = [(req, rng_a.random()) for req in poisson_requests(wl, nodes, rng_a)]
    want = [(req, rng_b.random()) for req in ref_poisson_requests(wl, nodes, rng_b)]
    assert got == want


def test_stream_is_lazy_and_short_streams_equal() -> None:
    wl, nodes = _stream_workload(orlg=True, seed=3, requests=1)
    for n in (1, 2, 3, 1000, 4097):
        w = wl.model_copy(update={"requests": n})
        assert list(poisson_requests(w, nodes)) == list(ref_poisson_requests(w, nodes))
    big = wl.model_copy(update={"requests": 10_000_000})
    head = list(islice(poisson_requests(big, nodes), 5))
    assert head == list(islice(ref_poisson_requests(big, nodes), 5))


@pytest.mark.parametrize("policy", POLICIES)
def test_choose_start_equals_reference(policy: str) -> None:
    gen = random.Random(2024)
    rng_a, rng_b = random.Random(1), random.Random(1)
    for _ in range(3000):
        slots = gen.choice([1, 4, 16, 80, 130])
        busy = gen.getrandbits(slots) & gen.getrandbits(slots)  # sparse-ish
        free = ((1 << slots) - 1) & ~busy
        n = gen.randint(1, min(slots, 12))
        got = choose_start(free, n, policy, rng_a)
        assert got == ref_choose_start(free, n, policy, rng_b), (free, n)
        starts = fitting_starts(free, n)
        assert (starts == 0) == (got is None)
        assert sum(length for _, length in free_runs(free)) == free.bit_count()


def test_k_shortest_paths_equal_networkx() -> None:
    g = load_library("nsfnet").graph()
    for src in ("1", "5", "14"):
        for dst in ("2", "10", "13"):
            if src == dst:
                continue
            want = [list(p) for p in islice(nx.shortest_simple_paths(g, src, dst,
                                                                     weight="length_km"), 5)]
            assert k_shortest_paths(g, src, dst, 5) == want
            assert k_shortest_paths(g, src, dst, 1) == want[:1]
    assert k_shortest_paths(g, "1", "99", 3) == []


def test_orlg_setting_slot_needs() -> None:
    """The bench's setting: 100 Gb/s on a <= 125 km path is 64QAM, 2 data slots + 1 guard."""
    from testbed.optical import OpticalNetwork

    net = OpticalNetwork.from_scenario(scenario(orlg=True, k=5))
    p = net.path_info(["13", "14"])  # 150 km: 32QAM
    assert p.modulation == "32QAM" and net.slots_needed(100, p) == 2 + 1
    assert net.slots_needed(25, p) == 1 + 1
    far = net.path_info(["1", "8"])  # 2,400 km: only BPSK (100,000 km) reaches
    assert far.modulation == "BPSK" and net.slots_needed(100, far) == 8 + 1


# ---- the model equals optical-rl-gym's ----------------------------------------------------
@pytest.mark.parametrize("k", [5, 1])
def test_decisions_equal_optical_rl_gym(k: int) -> None:
    """optical-rl-gym's own requests and kSP-FF decisions (recorded from the real peer,
    tests/data/orlg_decisions.json) replayed on OpticalNetwork with the peer's candidate
    paths: every accept/block, route and first slot is the same. The peer's first fit
    scans range(0, slots - n), so never uses the top slot: 79 slots here; at 80 some differ.
    """
    from heapq import heappop, heappush

    from testbed.optical import OpticalNetwork

    data = json.loads((FIXTURE.parent / "orlg_decisions.json").read_text())
    rows = data[f"k{k}"]

    def replay(slots: int) -> tuple[int, int]:
        optical = scenario(k=k, orlg=True).optical.model_copy(update={"slots": slots})
        net = OpticalNetwork(load_library("nsfnet"), optical)
        paths: dict[tuple[str, str], list[Any]] = {}
        for key, routes in data["ksp"].items():
            a, b = key.split(",")
            paths[(a, b)] = paths[(b, a)] = [net.path_info(r) for r in routes[:k]]
        live: list[tuple[float, int, Any]] = []
        differ = blocked = 0
        for arrival, holding, src, dst, bitrate, accepted, route, first in rows:
            while live and live[0][0] <= arrival:
                net.release(heappop(live)[2])
            lp = net.allocate(src, dst, bitrate_gbps=bitrate, paths=paths[(src, dst)])
            if lp is None:
                blocked += 1
                differ += accepted != 0
                continue
            heappush(live, (arrival + holding, lp.id, lp))
            nodes = route.split("-")
            differ += not (accepted == 1 and lp.first_slot == first
                           and list(lp.nodes) in (nodes, nodes[::-1]))
        return differ, blocked

    differ, blocked = replay(79)
    assert differ == 0
    assert blocked == sum(1 - r[5] for r in rows) > 0
    assert replay(80)[0] > 0  # the top slot matters: the fixture can tell the two apart
