"""The cut's phase (issue 58): what the hit lightpath carried at the cut, taken from the
workers' records, and the simulator's TCP model of each phase (docs/faults.md, "The
cut's phase"). Pure: no root, no emulation, no wall-clock time."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from testbed.analysis.faultimpact import WorkerModel, outage_effect
from testbed.errors import InputError
from testbed.jobs.faults import (
    TCP_TIMEOUT_MIN_S,
    CutPhase,
    cut_transport,
    message_segments,
    phase_effect,
    recovery_rounds,
)
from testbed.jobs.outage import predict_outage
from testbed.orchestrate.cutphase import _cut_instant, cut_phase_at
from testbed.orchestrate.impact import cut_phases, fault_agreement
from testbed.spec.load import load_scenario

ROOT = Path(__file__).resolve().parent.parent
RTT, RTT2, RTO_MIN, SLACK = 0.004, 0.006, 0.2, 0.0002


def wait(cut: CutPhase, outage: float) -> tuple[float, float]:
    w, r, _ = cut_transport(cut, outage_s=outage, rtt_s=RTT, rtt_after_s=RTT2,
                            rto_min_s=RTO_MIN)
    return w, r


# ------------------------------------------------------------------ the model
def test_a_control_message_lost_is_sent_again_by_the_probe_and_back_in_two_round_trips():
    w, r = wait(CutPhase("control", 2, -0.001, tlp_slack_s=SLACK), 0.003)
    assert w == pytest.approx(-0.001 + 2 * RTT + SLACK)  # the probe after its last send
    assert r == pytest.approx(2 * RTT2)                  # ceil(log2(3)) = 2 rounds


def test_a_lost_flight_of_activations_takes_more_round_trips_the_more_segments():
    w, r = wait(CutPhase("bulk", 17, 0.0, tlp_slack_s=SLACK), 0.003)
    assert w == pytest.approx(2 * RTT + SLACK)
    assert r == pytest.approx(5 * RTT2)  # 1 + 2 + 4 + 8 < 17 <= 31: five rounds
    assert [recovery_rounds(k) for k in (1, 2, 3, 4, 7, 8, 17)] == [1, 2, 2, 3, 3, 4, 5]


def test_nothing_in_flight_means_no_retransmission_wait():
    assert wait(CutPhase("idle", 0, next_send_s=None), 0.003) == (0.0, 0.0)
    assert wait(CutPhase("idle", 9, next_send_s=0.004), 0.003) == (0.0, 0.0)  # after it
    # a send into the outage is lost: a tail from that send
    w, r = wait(CutPhase("idle", 9, next_send_s=0.001, tlp_slack_s=SLACK), 0.003)
    assert w == pytest.approx(0.001 + 2 * RTT + SLACK)
    assert r == pytest.approx(4 * RTT2)


def test_one_segment_out_waits_for_the_time_out_and_a_long_outage_for_the_back_off():
    w, _ = wait(CutPhase("bulk", 1, 0.0), 0.003)
    assert w == pytest.approx(RTT + RTO_MIN)  # 2 srtt + rto_min, capped by the RTO
    w, r = wait(CutPhase("bulk", 17, 0.0, tlp_slack_s=SLACK), 0.3)
    pto = 2 * RTT + SLACK
    assert w == pytest.approx(pto + (RTT + RTO_MIN) + 2 * (RTT + RTO_MIN))  # 2nd RTO
    assert r == pytest.approx(5 * RTT2)


def test_data_sent_on_after_the_return_brings_the_flight_back_by_its_sacks():
    cut = CutPhase("bulk", 9, 0.0, continued_s=0.004, continued_segments=9,
                   tlp_slack_s=SLACK)
    w, r = wait(cut, 0.003)
    assert w == pytest.approx(0.004 + RTT2) and r == pytest.approx(RTT2)  # one round
    w, r = wait(CutPhase("bulk", 18, 0.0, continued_s=0.004, continued_segments=9), 0.003)
    assert r == pytest.approx(2 * RTT2)  # 9 SACKs for 18 lost: ceil(log2(2 + 1))
    # sent on before the path was back (lost too), or after the probe: the probe's way
    for cont in (0.002, 0.05):
        w, r = wait(CutPhase("bulk", 9, 0.0, continued_s=cont, continued_segments=9,
                             tlp_slack_s=SLACK), 0.003)
        assert w == pytest.approx(2 * RTT + SLACK) and r == pytest.approx(4 * RTT2)


def test_a_wait_past_the_time_out_fails_as_the_phase_free_model():
    wm = WorkerModel(collective_timeout_s=0.1)
    kw = dict(phase=0.5, steady_s=0.015, outage_s=0.3, rtt_s=RTT, rtt_after_s=RTT2,
              workers=wm)
    got = phase_effect(CutPhase("bulk", 17), **kw)
    base = outage_effect(**kw)
    assert not got.survived and got.fail_after_s == base.fail_after_s == 0.1
    assert got.error == base.error
    assert phase_effect(None, **kw) == base


def test_message_segments_count_the_preamble():
    assert message_segments(10486) == 1 + 8
    assert message_segments(0) == 2


# ------------------------------------------------------------------ the prediction
@pytest.fixture(scope="module")
def flap():
    return load_scenario(ROOT / "scenarios" / "fault-link-flap.yaml")


def stall(sc, phase, **kw):
    p = predict_outage(sc, 0.003, phases=None if phase is None else {0: phase}, **kw)
    return p["fault_impact"][0]


def test_the_prediction_follows_the_phase(flap):
    free, ctl, bulk, idle = (stall(flap, p) for p in (
        None, {"kind": "control", "lost_segments": 2},
        {"kind": "bulk", "lost_segments": 17}, "idle"))
    # the phase-free model: the probe at 2 RTT, then 2 RTTs of the detour
    assert free["model"]["resume_wait_s"] == pytest.approx(2 * RTT)
    assert free["model"]["recovery_s"] == pytest.approx(2 * RTT2)
    assert ctl["model"]["recovery_s"] == pytest.approx(2 * RTT2)
    assert bulk["model"]["recovery_s"] == pytest.approx(5 * RTT2)
    assert bulk["stall_s"] - ctl["stall_s"] == pytest.approx(3 * RTT2, abs=1e-9)
    assert idle["model"]["resume_wait_s"] == 0.0 and idle["model"]["recovery_s"] == 0.0
    assert idle["stall_s"] < ctl["stall_s"] - 0.015
    assert bulk["model"]["cut"]["cut_phase"] == "bulk"


def test_as_emulated_the_kernel_constant_is_over_the_time_factor(flap):
    ph = {"kind": "bulk", "lost_segments": 17}
    emu = stall(flap, ph)["model"]["cut"]["loss_probe_s"]
    real = stall(flap, ph, as_emulated=False)["model"]["cut"]["loss_probe_s"]
    tf = flap.emulation.time_factor
    assert real - emu == pytest.approx(TCP_TIMEOUT_MIN_S * (1 - 1 / tf))
    assert emu == pytest.approx(2 * RTT + TCP_TIMEOUT_MIN_S / tf)


def test_phases_by_job_name_and_bad_phases(flap):
    a = predict_outage(flap, 0.003, phases={"job0": {0: "control"}})
    assert a["cut_phases"]["job0"][0]["kind"] == "control"
    with pytest.raises(InputError):
        predict_outage(flap, 0.003, phases={0: "sideways"})
    with pytest.raises(InputError):
        predict_outage(flap, 0.003, phases={5: "idle"})


def test_the_known_outage_prediction_stays_without_a_phase():
    sc = load_scenario(ROOT / "scenarios" / "fault-outage.yaml")
    r = predict_outage(sc, 0.3)["fault_impact"][0]
    assert r["model"]["resume_wait_s"] == pytest.approx(2 * RTT + 2 * (RTT + RTO_MIN) + RTT
                                                        + RTO_MIN)
    # with the flight of two activations, 3 more round trips of the same route
    b = predict_outage(sc, 0.3, phases={0: {"kind": "bulk", "lost_segments": 18,
                                            "last_send_s": -0.0005}})["fault_impact"][0]
    assert b["model"]["recovery_s"] == pytest.approx(5 * RTT)


# ------------------------------------------------------------------ from the records
ACT = 10486


def records(t0: float) -> list[list[dict]]:
    """Two stages of a 1F1B job, 2 micro-batches, two iterations (wall s): transfers
    take 20 ms; stage 0 sends F0, F1 at +1, +2 ms; stage 1 answers B0, B1."""
    s0, s1 = [], []
    for k, base in enumerate((t0, t0 + 0.2)):
        s0.append({"type": "iteration", "iteration": k, "start_s": base,
                   "end_s": base + 0.070,
                   "ops": [["F0", base, base + 0.001], ["F1", base + 0.001, base + 0.002],
                           ["B0", base + 0.045, base + 0.046],
                           ["B1", base + 0.066, base + 0.067]],
                   "waits": [["B0", base + 0.002, base + 0.045],
                             ["B1", base + 0.046, base + 0.066]]})
        s1.append({"type": "iteration", "iteration": k, "start_s": base,
                   "end_s": base + 0.050,
                   "ops": [["F0", base + 0.021, base + 0.022], ["B0", base + 0.022,
                                                                 base + 0.025],
                           ["F1", base + 0.025, base + 0.026],
                           ["B1", base + 0.026, base + 0.046]],
                   "waits": [["F0", base, base + 0.021]]})
    return [s0, s1]


PLAN = {"activation_bytes": [ACT], "info": {"stage_dcs": ["dc-a", "dc-b"]}}


def phase(cut: float, outage: float = 0.030):
    from testbed.orchestrate.cutphase import transfers as _transfers

    tr = _transfers(records(100.0), PLAN, 0)
    return cut_phase_at(tr, cut, outage, 10.0)


def test_a_cut_while_activations_are_on_the_wire_is_bulk():
    p = phase(100.2015)  # F0 sent at +1 ms of iteration 1, F1 at +2 ms (in the outage)
    assert p.kind == "bulk"
    assert p.lost_segments == 2 * message_segments(ACT)
    assert p.last_send_s == pytest.approx((100.202 - 100.2015) / 10)
    assert p.detail["direction"] == "down"
    assert p.detail["transit_s"] == pytest.approx(0.0020)  # 20 ms wall, from iteration 0
    assert p.continued_s is None  # no activation follows before the next iteration
    q = phase(100.2005, outage=0.001)  # F0 on the wire, F1 sent once the path is back
    assert q.kind == "bulk" and q.lost_segments == message_segments(ACT)
    assert q.continued_s == pytest.approx((100.202 - 100.2005) / 10)


def test_a_cut_between_messages_is_idle_with_the_next_send():
    p = phase(100.2235, outage=0.001)  # after F1 arrived, before B0 leaves stage 1
    assert p.kind == "idle" and p.lost_segments == 0
    assert p.next_send_s == pytest.approx((100.225 - 100.2235) / 10)


def test_a_cut_in_the_barrier_is_control():
    # iteration 0 ends on stage 0 at +70 ms, stage 1's at +50 ms (barrier messages)
    p = phase(100.0695, outage=0.0004)
    assert p.kind == "control" and p.lost_segments == 2


def test_cut_phases_per_job_and_event_from_the_injector_rows(flap):
    faults = {"events_clock_zero_monotonic_s": 90.2015,
              "faults": [{"kind": "link_flap", "target": "A-B", "at_s": 1.0,
                          "applied": True, "monotonic_s": 100.19,
                          "cuts": [{"at_s": 1.0, "link_set_monotonic_s": 100.2015,
                                    "cut_to_restored_s": 0.03}]}]}
    got = cut_phases(flap, {"job0": records(100.0)}, faults, 10.0, {"job0": PLAN})
    assert got["job0"][0]["kind"] == "bulk"
    assert got["job0"][0]["lost_segments"] == 18
    # without the injector's link stamp: the row's stamp, the event's outage
    assert _cut_instant({"monotonic_s": 5.0}, 0.02) == (5.0, 0.02)
    rows = [{"job": "job0", "event": 0, "kind": "link_flap", "target": "A-B",
             "outage_s": 0.003, "stall_s": 0.045, "hit": True, "survived": True}]
    agree = fault_agreement(flap, rows, None, got)
    assert agree["rows"][0]["cut_phase"]["kind"] == "bulk"
    sim = predict_outage(flap, {0: 0.003}, phases=got)["fault_impact"][0]["stall_s"]
    assert agree["rows"][0]["sim_stall_s"] == pytest.approx(sim)
    assert math.isfinite(sim)


def test_records_that_do_not_tell_give_no_phase(flap):
    faults = {"events_clock_zero_monotonic_s": 90.0,
              "faults": [{"kind": "link_flap", "target": "A-B", "at_s": 1.0,
                          "applied": True, "monotonic_s": 100.0}]}
    bad = {"job0": [[{"type": "iteration", "iteration": 0, "ops": [["F0", 1.0, 2.0]]}],
                    [{"type": "iteration", "iteration": 0}]]}
    assert cut_phases(flap, bad, faults, 10.0, {"job0": PLAN}) == {}
    assert cut_phases(flap, {"job0": records(100.0)}, {}, 10.0, {"job0": PLAN}) == {}


def test_a_job_that_failed_in_the_outage_gets_its_interrupted_iteration_projected(flap):
    # the records stop after iteration 1 (the worker writes an iteration when it ends);
    # the plan runs 5: the cut at +1.5 ms of iteration 2 caught its F0 on the wire
    plan = {**PLAN, "iterations": 4, "warmup_iterations": 1}

    def at(cut: float, outage: float = 0.03, plan: dict = plan) -> dict:
        faults = {"events_clock_zero_monotonic_s": cut - 10.0,
                  "faults": [{"kind": "link_flap", "target": "A-B", "at_s": 1.0,
                              "applied": True, "monotonic_s": cut,
                              "cuts": [{"at_s": 1.0, "link_set_monotonic_s": cut,
                                        "cut_to_restored_s": outage}]}]}
        return cut_phases(flap, {"job0": records(100.0)}, faults, 10.0, {"job0": plan})["job0"][0]

    p = at(100.4015)
    assert p["kind"] == "bulk" and p["projected_stages"] == [0, 1]
    assert p["lost_segments"] == 2 * message_segments(ACT)
    q = at(100.4235, outage=0.001)  # after F1 arrived, before B0 leaves stage 1
    assert q["kind"] == "idle" and q["next_send_s"] == pytest.approx(0.0015 / 10)
    # all the plan's iterations recorded: nothing after the last one is invented
    done = at(100.4015, plan={**plan, "iterations": 1})
    assert done["kind"] == "idle" and done["next_send_s"] is None
    assert "projected_stages" not in done


def test_a_projection_needs_the_steady_period():
    from testbed.orchestrate.cutphase import with_iteration_in_progress

    one = [[records(100.0)[0][0]], [records(100.0)[1][0]]]
    assert with_iteration_in_progress(one, 100.5, 5) == (one, [])
    two = records(100.0)
    got, which = with_iteration_in_progress(two, 100.41, 5)
    assert which == [0, 1] and got[0][-1]["start_s"] == pytest.approx(100.4)
    assert got[0][-1]["waits"] == [] and got[0][-1]["projected"]
    # the ops under way at the cut and the next: B1 may wait for what the cut holds back
    assert [o[0] for o in got[0][-1]["ops"]] == ["F0", "F1", "B0"]
    # a cut inside the recorded span projects nothing; nor do records that do not tell
    assert with_iteration_in_progress(two, 100.25, 5)[1] == []
    bad = [[{"type": "iteration", "iteration": 0, "ops": [["F0", 1.0, 2.0]]}], []]
    assert with_iteration_in_progress(bad, 5.0, 5) == (bad, [])


def test_a_flap_is_judged_by_the_cuts_that_took_a_lightpath_down(flap):
    from testbed.orchestrate.impact import event_marks

    row = {"kind": "link_flap", "target": "A-B", "at_s": 1.0, "applied": True,
           "monotonic_s": 100.0,
           "cuts": [{"at_s": 1.0, "link_set_monotonic_s": 100.002, "cut_to_restored_s": 0.02,
                     "restored": [1, 2], "lost": []},
                    # the detour no longer crosses A-B: the second cut hits nothing
                    {"at_s": 1.4, "link_set_monotonic_s": 104.0, "cut_to_restored_s": 0.04,
                     "restored": [], "lost": []}]}
    faults = {"events_clock_zero_monotonic_s": 90.0, "faults": [row]}
    ((mark, _at, _row),) = event_marks(flap, faults, 90.0, 10.0)
    assert mark.outage_s == pytest.approx(0.002)  # the first cut's, not the longest
    assert _cut_instant(row, 0.04) == (100.002, 0.02)
    # a row that does not say what each cut took: every cut counts
    bare = {**row, "cuts": [{k: v for k, v in c.items() if k not in ("restored", "lost")}
                            for c in row["cuts"]]}
    ((mark, _, _),) = event_marks(flap, {**faults, "faults": [bare]}, 90.0, 10.0)
    assert mark.outage_s == pytest.approx(0.004)
