"""Issue 58's loose ends, without root: a null collective time-out is gloo's 1800 s on both
backends; a repair (or any event that did not hit a job) is not charged the stall of the
cut before it; the fidelity verdict leaves a fault's losses out of its bounds; the stages a
worker agent starts on another machine get the launcher's fault options."""

from __future__ import annotations

import io
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from testbed.analysis.faultimpact import (
    GLOO_DEFAULT_TIMEOUT_S,
    EventMark,
    IterationMark,
    WorkerModel,
    impact_rows,
)
from testbed.emu.fidelity import (
    fault_accounting,
    fault_windows,
    forwarder_totals,
    link_invariants,
    record_tcp_samples,
    window_tcp_segments,
)
from testbed.emu.scale import Scale
from testbed.errors import InputError
from testbed.orchestrate.impact import emu_fault_impact, fault_agreement, job_fibres
from testbed.orchestrate.launch import FaultPolicy, Host, Launcher
from testbed.spec import load_scenario, parse_scenario

from .test_cluster_agent import HOSTS, _start
from .test_fault_impact_emu import TF, ZERO, _stage, _static_faults

ROOT = Path(__file__).resolve().parent.parent
OUTAGE = ROOT / "scenarios" / "fault-outage.yaml"


# -- 1. a null collective time-out ----------------------------------------------------------

def _null_timeout_scenario() -> Any:
    data = yaml.safe_load(OUTAGE.read_text())
    data["policy"]["workers"]["collective_timeout_s"] = None
    return parse_scenario(data)


def test_a_null_time_out_is_glooss_default_times_the_time_factor_as_in_the_simulator(
        ) -> None:
    sc = _null_timeout_scenario()
    assert sc.policy.workers.collective_timeout_s is None
    sim = WorkerModel.from_spec(sc.policy.workers)
    pol = FaultPolicy.of(sc.policy.workers, TF)
    assert sim.collective_timeout_s == GLOO_DEFAULT_TIMEOUT_S == 1800.0
    assert pol.collective_timeout_s == pytest.approx(1800.0 * TF)
    argv = pol.argv()
    assert argv[argv.index("--collective-timeout-s") + 1] == "18000"
    rec = pol.as_record()
    assert rec["collective_timeout_scenario_s"] == pytest.approx(sim.collective_timeout_s)
    assert "gloo default (1800 s)" in rec["collective_timeout_source"]
    given = FaultPolicy.of(load_scenario(OUTAGE).policy.workers, TF).as_record()
    assert given["collective_timeout_scenario_s"] == pytest.approx(2.0)
    assert "the scenario's" in given["collective_timeout_source"]
    # a launcher used without a scenario keeps the workers' start-up time-out, and says so
    assert "--collective-timeout-s" not in FaultPolicy().argv()
    assert "start-up" in FaultPolicy().as_record()["collective_timeout_source"]
    # the worker takes it (a finite number > 0)
    from workloads.worker import parse_args

    base = ["--plan", "p.json", "--rank", "0", "--master", "127.0.0.1:0", "--out", "o"]
    assert parse_args([*base, *argv]).collective_timeout_s == 18000.0


def test_the_agreement_names_the_time_out_each_side_applied() -> None:
    sc = _null_timeout_scenario()
    pol = FaultPolicy.of(sc.policy.workers, TF).as_record()
    agree = fault_agreement(sc, [], pol)
    t = agree["collective_timeout_s"]
    assert t["emu"] == pytest.approx(t["sim"]) and t["sim"] == 1800.0, t
    assert "gloo default" in t["emu_source"]


# -- 2. a repair is not charged the cut's stall ---------------------------------------------

def _cut_and_repair_records() -> tuple[Any, list[list[dict[str, Any]]], dict[str, Any],
                                        list[dict[str, Any]], dict[str, Any]]:
    """fault-outage's job through a static cut at 0.5002 s and its repair at 0.8003 s:
    iteration 40 stalls from 5.6 to 11.8 s wall (past the repair)."""
    sc = load_scenario(OUTAGE)
    cycle = 0.14
    before = [(i, ZERO + i * cycle, ZERO + (i + 1) * cycle) for i in range(40)]
    stalled = [(40, ZERO + 5.6, ZERO + 11.8)]
    after = [(40 + k, ZERO + 11.8 + (k - 1) * cycle, ZERO + 11.8 + k * cycle)
             for k in range(1, 20)]
    stages = [_stage(before + stalled + after)] * 2
    per_job = [{"job": "job0", "failure": None, "stage_dcs": ["dc-a", "dc-b"],
                "lightpaths": [{"boundary": 0, "route": ["A", "B"]}]}]
    fibres = {"job0": job_fibres(per_job[0]["lightpaths"], {frozenset(("dc-a", "dc-b")):
                                                            ("A", "B")}, ["dc-a", "dc-b"])}
    return sc, stages, _static_faults(0.5002, 0.8003), per_job, fibres


def test_a_repair_row_is_not_charged_the_stall_of_the_cut() -> None:
    sc, stages, faults, per_job, fibres = _cut_and_repair_records()
    out = emu_fault_impact(sc, {"job0": stages}, faults, per_job, TF, fibres, {"job0": 60})
    cut, rep = out["fault_impact"]
    assert cut["hit"] and not rep["hit"]
    assert cut["touched_iterations"][-1] == 40  # (35-39 end after the cut, began in it)
    assert cut["stall_s"] == pytest.approx(0.62 - 0.014, abs=1e-6)
    # the repair: iteration 40 is the cut's; what follows the repair is steady
    assert 40 not in rep["touched_iterations"] and rep["touched_iterations"] == [41]
    assert rep["stall_s"] == pytest.approx(0.0, abs=1e-6)
    assert rep["recovery_s"] == 0.0 and rep["iterations_redone"] == 0
    assert rep["steady_iteration_s"] == pytest.approx(0.014)
    # fault_iterations.csv: the hit's window (it runs on through the repair)
    assert {r["event"] for r in out["fault_iterations"]} == {0}
    assert any(r["iteration"] == 40 for r in out["fault_iterations"])


def test_a_failure_is_charged_to_the_hit_before_it_not_to_the_repair() -> None:
    sc, stages, faults, per_job, fibres = _cut_and_repair_records()
    bad = [*stages[0][:41], {"type": "error", "error": "RuntimeError: ...",
                             "t_s": ZERO + 9.0}]
    err = "stage 1 exited with code 1: RuntimeError: Timed out waiting 4000ms"
    out = emu_fault_impact(sc, {"job0": [bad, bad]}, faults,
                           [{**per_job[0], "failure": err}], TF, fibres, {"job0": 41})
    cut, rep = out["fault_impact"]
    assert not cut["survived"] and "Timed out" in cut["error"]
    assert cut["failed_at_s"] == pytest.approx(0.9) and cut["stall_s"] > 0.3
    assert rep["error"] is None and rep["stall_s"] in (0, 0.0)
    assert rep["iterations_lost"] == 0.0
    assert "charged to event 0" in rep["note"]


def test_an_event_that_missed_the_job_just_before_a_hit_does_not_take_its_stall() -> None:
    """A cut of another fibre 2 ms before the hit, in the same iteration: the hit is
    charged the stalled iteration, the other event the next one."""
    marks = [IterationMark("j", i, 0.01 * (i + 1), 0.01 * i) for i in range(20)]
    marks.append(IterationMark("j", 20, 0.21 + 0.5, 0.2))  # stalled by the cut at 0.203
    marks += [IterationMark("j", 21 + k, 0.71 + 0.01 * (k + 1)) for k in range(10)]
    other = EventMark(0, "fiber_cut", "C-D", 0.201, 0.0)
    hit = EventMark(1, "fiber_cut", "A-B", 0.203, 0.3)
    rows = impact_rows({"j": marks}, [other, hit], hit={"j": {1}})
    by = {r["event"]: r for r in rows}
    assert by[1]["touched_iterations"] == [20] and by[1]["stall_s"] == pytest.approx(0.5)
    assert 20 not in by[0]["touched_iterations"]
    assert by[0]["stall_s"] == pytest.approx(0.0, abs=1e-9)
    # both events hit it (hit=None): each its own iterations, the first its stall
    both = {r["event"]: r for r in impact_rows({"j": marks}, [other, hit])}
    assert set(both[0]["touched_iterations"]).isdisjoint(both[1]["touched_iterations"])


# -- 3. the fidelity verdict and a fault's losses -----------------------------------------

def _fwd(send_errors: int, fibre: str | None = "A-B") -> dict[str, Any]:
    d = {"rx_packets": 2456, "tx_segments": 4751, "queue_drops": 0, "loss_drops": 0,
         "down_drops": 0, "socket_drops": 0, "send_errors": send_errors, "vlans": {}}
    st: dict[str, Any] = {"rate_mbps": 100.0, "directions": {"u": d}}
    if fibre is not None:
        st["fibre"] = fibre
    return st


TCP = {"dc-a-h0": {"TcpOutSegs": 2122, "TcpRetransSegs": 3, "TcpExtTCPTimeouts": 2},
       "dc-b-h0": {"TcpOutSegs": 2042, "TcpRetransSegs": 3, "TcpExtTCPTimeouts": 2}}
"""fault-outage's hosts as measured (a 300 ms cut; /tmp bench run, 2026-12-07): 6
retransmitted, 5 frames lost as send errors of the cut fibre's forwarder."""


def test_the_cut_fibres_send_errors_are_the_models_drops() -> None:
    scale = Scale(time_factor=TF)
    plain = link_invariants(forwarder_totals([_fwd(5)]), TCP, scale, max_rtt_ms=4.0)
    by = {i.name: i for i in plain}
    assert not by["emulator_drops"].ok and not by["tcp_retransmits"].ok  # (as it was)
    cut = forwarder_totals([_fwd(5)], [frozenset(("B", "A"))])
    assert cut["send_errors"] == 0 and cut["cut_drops"] == 5 and cut["modelled_drops"] == 5
    by = {i.name: i for i in link_invariants(cut, TCP, scale, max_rtt_ms=4.0)}
    assert by["emulator_drops"].ok and "send errors of forwarders whose fibre" in \
        by["emulator_drops"].detail
    assert by["tcp_retransmits"].ok, by["tcp_retransmits"].reason()
    # another fibre's send errors stay the emulator's
    other = forwarder_totals([_fwd(5, "C-D")], [frozenset(("A", "B"))])
    assert other["send_errors"] == 5 and other["cut_drops"] == 0


def _summary_with_a_hit(recovery_s: float | None, survived: bool = True) -> dict[str, Any]:
    return {"events_clock_zero_monotonic_s": ZERO, "worker_jobs": [{"time_factor": TF}],
            "faults": [{"kind": "fiber_cut", "target": "A-B", "applied": True},
                       {"kind": "fiber_repair", "target": "A-B", "applied": True}],
            "fault_impact": [
                {"job": "job0", "event": 0, "kind": "fiber_cut", "target": "A-B",
                 "hit": True, "applied_at_s": 0.5, "recovery_s": recovery_s,
                 "survived": survived},
                {"job": "job0", "event": 1, "kind": "fiber_repair", "target": "A-B",
                 "hit": False, "applied_at_s": 0.8, "recovery_s": 0.0}]}


def _records(netns: str, samples: list[tuple[float, int, int]]) -> list[dict[str, Any]]:
    t0, out0, re0 = samples[0]
    recs: list[dict[str, Any]] = [{"type": "start", "ready_s": t0, "netns": netns,
                                   "tcp_segs": [out0, re0]}]
    recs += [{"type": "iteration", "iteration": k, "end_s": t, "tcp_segs": [o, r]}
             for k, (t, o, r) in enumerate(samples[1:])]
    return recs


def test_fault_windows_run_from_the_cut_until_the_iterations_are_back() -> None:
    (w,) = fault_windows(_summary_with_a_hit(0.65))
    assert w["start_s"] == pytest.approx(ZERO + 5.0) and w["end_s"] == pytest.approx(
        ZERO + 11.5)
    assert "fiber_cut A-B (job0)" == w["what"]
    (w,) = fault_windows(_summary_with_a_hit(None))  # never back: to the end
    assert w["end_s"] == float("inf")
    assert fault_windows({"fault_impact": []}) == []
    assert fault_windows({"fault_impact": [{"hit": True}]}) == []  # no clock


def test_window_segments_are_counted_once_per_host() -> None:
    # one host, two stages (the same namespace); counters at iteration ends
    pts = [(ZERO + 1.0, 100, 0), (ZERO + 4.9, 1000, 1), (ZERO + 11.8, 1010, 7),
           (ZERO + 12.0, 1100, 7), (ZERO + 20.0, 2000, 7)]
    stage0 = _records("m:1", pts)
    stage1 = _records("m:1", [(t + 0.01, o, r) for t, o, r in pts])
    samples = record_tcp_samples([stage0, stage1, [{"type": "start"}]])
    assert list(samples) == ["m:1"] and len(samples["m:1"]) == 10
    windows = fault_windows(_summary_with_a_hit(0.65))
    got = window_tcp_segments(samples, windows * 2)  # (overlapping windows: merged)
    assert got["retrans_segs"] == 6 and got["out_segs"] == 10 + 0, got  # 4.91 .. 11.8
    assert got["namespaces"] == 1 and got["spans"] == 1


def test_the_verdict_leaves_the_fault_windows_retransmits_out_and_says_so() -> None:
    scale = Scale(time_factor=TF)
    pts = [(ZERO + 1.0, 100, 0), (ZERO + 4.9, 1000, 0), (ZERO + 11.8, 1010, 40),
           (ZERO + 20.0, 2000, 40)]
    acct = fault_accounting(_summary_with_a_hit(0.65), [_records("m:1", pts)])
    assert acct["cut_fibres"] == [frozenset(("A", "B"))]
    assert acct["tcp"]["retrans_segs"] == 40
    tcp = {"h": {"TcpOutSegs": 4000, "TcpRetransSegs": 40}}
    by = {i.name: i for i in link_invariants(forwarder_totals([_fwd(0)]), tcp, scale,
                                             max_rtt_ms=4.0)}
    assert not by["tcp_retransmits"].ok  # 40 resends, nothing dropped: unexplained
    by = {i.name: i for i in link_invariants(forwarder_totals([_fwd(0)]), tcp, scale,
                                             max_rtt_ms=4.0, in_faults=acct["tcp"])}
    inv = by["tcp_retransmits"]
    assert inv.ok and inv.value == 0.0, inv.reason()
    assert "40 retransmitted and 10 sent in 1 fault window(s) left out" in inv.detail
    # a resend outside the windows still counts
    tcp["h"]["TcpRetransSegs"] = 60
    inv = {i.name: i for i in link_invariants(forwarder_totals([_fwd(0)]), tcp, scale,
                                              max_rtt_ms=4.0, in_faults=acct["tcp"])
           }["tcp_retransmits"]
    assert not inv.ok and inv.value == pytest.approx(20 / 3990)


def test_the_whole_verdict_records_the_faults_it_accounted_for() -> None:
    from testbed.emu.fidelity import verdict

    acct = fault_accounting(_summary_with_a_hit(None), [])
    v = verdict(Scale(time_factor=TF), [], forwarder_stats=[_fwd(5)], tcp=TCP, faults=acct)
    names = {i["name"]: i for i in v["invariants"]}
    assert names["emulator_drops"]["ok"] and names["tcp_retransmits"]["ok"], v["reasons"]
    assert v["faults"]["cut_fibres"] == ["A-B"] and v["faults"]["windows"][0]["end_s"] is None
    json.dumps(v)  # JSON-ready (no inf, no frozenset)
    assert fault_accounting({"faults": []}) == {}


def test_the_worker_reads_its_hosts_tcp_counters(tmp_path: Path) -> None:
    from workloads.faulttol import netns_id, tcp_segments

    snmp = tmp_path / "snmp"
    snmp.write_text("Ip: Forwarding\nIp: 1\nTcp: RtoAlgorithm OutSegs RetransSegs InErrs\n"
                    "Tcp: 1 4532038 390 0\n")
    assert tcp_segments(str(snmp)) == [4532038, 390]
    assert tcp_segments(str(tmp_path / "absent")) is None
    now = tcp_segments()
    assert now is None or (len(now) == 2 and all(x >= 0 for x in now))
    ns = netns_id()
    assert ns is None or ns.split(":")[-1].isdigit()


# -- 4. a stage on another machine gets the fault options ---------------------------------

FAULT = {"collective_timeout_s": 20.0, "on_fault": "retry", "max_restarts": 2,
         "restart_s": 1.5}


def test_the_start_message_carries_the_fault_options() -> None:
    from testbed.cluster.agent import parse_start

    o = parse_start(_start(fault=FAULT), HOSTS)
    assert o.fault is not None and o.fault.on_fault == "retry"
    assert o.fault.argv() == ["--on-fault", "retry", "--max-restarts", "2", "--restart-s",
                              "1.5", "--collective-timeout-s", "20"]
    assert parse_start(_start(), HOSTS).fault is None  # (an older driver: the defaults)
    null = parse_start(_start(fault={**FAULT, "collective_timeout_s": None}), HOSTS)
    assert null.fault is not None and "--collective-timeout-s" not in null.fault.argv()


@pytest.mark.parametrize("fault, field", [
    ("retry", "fault"),
    ({"bogus": 1}, "fault"),
    ({**FAULT, "collective_timeout_s": 0}, "fault.collective_timeout_s"),
    ({**FAULT, "collective_timeout_s": float("inf")}, "fault.collective_timeout_s"),
    ({**FAULT, "on_fault": "ignore"}, "fault.on_fault"),
    ({**FAULT, "max_restarts": -1}, "fault.max_restarts"),
    ({**FAULT, "max_restarts": True}, "fault.max_restarts"),
    ({**FAULT, "restart_s": -1}, "fault.restart_s"),
])
def test_bad_fault_options_are_refused_naming_the_field(fault: Any, field: str) -> None:
    from testbed.cluster.agent import parse_start

    with pytest.raises(InputError) as exc:
        parse_start(_start(fault=fault), HOSTS)
    assert exc.value.path == field, str(exc.value)


def test_the_agent_starts_its_worker_with_the_fault_options(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The agent's real start (a stand-in mnexec that writes the argv it was given): the
    worker's options are the launcher's, and the worker parses them."""
    from testbed.cluster.agent import Agent, parse_start
    from workloads.worker import parse_args

    bindir = tmp_path / "bin"
    bindir.mkdir()
    said = tmp_path / "argv.json"
    fake = bindir / "mnexec"
    fake.write_text(f"#!{sys.executable}\nimport json, sys\n"
                    f"open({str(said)!r}, 'w').write(json.dumps(sys.argv[1:]))\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}")
    agent = Agent("lp0001", tmp_path, HOSTS, io.BytesIO())
    try:
        agent.start(parse_start(_start(stage=1, metrics_address="127.0.0.1", fault=FAULT),
                                HOSTS))
        w = agent.workers[("job0", 1)]
        w.proc.wait(30)
    finally:
        agent.stop_all(grace_s=5.0)
    argv = json.loads(said.read_text())
    tail = argv[argv.index("workloads.worker") + 1:]
    args = parse_args(tail)
    assert (args.collective_timeout_s, args.on_fault, args.max_restarts, args.restart_s) == (
        20.0, "retry", 2, 1.5)


def test_the_driver_sends_the_launchers_fault_options_to_the_agent(tmp_path: Path) -> None:
    """The launcher's stage on another machine: its policy's options reach the agent's
    `start` message as a local stage's argv has them."""
    from workloads.plan import JobPlan

    from .test_cluster_agent import _plan

    class Remote:
        def __init__(self) -> None:
            self.calls: list[dict[str, Any]] = []

        def spawn(self, machine: str, **kw: Any) -> tuple[Any, str, int, float]:
            self.calls.append({"machine": machine, **kw})

            class P:
                pid = 7

                def poll(self) -> int | None:
                    return None

            return P(), "192.0.2.2", 9100, 1.0

    remote = Remote()
    sc = _null_timeout_scenario()
    pol = FaultPolicy.of(sc.policy.workers, TF)
    plan = JobPlan.from_dict(_plan())
    launcher = Launcher(tmp_path, remote=remote, fault_policy=pol)
    run_hosts = [Host("h0", "10.0.0.1", machine="m1"), Host("h1", "10.0.0.2", machine="m2")]
    launcher._start_job(plan, run_hosts, 1.0)
    assert [c["machine"] for c in remote.calls] == ["m1", "m2"]
    for c in remote.calls:
        assert c["fault"] == {"collective_timeout_s": pytest.approx(18000.0),
                              "on_fault": "fail", "max_restarts": 3,
                              "restart_s": pytest.approx(sc.policy.workers.restart_s * TF)}
    # and the session's message (ClusterWorkers.spawn) carries it
    from testbed.cluster.agentlink import ClusterWorkers
    from testbed.cluster.spec import parse_cluster

    c = parse_cluster({"machines": [{"name": "m1", "address": "192.0.2.1"}]})
    cw = ClusterWorkers(c, "lp0a0e")
    s = cw.sessions["m1"]
    sent: list[dict[str, Any]] = []

    def agent_answers(msg: dict[str, Any]) -> None:
        sent.append(msg)
        cw.dispatch(s, {"op": "started", "job": "job0", "stage": 0, "pid": 31,
                        "metrics_port": 9000, "spawn_s": 1.0})

    s.send = agent_answers  # type: ignore[method-assign]
    cw.spawn("m1", job="job0", stage=0, host="h0", plan={}, master="10.0.0.1:0",
             record_path=tmp_path / "s0.jsonl", log_path=tmp_path / "s0.log", timeout_s=60,
             duty=1.0, linger_s=0.0, nice=0, fault=pol.as_order(), reply_timeout_s=10)
    assert sent[0]["op"] == "start" and sent[0]["fault"] == pol.as_order()
