"""The compiled RMSA loop (testbed/sim/rmsa_kernel.py) gives the same records as the pure-Python
loop it replaces: requests.csv byte for byte, the summary, the statistics and the network's
slot bitmaps at the end, on first and last fit, both grids, both sharing modes, k = 1..5,
traces and request counts that fill no batch; the same records as the kernel before the
bit-parallel rewrite (recorded: tests/rmsa_kernel_cases.py), from the ahead-of-time module
and from numba's JIT; the stream it draws equals requests.poisson_columns' bit for bit;
and without numba the Python loop runs.
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
from testbed.sim.requests import poisson_columns
from testbed.spec import parse_scenario
from testbed.spec.models import LightpathRequestsWorkload
from tests.rmsa_kernel_cases import CASES as RECORDED_CASES
from tests.rmsa_kernel_cases import case_digest
from tests.test_rmsa_speed_equal import TIMING, ref_poisson_requests, scenario

RECORDED = Path(__file__).parent / "data" / "rmsa_kernel_recorded.json"

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
            tables, source = engine._sources(sc, net, iter(()))
            st = engine._loop_compiled(net, tables, source, total,
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
    """The kernel's slot scans over 64-bit words against spectrum.choose_start on random
    masks of several fibres (continuity, the words ORed as the kernel does): lowest and
    highest start of an n-slot free block, or none; grids of 1 to 5 words."""
    rmsa_kernel._compile_namespace()
    gen = random.Random(7)
    for _ in range(6000):
        slots = gen.choice([1, 5, 63, 64, 65, 80, 127, 128, 130, 320])
        n_sp = gen.randint(1, 4)
        busy_bits = [gen.getrandbits(slots) & gen.getrandbits(slots) & gen.getrandbits(slots)
                     for _ in range(n_sp)]
        n_words = -(-slots // 64)
        busy = np.array([[m >> (64 * w) & (2 ** 64 - 1) for w in range(n_words)]
                         for m in busy_bits], np.uint64)
        sp = np.arange(n_sp, dtype=np.int32)
        uni = np.zeros(n_words, np.uint64)
        rmsa_kernel._union(busy, sp, 0, n_sp, n_words, uni)
        n = gen.randint(1, min(slots, 70))
        union = 0
        for m in busy_bits:
            union |= m
        assert [int(x) for x in uni] == [union >> (64 * w) & (2 ** 64 - 1)
                                         for w in range(n_words)]
        free = ((1 << slots) - 1) & ~union
        for policy, scan in (("first_fit", rmsa_kernel._first_start),
                             ("last_fit", rmsa_kernel._last_start)):
            want = choose_start(free, n, policy)
            got = scan(uni, n_words, n, slots)
            assert got == (-1 if want is None else want), (policy, busy_bits, n)


def test_set_block_sets_and_clears_exactly_the_block() -> None:
    rmsa_kernel._compile_namespace()
    gen = random.Random(8)
    for _ in range(2000):
        slots = gen.choice([5, 64, 65, 130, 320])
        n_words = -(-slots // 64)
        busy = np.zeros((3, n_words), np.uint64)
        n = gen.randint(1, slots)
        f = gen.randint(0, slots - n)
        sp = np.array([2, 0], np.int32)
        rmsa_kernel._set_block(busy, sp, 0, 2, f, n, True)
        words = [sum(int(busy[s, w]) << (64 * w) for w in range(n_words)) for s in range(3)]
        assert words == [((1 << n) - 1) << f, 0, ((1 << n) - 1) << f]
        rmsa_kernel._set_block(busy, sp, 1, 2, f, n, False)  # (sp[1]: spectrum 0 only)
        words = [sum(int(busy[s, w]) << (64 * w) for w in range(n_words)) for s in range(3)]
        assert words == [0, 0, ((1 << n) - 1) << f]


@pytest.mark.parametrize("advance", [0, 3, 311, 312, 400])
def test_drawn_stream_equals_poisson_columns(advance: int) -> None:
    """The requests the kernel draws (arrival, holding, src, dst, bitrate index) are
    requests.poisson_columns' (numpy's MT19937 and math.log) bit for bit, also from a
    generator state part-way through its words."""
    wl = LightpathRequestsWorkload(kind="lightpath_requests", load_erlang=37.0,
                                   mean_holding_s=3.5, requests=20_000,
                                   bitrate_gbps=[10.0, 40.0, 100.0, 40.0, 400.0], seed=11)
    rng = random.Random(wl.seed)
    for _ in range(advance):
        rng.random()  # 2 words each: the position stays even
    n_end = 9
    want = [np.concatenate(c) for c in zip(*(cols[1:] for cols in poisson_columns(
        wl, n_end, _copy(rng))), strict=True)]
    kernel = rmsa_kernel.load()
    assert kernel is not None
    mt, dbuf, pos = rmsa_kernel.mt_state(rng.getstate()[1])
    m = wl.requests
    f8, i4, i8 = np.float64, np.int32, np.int64
    st_i, st_f = rmsa_kernel.new_state()
    st_i[rmsa_kernel.MT_POS] = pos
    st_i[rmsa_kernel.BLEFT] = -1
    st_f[rmsa_kernel.GEN_RATE] = wl.load_erlang / wl.mean_holding_s
    st_f[rmsa_kernel.GEN_LAM_HOLD] = 1.0 / wl.mean_holding_s
    outs = [np.zeros(m, i4) for _ in range(3)]
    cols = [np.zeros(m, f8), np.zeros(m, f8), np.zeros(m, i4), np.zeros(m, i4),
            np.zeros(m, i4)]
    one = np.zeros(1, i4)  # one pair table with no route: every request blocked
    nf, ni, ni8 = np.empty(0, f8), np.empty(0, i4), np.empty(0, i8)
    for at, end in ((0, m // 3), (m // 3, m)):  # two calls: the state carries over
        status = kernel.run(True, end - at, nf, nf, ni, ni, nf, mt, dbuf, n_end,
                            np.zeros(n_end * n_end, i4), np.arange(5, dtype=i4),
                            np.array(wl.bitrate_gbps), one, one, one, ni, ni, ni,
                            np.zeros(1, i4), np.zeros((1, 1), i4), np.zeros((1, 1), np.uint64),
                            8, False, np.zeros(1, np.uint64), np.zeros(8, f8),
                            np.zeros(8, i8), st_i, st_f, ni8, ni8, True,
                            *(o[at:] for o in outs), *(c[at:] for c in cols))
        assert status == 0
    assert cols[0].tobytes() == want[0].tobytes()  # arrival_s
    assert cols[1].tobytes() == want[1].tobytes()  # holding_s
    for got, ref in zip(cols[2:], want[2:], strict=True):  # src, dst, bitrate index
        assert got.tolist() == ref.tolist()
    assert int(st_i[rmsa_kernel.NBLOCKED]) == m and (outs[0] == -1).all()


def _copy(rng: random.Random) -> random.Random:
    out = random.Random()
    out.setstate(rng.getstate())
    return out


def test_mt_state_rejects_an_odd_position() -> None:
    rng = random.Random(1)
    rng.getrandbits(32)
    with pytest.raises(ValueError, match="odd"):
        rmsa_kernel.mt_state(rng.getstate()[1])


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
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "cache"))  # no module built there
    monkeypatch.setattr(rmsa_kernel, "_numba_installed", lambda: False)
    monkeypatch.setattr(rmsa_kernel, "_kernel", None)
    monkeypatch.setattr(rmsa_kernel, "_logged", False)
    with caplog.at_level(logging.INFO, logger="testbed.sim.rmsa_kernel"):
        csv_a, sum_a, calls_a = run("k3_odd_count", True, tmp_path, monkeypatch)
        csv_b, _, calls_b = run("k3_odd_count", True, tmp_path, monkeypatch)
    assert calls_a == calls_b == 0
    assert (csv_a, sum_a) == (csv_c, sum_c) and csv_b == csv_c
    said = [r.getMessage() for r in caplog.records if "numba" in r.getMessage()]
    assert said == ["numba is not installed: dynamic RMSA runs use the pure-Python loop"]


def test_failed_build_falls_back_to_the_jit_once(monkeypatch: pytest.MonkeyPatch,
                                                 caplog: pytest.LogCaptureFixture,
                                                 tmp_path: Path) -> None:
    """No C compiler: the ahead-of-time build fails, numba's JIT runs the same loop, and
    the failure is remembered (the next process does not try again)."""
    calls = []

    def no_compiler() -> Path:
        calls.append(1)
        raise OSError("error: command 'gcc' failed: No such file or directory")

    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(rmsa_kernel, "build_aot", no_compiler)
    for _ in range(2):  # as two processes
        monkeypatch.setattr(rmsa_kernel, "_kernel", None)
        with caplog.at_level(logging.INFO, logger="testbed.sim.rmsa_kernel"):
            kernel = rmsa_kernel.load()
        assert kernel is not None and kernel.how == "jit"
    assert calls == [1]
    assert list(tmp_path.glob("_rmsa_kernel_*.failed"))
    assert any("build failed" in r.getMessage() for r in caplog.records)


def test_ahead_of_time_module_loads_without_numba(tmp_path: Path) -> None:
    """A process that finds the built module never imports numba."""
    import subprocess
    import sys

    assert rmsa_kernel._find_aot(rmsa_kernel._module_name()) is not None or \
        rmsa_kernel.build_aot()
    code = ("import sys; from testbed.sim import rmsa_kernel as rk; k = rk.load(); "
            "print(k.how, 'numba' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).parents[1]).stdout.split()
    assert out == ["aot", "False"]
    assert rmsa_kernel.main([]) == 0


def test_a_build_removes_only_its_own_older_modules(tmp_path: Path) -> None:
    """Two venvs of one checkout (3.11 and 3.13) keep a module each: a build removes the
    same Python build's modules of older versions of the file, and the single-key ones of
    its extension suffix, never another Python's (which would then rebuild on every run)."""
    import importlib.machinery

    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    name = rmsa_kernel._module_name()
    own = rmsa_kernel.build_key()
    other = "0" * 12 if own != "0" * 12 else "1" * 12
    keep = [f"{name}{suffix}", f"{name}.lock",
            f"_rmsa_kernel_{other}_{rmsa_kernel.source_key()}.cpython-399-x86_64-linux-gnu.so",
            f"_rmsa_kernel_{other}_{'a' * 12}.lock",
            f"_rmsa_kernel_{'b' * 16}.cpython-399-x86_64-linux-gnu.so"]
    gone = [f"_rmsa_kernel_{own}_{'c' * 12}{suffix}", f"_rmsa_kernel_{own}_{'c' * 12}.lock",
            f"_rmsa_kernel_{own}_{'d' * 12}.failed", f"_rmsa_kernel_{'e' * 16}{suffix}"]
    for n in keep + gone:
        (tmp_path / n).write_text("")
    removed = rmsa_kernel._remove_older_builds(tmp_path, name)
    assert sorted(p.name for p in removed) == sorted(gone)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(keep)


@pytest.fixture(scope="module")
def recorded() -> dict[str, Any]:
    import json

    return json.loads(RECORDED.read_text())["runs"]


@pytest.mark.parametrize("name", sorted(RECORDED_CASES))
def test_equals_the_kernel_before(name: str, recorded: dict[str, Any]) -> None:
    """The bench's setting at its size (1,000,000 requests) and smaller runs with
    requests.csv, as the uint8 kernel before the bit-parallel rewrite recorded them."""
    assert set(recorded) == set(RECORDED_CASES)
    assert case_digest(name) == recorded[name]


@pytest.mark.parametrize("name", ["bench_k5_200k_csv", "k5_320slots_last_csv",
                                  "k3_65slots_last_csv"])
def test_jit_equals_the_kernel_before(name: str, recorded: dict[str, Any],
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """numba's JIT (the fallback without a C compiler) runs the same functions."""
    monkeypatch.setenv("LIGHTPIPE_RMSA_KERNEL", "jit")
    monkeypatch.setattr(rmsa_kernel, "_kernel", None)
    assert rmsa_kernel.load().how == "jit"  # type: ignore[union-attr]
    assert case_digest(name) == recorded[name]


def both_loops(spec: dict[str, Any], tmp: Path, monkeypatch: pytest.MonkeyPatch
               ) -> list[tuple[bytes, dict[str, Any]]]:
    """requests.csv and the summary without timing, of the Python loop then the compiled."""
    got = []
    for flag in ("0", "1"):
        monkeypatch.setenv("LIGHTPIPE_RMSA_KERNEL", flag)
        out = tmp / f"r{flag}.csv"
        s = simulate_lightpaths(parse_scenario(spec), out)
        got.append((out.read_bytes(), {k: v for k, v in s.items() if k not in TIMING}))
    return got


def test_repeated_bitrates_equal_python_loop(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A bitrate listed twice: the stream's index into the list is mapped to the
    table's column of that bitrate (the kernel before read the column of the index)."""
    spec = {"name": "dup", "topology": {"library": "nsfnet"},
            "optical": {"grid": "flex", "slots": 80, "k_paths": 3},
            "workload": {"kind": "lightpath_requests", "load_erlang": 30, "requests": 6000,
                         "bitrate_gbps": [100, 100, 200, 400, 200], "seed": 3},
            "policy": {"spectrum": "first_fit"}}
    got = both_loops(spec, tmp_path, monkeypatch)
    assert got[0] == got[1] and got[0][1]["blocked"] > 0


def test_dc_endpoints_equal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Requests between data centres only (workload.endpoints: dcs): a subset of the nodes."""
    spec = {"name": "dcs", "topology": {"library": "nsfnet"},
            "dcs": [{"name": f"dc{n}", "node": n, "gpus": 8} for n in ("1", "5", "9", "13")],
            "optical": {"grid": "flex", "slots": 40, "k_paths": 2},
            "workload": {"kind": "lightpath_requests", "endpoints": "dcs", "load_erlang": 15,
                         "requests": 5000, "mean_holding_s": 2.0, "seed": 8},
            "policy": {"spectrum": "first_fit"}}
    got = both_loops(spec, tmp_path, monkeypatch)
    assert got[0] == got[1]
    nodes = {line.split(b",")[1] for line in got[0][0].splitlines()[1:]}
    assert nodes == {b"1", b"5", b"9", b"13"} and got[0][1]["blocked"] > 0


def test_a_built_module_others_can_write_is_not_loaded(tmp_path) -> None:
    """The ahead-of-time module is native code: one that another user could have written
    (a group-writable file or directory, a link) is refused, a private one is accepted."""
    import os

    from testbed.sim import rmsa_kernel

    d = tmp_path / "cache"
    d.mkdir(mode=0o755)
    os.chmod(d, 0o755)
    mod = d / "m.so"
    mod.write_bytes(b"\0")
    os.chmod(mod, 0o644)
    assert rmsa_kernel._trusted_module(d, mod)
    os.chmod(mod, 0o664)
    assert not rmsa_kernel._trusted_module(d, mod)
    os.chmod(mod, 0o644)
    os.chmod(d, 0o775)
    assert not rmsa_kernel._trusted_module(d, mod)
    os.chmod(d, 0o755)
    link = d / "l.so"
    link.symlink_to(mod)
    assert not rmsa_kernel._trusted_module(d, link)
