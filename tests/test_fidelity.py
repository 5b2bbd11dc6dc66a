"""The fidelity verdict's logic on made-up records (testbed.emu.fidelity): each invariant
against its threshold, in scenario time, and the reasons it names; the timer slack
histogram; the agreement's UNRELIABLE flag as one of the invariants."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from testbed.emu import fidelity as fid
from testbed.emu.procstat import ProcSampler, parse_schedstat, parse_stat, read_times
from testbed.emu.scale import Scale
from testbed.emu.slack import BOUNDS_S, SlackHistogram, merge, quantile_s
from tests.waiting import wait_until


def rtt_row(pair: str, expected_ms: float, samples: list[float]) -> dict:
    return {"pair": pair, "hops": 2, "expected_rtt_ms": expected_ms, "samples_ms": samples,
            "median_ms": sorted(samples)[len(samples) // 2] if samples else None,
            "replies": len(samples)}


def fwd_stats(rx: int = 1000, socket_drops: int = 0, queue_drops: int = 0,
              late_s: tuple[float, ...] = (0.00003,) * 100) -> dict:
    h = SlackHistogram()
    for x in late_s:
        h.observe(x)
    d = {"rx_packets": rx, "tx_segments": rx, "queue_drops": queue_drops, "loss_drops": 0,
         "down_drops": 0, "socket_drops": socket_drops, "send_errors": 0,
         "vlans": {"101": {"drops": 0}}}
    return {"directions": {"a_to_b": d, "b_to_a": dict(d)}, "timer_slack": h.as_record()}


def proc(role: str, name: str, share: float, run_s: float = 5.0,
         per_slice_ms: float = 0.02) -> dict:
    """A process's record: run_s of CPU at `share`, its wait in slices of per_slice_ms."""
    wait = run_s * (1 - share) / share
    return {"pid": 1, "role": role, "name": name, "run_s": run_s, "wait_s": wait,
            "cpu_share": share, "slices": max(1, round(1000 * wait / per_slice_ms))}


def good_inputs() -> dict:
    return {"rtt_rows": [rtt_row("a~b", 20.0, [20.2] * 19 + [20.9]),
                         rtt_row("a~c", 40.0, [39.8] * 20)],
            "procs": [proc("forwarder", "A-B", 0.99), proc("switch", "ovs-vswitchd", 0.95),
                      proc("worker", "job0/stage0", 0.9)],
            "forwarder_stats": [fwd_stats()],
            "tcp": {"h0": {"TcpOutSegs": 10_000, "TcpRetransSegs": 10}},
            "jobs": [{"job": "job0", "cpu_share_median": 0.95, "op_overrun_median": 0.01}],
            "host": {"steal_frac": 0.0},
            "send_socket": {"wanted_bytes": 1000, "bytes": 1000, "sockets": 1}}


def by_name(v: dict) -> dict[str, dict]:
    return {i["name"]: i for i in v["invariants"]}


def test_a_run_within_every_bound_is_faithful() -> None:
    v = fid.verdict(Scale(), **good_inputs())
    assert v["faithful"] and v["reasons"] == []
    inv = by_name(v)
    assert set(inv) == {"rtt_median_error", "rtt_p99_error", "forwarder_sched_delay",
                        "forwarder_cpu_share", "switch_sched_delay",
                        "switch_cpu_share", "worker_cpu_share", "worker_compute_share",
                        "worker_timer_slack", "forwarder_timer_slack", "emulator_drops",
                        "tcp_retransmits", "switch_send_socket", "host_steal"}
    assert all(i["measured"] and i["ok"] for i in inv.values())
    assert inv["rtt_median_error"]["value"] == pytest.approx(0.2)  # a~b, |+0.2| > |-0.2|
    assert inv["rtt_p99_error"]["value"] == pytest.approx(0.9)  # p99 of 20 = the largest
    assert inv["forwarder_timer_slack"]["value"] == pytest.approx(0.05)  # its bucket, ms
    assert "faithful" in fid.verdict_line(v) and "NOT" not in fid.verdict_line(v)


def test_device_stand_ins_are_judged_by_their_wake_ups_not_their_cpu_share() -> None:
    """A device stand-in (worker_compute: device) sleeps through its ops: its few wake-ups'
    latency against almost no run time is no compute the simulator assumes, so its share
    is listed but not judged; a CPU worker beside it is still judged, and the stand-ins'
    late wake-ups still fail worker_timer_slack."""
    d = good_inputs()
    d["procs"] = [p for p in d["procs"] if p["role"] != "worker"]
    d["procs"] += [{**proc("worker", f"job0/stage{k}", 0.07, run_s=0.5), "compute": "device"}
                   for k in range(4)]
    v = fid.verdict(Scale(), **d)
    inv = by_name(v)["worker_cpu_share"]
    assert v["faithful"], v["reasons"]
    assert not inv["measured"] and "device stand-ins only" in inv["detail"]
    assert sum(1 for p in v["processes"] if p.get("compute") == "device") == 4  # listed
    d["procs"].append({**proc("worker", "job1/stage0", 0.5), "compute": "cpu"})
    v = fid.verdict(Scale(), **d)
    assert [i["name"] for i in v["invariants"] if not i["ok"]] == ["worker_cpu_share"]
    assert "job1/stage0" in v["reasons"][0]
    d["procs"].pop()
    d["jobs"] = [{"job": "job0", "op_overrun_median": 0.08}]
    v = fid.verdict(Scale(), **d)
    assert [i["name"] for i in v["invariants"] if not i["ok"]] == ["worker_timer_slack"]
    failed = fid.Invariant("worker_timer_slack", 0.031, fid.MAX_OP_OVERRUN, "max", "share")
    assert fid.starvation_reason(failed) == "its ops ran 3.1 % longer than asked (> 2.5 %)"


@pytest.mark.parametrize(("change", "failed", "words"), [
    (lambda d: d["rtt_rows"].append(rtt_row("b~c", 10.0, [11.5] * 20)),
     "rtt_median_error", "b~c +1.500 ms"),
    (lambda d: d["rtt_rows"].append(rtt_row("b~c", 10.0, [10.0] * 19 + [13.0])),
     "rtt_p99_error", "b~c +3.000 ms"),
    (lambda d: d["rtt_rows"].append(rtt_row("b~c", 10.0, [])),
     "rtt_median_error,rtt_p99_error", "without an echo reply (b~c)"),
    (lambda d: d["procs"].append(proc("forwarder", "B-C", 0.9, per_slice_ms=0.3)),
     "forwarder_sched_delay", "0.3 ms > 0.1 ms (forwarder B-C, mean of 1852 wake-ups)"),
    (lambda d: d["procs"].append(proc("switch", "ovs-vswitchd", 0.95, per_slice_ms=0.25)),
     "switch_sched_delay", "0.25 ms > 0.1 ms (switch ovs-vswitchd"),
    (lambda d: d["procs"].append(proc("worker", "job1/stage2", 0.5)),
     "worker_cpu_share", "worker job1/stage2"),
    (lambda d: d["jobs"].append({"job": "job1", "cpu_share_median": 0.55}),
     "worker_compute_share", "55.0 % < 80.0 % (job1)"),
    (lambda d: d["jobs"].append({"job": "job1", "op_overrun_median": 0.12}),
     "worker_timer_slack", "(job1)"),
    (lambda d: d["forwarder_stats"].append(fwd_stats(late_s=(0.003,) * 100)),
     "forwarder_timer_slack", "5 ms > 0.5 ms"),
    (lambda d: d["forwarder_stats"].append(fwd_stats(rx=1000, socket_drops=50)),
     "emulator_drops", "100 of 4000 frames"),
    (lambda d: d["tcp"].update(h1={"TcpOutSegs": 10_000, "TcpRetransSegs": 900}),
     "tcp_retransmits", "910 retransmitted, 0 dropped by the model"),
    (lambda d: d.update(host={"steal_frac": 0.2}), "host_steal", "20.0 % > 5.0 %"),
])
def test_each_invariant_fails_alone_and_is_named(change, failed: str, words: str) -> None:  # type: ignore[no-untyped-def]
    d = good_inputs()
    change(d)
    v = fid.verdict(Scale(), **d)
    assert not v["faithful"]
    names = failed.split(",")  # a lightpath without replies fails its median and tail
    assert [i["name"] for i in v["invariants"] if not i["ok"]] == names
    assert len(v["reasons"]) == len(names) and v["reasons"][0].startswith(names[0])
    assert words in v["reasons"][0], v["reasons"][0]
    line = fid.verdict_line(v)
    assert line.startswith("fidelity: NOT FAITHFUL: ") and names[0] in line


def test_times_are_judged_in_scenario_time() -> None:
    """An emulated error of 5 ms is 0.5 ms of scenario time at time_factor 10: within the
    band; so is a 3 ms late wake-up (0.3 ms)."""
    d = good_inputs()
    d["rtt_rows"] = [rtt_row("a~b", 200.0, [205.0] * 20)]
    d["forwarder_stats"] = [fwd_stats(late_s=(0.002,) * 100)]
    assert not fid.verdict(Scale(), **d)["faithful"]
    v = fid.verdict(Scale(time_factor=10.0), **d)
    assert v["faithful"], v["reasons"]
    inv = by_name(v)
    assert inv["rtt_median_error"]["value"] == pytest.approx(0.5)
    assert inv["forwarder_timer_slack"]["value"] == pytest.approx(0.25)
    assert v["lightpaths"][0]["expected_rtt_ms"] == pytest.approx(20.0)


def test_retransmits_the_model_dropped_are_allowed() -> None:
    d = good_inputs()
    d["tcp"] = {"h0": {"TcpOutSegs": 10_000, "TcpRetransSegs": 900}}
    assert not fid.verdict(Scale(), **d)["faithful"]
    d["forwarder_stats"] = [fwd_stats(queue_drops=250)]  # 500 segments dropped, x 2
    assert fid.verdict(Scale(), **d)["faithful"]


def test_retransmits_the_fabric_queues_dropped_are_allowed() -> None:
    """A shaped DC fabric link's FIFO drops whole GSO frames: each may hold several
    segments, and each of those is a retransmission TCP owes."""
    d = good_inputs()
    d["tcp"] = {"h0": {"TcpOutSegs": 10_000, "TcpRetransSegs": 900}}
    d["fabric"] = {"frames": 40, "segments_per_frame": 4}  # 160 segments: too few
    v = fid.verdict(Scale(), **d)
    assert not v["faithful"]
    assert "160 dropped by the model (40 frames of up to 4 segments" in v["reasons"][0]
    d["fabric"] = {"frames": 40, "segments_per_frame": 11}  # 440 segments, x 2
    v = fid.verdict(Scale(), **d)
    assert v["faithful"], v["reasons"]
    assert v["fabric_drops"] == {"frames": 40, "segments_per_frame": 11}


def test_the_switch_sockets_drops_are_the_emulators_not_tcps() -> None:
    """Frames the user-space switch's receive sockets dropped (a burst beyond the socket's
    buffer: counted by no interface) fail emulator_drops, named; the retransmissions
    they cause are then explained, so tcp_retransmits does not blame TCP for them."""
    d = good_inputs()
    d["tcp"] = {"h0": {"TcpOutSegs": 10_000, "TcpRetransSegs": 900}}
    d["switch"] = {"frames": 20, "sockets": 6, "segments_per_frame": 46}
    v = fid.verdict(Scale(), **d)
    inv = by_name(v)
    assert not v["faithful"] and not inv["emulator_drops"]["ok"]
    assert "20 at the user-space switch's receive sockets" in inv["emulator_drops"]["detail"]
    assert inv["tcp_retransmits"]["ok"], inv["tcp_retransmits"]  # 900 <= 2 x 20 x 46
    assert v["switch_socket_drops"]["frames"] == 20
    assert fid.verdict(Scale(), **good_inputs())["faithful"]  # none dropped: no change


def test_the_switch_send_socket_must_hold_the_ports_fifos() -> None:
    """Sized to what was wanted: passes, with the figures; smaller, or not sized at all
    (the error named): fails, so a run whose switch may drop uncounted is not faithful."""
    d = good_inputs()
    v = fid.verdict(Scale(), **d)
    inv = by_name(v)["switch_send_socket"]
    assert v["faithful"] and inv["measured"] and inv["detail"] == "1000 of 1000 bytes"
    assert v["switch_send_buffers"]["sockets"] == 1
    d["send_socket"] = {"wanted_bytes": 1000, "bytes": 500}
    small = fid.verdict(Scale(), **d)
    assert not small["faithful"] and small["reasons"][0].startswith("switch_send_socket 50")
    d["send_socket"] = {"wanted_bytes": 1000, "error": "no send socket found"}
    failed = fid.verdict(Scale(), **d)
    assert not failed["faithful"]
    assert failed["reasons"] == ["switch_send_socket: not sized (no send socket found)"]


def test_a_threads_run_time_stays_counted_after_it_exits() -> None:
    """schedstat is per thread and leaves /proc with it: the sums keep an exited thread's
    last figures, so a process's run time never falls between readings (a worker's did,
    to a negative run_s, when a gloo thread ended inside its window)."""
    from testbed.emu.procstat import ProcTimes, carried

    before = {1: (1.0, 0.1, 10), 2: (2.0, 0.2, 20)}
    now = ProcTimes(7, 3.0, 1.5, 0.1, 10.0, {1: (1.5, 0.1, 15), 3: (0.5, 0.0, 4)}, 19)
    got, seen = carried(before, now)
    assert (got.run_s, got.wait_s) == pytest.approx((4.0, 0.3)) and set(seen) == {1, 2, 3}
    assert got.slices == 15 + 20 + 4
    child = subprocess.Popen([sys.executable, "-c",
                              "import sys, threading, time\n"
                              "def spin():\n    t = time.thread_time() + 0.3\n"
                              "    while time.thread_time() < t: pass\n"
                              "    print(1, flush=True); sys.stdin.readline()\n"
                              "th = threading.Thread(target=spin); th.start()\n"
                              "th.join(); print(2, flush=True); time.sleep(60)"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdin is not None and child.stdout is not None
        s = ProcSampler()
        s.watch(child.pid, "worker", "w")
        assert child.stdout.readline()  # the thread has spun 0.3 s of CPU
        s.sample()  # and is seen alive with it
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.stdout.readline()  # it ended
        s.sample()
        (rec,) = s.records()
        assert rec["run_s"] >= 0.25, rec  # its 0.3 s of CPU stay counted
    finally:
        child.kill()
        child.wait()


def test_packet_socket_drops_are_read_for_the_switch_only() -> None:
    from testbed.emu.fidelity_probe import parse_packet_socket_drops

    text = ('p_raw UNCONN 0 0 *:lp42e7s4-eth3 * users:(("ovs-vswitchd",pid=17114,fd=39))\n'
            '\t skmem:(r0,rb212992,t0,tb212992,f0,w0,o176,bl0,d510)\n'
            'p_raw UNCONN 0 0 *:lp42e7s3-eth1 * users:(("ovs-vswitchd",pid=17114,fd=40))\n'
            '\t skmem:(r0,rb212992,t0,tb212992,f0,w0,o176,bl0,d27)\n'
            'p_raw UNCONN 0 0 *:eth0 * users:(("other",pid=999,fd=3))\n'
            '\t skmem:(r0,rb212992,t0,tb212992,f0,w0,o176,bl0,d7000)\n')
    assert parse_packet_socket_drops(text, 17114) == (2, 537)
    assert parse_packet_socket_drops(text, 1) == (0, 0)


def test_unmeasured_parts_are_listed_not_failed() -> None:
    """No workers, no forwarders (netem links), no TCP: those invariants have no value."""
    v = fid.verdict(Scale(), [rtt_row("a~b", 20.0, [20.1] * 20)])
    assert v["faithful"]
    inv = by_name(v)
    assert not inv["worker_cpu_share"]["measured"] and inv["worker_cpu_share"]["ok"]
    assert not inv["emulator_drops"]["measured"]
    assert not inv["switch_send_socket"]["measured"]  # no shaped switch port
    assert "2 of 14 invariants measured" in fid.verdict_line(v)


def test_nearly_idle_processes_are_judged_together() -> None:
    """A forwarder that ran 2 ms has a share made of wake-up latency: it joins the others
    that barely ran; a busy one is judged alone."""
    procs = [proc("forwarder", "A-B", 0.5, run_s=0.002), proc("forwarder", "B-C", 0.99,
                                                               run_s=0.08),
             proc("forwarder", "C-D", 0.97, run_s=3.0)]
    inv = fid.share_invariant("forwarder_cpu_share", procs, "forwarder", 0.9, "")
    assert inv.ok and 0.9 < inv.value < 0.97  # (A-B and B-C together: 0.967)
    inv = fid.share_invariant("forwarder_cpu_share", procs[:1] * 60, "forwarder", 0.9, "")
    assert not inv.ok and inv.detail == "forwarder A-B, A-B, A-B ... (nearly idle, together)"


def test_shadow_cpu_workers_are_judged_by_the_work_they_did_not_their_share() -> None:
    """A shadow worker's duty-cycled chunks wait about as long as they run at each wake-up:
    a schedstat share of 25 % with its work done (compute share 110 %) and its ops on time
    is listed, not failed; the same share for a worker whose job reports no compute share
    (model mode) is judged, and a job whose work was not done still fails."""
    d = good_inputs()
    d["procs"] = [p for p in d["procs"] if p["role"] != "worker"]
    d["procs"] += [{**proc("worker", f"job0/stage{k}", 0.25), "compute": "cpu"}
                   for k in range(4)]
    d["jobs"] = [{"job": "job0", "cpu_share_median": 1.1, "op_overrun_median": 0.016}]
    v = fid.verdict(Scale(), **d)
    inv = by_name(v)["worker_cpu_share"]
    assert v["faithful"], v["reasons"]
    assert inv["measured"] and inv["judged"] is False and inv["value"] == pytest.approx(0.25)
    d["procs"].append({**proc("worker", "job1/stage0", 0.25), "compute": "cpu"})
    v = fid.verdict(Scale(), **d)
    assert [i["name"] for i in v["invariants"] if not i["ok"]] == ["worker_cpu_share"]
    assert "job1/stage0" in v["reasons"][0]
    d["procs"].pop()
    d["jobs"] = [{"job": "job0", "cpu_share_median": 0.6, "op_overrun_median": 0.02}]
    v = fid.verdict(Scale(), **d)
    assert [i["name"] for i in v["invariants"] if not i["ok"]] == ["worker_compute_share"]


def test_a_starved_second_is_not_spread_over_the_run() -> None:
    """A forwarder that waits 20 us per wake-up for a minute and 3 ms per wake-up for one
    second has a run's mean of 0.07 ms; its worst window of the sampler's readings says
    3 ms, and the verdict judges that. Windows merge readings until they hold
    MIN_WINDOW_SLICES wake-ups."""
    from testbed.emu.procstat import MIN_WINDOW_SLICES, ProcTimes, worst_window

    def at(t: float, wait_s: float, slices: int) -> ProcTimes:
        return ProcTimes(1, 0.0, 0.0, wait_s, t, {}, slices)

    reads, wait, n = [at(0.0, 0.0, 0)], 0.0, 0
    for k in range(1, 121):  # 0.5 s readings: 1,000 wake-ups each at 20 us ...
        starved = k in (60, 61)  # ... but 150 of 3 ms in two of them
        n += 150 if starved else 1000
        wait += 150 * 0.003 if starved else 1000 * 0.00002
        reads.append(at(0.5 * k, wait, n))
    worst = worst_window(reads)
    assert worst is not None and worst[0] == pytest.approx(3.0) and worst[1] == 150
    assert 1000 * wait / n < 0.1  # the run's mean hides it
    few = [at(0.0, 0.0, 0), at(0.5, 0.01, MIN_WINDOW_SLICES // 2),
           at(1.0, 0.011, MIN_WINDOW_SLICES)]
    assert worst_window(few) == (pytest.approx(0.11), MIN_WINDOW_SLICES)  # merged
    assert worst_window(few[:2]) is None
    rec = {**proc("forwarder", "A-B", 0.9), "slices": n, "wait_s": wait,
           "worst_wait_per_slice_ms": worst[0], "worst_window_slices": worst[1]}
    inv = fid.sched_delay_invariant("forwarder_sched_delay", [rec], "forwarder",
                                    Scale(time_factor=10.0), "")
    assert not inv.ok and inv.value == pytest.approx(0.3)
    assert inv.detail == "forwarder A-B, its worst window of 150 wake-ups"


def test_forwarders_and_switch_are_judged_by_their_wait_per_wake_up() -> None:
    """A forwarder runs a few microseconds each time a frame wakes it: 20 us behind another
    real-time process at each wake-up is a share of 60 % and a frame delayed 0.02 ms. Its
    share is listed, not judged; its wait per wake-up is, in scenario time (a factor of 4
    makes 0.3 ms emulated 0.075 ms), with the nearly idle ones together."""
    d = good_inputs()
    d["procs"].append(proc("forwarder", "B-C", 0.6, per_slice_ms=0.02))
    v = fid.verdict(Scale(), **d)
    inv = by_name(v)
    assert v["faithful"], v["reasons"]
    share = inv["forwarder_cpu_share"]
    assert share["measured"] and share["ok"] and share["judged"] is False
    assert share["value"] == pytest.approx(0.6)  # listed with its value
    assert inv["forwarder_sched_delay"]["value"] == pytest.approx(0.02, rel=1e-3)
    slow = proc("forwarder", "C-D", 0.9, per_slice_ms=0.3)
    d["procs"].append(slow)
    assert not fid.verdict(Scale(), **d)["faithful"]
    v = fid.verdict(Scale(time_factor=4.0), **d)
    assert v["faithful"], v["reasons"]
    assert by_name(v)["forwarder_sched_delay"]["value"] == pytest.approx(0.075, rel=1e-3)
    idle = [proc("forwarder", "E-F", 0.5, run_s=0.001, per_slice_ms=0.4)] * 3 + [
        proc("forwarder", "F-G", 0.5, run_s=0.001, per_slice_ms=0.01)]
    inv = fid.sched_delay_invariant("forwarder_sched_delay", idle, "forwarder", Scale(), "")
    together_ms = 1000 * sum(p["wait_s"] for p in idle) / sum(p["slices"] for p in idle)
    assert inv.value == pytest.approx(together_ms) and inv.value < 0.1  # not E-F's alone
    assert "(nearly idle, together)" in inv.detail
    old = [{k: x for k, x in p.items() if k != "slices"} for p in d["procs"]]
    inv = fid.sched_delay_invariant("forwarder_sched_delay", old, "forwarder", Scale(), "")
    assert not inv.measured and inv.ok  # an older run's records: not measured


def test_slack_histogram_buckets_and_quantiles() -> None:
    h = SlackHistogram()
    for late_s in [-0.001] + [0.00004] * 96 + [0.0007, 0.004, 0.3]:
        h.observe(late_s)
    rec = h.as_record()
    assert sum(rec["counts"]) == 100 and rec["counts"][0] == 97  # early counts as on time
    assert rec["counts"][-1] == 1 and rec["max_s"] == pytest.approx(0.3)
    assert quantile_s(rec, 0.5) == BOUNDS_S[0]
    assert quantile_s(rec, 0.99) == 0.005  # the 99th of 100: 4 ms, in the 5 ms bucket
    assert quantile_s(rec, 1.0) == pytest.approx(0.3)  # beyond the last bound: the max
    both = merge([rec, rec])
    assert sum(both["counts"]) == 200 and both["sum_s"] == pytest.approx(2 * rec["sum_s"])
    assert quantile_s(SlackHistogram().as_record(), 0.99) is None
    with pytest.raises(ValueError, match="bounds"):
        merge([{**rec, "bounds_s": [1.0]}])


def test_agreement_unreliable_flag_is_the_fidelity_invariants() -> None:
    """The agreement's CPU-starvation reasons are the worker invariants' failures, and an
    unfaithful run's agreement is UNRELIABLE with the failed invariant named."""
    from testbed.emu.fidelity import with_fidelity
    from testbed.metrics.agreement import (
        agreement_rows,
        agreement_verdict,
        starvation_reasons,
        verdict_line,
    )

    row = {"cpu_share_median": 0.55, "op_overrun_median": 0.12}
    assert starvation_reasons(row) == [
        fid.starvation_reason(i) for i in fid.worker_job_invariants(row) if not i.ok]
    assert len(starvation_reasons(row)) == 2
    rows = agreement_rows({"job0": 1.0}, {"job0": 1.01},
                          {"job0": {"iterations_measured": 25, "cpu_share_median": 0.95,
                                    "op_overrun_median": 0.01}})
    agr = agreement_verdict(rows, {"steal_frac": 0.0})
    assert agr["reliable"]
    d = good_inputs()
    d["procs"].append(proc("forwarder", "B-C", 0.6, per_slice_ms=0.5))
    d["jobs"] = [{"job": "job0", "cpu_share_median": 0.95, "op_overrun_median": 0.01}]
    folded = with_fidelity(agr, fid.verdict(Scale(), **d))
    assert not folded["reliable"] and not folded["faithful"]
    assert folded["reasons"] == ["fidelity: forwarder_sched_delay 0.5 ms > 0.1 ms "
                                 "(forwarder B-C, mean of 6667 wake-ups)"]
    assert "UNRELIABLE: fidelity: forwarder_sched_delay" in verdict_line(folded)
    # a starved job is named once (by the agreement, per job), not again by the fold
    d["jobs"] = [{"job": "job0", "cpu_share_median": 0.5}]
    starved = agreement_rows({"job0": 1.0}, {"job0": 1.01},
                             {"job0": {"iterations_measured": 25, "cpu_share_median": 0.5}})
    folded = with_fidelity(agreement_verdict(starved), fid.verdict(Scale(), **d))
    assert sum("50 %" in r for r in folded["reasons"]) == 1


def test_a_worker_reads_its_own_window_shorter_than_a_reading(tmp_path: Path) -> None:
    """A worker whose iterations last less than one sampler reading (0.5 s) reads itself at
    ready and at done; the verdict takes that exact usage, not its whole life (CI of
    402c12f: a 0.1 s window after a 12 s start-up was judged over all 12 s)."""
    import json
    import threading

    from testbed.emu.fidelity_probe import worker_own_usage, worker_window
    from testbed.emu.procstat import own_usage_since

    assert own_usage_since(None)[1] == {}
    t0 = time.monotonic()
    at_ready, _ = own_usage_since(None)
    assert at_ready is not None

    def spin(s: float) -> None:
        end = time.thread_time() + s
        while time.thread_time() < end:
            pass

    spin(0.05)
    gone = threading.Thread(target=spin, args=(0.05,))  # exits inside the window
    gone.start()
    gone.join()
    _, used = own_usage_since(at_ready)
    t1 = time.monotonic()
    assert 0.04 <= used["run_s"] and used["wait_s"] >= 0  # type: ignore[operator]
    assert used["cpu_s"] >= 0.05 and 0 < used["wall_s"] <= t1 - t0 + 0.01  # type: ignore[operator]
    assert 0.0 < used["cpu_share"] <= 1.0  # type: ignore[operator]
    rec = tmp_path / "stage0.jsonl"
    rec.write_text("\n".join(json.dumps(r) for r in (
        {"type": "start", "ready_s": t0}, {"type": "iteration"},
        {"type": "done", "end_s": t1, "usage": used})) + "\n")
    own = worker_own_usage(str(rec))
    assert own is not None and own["read_by"] == "worker" and own["run_s"] == used["run_s"]
    assert own["window_s"] == [round(t0, 3), round(t1, 3)] and worker_window(str(rec)) == (t0, t1)
    # records from before the worker read itself, or cut short: the sampler's figures stay
    for done in ({"type": "done", "end_s": t1}, {"type": "done", "end_s": t1,
                                                 "usage": {"run_s": "x"}}):
        rec.write_text(json.dumps({"type": "start", "ready_s": t0}) + "\n"
                       + json.dumps(done) + "\n")
        assert worker_own_usage(str(rec)) is None


def test_proc_readings_of_a_busy_and_a_sleeping_child() -> None:
    """/proc parsing on real processes: a spinning child uses about a core, a sleeping
    one almost nothing; a PID read with another start time is not read at all."""
    assert parse_stat("42 (a) b) c) S " + "0 " * 10 + "300 200 " + "0 " * 6 + "777")\
        == (777, 500 / os.sysconf("SC_CLK_TCK"), "S")
    assert parse_schedstat("2000000000 500000000 9\n") == (2.0, 0.5, 9)
    spin = subprocess.Popen([sys.executable, "-c", "print(1, flush=True)\nwhile True: pass"],
                            stdout=subprocess.PIPE)
    nap = subprocess.Popen([sys.executable, "-c", "import time; print(1, flush=True); "
                            "time.sleep(60)"], stdout=subprocess.PIPE)
    try:
        for p in (spin, nap):  # started up (Python's start-up is not the nap's)
            assert p.stdout is not None and p.stdout.readline()
        s = ProcSampler(interval_s=0.05)
        s.watch(spin.pid, "worker", "spin")
        s.watch(nap.pid, "worker", "nap")
        first = read_times(spin.pid)
        assert first is not None and read_times(spin.pid, first.start_ticks + 1) is None
        s.start()
        time.sleep(0.5)
        mid_s = time.monotonic()
        time.sleep(0.5)
        s.stop()
        recs = {r["name"]: r for r in s.records()}
        (half,) = [r for r in s.records({spin.pid: (mid_s, None)}) if r["name"] == "spin"]
        # (a record says its window in ms: compare at that precision)
        assert half["window_s"][0] <= round(mid_s, 3) and half["wall_s"] < recs["spin"]["wall_s"]
        assert recs["spin"]["run_s"] > 10 * recs["nap"]["run_s"]
        assert recs["spin"]["cpu_s"] > 0 and recs["spin"]["cpu_share"] is not None
        assert 0.0 <= recs["spin"]["cpu_share"] <= 1.0
        assert recs["spin"]["slices"] >= 1 and recs["spin"]["wait_per_slice_ms"] >= 0.0
        nap.kill()  # a zombie until reaped: no longer read
        wait_until(lambda: read_times(nap.pid) is None or None, "the nap exited",
                   timeout_s=30, interval_s=0.05)
    finally:
        for p in (spin, nap):
            p.kill()
            p.communicate()


def test_report_section_shows_the_verdict_each_invariant_and_the_parts(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """`lightpipe report`'s fidelity section of an emulated run: the verdict with its
    reasons, a row per invariant with its value, threshold and result, each lightpath's
    RTT error and each process's CPU share, least served first."""
    import json

    from testbed.io.bounded import DirReader
    from testbed.report import sections
    from testbed.report.fidelity import fidelity_sections

    d = good_inputs()
    d["procs"].append({**proc("forwarder", "B-C", 0.6, per_slice_ms=3.0),
                       "wait_per_slice_ms": 3.0})
    v = fid.verdict(Scale(time_factor=10.0), **d)
    (tmp_path / "summary.json").write_text(json.dumps({"backend": "emu", "fidelity": v}))
    with DirReader.open(tmp_path) as rd:
        (sec,) = fidelity_sections(rd)
        body = [s.title for s in sections.run(rd, "emu")]
    assert "emulation: fidelity verdict" in body
    assert sec.text.startswith("NOT FAITHFUL: forwarder_sched_delay 0.3 ms > 0.1 ms")
    assert "time_factor 10" in sec.text
    invs, lps, procs = sec.tables
    rows = {r[0]: r for r in invs.rows}
    assert len(rows) == 14
    assert rows["forwarder_sched_delay"][1:5] == ["0.3 ms", "<=", "0.1 ms", "FAIL"]
    assert rows["forwarder_cpu_share"][1:5] == ["60.0 %", ">=", "90.0 %", "listed"]
    assert rows["rtt_median_error"][4] == "pass"
    assert [r[0] for r in lps.rows] == ["a~b", "a~c"] and lps.rows[0][3] == pytest.approx(0.02)
    assert procs.rows[0][:5] == ["forwarder", "B-C", "", "60.0 %", pytest.approx(0.3)]
    assert procs.rows[1][4] is None  # a record without the figure: not made up
    # a time_factor auto run that was run again says so, each earlier run in words; a
    # hand-edited entry is shown as unreadable, not as a number it is not
    (tmp_path / "summary.json").write_text(json.dumps({"backend": "emu", "fidelity": v,
        "time_factor_reruns": [{"time_factor": 2.0, "next_time_factor": 5.0,
                                "asks": ["worker_timer_slack 0.1 against 0.05 at 2 asks "
                                         "for 5"]}, {"time_factor": "x"}, "junk"]}))
    with DirReader.open(tmp_path) as rd:
        (sec,) = fidelity_sections(rd)
    assert "not faithful at time factor 2 (worker_timer_slack 0.1 against 0.05 at 2 asks " \
        "for 5), run again from 5; an earlier run (unreadable)." in sec.text
    (tmp_path / "summary.json").write_text(json.dumps({"fidelity": {
        "faithful": True, "invariants": [{"name": "x", "value": "1e999", "unit": "ms"}]}}))
    with DirReader.open(tmp_path) as rd:  # a hand-edited record: no number, no crash
        (sec,) = fidelity_sections(rd)
    assert sec.tables[0].rows[0][1] == "not measured"


def test_unexplained_retransmits_are_judged_per_window_in_flight() -> None:
    """0.03 % of segments resent with nothing dropped is far under the 1 % share, but on a
    50 Mbit/s lightpath at 360 ms (18 ms x time_factor 20: a window of 1554 segments)
    it is 0.47 losses per window, each holding its message back a round trip: not
    faithful. A window 10 times smaller (5 Mbit/s) takes the same share."""
    d = good_inputs()
    d["rtt_rows"] = [rtt_row("a~b", 360.0, [360.4] * 20)]
    d["tcp"] = {"h0": {"TcpOutSegs": 1_000_000, "TcpRetransSegs": 300}}
    fast = fwd_stats()
    for direction in fast["directions"].values():
        direction["vlans"] = {"101": {"drops": 0, "rate_mbps": 50.0}}
    d["forwarder_stats"] = [fast]
    v = fid.verdict(Scale(time_factor=20.0), **d)
    inv = by_name(v)["tcp_retransmits"]
    assert [i["name"] for i in v["invariants"] if not i["ok"]] == ["tcp_retransmits"]
    assert inv["threshold"] == pytest.approx(fid.MAX_UNEXPLAINED_LOSSES_PER_WINDOW / 1554,
                                             rel=1e-3)
    assert "0.47 unexplained per window of 1554 segments (50 Mbit/s x 360 ms" in inv["detail"]
    assert v["reasons"][0].startswith("tcp_retransmits 0.03 % > 0.016 % (300 retransmitted")
    assert v["forwarders"]["max_rate_mbps"] == 50.0
    for direction in fast["directions"].values():
        direction["vlans"]["101"]["rate_mbps"] = 5.0
    assert fid.verdict(Scale(time_factor=20.0), **d)["faithful"]
    # without a rate (netem, the kernel datapath: no forwarder counters) the share alone
    del d["forwarder_stats"]
    inv = by_name(fid.verdict(Scale(time_factor=20.0), **d))["tcp_retransmits"]
    assert inv["threshold"] == fid.MAX_UNEXPLAINED_RETRANSMIT_SHARE and inv["ok"]
    assert fid.window_segments(None, 360.0) is None and fid.window_segments(50.0, 0) is None


def test_the_retransmit_detail_names_what_the_hosts_counted() -> None:
    """The hosts' nstat counters that tell why TCP resent, summed over hosts, in the
    tcp_retransmits detail: spurious resends (D-SACKs) and the receivers' own drops are
    told apart from losses; a counter at 0 is not named."""
    tcp = {"h0": {"TcpOutSegs": 100_000, "TcpRetransSegs": 40, "TcpExtTCPFastRetrans": 30,
                  "TcpExtTCPDSACKRecv": 25, "TcpExtTCPTimeouts": 0},
           "h1": {"TcpOutSegs": 100_000, "TcpRetransSegs": 10, "TcpExtTCPFastRetrans": 5,
                  "TcpExtTCPRcvQDrop": 3, "TcpExtTCPBacklogDrop": 1}}
    assert fid.retransmit_causes(tcp) == ("35 fast retransmits, 25 D-SACKs (already received)"
                                          ", 4 dropped by the receivers (their queues full)")
    assert fid.retransmit_causes({"h0": {"TcpOutSegs": 5}}) == ""
    d = good_inputs()
    d["tcp"] = tcp
    inv = by_name(fid.verdict(Scale(), **d))["tcp_retransmits"]
    assert inv["detail"].startswith("50 retransmitted [35 fast retransmits, 25 D-SACKs")


def test_a_released_lightpaths_drops_still_count_as_the_models() -> None:
    """A job's lightpath is released (its cap removed from the forwarder) before the run
    reads the counters: its pacer's tail drops must still count as the model's, else TCP's
    recovery of them reads as losses nothing explains (calib-bandwidth-gpipe, 2026-12-04:
    296 of 346 pacer drops were gone from the verdict's count)."""
    import random as _random
    import socket

    from testbed.emu.forwarder import VNET_HDR_LEN, Direction, Forwarder
    from testbed.emu.slack import SlackHistogram

    class Out:
        def send(self, frame: bytes) -> int:
            return len(frame)

    fwd = Forwarder.__new__(Forwarder)  # the data path alone
    fwd.rate_bps, fwd.delay_s, fwd.loss, fwd.down = 1e9, 0.010, 0.0, False
    fwd.queue_bytes, fwd.rng, fwd.slack = 10**6, _random.Random(1), SlackHistogram()
    d = Direction("a_to_b", Out())  # type: ignore[arg-type]
    with socket.socket() as sock:  # not a packet socket: its drop counter reads 0
        fwd.dirs, fwd.socks = {sock.fileno(): d}, {sock.fileno(): sock}
        fwd.set_vlan(2, 50.0, limit_bytes=3000)
        eth = b"\x02" * 12 + b"\x81\x00" + (2).to_bytes(2, "big") + b"\x08\x00"
        for _ in range(10):  # 10 frames of 1,000 bytes at once into a 3,000-byte queue
            fwd._arrive(d, bytes(VNET_HDR_LEN) + eth + bytes(1000 - 18), 0.0)
        held = fid.forwarder_totals([fwd.stats()])
        fwd.remove_vlan(2)
        released = fid.forwarder_totals([fwd.stats()])
    assert held["lightpath_drops"] == 7 and held["max_rate_mbps"] == 50.0
    assert released["lightpath_drops"] == 7 and released["modelled_drops"] == 7
    assert released["max_rate_mbps"] == 50.0  # the released cap's, not the fibre's 1000
