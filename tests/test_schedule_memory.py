"""Memory in bytes (testbed.schedule.memory) and schedules at one byte budget (budget.py)."""

from __future__ import annotations

import pytest

from testbed.catalog import MODELS
from testbed.errors import InputError
from testbed.schedule.budget import measure, one_f_one_b_budget, one_f_one_b_peaks, optimal
from testbed.schedule.memory import (
    MemoryModel,
    StageMemory,
    layer_activation_bytes,
    layer_params,
    layer_wgrad_bytes,
    memory_model,
)
from testbed.schedule.model import Hop, PipelineProblem
from testbed.schedule.registry import SCHEDULES, build_schedule
from testbed.schedule.timer import time_schedule

INTRA = Hop(0.005, 400.0)


def _cut(p: int, m: int, lat: float, bw: float = 100.0) -> PipelineProblem:
    hops = tuple(Hop(lat, bw) if h == p // 2 - 1 else INTRA for h in range(p - 1))
    return PipelineProblem((10.0,) * p, (20.0,) * p, hops, 50.0, m)


def test_gpt3_layer_matches_the_published_formulas() -> None:
    g = MODELS["gpt3-175b"]
    s, h = g.seq_len, g.hidden
    assert layer_params(g) == 12 * h * h
    assert layer_activation_bytes(g) == 34 * s * h  # Korthikanti et al., micro-batch 1
    assert layer_activation_bytes(g, store_attention_scores=True) == \
        34 * s * h + 5 * g.heads * s * s
    assert layer_wgrad_bytes(g) == 32 * s * h  # zero-bubble paper's M_W
    mm = memory_model(g, 4, tensor_parallel=8)
    # 24 layers per stage, 16 B per parameter, embedding on stage 0, LM head on stage 3
    assert mm.stages[1].static_bytes == 24 * 12 * h * h * 16 // 8
    assert mm.stages[0].static_bytes == (24 * 12 * h * h + g.vocab * h) * 16 // 8
    assert mm.stages[0].activation_bytes == 24 * 34 * s * h // 8


def test_gated_mlp_counts_three_matrices() -> None:
    ll = MODELS["llama2-7b"]
    assert layer_params(ll) == 4 * ll.hidden ** 2 + 3 * ll.hidden * ll.ffn_hidden
    assert layer_wgrad_bytes(ll) < layer_activation_bytes(ll)


@pytest.mark.parametrize("name", ["1f1b", "gpipe", "geopipe"])
def test_peak_bytes_of_unsplit_schedules_follow_the_timer_count(name: str) -> None:
    prob = _cut(4, 8, 10.0)
    mm = memory_model(MODELS["gpt3-6.7b"], 4, 2)
    sched = build_schedule(name, prob)
    peaks = time_schedule(prob, sched).peak_inflight
    assert mm.peak_bytes(sched) == [st.static_bytes + k * st.activation_bytes
                                    for st, k in zip(mm.stages, peaks, strict=True)]


def test_split_is_never_slower_nor_larger() -> None:
    prob = _cut(4, 8, 20.0)
    mm = memory_model(MODELS["gpt3-175b"], 4, 8)
    for name in ("1f1b", "gpipe", "geopipe"):
        sched = build_schedule(name, prob)
        split = sched.split()
        assert split.split_backward
        assert time_schedule(prob, split).iteration_time_ms <= \
            time_schedule(prob, sched).iteration_time_ms + 1e-9
        assert all(a <= b for a, b in zip(mm.peak_bytes(split), mm.peak_bytes(sched),
                                          strict=True))


def test_zb_h1_fits_1f1b_bytes_and_gpipe_does_not() -> None:
    prob = _cut(4, 8, 10.0)
    mm = memory_model(MODELS["gpt3-175b"], 4, 8)
    budget = one_f_one_b_budget(prob, mm)
    assert budget == max(one_f_one_b_peaks(prob, mm))
    assert measure(prob, mm, build_schedule("zb-h1", prob), budget).fits
    assert not measure(prob, mm, build_schedule("gpipe", prob), budget).fits


def test_budget_too_small_is_one_line_error() -> None:
    mm = MemoryModel((StageMemory(100, 10, 8),) * 2)
    assert mm.microbatch_caps(135) == [3, 3]
    with pytest.raises(InputError, match="stage 0"):
        mm.microbatch_caps(105)


# Small synthetic memory models: static, activations A and W buffers M_W per stage.
MODELS_SMALL = [
    MemoryModel((StageMemory(100, 10, 8),) * 3),
    MemoryModel((StageMemory(120, 10, 9), StageMemory(100, 10, 9), StageMemory(110, 10, 9))),
]


@pytest.mark.parametrize("lat", [0.0, 15.0, 40.0])
@pytest.mark.parametrize("mm", MODELS_SMALL)
@pytest.mark.parametrize("strict", [False, True])
def test_optimum_never_beaten_at_the_same_byte_budget(lat: float, mm: MemoryModel,
                                                      strict: bool) -> None:
    """crosspipe-opt within a byte budget is at least as fast as every registered
    schedule that fits it, built freely or under the budget's micro-batch caps."""
    prob = _cut(3, 6, lat)
    peaks = one_f_one_b_peaks(prob, mm)
    budget = peaks if strict else max(peaks)
    opt = optimal(prob, mm, budget, time_limit_s=10.0)
    mine = measure(prob, mm, opt, budget)
    assert mine.fits
    assert opt.info["solver_status"] == "OPTIMAL" and opt.info["gap"] == 0.0
    caps = mm.microbatch_caps(budget)
    checked = 0
    for name in SCHEDULES:
        if name == "crosspipe-opt":
            continue
        for p in (prob, prob.with_memory_cap(caps)):
            try:
                sched = build_schedule(name, p)
            except InputError:  # e.g. interleaved needs m % p == 0
                continue
            other = measure(prob, mm, sched, budget)
            if other.fits:
                checked += 1
                assert mine.iteration_time_ms <= other.iteration_time_ms + 1e-6, name
    assert checked >= 6
    # the exact unsplit optimum at the same caps is a hint, so never better
    assert mine.iteration_time_ms <= opt.info["unsplit_opt_ms"] + 1e-6


@pytest.mark.parametrize("mm", MODELS_SMALL)
def test_optimum_out_of_time_falls_back_to_the_best_heuristic(mm: MemoryModel) -> None:
    """A solve that finds nothing in its time (a loaded machine; here a 1 us limit) still
    returns a schedule within the budget, no slower than the best heuristic that fits:
    the unsplit solve gets a hint even where the best fitting heuristic is split (it
    failed the whole command with "CP-SAT found no schedule (UNKNOWN)")."""
    from testbed.schedule.budget import best_fitting

    prob = _cut(3, 6, 15.0)
    budget = one_f_one_b_peaks(prob, mm)
    hint = best_fitting(prob, mm, budget)
    assert hint.schedule.split_backward  # the case that had no unsplit hint
    opt = optimal(prob, mm, budget, time_limit_s=1e-6)
    mine = measure(prob, mm, opt, budget)
    assert mine.fits and mine.iteration_time_ms <= hint.iteration_time_ms + 1e-9
    assert opt.info["unsplit_opt_ms"] is not None
    # an answer the solver did not prove says so: a gap against its bound, never "none"
    if opt.info["solver_status"] != "OPTIMAL":
        assert opt.info["gap"] is not None and 0.0 < opt.info["gap"] <= 1.0, opt.info
        assert opt.info["objective_ms"] is not None


def test_registry_opt_with_split_backward_never_loses_to_zb_h1() -> None:
    prob = _cut(4, 8, 20.0).with_memory_cap([4, 3, 2, 1])
    opt = build_schedule("crosspipe-opt", prob, split_backward=True, time_limit_s=10.0)
    zb = build_schedule("zb-h1", prob)
    assert time_schedule(prob, opt).iteration_time_ms <= \
        time_schedule(prob, zb).iteration_time_ms + 1e-6


def test_byte_budget_needs_split_backward() -> None:
    from testbed.schedule.cpsat import solve
    prob = _cut(3, 4, 5.0)
    with pytest.raises(InputError, match="split_backward"):
        solve(prob, memory=MODELS_SMALL[0], budget_bytes=[200, 200, 200])
