"""The compiled RMSA loop (testbed/sim/rmsa_kernel.py) gives the same records as the pure-Python
loop it replaces: requests.csv byte for byte, the summary, the statistics and the network's
slot bitmaps at the end, on first and last fit, both grids, both sharing modes, k = 1..5,
traces and request counts that fill no batch; and without numba the Python loop runs.
"""

from __future__ import annotations

import logging
import math
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from testbed.optical import OpticalNetwork
from testbed.optical.spectrum import choose_start
from testbed.progress import progress
from testbed.sim import engine, rmsa_kernel, simulate_lightpaths
from tests.test_rmsa_speed_equal import TIMING, ref_poisson_requests, scenario

numba = pytest.importorskip("numba")

CASES: dict[str, dict[str, Any]] = {
    "orlg_k5": {"k": 5, "orlg": True, "seed": 21, "requests": 30_000},
    "orlg_k1": {"k": 1, "orlg": True, "seed": 22, "requests": 30_000},
    "orlg_k5_last": {"k": 5, "orlg": True, "seed": 23, "policy": "last_fit"},
    "orlg_k2_150E": {"k": 2, "orlg": True, "load": 150.0, "seed": 24},
    "k3_odd_count": {"k": 3, "load": 12.0, "seed": 25, "requests": 9_001},
    "k4_tiny": {"k": 4, "load": 12.0, "seed": 26, "requests": 7},
    "k3_last_25E": {"k": 3, "load": 25.0, "policy": "last_fit", "seed": 27},
    "fixed_k5": {"k": 5, "load": 60.0, "grid": "fixed", "seed": 28},
    "fixed_last": {"k": 2, "load": 60.0, "grid": "fixed", "seed": 29, "policy": "last_fit"},
    "per_direction": {"k": 3, "load": 30.0, "sharing": "per_direction", "seed": 30},
    "trace": {"k": 5, "orlg": True, "trace_seed": 31},
    # ~6,000 distinct bitrates (the (format, bitrate) slot table grows many times)
    "trace_float_bitrates": {"k": 3, "orlg": True, "trace_seed": 32, "jitter": True},
}


def run(name: str, compiled: bool, tmp: Path, monkeypatch: pytest.MonkeyPatch
        ) -> tuple[bytes, dict[str, Any], int]:
    """requests.csv, the summary without timing, and how often the compiled loop ran."""
    kw = dict(CASES[name])
    calls = []
    real = engine._loop_compiled

    def counted(*a: Any, **k: Any) -> dict[str, Any]:
        calls.append(1)
        return real(*a, **k)

    monkeypatch.setattr(engine, "_loop_compiled", counted)
    monkeypatch.setenv("LIGHTPIPE_RMSA_KERNEL", "1" if compiled else "0")
    trace_seed = kw.pop("trace_seed", None)
    jitter = random.Random(5).random if kw.pop("jitter", False) else (lambda: 0)
    if trace_seed is not None:  # the generator's requests at a high load, as a trace file
        sc = scenario(**kw, seed=trace_seed, requests=6000, load=90.0)
        nodes = [str(i) for i in range(1, 15)]
        trace = tmp / "trace.csv"
        trace.write_text("id,arrival_s,holding_s,src,dst,bitrate_gbps\n" + "".join(
            f"{r[0] * 3},{r[1]!r},{r[2]!r},{r[3]},{r[4]},{r[5] + jitter()!r}\n"
            for r in ref_poisson_requests(sc.workload, nodes)))  # type: ignore[arg-type]
        kw["trace"] = str(trace)
    out = tmp / f"requests_{int(compiled)}.csv"
    summary = simulate_lightpaths(scenario(**kw), out)
    return out.read_bytes(), {k: v for k, v in summary.items() if k not in TIMING}, len(calls)


@pytest.mark.parametrize("name", sorted(CASES))
def test_compiled_equals_python_loop(name: str, tmp_path: Path,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    csv_py, sum_py, calls_py = run(name, False, tmp_path, monkeypatch)
    csv_c, sum_c, calls_c = run(name, True, tmp_path, monkeypatch)
    assert (calls_py, calls_c) == (0, 1)  # each loop really ran
    assert sum_c == sum_py
    assert csv_c == csv_py
    assert sum_py["requests"] == csv_py.count(b"\n") - 1 > 0


def test_random_and_best_fit_and_events_keep_the_python_loop(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    monkeypatch.setattr(engine, "_loop_compiled", lambda *a, **k: calls.append(1))
    for kw in ({"policy": "random_fit"}, {"policy": "best_fit"}, {"events": True}):
        s = simulate_lightpaths(scenario(k=3, load=20.0, seed=3, requests=2000, **kw))
        assert s["requests"] == 2000
    assert calls == []


def _stats_and_masks(compiled: bool, **kw: Any) -> tuple[dict[str, Any], tuple[Any, ...]]:
    sc = scenario(**kw)
    net = OpticalNetwork.from_scenario(sc)
    total = sc.workload.requests  # type: ignore[union-attr]
    with progress(total, "t", True) as bar:
        if compiled:
            tables, chunks = engine._chunks(sc, net, iter(()), rmsa_kernel.neg_log1m)
            st = engine._loop_compiled(net, tables, chunks, total,
                                       sc.policy.spectrum == "last_fit", None, bar, 20)
        else:
            router = engine._Router(net, sc.policy.spectrum, random.Random(0))
            stream, _ = engine.request_stream(sc, net)
            st = engine._loop_plain(net, router, stream, total, None, bar, 20)
    occ, busy, blocked = net.slot_masks()
    return st, (list(occ), list(busy), list(blocked))


@pytest.mark.parametrize("policy", ["first_fit", "last_fit"])
def test_statistics_and_end_state_equal(policy: str) -> None:
    """Every statistic (time-weighted area, batch ratios, reasons) and the slot bitmaps
    of the lightpaths still live at the end."""
    kw = {"k": 5, "orlg": True, "seed": 41, "requests": 12_345, "policy": policy,
          "load": 80.0}
    st_py, masks_py = _stats_and_masks(False, **kw)
    st_c, masks_c = _stats_and_masks(True, **kw)
    assert st_c == st_py
    assert masks_c == masks_py
    assert st_py["live_at_end"] > 0 and any(masks_py[1])
    assert len(st_py["batch_ratios"]) == 20


def test_fit_scans_equal_choose_start() -> None:
    """The kernel's slot scans against spectrum.choose_start on random masks of several
    fibres (continuity): lowest and highest start of an n-slot free block, or none."""
    gen = random.Random(7)
    for _ in range(4000):
        slots = gen.choice([1, 5, 64, 80, 130])
        n_sp = gen.randint(1, 4)
        busy_bits = [gen.getrandbits(slots) & gen.getrandbits(slots) & gen.getrandbits(slots)
                     for _ in range(n_sp)]
        busy = np.array([[m >> j & 1 for j in range(slots)] for m in busy_bits], np.uint8)
        sp = np.arange(n_sp, dtype=np.int32)
        n = gen.randint(1, min(slots, 12))
        union = 0
        for m in busy_bits:
            union |= m
        free = ((1 << slots) - 1) & ~union
        for policy, scan in (("first_fit", rmsa_kernel._first_start),
                             ("last_fit", rmsa_kernel._last_start)):
            want = choose_start(free, n, policy)
            got = scan(busy, sp, 0, n_sp, n, slots)
            assert got == (-1 if want is None else want), (policy, busy_bits, n)


def test_neg_log1m_is_libm_log() -> None:
    """The compiled -log(1 - u) gives math.log's bits (the request stream depends on it)."""
    u = np.random.default_rng(3).random(200_000)
    u[:6] = [0.0, 5e-324, 2.0 ** -53, 0.5, 1.0 - 2.0 ** -53, 0.999999]
    want = np.array([-math.log(1.0 - x) for x in u.tolist()])
    got = rmsa_kernel.neg_log1m(u)
    assert got.tobytes() == want.tobytes()
    assert rmsa_kernel.neg_log1m(u[::5]).tobytes() == want[::5].tobytes()  # strided view


def test_without_numba_the_python_loop_runs(monkeypatch: pytest.MonkeyPatch,
                                            caplog: pytest.LogCaptureFixture,
                                            tmp_path: Path) -> None:
    csv_c, sum_c, _ = run("k3_odd_count", True, tmp_path, monkeypatch)
    monkeypatch.setattr(rmsa_kernel, "numba", None)
    monkeypatch.setattr(rmsa_kernel, "_logged", False)
    with caplog.at_level(logging.INFO, logger="testbed.sim.rmsa_kernel"):
        csv_a, sum_a, calls_a = run("k3_odd_count", True, tmp_path, monkeypatch)
        csv_b, _, calls_b = run("k3_odd_count", True, tmp_path, monkeypatch)
    assert calls_a == calls_b == 0
    assert (csv_a, sum_a) == (csv_c, sum_c) and csv_b == csv_c
    said = [r.getMessage() for r in caplog.records if "numba" in r.getMessage()]
    assert said == ["numba is not installed: dynamic RMSA runs use the pure-Python loop"]


def test_dc_endpoints_equal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Requests between data centres only (workload.endpoints: dcs): a subset of the nodes."""
    from testbed.spec import parse_scenario

    spec = {"name": "dcs", "topology": {"library": "nsfnet"},
            "dcs": [{"name": f"dc{n}", "node": n, "gpus": 8} for n in ("1", "5", "9", "13")],
            "optical": {"grid": "flex", "slots": 40, "k_paths": 2},
            "workload": {"kind": "lightpath_requests", "endpoints": "dcs", "load_erlang": 15,
                         "requests": 5000, "mean_holding_s": 2.0, "seed": 8},
            "policy": {"spectrum": "first_fit"}}
    got = []
    for flag in ("0", "1"):
        monkeypatch.setenv("LIGHTPIPE_RMSA_KERNEL", flag)
        out = tmp_path / f"r{flag}.csv"
        s = simulate_lightpaths(parse_scenario(spec), out)
        got.append((out.read_bytes(), {k: v for k, v in s.items() if k not in TIMING}))
    assert got[0] == got[1]
    nodes = {line.split(b",")[1] for line in got[0][0].splitlines()[1:]}
    assert nodes == {b"1", b"5", b"9", b"13"} and got[0][1]["blocked"] > 0
