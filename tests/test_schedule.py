"""Schedule engine: exact timer, generators, validator, bounds, CP-SAT optimum."""

from __future__ import annotations

import itertools
import random
import signal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from testbed.errors import InputError
from testbed.schedule import (
    Action,
    Hop,
    PipelineProblem,
    Schedule,
    ScheduleError,
    build_schedule,
    get_schedule,
    lower_bound_ms,
    schedule_names,
    simulate,
    time_schedule,
    validate,
)
from testbed.schedule.greedy import list_schedule


@settings(max_examples=40, deadline=None)
@given(p=st.integers(1, 8), m=st.integers(1, 12), f=st.floats(0.1, 50), b=st.floats(0.1, 50))
def test_no_delay_uniform_gpipe_1f1b_formula(p: int, m: int, f: float, b: float) -> None:
    prob = PipelineProblem.uniform(p, m, f, b)
    want = (m + p - 1) * (f + b)
    for name in ("gpipe", "1f1b"):
        t = simulate(name, prob)
        assert t.iteration_time_ms == pytest.approx(want, rel=1e-9)
        assert t.bubble_ratio == pytest.approx((p - 1) / (m + p - 1), abs=1e-9)
    assert lower_bound_ms(prob) == pytest.approx(want, rel=1e-9)


def test_peak_inflight_gpipe_and_1f1b() -> None:
    prob = PipelineProblem.uniform(4, 8, 1, 2)
    assert simulate("gpipe", prob).peak_inflight == [8, 8, 8, 8]
    assert simulate("1f1b", prob).peak_inflight == [4, 3, 2, 1]


def test_hand_checked_latency_single_microbatch() -> None:
    prob = PipelineProblem.uniform(2, 1, 1.0, 2.0, latency_ms=5.0)
    t = simulate("1f1b", prob)
    # F0@0 0-1, arrives 6, F 6-7, B 7-9, gradient arrives 14, B 14-16
    assert t.iteration_time_ms == pytest.approx(16.0)
    assert t.bubble_ratio == pytest.approx(1 - 6 / 32)
    starts = [(o.stage, str(o.action), o.start_ms) for o in t.ops]
    assert (1, "F0", 6.0) in starts and (0, "B0", 14.0) in starts


def test_hand_checked_latency_1f1b_two_microbatches() -> None:
    prob = PipelineProblem.uniform(2, 2, 1.0, 1.0, latency_ms=2.0)
    t = simulate("1f1b", prob)
    assert t.iteration_time_ms == pytest.approx(10.0)
    assert t.bubble_ratio == pytest.approx(0.6)


def test_hand_checked_bandwidth_bottleneck() -> None:
    # 1 MB over 2 Gb/s = 4 ms per transfer; FIFO queueing on each direction.
    prob = PipelineProblem.uniform(2, 3, 1.0, 1.0, bandwidth_gbps=2.0, activation_mb=1.0)
    assert simulate("gpipe", prob).iteration_time_ms == pytest.approx(28.0)
    t = simulate("1f1b", prob)
    assert t.iteration_time_ms == pytest.approx(24.0)
    fwd = [x for x in t.transfers if x.link == "h0+"]
    assert [(x.start_ms, x.arrive_ms) for x in fwd] == [(1.0, 5.0), (5.0, 9.0), (13.0, 17.0)]


def test_transfers_are_fifo_and_wait_for_ready() -> None:
    prob = PipelineProblem((1, 2, 1.5), (2, 3, 2), (Hop(3, 10), Hop(1, 50)), (20, 5), 6)
    for name in ("gpipe", "1f1b", "crosspipe-greedy", "geopipe"):
        t = simulate(name, prob)
        by_link: dict[str, list] = {}
        for x in t.transfers:
            by_link.setdefault(x.link, []).append(x)
            assert x.start_ms >= x.ready_ms - 1e-12
            assert x.arrive_ms == pytest.approx(x.leave_ms + prob.hops[int(x.link[1])].latency_ms)
        for xs in by_link.values():
            for a, b in itertools.pairwise(xs):
                assert b.start_ms >= a.leave_ms - 1e-12


def test_interleaved_no_delay_bubble_shrinks_by_v() -> None:
    p, m, f, b = 4, 8, 1.0, 2.0
    for v in (1, 2, 4):
        prob = PipelineProblem.uniform(p, m, f, b)
        t = time_schedule(prob, build_schedule("interleaved-1f1b", prob, virtual_stages=v))
        assert t.iteration_time_ms == pytest.approx(m * (f + b) + (p - 1) * (f + b) / v)


def test_interleaved_needs_multiple_of_p() -> None:
    prob = PipelineProblem.uniform(4, 6, 1, 2)
    with pytest.raises(InputError, match="multiple"):
        build_schedule("interleaved-1f1b", prob)


def test_interleaved_uses_wrap_link_with_latency() -> None:
    prob = PipelineProblem.uniform(2, 2, 1.0, 1.0, latency_ms=1.0)
    t = time_schedule(prob, build_schedule("interleaved-1f1b", prob, virtual_stages=2))
    links = {x.link for x in t.transfers}
    assert {"h0+", "h0-", "wrap+", "wrap-"} <= links
    assert t.iteration_time_ms >= lower_bound_ms(prob, virtual_stages=2) - 1e-9


def test_zero_bubble_splits_backward_and_beats_1f1b() -> None:
    prob = PipelineProblem.uniform(4, 8, 1.0, 2.0)
    sched = build_schedule("zero-bubble", prob)
    assert sched.split_backward
    t = time_schedule(prob, sched)
    assert t.iteration_time_ms < simulate("1f1b", prob).iteration_time_ms
    assert t.iteration_time_ms >= lower_bound_ms(prob, split_backward=True) - 1e-9
    assert all(pk <= 4 - s for s, pk in enumerate(t.peak_inflight))
    ops = {str(o.action) for o in t.stage_ops(0)}
    assert {"I0", "W0"} <= ops and "B0" not in ops


def test_weight_grad_fraction_sets_durations() -> None:
    prob = PipelineProblem.uniform(1, 1, 1.0, 4.0, weight_grad_fraction=0.25)
    t = time_schedule(prob, Schedule.from_strings("x", ["F0 I0 W0"]))
    durs = {str(o.action): o.end_ms - o.start_ms for o in t.ops}
    assert durs == {"F0": 1.0, "I0": 3.0, "W0": 1.0}


def test_validator_rejects_deadlock() -> None:
    prob = PipelineProblem.uniform(2, 2, 1, 1)
    bad = Schedule.from_strings("bad", ["F0 B0 F1 B1", "F0 F1 B0 B1"])
    with pytest.raises(ScheduleError, match="deadlock"):
        validate(prob, bad)
    with pytest.raises(ScheduleError, match="before F0"):
        validate(prob, Schedule.from_strings("bad", ["B0 F0 F1 B1", "F0 B0 F1 B1"]))


def test_validator_rejects_memory_cap_and_structure() -> None:
    prob = PipelineProblem.uniform(2, 4, 1, 1, memory_cap=2)
    gp = build_schedule("gpipe", prob)
    with pytest.raises(ScheduleError, match="memory cap"):
        validate(prob, gp)
    with pytest.raises(ScheduleError, match="missing B3"):
        validate(prob, Schedule.from_strings("x", ["F0 B0 F1 B1 F2 B2 F3", "F0 B0"]))
    with pytest.raises(ScheduleError, match="twice"):
        validate(prob, Schedule.from_strings("x", ["F0 F0", "F0"]))
    with pytest.raises(ScheduleError, match="stage lists"):
        validate(prob, Schedule.from_strings("x", ["F0 B0"]))
    assert validate(prob, build_schedule("1f1b", prob)) == [2, 1]


def test_action_strings_round_trip() -> None:
    for text in ("F3", "B0", "I12", "W7", "F3@1", "B2@3"):
        assert str(Action.parse(text)) == text
    with pytest.raises(ScheduleError):
        Action.parse("X1")
    s = build_schedule("interleaved-1f1b", PipelineProblem.uniform(2, 2, 1, 1))
    assert Schedule.from_dict(s.to_dict()).actions == s.actions


def test_registry_lists_valid_names() -> None:
    assert set(schedule_names()) == {"gpipe", "1f1b", "interleaved-1f1b", "zb-h1",
                                     "crosspipe-greedy", "crosspipe-opt", "geopipe"}
    with pytest.raises(InputError, match="valid: gpipe, 1f1b"):
        get_schedule("nope")
    with pytest.raises(InputError, match="not an option"):
        build_schedule("1f1b", PipelineProblem.uniform(2, 2, 1, 1), foo=1)


def test_problem_rejects_bad_values() -> None:
    with pytest.raises(InputError, match="forward_ms"):
        PipelineProblem((1, -1), (1, 1), (Hop(),), 1.0, 2)
    with pytest.raises(InputError, match="hops"):
        PipelineProblem((1, 1), (1, 1), (), 1.0, 2)
    with pytest.raises(InputError, match="bandwidth_gbps"):
        Hop(0, 0)
    with pytest.raises(InputError, match="microbatches"):
        PipelineProblem.uniform(2, 0, 1, 1)
    with pytest.raises(InputError, match="memory_cap"):
        PipelineProblem.uniform(2, 2, 1, 1, memory_cap=0)


def _random_problem(rng: random.Random, p: int, m: int, cap: int | None) -> PipelineProblem:
    hops = tuple(Hop(rng.choice([0.0, 0.5, 3.0, 10.0]), rng.choice([10.0, 50.0, 400.0]))
                 for _ in range(p - 1))
    return PipelineProblem(tuple(rng.uniform(0.5, 3) for _ in range(p)),
                           tuple(rng.uniform(1, 5) for _ in range(p)), hops,
                           rng.choice([1.0, 10.0, 25.0]), m, cap)


@pytest.mark.parametrize("seed", range(6))
def test_greedy_is_exact_and_respects_cap(seed: int) -> None:
    rng = random.Random(seed)
    prob = _random_problem(rng, rng.randint(2, 5), rng.randint(1, 8), rng.choice([None, 1, 2, 3]))
    for rule in ("nondelay", "lookahead"):
        for split in (False, True):
            sched, t_sim = list_schedule(prob, rule=rule, split_backward=split)
            t = time_schedule(prob, sched)
            assert t.iteration_time_ms == pytest.approx(t_sim, rel=1e-12)


@pytest.mark.parametrize("seed", range(5))
def test_optimum_between_lower_bound_and_heuristics(seed: int) -> None:
    rng = random.Random(100 + seed)
    cap = rng.choice([None, 2, 3])
    prob = _random_problem(rng, 3, 4, cap)
    opt = build_schedule("crosspipe-opt", prob, time_limit_s=20)
    assert opt.info["solver_status"] == "OPTIMAL" and opt.info["gap"] == 0.0
    t_opt = time_schedule(prob, opt).iteration_time_ms
    assert t_opt >= lower_bound_ms(prob) - 1e-6
    assert t_opt == pytest.approx(opt.info["objective_ms"], abs=0.01)
    for name in ("gpipe", "1f1b", "crosspipe-greedy", "geopipe"):
        try:
            t = simulate(name, prob).iteration_time_ms
        except ScheduleError:
            continue  # over the memory cap: not a competitor
        assert t_opt <= t + 1e-6, name
    split = build_schedule("crosspipe-opt", prob, time_limit_s=20, split_backward=True)
    t_split = time_schedule(prob, split).iteration_time_ms
    assert t_split >= lower_bound_ms(prob, split_backward=True) - 1e-6
    if cap is None or cap >= 3:
        assert t_split <= simulate("zb-h1", prob).iteration_time_ms + 1e-6


def test_optimum_hides_latency_better_than_1f1b() -> None:
    prob = PipelineProblem.uniform(4, 8, 1.0, 2.0, latency_ms=5, bandwidth_gbps=100,
                                   activation_mb=50)
    opt = simulate("crosspipe-opt", prob, time_limit_s=20)
    assert opt.iteration_time_ms < 0.7 * simulate("1f1b", prob).iteration_time_ms


def test_geopipe_equals_1f1b_without_delay_and_helps_with_latency() -> None:
    prob = PipelineProblem.uniform(4, 16, 1.0, 2.0)
    assert simulate("geopipe", prob).iteration_time_ms == pytest.approx(
        simulate("1f1b", prob).iteration_time_ms)
    lat = PipelineProblem((1.0,) * 4, (2.0,) * 4, (Hop(0.01), Hop(10.0), Hop(0.01)), 10.0, 16)
    g = simulate("geopipe", lat)
    assert g.iteration_time_ms < simulate("1f1b", lat).iteration_time_ms
    small = simulate("geopipe", lat, buffer_microbatches=5)
    assert max(small.peak_inflight) <= 5
    assert g.iteration_time_ms <= small.iteration_time_ms


def test_optimum_leaves_ctrl_c_to_python() -> None:
    """CP-SAT's own SIGINT handler (on by default) left SIGINT at SIG_DFL in the kernel
    after each solve: the next Ctrl-C killed the process without its clean-up."""
    from tests.sigstate import os_disposition, python_disposition

    assert python_disposition(signal.SIGINT) == "caught"
    assert os_disposition(signal.SIGINT) == "caught"
    prob = PipelineProblem.uniform(3, 4, 1.0, 2.0, latency_ms=5, bandwidth_gbps=100,
                                   activation_mb=50)
    build_schedule("crosspipe-opt", prob, time_limit_s=20)
    assert os_disposition(signal.SIGINT) == "caught"
