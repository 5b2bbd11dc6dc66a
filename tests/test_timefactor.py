"""time_factor auto (testbed.emu.timefactor) and delays that hold for any traffic (each
lightpath calibrated on its own, centred between sparse and dense echoes): the
mechanisms, on model emulators and model paths (no network, no wall clock)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from testbed.emu.delaycal import PathRtt
from testbed.emu.scale import Scale
from testbed.emu.timefactor import (
    FACTOR_STEP,
    ComputeCost,
    PathCost,
    SlackCost,
    candidates,
    choose,
    compute_error,
    path_costs,
    path_error_ms,
)
from testbed.errors import InputError
from tests.model_links import model_links


def test_a_path_shorter_than_its_processing_needs_a_factor_above_one() -> None:
    """1.1 ms of processing per round trip on a 0.1 ms RTT fibre: at 1 the RTT is 1.0 ms
    off, so the smallest factor whose scenario-time error is within 0.8 ms is chosen."""
    p = PathCost("a~b", one_way_ms=0.05, excess_ms=1.1, spread_ms=0.1)
    c = choose([p], None, bound=20.0)
    assert c.fits and c.factor > 1 and c.binding_pair == "a~b"
    assert path_error_ms(p, c.factor) <= 0.8 < path_error_ms(p, c.factor - FACTOR_STEP)
    assert c.network_factor == c.factor and c.compute_factor == 1.0
    assert len(c.reasons) == 3 and c.reasons[-1].startswith(f"chosen {c.factor:g}")


def test_a_long_path_that_can_be_corrected_stays_at_one() -> None:
    p = PathCost("a~b", one_way_ms=5.0, excess_ms=1.1, spread_ms=0.2)
    assert choose([p], None, bound=20.0).factor == 1.0
    # What no correction takes off counts in scenario time: 1.6 ms needs 2 (0.8 at 2).
    q = dataclasses.replace(p, spread_ms=1.6)
    assert choose([q], None, bound=20.0).factor == 2.0


def test_compute_overrun_binds_in_scenario_time() -> None:
    """Ops of 4 ms (real) missing by 1 ms at every factor: 1 / (4 f) <= 0.8 x the
    verdict's 2.5 % op overrun (2 %) -> 12.5."""
    from testbed.emu.fidelity import MAX_OP_OVERRUN

    comp = ComputeCost(op_ms=4.0, overrun_ms=1.0, workers=4)
    c = choose([PathCost("a~b", 5.0, 1.0, 0.1)], comp, bound=20.0)
    assert c.factor == 12.5 and c.compute_factor == 12.5 and c.network_factor == 1.0
    assert compute_error(comp, 12.5) == pytest.approx(0.8 * MAX_OP_OVERRUN)
    assert "compute: 4 worker(s)" in c.reasons[1]


def test_forwarder_wake_ups_bind_in_scenario_time() -> None:
    """The forwarders woke 2.5 ms late at their p99 under load (emulated): within 0.8 x
    the verdict's 0.5 ms in scenario time needs 2.5 / 0.4 = 6.25; unmeasured, no bound."""
    from testbed.emu.fidelity import MAX_FORWARDER_SLACK_MS

    path, comp = PathCost("a~b", 5.0, 1.0, 0.1), ComputeCost(4.0, 0.05, 4)
    c = choose([path], comp, bound=20.0, slack=SlackCost(p99_ms=2.5, wakeups=9000))
    assert c.factor == 6.25 and c.slack_factor == 6.25 and c.compute_factor == 1.0
    assert 2.5 / c.factor <= 0.8 * MAX_FORWARDER_SLACK_MS < 2.5 / (c.factor - FACTOR_STEP)
    assert "forwarders: 9000 timed wake-ups" in c.reasons[2]
    assert c.reasons[-1].startswith("chosen 6.25")
    unmeasured = choose([path], comp, bound=20.0)
    assert unmeasured.factor == 1.0 and unmeasured.slack_factor is None
    late = choose([path], comp, bound=4.0, slack=SlackCost(p99_ms=25.0))
    assert not late.fits and late.slack_factor == -1.0 and "does NOT fit" in late.reasons[-1]


def test_slack_since_takes_the_burst_window_of_the_histograms() -> None:
    from testbed.emu.slack import BOUNDS_S, SlackHistogram
    from testbed.orchestrate.timescale import slack_cost, slack_since

    h = SlackHistogram()
    for _ in range(1000):
        h.observe(0.00003)
    before = h.as_record()
    for _ in range(95):
        h.observe(0.00003)
    for _ in range(5):
        h.observe(0.002)  # the burst's late wake-ups: 5 of its 100 (p99 in 2.5 ms bucket)
    got = slack_since(before, h.as_record())
    assert got == {"wakeups": 100, "p99_ms": 1e3 * BOUNDS_S[BOUNDS_S.index(0.0025)]}
    assert slack_cost({"forwarder_slack": got}) == SlackCost(2.5, 100)
    assert slack_since(before, before) is None and slack_since(None, before) is None
    assert slack_cost({"forwarder_slack": None}) is None


def test_when_the_bound_does_not_fit_the_run_says_so_and_the_way_out() -> None:
    p = PathCost("a~b", one_way_ms=0.05, excess_ms=30.0, spread_ms=10.0)
    c = choose([p], None, bound=4.0)
    assert not c.fits and c.factor == 4.0 and c.network_factor == -1.0
    assert "does NOT fit" in c.reasons[-1] and "VM" in c.reasons[-1]
    assert "several machines" in c.reasons[-1] and "more cores" in c.reasons[-1]
    with pytest.raises(ValueError, match="time_factor_max"):
        choose([p], None, bound=0.5)


def test_candidates_are_steps_up_to_the_bound() -> None:
    assert candidates(1.0, 2.0) == [1.0, 1.25, 1.5, 1.75, 2.0]
    assert candidates(1.0, 1.0) == [1.0]
    assert candidates(1.0, 1.1) == [1.0, 1.1]


def test_path_costs_from_a_calibration_record() -> None:
    """x_p over the rounds, the spread and the drift (between rounds, and what the
    kept round still had beyond the model's floor) as what no correction takes off."""
    row = {"pair": "a~b", "expected_rtt_ms": 3.0, "excess_ms": 1.2, "spread_ms": 0.2,
           "error_ms": 1.0}
    later = {**row, "excess_ms": 1.6, "error_ms": 0.1}
    rec = {"rounds": [{"paths": [row]}, {"paths": [later]}], "after": [later]}
    (p,) = path_costs(rec, start=1.0)
    assert p.one_way_ms == 1.5 and p.excess_ms == pytest.approx(1.4)  # over the rounds
    assert p.spread_ms == pytest.approx(0.2 + 0.2)  # (1.6 - 1.2) / 2 between rounds
    assert path_costs({"rounds": []}, 1.0) == []


def test_spec_time_factor_auto_is_the_default_and_numbers_still_work() -> None:
    from testbed.spec.models import EmulationSpec

    em = EmulationSpec()
    assert em.time_factor == "auto" and em.time_factor_max == 20.0
    assert Scale.is_auto(em) and Scale.of(em).time_factor == 1.0
    fixed = EmulationSpec(time_factor=2.5)
    assert not Scale.is_auto(fixed) and Scale.of(fixed).time_factor == 2.5
    for bad in ({"time_factor": "fast"}, {"time_factor": 0}, {"time_factor_max": 0.5}):
        with pytest.raises(ValueError):
            EmulationSpec(**bad)
    assert Scale(10.0, 1.0).with_time_factor(3.0) == Scale(10.0, 3.0)


def test_bad_time_factor_in_a_scenario_names_the_field() -> None:
    from testbed.spec import parse_scenario

    spec = {"name": "x", "topology": {"links": [{"u": "A", "v": "B", "length_km": 10}]},
            "workload": {"kind": "lightpath_requests"}, "emulation": {"time_factor": "fast"}}
    with pytest.raises(InputError, match="time_factor"):
        parse_scenario(spec)


def test_rescaled_plan_stretches_every_delay_and_carries_the_factor() -> None:
    from testbed.emu.plan import build_plan
    from testbed.orchestrate.timescale import rescaled_plan
    from testbed.spec import parse_scenario

    spec = {"name": "x", "topology": {"links": [{"u": "A", "v": "B", "length_km": 300}]},
            "dcs": [{"name": "dc-a", "node": "A", "gpus": 8},
                    {"name": "dc-b", "node": "B", "gpus": 8}],
            "workload": {"kind": "lightpath_requests"},
            "emulation": {"bandwidth_divisor": 10000, "hosts_per_dc": 1}}
    plan = build_plan(parse_scenario(spec))
    assert plan.scale.time_factor == 1.0 and plan.fibres[0].delay_ms == pytest.approx(1.5)
    big = rescaled_plan(plan, 4.0)
    assert big.scale == plan.scale.with_time_factor(4.0)
    assert big.fibres[0].delay_ms == pytest.approx(6.0)
    assert big.lightpaths[0].delay_ms == pytest.approx(4 * plan.lightpaths[0].delay_ms)
    assert big.fibres[0].rate_mbps == plan.fibres[0].rate_mbps


def test_a_fixed_factor_is_left_as_it_is() -> None:
    from testbed.orchestrate.timescale import apply_time_factor
    from testbed.spec.models import EmulationSpec

    @dataclasses.dataclass
    class Rp:
        scenario: Any

    @dataclasses.dataclass
    class Sc:
        emulation: Any

    rp = Rp(Sc(EmulationSpec(time_factor=3.0)))
    cal = {"enabled": True}
    assert apply_time_factor(rp, None, cal, True) == (rp, cal, {"mode": "fixed",
                                                                  "factor": 3.0})


# ---- delays that hold whatever the traffic: model emulators ------------------------------

# A path's processing per round trip as sparse echoes (20 ms apart) and a dense stream
# (2 ms apart) see it: busy bridges take less time per packet (measured on the hidden
# ring: 0.3-0.5 ms apart).
SPARSE_MS, DENSE_MS = 1.4, 0.9


def _ring_measure(links: dict[str, Any], paths: dict[str, tuple[tuple[str, ...], int]],
                  dense: bool) -> Any:
    def measure() -> list[PathRtt]:
        out = []
        for pair, (fibres, vlan) in paths.items():
            two_e = 2 * sum(links[f].emulated_delay_ms(vlan) for f in fibres)
            d = sum(links[f].fibre.delay_ms for f in fibres)
            out.append(PathRtt(pair, fibres, d, (two_e + SPARSE_MS,) * 9, vlan,
                               dense_rtts_ms=(two_e + DENSE_MS,) * 9 if dense else ()))
        return out
    return measure


def _errors(links: dict[str, Any], fibres: tuple[str, ...], vlan: int) -> tuple[float, float]:
    """(sparse, dense) RTT error of a path as the model network runs it now."""
    two_e = 2 * sum(links[f].emulated_delay_ms(vlan) for f in fibres)
    two_d = 2 * sum(links[f].fibre.delay_ms for f in fibres)
    return two_e + SPARSE_MS - two_d, two_e + DENSE_MS - two_d


def test_the_correction_is_centred_so_a_dense_stream_stays_in_band(tmp_path: Path) -> None:
    """Calibrated on sparse and dense echoes, both kinds of traffic land within half their
    gap (+-0.25 ms) of 2 x delay. Calibrated on sparse echoes alone (the old model), the
    dense stream runs 0.5 ms fast: outside that band."""
    from testbed.emu.calibrate import CalibrationConfig, calibrate

    band = (SPARSE_MS - DENSE_MS) / 2 + 0.01
    path = {"x~y": (("xy",), 101)}
    links = model_links(tmp_path, {"xy": 1.5})
    rec = calibrate(links, _ring_measure(links, path, dense=True), CalibrationConfig(pings=9))
    sparse, dense = _errors(links, ("xy",), 101)
    assert abs(sparse) <= band and abs(dense) <= band, (sparse, dense)
    assert rec["after"][0]["spread_ms"] == pytest.approx(0.25)
    assert rec["after"][0]["dense_median_ms"] is not None

    old = model_links(tmp_path, {"xy": 1.5})
    calibrate(old, _ring_measure(old, path, dense=False),
              CalibrationConfig(pings=9, dense_pings=0))
    sparse, dense = _errors(old, ("xy",), 101)
    assert abs(sparse) <= band and abs(dense) > band, (sparse, dense)


def test_each_fibre_is_calibrated_on_its_own_path_only(tmp_path: Path) -> None:
    """The ring x-y (direct) with the detour x-z-y unused: the lightpath's processing is
    taken off its own VLAN on its own fibre; the detour's fibres keep their delay and get
    nothing measured on x-y (before: every fibre had x-y's per-hop correction)."""
    from testbed.emu.calibrate import CalibrationConfig, calibrate

    links = model_links(tmp_path, {"xy": 1.5, "xz": 1.5, "zy": 1.5})
    rec = calibrate(links, _ring_measure(links, {"x~y": (("xy",), 101)}, dense=True),
                    CalibrationConfig(pings=9))
    assert rec["mode"] == "per_lightpath"
    assert set(rec["path_corrections_ms"]["x~y"]) == {"xy"}
    for k in ("xz", "zy"):
        assert links[k].vlan_corrections_ms == {} and links[k].emulated_delay_ms() == 1.5
    for f in rec["fibres"]:  # no fibre-wide correction: each lightpath has its own
        assert f["correction_ms"] == 0.0
    assert links["xy"].emulated_delay_ms(101) == pytest.approx(1.5 - (SPARSE_MS + DENSE_MS) / 4)
    assert links["xy"].emulated_delay_ms() == 1.5  # other lightpaths on x-y untouched


def test_forwarder_wake_lead_learns_the_lateness_within_bounds() -> None:
    """The forwarder asks to wake this long before a due frame: ~the 90th percentile of
    how late its timed wake-ups come, bounded (the poll after it costs at most that)."""
    from testbed.emu.forwarder import MAX_LEAD_S, MIN_LEAD_S, WakeLead

    w = WakeLead()
    for i in range(400):
        w.learn(0.00008 if i % 10 else 0.00016)  # 80 us, every tenth 160 us
    assert 0.00008 < w.lead_s < 0.00016
    for _ in range(400):
        w.learn(0.05)  # stalls: capped at 10 ms each, the lead at its bound
    assert w.lead_s == MAX_LEAD_S
    for _ in range(400):
        w.learn(-0.001)  # early wake-ups count as on time
    assert w.lead_s == MIN_LEAD_S


def _inv(name: str, value: float | None, threshold: float, ok: bool) -> dict[str, Any]:
    return {"name": name, "value": value, "threshold": threshold, "ok": ok}


def test_a_rerun_takes_the_factor_the_failed_dilatable_invariants_ask_for() -> None:
    """Ops 10 % late at 2 (bound 5 %): 2 x 0.10 / (0.8 x 0.05) = 5; forwarders 0.625 ms
    late (bound 0.5): 2 x 0.625 / 0.4 = 3.125 -> 3.25; the larger wins. A CPU share that
    failed too is named, never asked for."""
    from testbed.emu.timefactor import rerun_factor

    fid = {"faithful": False, "invariants": [
        _inv("worker_timer_slack", 0.10, 0.05, False),
        _inv("forwarder_timer_slack", 0.625, 0.5, False),
        _inv("worker_cpu_share", 0.6, 0.8, False),
        _inv("rtt_median_error", 0.2, 1.0, True)]}
    nxt, why = rerun_factor(fid, 2.0, 20.0)
    assert nxt == 5.0
    assert any("worker_timer_slack" in w and "asks for 5" in w for w in why)
    assert any("forwarder_timer_slack" in w and "asks for 3.25" in w for w in why)
    assert why[-1] == "not a matter of the factor: worker_cpu_share"
    assert rerun_factor(fid, 2.0, 4.0)[0] == 4.0  # capped at the bound
    at_bound, why = rerun_factor(fid, 4.0, 4.0)
    assert at_bound is None and "already at time_factor_max 4" in why[-1]
    only_cpu = {"invariants": [_inv("worker_cpu_share", 0.6, 0.8, False)]}
    assert rerun_factor(only_cpu, 2.0, 20.0) == (
        None, ["not a matter of the factor: worker_cpu_share"])
    assert rerun_factor({"faithful": True, "invariants": [
        _inv("worker_timer_slack", 0.01, 0.05, True)]}, 2.0, 20.0)[0] is None


def test_time_factor_floor_and_reruns_in_the_spec() -> None:
    from testbed.spec import parse_scenario

    base = {"name": "tf", "topology": {"links": [{"u": "A", "v": "B", "length_km": 10}]},
            "dcs": [{"name": "dc-a", "node": "A", "gpus": 8}],
            "workload": {"kind": "lightpath_requests"}}
    sc = parse_scenario({**base, "emulation": {"time_factor_min": 3}})
    assert sc.emulation.time_factor_reruns == 1
    assert Scale.of(sc.emulation).time_factor == 3.0  # auto starts at the floor
    assert Scale.of(parse_scenario(base).emulation).time_factor == 1.0
    fixed = parse_scenario({**base, "emulation": {"time_factor": 7, "time_factor_min": 3}})
    assert Scale.of(fixed.emulation).time_factor == 7.0
    with pytest.raises(InputError, match="time_factor_min"):
        parse_scenario({**base, "emulation": {"time_factor_min": 30, "time_factor_max": 20}})
    with pytest.raises(InputError, match="time_factor_reruns"):
        parse_scenario({**base, "emulation": {"time_factor_reruns": 9}})


def test_the_suite_can_turn_reruns_off(monkeypatch: pytest.MonkeyPatch) -> None:
    from testbed.backends.emu import RERUNS_ENV, reruns_allowed
    from testbed.spec.models import EmulationSpec

    em = EmulationSpec(time_factor_reruns=2)
    monkeypatch.delenv(RERUNS_ENV, raising=False)
    assert reruns_allowed(em) == 2
    monkeypatch.setenv(RERUNS_ENV, "0")
    assert reruns_allowed(em) == 0
    monkeypatch.setenv(RERUNS_ENV, "nine")
    assert reruns_allowed(em) == 2  # ignored, with a warning
