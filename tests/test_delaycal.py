"""The pure delay-calibration solve: per-fibre corrections from measured DC-pair RTTs."""

from __future__ import annotations

import random
from typing import Any

import pytest

from testbed.emu.delaycal import (
    PathRtt,
    emulated_delays,
    excess_ms,
    path_corrections,
    path_row,
    per_hop_ms,
    pooled,
    rtt_ok,
    settled,
    solve_corrections,
)


def _measure(paths: dict[str, tuple[str, ...]], delay_ms: dict[str, float],
             emulated: dict[str, float], proc_ms: dict[str, float], end_ms: float,
             rng: random.Random | None = None) -> list[PathRtt]:
    """RTTs a network would give: 2 x (emulated + per-fibre processing) + DC-end cost."""
    out = []
    for pair, fibres in paths.items():
        base = 2 * sum(emulated[f] + proc_ms[f] for f in fibres) + end_ms
        rtts = tuple(base + (rng.gauss(0, 0.05) if rng else 0.0) for _ in range(21))
        out.append(PathRtt(pair, fibres, sum(delay_ms[f] for f in fibres), rtts))
    return out


RING = {"a~b": ("ab",), "a~c": ("ab", "bc"), "a~d": ("ab", "bc", "cd"),
        "b~d": ("bc", "cd"), "c~d": ("cd",)}
DELAY = {"ab": 5.0, "bc": 3.0, "cd": 1.5, "da": 4.0}


def test_every_path_lands_on_its_configured_delay_after_one_solve() -> None:
    proc = {"ab": 0.6, "bc": 0.9, "cd": 0.4, "da": 0.7}
    emulated = dict(DELAY)
    before = _measure(RING, DELAY, emulated, proc, end_ms=0.8)
    assert max(p.error_ms for p in before) > 3.0  # grows with the hop count
    c = solve_corrections(before, DELAY, emulated)
    after = _measure(RING, DELAY, emulated_delays(DELAY, c), proc, end_ms=0.8)
    # A cost per path (the DCs' ends) cannot be split exactly over fibres shared by
    # paths of 1 to 3 hops: least squares leaves up to half of it (0.8 ms here).
    for p in after:
        assert abs(p.error_ms) < 0.45, (p.pair, p.error_ms)
    assert max(abs(p.error_ms) for p in after) < max(abs(p.error_ms) for p in before) / 8
    exact = _measure(RING, DELAY, emulated_delays(DELAY, solve_corrections(
        _measure(RING, DELAY, emulated, proc, end_ms=0.0), DELAY, emulated)), proc, 0.0)
    assert settled(exact, 0.05)
    # The fibre on no measured path gets the per-hop estimate, within its bound.
    assert 0 < c["da"] <= DELAY["da"]


def test_iterating_from_a_wrong_start_converges_with_noise() -> None:
    rng = random.Random(3)
    proc = {"ab": 1.1, "bc": 0.5, "cd": 0.3, "da": 0.2}
    emulated = {f: d - 0.9 for f, d in DELAY.items()}  # a previous guess (netem's lo)
    for _ in range(3):
        paths = _measure(RING, DELAY, emulated, proc, 0.5, rng)
        emulated = emulated_delays(DELAY, solve_corrections(paths, DELAY, emulated))
    final = _measure(RING, DELAY, emulated, proc, 0.5, rng)
    assert all(rtt_ok(p.median_ms, p.configured_ms, 0.3) for p in final)


def test_bounds_hold_and_a_short_fibre_gives_all_it_has() -> None:
    delay = {"x": 0.5, "y": 10.0}
    paths = [PathRtt("p~q", ("x",), 0.5, (1.0 + 3.0,) * 5)]  # 3 ms excess on 0.5 ms
    c = solve_corrections(paths, delay, delay)
    assert c["x"] == pytest.approx(0.5)  # the whole delay, no more
    assert 0 <= c["y"] <= 10.0
    half = solve_corrections(paths, delay, delay, max_fraction=0.5)
    assert half["x"] == pytest.approx(0.25)
    zero = solve_corrections(paths, {"x": 0.0, "y": 1.0}, {"x": 0.0, "y": 1.0})
    assert zero["x"] == 0.0


def test_a_shared_fibre_gets_one_value_fitting_both_paths() -> None:
    # Two paths share "s"; their own fibres differ in processing.
    paths = {"p": ("s", "u"), "q": ("s", "v"), "r": ("u",), "t": ("v",)}
    delay = {"s": 4.0, "u": 4.0, "v": 4.0}
    proc = {"s": 1.0, "u": 0.2, "v": 1.5}
    before = _measure(paths, delay, delay, proc, end_ms=0.0)
    c = solve_corrections(before, delay, delay)
    assert c["s"] == pytest.approx(1.0, abs=0.05)
    assert c["u"] == pytest.approx(0.2, abs=0.05)
    assert c["v"] == pytest.approx(1.5, abs=0.05)


def test_an_emulator_faster_than_configured_is_not_sped_up_further() -> None:
    delay = {"f": 5.0}
    paths = [PathRtt("a~b", ("f",), 5.0, (9.0,) * 5)]  # 1 ms below 2 x delay
    assert excess_ms(paths[0], delay) == pytest.approx(-1.0)
    assert per_hop_ms(paths, delay) == 0.0
    assert solve_corrections(paths, delay, delay) == {"f": 0.0}


def test_bad_input_names_the_path() -> None:
    with pytest.raises(ValueError, match=r"a~b.*zz"):
        solve_corrections([PathRtt("a~b", ("zz",), 1.0, (2.0,))], {"f": 1.0}, {"f": 1.0})
    with pytest.raises(ValueError, match="no RTT"):
        solve_corrections([PathRtt("a~b", ("f",), 1.0, ())], {"f": 1.0}, {"f": 1.0})
    with pytest.raises(ValueError, match="max_fraction"):
        solve_corrections([], {"f": 1.0}, {"f": 1.0}, max_fraction=2.0)


def test_rtt_band_and_record_row() -> None:
    assert rtt_ok(21.0, 10.0) and rtt_ok(19.0, 10.0)
    assert not rtt_ok(21.01, 10.0) and not rtt_ok(None, 10.0)
    row = path_row(PathRtt("a~b", ("f", "g"), 10.0, (20.5, 21.5, 20.0)))
    assert row["hops"] == 2 and row["median_ms"] == 20.5 and row["max_ms"] == 21.5
    assert row["error_ms"] == 0.5 and row["expected_rtt_ms"] == 20.0


def test_the_run_names_the_dc_pair_whose_rtt_fails() -> None:
    from testbed.orchestrate.run import first_failure

    ping = {"src": "dc-a-h0", "dst": "dc-b-h0", "sent": 20, "received": 20}
    rtt = {"pair": "dc-a~dc-b", "hops": 2, "median_ms": 41.7, "replies": 20,
           "expected_rtt_ms": 33.0, "tolerance_ms": 1.0, "ok": False}
    check = {"pings": [ping], "rtts": [rtt], "probes": [], "rtt_enforced": True}
    msg = first_failure(check)
    assert "dc-a~dc-b" in msg and "2 fibre hops" in msg and "41.7" in msg
    assert first_failure({**check, "rtt_enforced": False}) == "unknown"
    lossy = {**check, "rtts": [], "lossy": True, "pings": [{**ping, "received": 17}]}
    assert first_failure(lossy) == "unknown"  # some echoes lost on lossy fibres: fine
    assert "0/20" in first_failure({**lossy, "pings": [{**ping, "received": 0}]})
    # a probe held late: named where the delays are enforced; one off its route, always
    probe = {"vlan": 11, "src_host": "dc-a-h0", "dst_host": "dc-b-h0", "delivered": True,
             "hops_seen": ["m0"], "hops_expected": ["m0"], "one_way_ms": 9.9,
             "expected_ms": 3.0, "tolerance_ms": 6.0, "fibre_delay_ms": {"m0": 9.1},
             "route_ok": True, "delay_ok": False, "ok": False}
    late = {**check, "rtts": [], "probes": [probe], "delays_enforced": True}
    assert "VLAN 11" in first_failure(late) and "9.9 ms" in first_failure(late)
    assert first_failure({**late, "delays_enforced": False}) == "unknown"
    lost = {**late, "delays_enforced": False,
            "probes": [{**probe, "delivered": False, "route_ok": False}]}
    assert "delivered=False" in first_failure(lost)


def _verify_with(monkeypatch, link_mode: str, settles: list[bool], rtt_check: str = "auto"
                 ):  # type: ignore[no-untyped-def]
    """verify_network on a stand-in network whose one DC pair stays out of the band:
    every calibration again returns the next of `settles`; (check, calibrations run)."""
    import types

    from testbed.orchestrate import run

    out = {"pair": "dc-a~dc-b", "hops": 1, "median_ms": 9.0, "replies": 20,
           "expected_rtt_ms": 3.0, "tolerance_ms": 1.0, "ok": False}
    monkeypatch.setattr(run, "verify", lambda net, **kw: {
        "pings": [], "rtts": [dict(out)], "probes": [], "rtt_ok": False, "reach_ok": True,
        "routes_ok": True, "delays_ok": True, "lossy": False})
    again = iter(settles[1:])
    calls: list[int] = []

    def calibrate(net):  # type: ignore[no-untyped-def]
        calls.append(1)
        return {"enabled": True, "settled": next(again), "corrections_applied": 3}

    monkeypatch.setattr(run, "calibrate_network", calibrate)
    monkeypatch.setattr(run, "dc_pair_rtts", lambda net: ([], [dict(out)]))
    net = types.SimpleNamespace(link_mode=link_mode, datapath="user" if link_mode ==
                                "userspace" else "kernel")
    first = {"enabled": True, "settled": settles[0], "corrections_applied": 3}
    try:
        return run.verify_network(net, first, rtt_check), len(calls)
    except run.RuntimeFailure:
        return None, len(calls)


def test_an_unsettled_calibration_is_not_run_again_where_the_rtt_is_not_enforced(
        monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """User-space links (rtt_check auto: recorded, not enforced): a calibration that did
    not settle in its own rounds is not run again (each try cost ~20 s of a busy machine
    and changed nothing: timer noise, not drift); one that had settled, and so was undone
    by drift, is; where the RTT is enforced, every recheck runs, as before."""
    from testbed.orchestrate.run import RTT_RECHECKS

    check, calls = _verify_with(monkeypatch, "userspace", [False, False, False])
    assert calls == 0 and check is not None and not check["rtt_ok"]
    assert "did not settle" in check["rtt_recheck_skipped"]
    check, calls = _verify_with(monkeypatch, "userspace", [True, False, False])
    assert calls == 1 and check["rtt_rechecks"][0]["out_of_band"] == ["dc-a~dc-b"]
    assert "did not settle" in check["rtt_recheck_skipped"]
    check, calls = _verify_with(monkeypatch, "userspace", [True, True, True])
    assert calls == RTT_RECHECKS and check["rtt_recheck_skipped"] is None
    check, calls = _verify_with(monkeypatch, "netem", [False, False, False])  # enforced
    assert calls == RTT_RECHECKS and check is None  # and the run fails
    check, calls = _verify_with(monkeypatch, "userspace", [False, False, False], "enforce")
    assert calls == RTT_RECHECKS and check is None


def test_per_path_corrections_take_the_dc_ends_off_exactly() -> None:
    """A cost per path (its DCs' ends) that per-fibre values leave: the per-lightpath
    correction gives each path the rest, so every path lands on its delay."""
    proc = {"ab": 0.6, "bc": 0.9, "cd": 0.4, "da": 0.7}
    before = _measure(RING, DELAY, dict(DELAY), proc, end_ms=1.9)
    c = solve_corrections(before, DELAY, DELAY)
    shares = path_corrections(before, DELAY, c, DELAY)
    for p in before:
        run_at = sum(DELAY[f] - c[f] - shares[p.pair][f] for f in p.fibres)
        rtt = 2 * sum(DELAY[f] - c[f] - shares[p.pair][f] + proc[f] for f in p.fibres) + 1.9
        assert rtt - 2 * p.configured_ms == pytest.approx(0.0, abs=1e-3), p.pair
        assert all(c[f] + shares[p.pair][f] <= DELAY[f] + 1e-9 for f in p.fibres)
        assert run_at >= 0
    # The measured emulated sum of a path (its lightpath's own corrections in) is used.
    p = PathRtt("a~b", ("ab",), 5.0, (12.0,), vlan=101, emulated_ms=4.0)
    assert excess_ms(p, {"ab": 5.0}) == pytest.approx(4.0)
    # No room left on the path: nothing more than the fibres' delays is given back.
    tight = path_corrections([PathRtt("x~y", ("ab",), 5.0, (30.0,))], DELAY, {"ab": 5.0},
                             DELAY)
    assert tight == {"x~y": {"ab": 0.0}}
    # The shared values overshoot a path: its lightpath runs longer (a negative share).
    over = path_corrections([PathRtt("x~y", ("ab", "bc"), 8.0, (16.0,))], DELAY,
                            {"ab": 1.0, "bc": 1.0}, DELAY)
    assert over == {"x~y": {"ab": -1.0, "bc": -1.0}}


class _Out:
    """A forwarder direction's send socket that records (time set by the test, frame)."""

    def __init__(self) -> None:
        self.sent: list[tuple[float, bytes]] = []
        self.now = 0.0

    def send(self, frame: bytes) -> int:
        self.sent.append((self.now, frame))
        return len(frame)


def _data_path(rate_mbps: float, queue_bytes: int) -> tuple[Any, Any, _Out]:
    """(forwarder, its one direction, what it sent): the data path alone, no sockets,
    delay 10 ms."""
    from testbed.emu.forwarder import Direction, Forwarder

    fwd = Forwarder.__new__(Forwarder)
    fwd.rate_bps, fwd.delay_s, fwd.loss, fwd.down = rate_mbps * 1e6, 0.010, 0.0, False
    fwd.queue_bytes, fwd.rng = queue_bytes, random.Random(1)
    out = _Out()
    d = Direction("a_to_b", out)  # type: ignore[arg-type]
    fwd.dirs = {1: d}
    return fwd, d, out


def test_forwarder_runs_a_lightpath_shorter_without_blocking_behind_other_frames() -> None:
    """The forwarder's per-lightpath correction: its frames get their own delay line, so
    a frame due earlier is not held behind another lightpath's frame due later."""
    from testbed.emu.forwarder import VNET_HDR_LEN

    fwd, d, out = _data_path(1000.0, 10**6)
    fwd.set_vlan(101, 100.0)
    fwd.set_vlan(102, 100.0)
    fwd.set_vlan_correction(102, 2.0)
    assert d.vlans[102].line is not None and d.vlans[101].correction_s == 0.0

    def frame(vlan: int) -> bytes:
        eth = b"\x02" * 12 + b"\x81\x00" + vlan.to_bytes(2, "big") + b"\x08\x00"
        return bytes(VNET_HDR_LEN) + eth + bytes(60)

    fwd._arrive(d, frame(101), 0.0)   # due at ~10 ms
    fwd._arrive(d, frame(102), 0.0)   # due at ~8 ms: must leave first
    fwd._arrive(d, frame(7), 0.0)     # no cap: the fibre's delay
    for t_ms in range(0, 13):
        out.now = t_ms / 1000
        fwd._service(out.now)
    # 7 (no cap, done at the fibre's 1 Gb/s) is due before 101, whose lightpath (100
    # Mbit/s) is still sending it: store-and-forward at the lightpath's rate.
    assert [int.from_bytes(f[VNET_HDR_LEN + 14:VNET_HDR_LEN + 16], "big") & 0xFFF
            for _, f in out.sent] == [102, 7, 101]
    assert out.sent[0][0] == pytest.approx(0.008, abs=0.0011)
    assert out.sent[1][0] == pytest.approx(0.010, abs=0.0011)
    with pytest.raises(ValueError, match="vlan 5"):
        fwd.set_vlan_correction(5, 1.0)


def test_pooled_averages_each_paths_processing_over_rounds() -> None:
    r0 = [PathRtt("a~b", ("f",), 5.0, (12.0,), emulated_ms=5.0)]   # x = 2.0
    r1 = [PathRtt("a~b", ("f",), 5.0, (12.0,), emulated_ms=4.0)]   # x = 4.0
    (p,) = pooled([r0, r1])
    assert p.emulated_ms == 4.0 and excess_ms(p, {}) == pytest.approx(3.0)
    with pytest.raises(ValueError, match="emulated_ms"):
        pooled([[PathRtt("a~b", ("f",), 5.0, (12.0,))]])


def test_calibration_keeps_the_best_rounds_settings_when_a_later_round_is_worse(
        tmp_path: object) -> None:
    """A busy moment adds 3 ms to every path in the last round: the calibration puts
    every fibre back to the settings of its best round and records which one it kept."""
    from pathlib import Path

    from testbed.emu.calibrate import CalibrationConfig, calibrate
    from tests.model_links import model_links

    delay = {"ab": 5.0, "bc": 3.0, "cd": 1.5}
    links = model_links(Path(str(tmp_path)), delay)
    paths = {"a~b": (("ab",), 101), "a~c": (("ab", "bc"), 102), "b~d": (("bc", "cd"), 103)}
    proc = {"ab": 0.6, "bc": 0.9, "cd": 0.4}
    shifts = iter([0.0, 0.5, -0.4, 3.0])  # per round, common to every path

    def measure() -> list[PathRtt]:
        shift = next(shifts)
        return [PathRtt(pair, fibres, sum(delay[f] for f in fibres),
                        tuple([2 * sum(links[f].emulated_delay_ms(vlan) + proc[f]
                                       for f in fibres) + 1.0 + shift] * 9), vlan)
                for pair, (fibres, vlan) in paths.items()]

    rec = calibrate(links, measure, CalibrationConfig(pings=9, rounds=3))
    assert rec["corrections_applied"] == 3
    worst = [max(abs(p["error_ms"]) for p in r["paths"]) for r in rec["rounds"]]
    assert worst[3] > 2.5 and rec["kept_round"] == worst.index(min(worst)) != 3
    kept = rec["rounds"][rec["kept_round"]]
    assert rec["after"] == kept["paths"]
    for f in rec["fibres"]:  # every fibre runs as it did in that round
        assert f["emulated_delay_ms"] == pytest.approx(kept["emulated_delay_ms"][f["middle"]])

    # Best before any correction: every fibre goes back to running as it started.
    proc.update({"ab": 0.0, "bc": 0.0, "cd": 0.0})
    for e in links.values():
        e.correction_ms, e.vlan_corrections_ms = None, {}
    shifts = iter([-0.3, 3.0, 3.0, 3.0])  # the first round's small error is the best
    rec = calibrate(links, measure, CalibrationConfig(pings=9, rounds=3))
    assert rec["kept_round"] == 0 and rec["corrections_applied"] >= 1
    assert {k: e.emulated_delay_ms() for k, e in links.items()} == pytest.approx(delay)
    assert all(e.emulated_delay_ms(v) == pytest.approx(e.emulated_delay_ms())
               for e in links.values() for v in (101, 102, 103))


def test_the_reroute_check_uses_its_link_modes_echoes() -> None:
    """A restored lightpath's check beside the workload: two short corrections, one path
    at a time; the dense stream only on user-space links (netem: sparse echoes, as the
    calibration of netem links)."""
    from testbed.emu.reroute import reroute_config

    netem, user = reroute_config("netem"), reroute_config("userspace")
    assert netem.dense_pings == 0 and user.dense_pings > 0
    assert netem.rounds == user.rounds == 2 and netem.parallel == user.parallel == 1
    assert netem.per_path and user.per_path  # each lightpath corrected on its own


def test_a_paced_frame_arrives_when_its_lightpath_has_sent_it_whole() -> None:
    """A message of frames on a capped lightpath: each frame's last bit leaves the pacer at
    its lightpath's rate, so the last frame reaches the far end at send + all the
    message's wire bytes / the lightpath's rate + delay (the simulator's FIFO link), not
    one frame's serialisation early where the fibre is faster than the lightpath."""
    from testbed.emu.forwarder import VNET_HDR_LEN

    for fibre_mbps in (500.0, 50.0):
        fwd, d, out = _data_path(fibre_mbps, 10**7)
        fwd.set_vlan(101, 50.0, limit_bytes=10**6)
        eth = b"\x02" * 12 + b"\x81\x00" + (101).to_bytes(2, "big") + b"\x08\x00"
        sizes = (1500, 1500, 1000)  # wire bytes: the eth header and the tag are counted
        for n in sizes:
            fwd._arrive(d, bytes(VNET_HDR_LEN) + eth + bytes(n - len(eth)), 0.0)
        t = 0.0
        while len(out.sent) < len(sizes) and t < 0.1:
            t += 1e-5
            out.now = t
            fwd._service(t)
        done = [at for at, _ in out.sent]
        ends = [sum(sizes[:i + 1]) * 8 / 50e6 + 0.010 for i in range(len(sizes))]
        assert done == [pytest.approx(e, abs=2e-5) for e in ends], fibre_mbps
