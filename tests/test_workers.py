"""Workers: plans (scaling), result parsing, agreement, and real gloo runs on localhost."""

from __future__ import annotations

import itertools
import json
import math
import os
import signal
from pathlib import Path

import pytest

from testbed.emu.scale import Scale
from testbed.errors import InputError
from testbed.metrics.agreement import agreement_rows, markdown_table, relative_error
from testbed.orchestrate.jobs import assign_hosts, plan_emulated_jobs, run_jobs_on_hosts
from testbed.orchestrate.launch import Host, Launcher, default_duty, fitting_duty
from testbed.orchestrate.results import chrome_trace, job_iterations, read_records, summarize_job
from testbed.schedule import PipelineProblem, Schedule, build_schedule, time_schedule
from testbed.spec import load_scenario
from tests.waiting import scaled, wait_until
from workloads.plan import JobPlan, TinyGPTConfig, model_plan, shadow_plan

ROOT = Path(__file__).resolve().parent.parent
LOCAL = Host("local", "127.0.0.1", "lo")


def _problem(p: int = 4, m: int = 4, f: float = 10.0, b: float = 20.0,
             act_mb: float = 1.0) -> PipelineProblem:
    return PipelineProblem.uniform(p, m, f, b, latency_ms=5.0, bandwidth_gbps=8.0,
                                   activation_mb=act_mb)


def test_shadow_plan_scales_time_and_bytes() -> None:
    prob = _problem(act_mb=16.0)
    sched = build_schedule("1f1b", prob)
    plan = shadow_plan("j", prob, sched, iterations=2, bandwidth_divisor=1000.0,
                       time_factor=10.0)
    assert plan.forward_ms == (100.0,) * 4 and plan.backward_ms == (200.0,) * 4
    # serialisation over the emulated link (8 Gb/s / 1000) = time_factor x the real one
    assert plan.activation_bytes == (160_000,) * 3
    emu_ser_ms = 8 * plan.activation_bytes[0] / (8e9 / 1000) * 1e3
    assert emu_ser_ms == pytest.approx(10.0 * prob.hop_serialisation_ms(0))
    again = JobPlan.from_dict(__import__("json").loads(plan.to_json()))
    assert again == plan and again.sched() == sched


def test_plan_rejects_bad_input() -> None:
    prob = _problem()
    sched = build_schedule("gpipe", prob)
    with pytest.raises(InputError, match="mode"):
        JobPlan("j", "bogus", sched.to_dict(), (1.0,) * 4, (1.0,) * 4, (1,) * 3, 4, 1)  # type: ignore[arg-type]
    with pytest.raises(InputError, match="activation_bytes"):
        JobPlan("j", "shadow", sched.to_dict(), (1.0,) * 4, (1.0,) * 4, (1,) * 2, 4, 1)
    zb = build_schedule("zb-h1", prob)
    with pytest.raises(InputError, match="model mode"):
        model_plan("j", zb, 4, iterations=1)
    with pytest.raises(InputError, match="heads"):
        TinyGPTConfig(hidden=30, heads=4)
    with pytest.raises(InputError, match="time_factor"):
        shadow_plan("j", prob, sched, iterations=1, bandwidth_divisor=10, time_factor=0)


def _rec(it: int, ops: list[tuple[str, float, float]], warm: bool = False) -> dict:
    return {"type": "iteration", "iteration": it, "warmup": warm, "start_s": 0.0,
            "end_s": 0.0, "ops": [list(o) for o in ops], "waits": [], "compute_s": 0.0,
            "sent_bytes": 10, "received_bytes": 10}


def test_job_iterations_measure_like_the_simulator() -> None:
    # stage 0 starts at 100.0; stage 1 ends last at 100.9 -> 0.9 s; busy 0.2 + 0.5
    s0 = [_rec(0, [("F0", 100.0, 100.1), ("B0", 100.6, 100.7)], warm=True),
          _rec(1, [("F0", 200.0, 200.2), ("B0", 200.8, 201.0)])]
    s1 = [_rec(0, [("F0", 100.2, 100.4), ("B0", 100.4, 100.9)], warm=True),
          _rec(1, [("F0", 200.3, 200.5), ("B0", 200.5, 200.7)])]
    its = job_iterations([s0, s1])
    assert [r["iteration"] for r in its] == [0, 1]
    assert its[0]["time_s"] == pytest.approx(0.9)
    assert its[0]["bubble_ratio"] == pytest.approx(1 - 0.9 / (2 * 0.9))
    assert its[1]["time_s"] == pytest.approx(1.0)
    summ = summarize_job("j", [s0, s1], Scale(time_factor=10.0))
    assert summ["iterations_measured"] == 1
    assert summ["emulated_iteration_time_s"] == pytest.approx(0.1)
    trace = chrome_trace({"j": [s0, s1]})
    xs = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(xs) == 8 and min(e["ts"] for e in xs) == 0.0
    assert {e["tid"] for e in xs} == {0, 1}


def test_read_records_skips_truncated_line(tmp_path: Path) -> None:
    p = tmp_path / "s.jsonl"
    p.write_text('{"type": "start"}\n{"type": "iter')
    assert read_records(p) == [{"type": "start"}]
    assert read_records(tmp_path / "missing.jsonl") == []


def test_agreement_rows_and_table() -> None:
    assert relative_error(2.0, 2.1) == pytest.approx(0.05)
    rows = agreement_rows({"a": 2.0, "b": 1.0}, {"a": 1.9, "b": None})
    assert rows[0] == {"job": "a", "simulated_iteration_time_s": 2.0,
                       "emulated_iteration_time_s": 1.9, "relative_error": pytest.approx(0.05),
                       "starved": []}
    assert rows[1]["emulated_iteration_time_s"] is None and rows[1]["relative_error"] is None
    table = markdown_table(rows)
    assert "5.0 %" in table and table.count("\n") == 4
    with pytest.raises(ValueError):
        relative_error(0.0, 1.0)


def test_plan_emulated_jobs_matches_timer() -> None:
    sc = load_scenario(ROOT / "scenarios" / "calib-latency-1f1b.yaml")
    jobs = plan_emulated_jobs(sc)
    assert len(jobs) == 2
    for j in jobs:
        assert j.problem.stages == 4 and len(set(j.stage_dcs)) >= 2
        t = time_schedule(j.problem, j.schedule)
        assert j.simulated_iteration_time_s == pytest.approx(t.iteration_time_ms / 1e3)
        assert j.plan.forward_ms == tuple(f * 10 for f in j.problem.forward_ms)
    hosts = {"dc-a": [Host("a0", "10.0.0.1"), Host("a1", "10.0.0.2")],
             "dc-b": [Host("b0", "10.0.0.3")], "dc-c": [Host("c0", "10.0.0.4")]}
    placed = assign_hosts(jobs, hosts)
    a_hosts = [h.name for row in placed for h in row if h.name.startswith("a")]
    assert a_hosts == ["a0", "a1"][:len(a_hosts)] or len(set(a_hosts)) == 2
    with pytest.raises(InputError, match="no emulated host"):
        assign_hosts(jobs, {"dc-a": hosts["dc-a"]})


def test_default_duty() -> None:
    assert default_duty(1, cores=2) == 1.0
    assert default_duty(8, cores=2) == pytest.approx(0.125)


def test_duty_fits_the_cores_the_machine_has_free() -> None:
    """8 CPU workers on 2 cores ask for half of them (duty 0.125); with another process
    spinning on one core (1.0 free) they ask for half of what is left, never for more
    cores than the machine has, never below MIN_DUTY; unread, the nominal cores."""
    from testbed.metrics.hostload import CpuTimes, idle_cores
    from testbed.orchestrate.launch import MIN_DUTY

    assert fitting_duty(8, 2.0, cores=2)["duty"] == pytest.approx(0.125)
    busy = fitting_duty(8, 1.0, cores=2)
    assert busy == {"duty": 0.0625, "workers": 8, "cores": 2, "free_cores": 1.0}
    assert fitting_duty(8, 3.5, cores=2)["duty"] == pytest.approx(0.125)  # capped
    assert fitting_duty(8, 0.0, cores=2)["duty"] == MIN_DUTY
    # pinned to one core of an idle 2-core machine: sized to that core (testbed.emu.cpuset)
    assert fitting_duty(8, 1.9, cores=1) == {"duty": 0.0625, "workers": 8, "cores": 1,
                                             "free_cores": 1.0}
    assert fitting_duty(8, None, cores=2) == {"duty": 0.125, "workers": 8, "cores": 2,
                                             "free_cores": None}
    # what is recorded gives back its duty (CI: 0.0548 sized from 0.87758, 0.0549 from 0.878)
    for free in [0.87758] + [i / 7919 for i in range(2 * 7919)]:
        chosen = fitting_duty(8, free, cores=2)
        assert fitting_duty(8, chosen["free_cores"], cores=2) == chosen
    # a spinner on one of 2 cores: half the time idle, steal not counted as free
    first, last = CpuTimes(100, 100, 0), CpuTimes(200, 190, 10)
    assert idle_cores(first, last, 2) == pytest.approx(2 * 90 / 200)
    assert idle_cores(first, first, 2) is None


@pytest.mark.parametrize("order", ["peer first", "victim first"])
def test_failure_names_the_cause_not_the_peer_that_lost_it(tmp_path: Path, order: str) -> None:
    """Two stages end between two polls: one killed by SIGKILL, the other exits 1 with
    gloo's peer-loss error. Whatever order they are listed or reaped in, the job's
    failure names the killed stage (a CI run named the peer: stage order decided)."""
    import subprocess
    import sys

    from testbed.orchestrate.launch import JobRun, Worker

    prob = PipelineProblem.uniform(2, 2, 5.0, 10.0, activation_mb=0.01)
    plan = shadow_plan("j", prob, build_schedule("1f1b", prob), iterations=1,
                       bandwidth_divisor=1.0, time_factor=1.0)
    peer_rec, victim_rec = tmp_path / "stage0.jsonl", tmp_path / "stage1.jsonl"
    peer_rec.write_text(json.dumps({"type": "error", "error": (
        "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection "
        "closed by peer [127.0.0.1]:40123")}) + "\n")
    victim_rec.write_text(json.dumps({"type": "iteration", "iteration": 0}) + "\n")
    peer = subprocess.Popen([sys.executable, "-c", "raise SystemExit(1)"])
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    victim.send_signal(signal.SIGKILL)
    peer.wait(30)
    victim.wait(30)
    workers = [Worker("j", 0, LOCAL, peer, peer_rec, tmp_path / "0.log", 0, 0.0),
               Worker("j", 1, LOCAL, victim, victim_rec, tmp_path / "1.log", 0, 0.0)]
    if order == "victim first":
        workers.reverse()
    launcher = Launcher(tmp_path)
    launcher.jobs["j"] = JobRun(plan, workers)
    assert not launcher.poll()
    failure = launcher.jobs["j"].failure
    assert failure is not None and failure.startswith("stage 1 ") and "SIGKILL" in failure


# -- real workers (torch + gloo on 127.0.0.1) -------------------------------------------

@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("compute", ["cpu", "device"])
def test_shadow_workers_agree_with_timer_on_localhost(tmp_path: Path, compute: str) -> None:
    """Two 4-stage jobs (gpipe, 1f1b) at once; no link delay here, so compare with
    the timer on the same problem without network delay. On a stand-in accelerator
    (compute device) every op lasts at least its time and no CPU share is recorded."""
    prob = PipelineProblem.uniform(4, 4, 40.0, 80.0, activation_mb=0.05)
    plans = []
    for name in ("gpipe", "1f1b"):
        sched = build_schedule(name, prob)
        plans.append((shadow_plan(name.replace("1f1b", "ofob"), prob, sched, iterations=2,
                                  bandwidth_divisor=1.0, time_factor=1.0,
                                  compute=compute), [LOCAL] * 4))  # type: ignore[arg-type]
    first_cpu = min(os.sched_getaffinity(0))  # a CPU worker runs on the cores it is given
    with Launcher(tmp_path, cpus=(first_cpu,)) as launcher:
        launcher.start(plans)
        launcher.wait(180)
        outcome = launcher.outcome()
        records = launcher.records()
        duty = launcher.host_load()["worker_duty"]
    assert all(o["ok"] for o in outcome.values()), outcome
    if compute == "cpu":  # sized to the cores free when they started, and said so
        assert duty["workers"] == 8 and 0.0 <= duty["free_cores"] <= duty["cores"], duty
        assert duty["cores"] == 1  # sized to the one core they were given
        assert duty["duty"] == fitting_duty(8, duty["free_cores"], duty["cores"])["duty"]
    else:
        assert duty["workers"] == 0  # stand-ins ask the CPU for no compute
    sim_s = time_schedule(prob, build_schedule("gpipe", prob)).iteration_time_ms / 1e3
    for job, stages in records.items():
        s = summarize_job(job, stages)
        assert s["iterations_measured"] == 2
        # Behaviour: the workers keep the schedule's ops (never faster than the timer,
        # which a skipped op or pause would give) and stay within the same schedule's
        # order of time (a serialised or stalled pipeline takes several times longer).
        # How close they get is measured by bench/bench_workers.py, not asserted here.
        emu_s = s["emulated_iteration_time_s"]
        assert sim_s * 0.97 <= emu_s < sim_s * 2.0, (job, s, sim_s)
        sent = sum(r["sent_bytes"] for st in stages for r in st if r.get("type") == "iteration")
        assert sent == 3 * 2 * 4 * 50_000 * 3  # hops x dirs x microbatches x bytes x iters
        starts = [r for st in stages for r in st if r.get("type") == "start"]
        assert len(starts) == 4 and all(r["calibration"]["compute"] == compute
                                        for r in starts)
        if compute == "cpu":
            assert all(r["calibration"]["duty"] == pytest.approx(duty["duty"], abs=1e-4)
                       for r in starts)
            assert all(r["calibration"]["cpus"] == [first_cpu] for r in starts)
        else:  # a stand-in asks for no CPU: left where it is
            assert all("cpus" not in r["calibration"] for r in starts)
        if compute == "device":
            its = [r for st in stages for r in st if r.get("type") == "iteration"]
            assert its and all("cpu_share" not in r for r in its)
            for r in its:
                for op, start, end in r["ops"]:
                    want = (40.0 if op.startswith("F") else 80.0) / 1e3
                    assert end - start >= want * 0.999, (op, end - start)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_model_mode_loss_falls_and_dead_worker_is_detected(tmp_path: Path) -> None:
    sched2 = Schedule.from_strings("1f1b", ["F0 F1 B0 F2 B1 F3 B2 B3", "F0 B0 F1 B1 F2 B2 F3 B3"])
    good = model_plan("good", sched2, 4, iterations=25,
                      config=TinyGPTConfig(layers=2, hidden=32, heads=2, seq_len=16))
    prob = PipelineProblem.uniform(2, 2, 200.0, 400.0, activation_mb=0.01)
    doomed = shadow_plan("doomed", prob, build_schedule("gpipe", prob), iterations=50,
                         bandwidth_divisor=1, time_factor=1)
    # the workers' rendezvous/collective time-out: 30 s was less than a busy machine takes
    # to start four torch workers one after another
    with Launcher(tmp_path, timeout_s=scaled(60)) as launcher:
        launcher.start([(good, [LOCAL] * 2), (doomed, [LOCAL] * 2)])
        victim = launcher.jobs["doomed"].workers[1]
        # killed only once it has finished two iterations (the test went on and killed it
        # anyway after 120 s before)
        wait_until(lambda: sum(r.get("type") == "iteration"
                               for r in read_records(victim.record_path)) >= 2,
                   "two iterations of the doomed job's stage 1", timeout_s=120, interval_s=0.2,
                   alive=lambda: None if victim.proc.poll() is None else
                   f"stage 1 exited early (rc {victim.proc.returncode})")
        os.kill(victim.proc.pid, signal.SIGKILL)
        launcher.wait(180)
        outcome = launcher.outcome()
        records = launcher.records()
    assert outcome["good"]["ok"], outcome["good"]
    assert not outcome["doomed"]["ok"]
    assert "stage 1" in outcome["doomed"]["failure"]
    assert "SIGKILL" in outcome["doomed"]["failure"]
    # the dead job's completed iterations are kept
    assert summarize_job("doomed", records["doomed"])["iterations_measured"] >= 1
    losses = summarize_job("good", records["good"])["losses"]
    assert len(losses) == 26 and all(math.isfinite(x) for x in losses)
    assert sum(losses[-5:]) / 5 < 0.6 * sum(losses[:3]) / 3


def _iterations(stage_records: list[dict]) -> list[dict]:  # type: ignore[type-arg]
    return [r for r in stage_records if r.get("type") == "iteration"]


@pytest.mark.slow
def test_jobs_go_on_iterating_until_the_events_are_done(tmp_path: Path) -> None:
    """--go-on-until (emulation.iterate_through_events): two 3-stage jobs with 2 planned
    iterations (+1 warm-up) go on until the file appears, every stage of a job the same
    number of times (they agree on each further one), and then end cleanly."""
    import time

    prob = PipelineProblem.uniform(3, 2, 5.0, 10.0, activation_mb=0.01)
    sched = build_schedule("1f1b", prob)
    plans = [(shadow_plan(f"j{k}", prob, sched, iterations=2, bandwidth_divisor=1.0,
                          time_factor=1.0), [LOCAL] * 3) for k in range(2)]
    stop = tmp_path / "events-done"

    def done(job: str) -> int:
        return len(_iterations(read_records(tmp_path / "workers" / job / "stage0.jsonl")))

    with Launcher(tmp_path, timeout_s=scaled(60), go_on_until=stop) as launcher:
        launcher.start(plans)
        wait_until(lambda: done("j0") >= 6 and done("j1") >= 6,
                   "both jobs 6 iterations in, 3 beyond their plans", timeout_s=120)
        t_stop = time.monotonic()
        stop.touch()
        launcher.wait(scaled(120))
        outcome = launcher.outcome()
        records = launcher.records()
    assert all(o["ok"] for o in outcome.values()), outcome
    for job, stages in records.items():
        counts = {len(_iterations(st)) for st in stages}
        assert len(counts) == 1, (job, counts)
        (n,) = counts
        assert n >= 6, (job, n)
        # it stopped: at most the iteration under way and the one already agreed on
        late = [r for r in _iterations(stages[0]) if r["start_s"] > t_stop]
        assert len(late) <= 2, (job, len(late))
        assert summarize_job(job, stages)["iterations_measured"] == n - 1


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_run_jobs_on_local_hosts_writes_records(tmp_path: Path) -> None:
    import yaml

    from testbed.spec import parse_scenario

    data = yaml.safe_load((ROOT / "scenarios" / "calib-latency-1f1b.yaml").read_text())
    data["emulation"].update({"worker_iterations": 3, "worker_warmup_iterations": 1})
    sc = parse_scenario(data)
    jobs = plan_emulated_jobs(sc)[:1]
    hosts = {dc.name: [LOCAL] for dc in sc.dcs}
    res = run_jobs_on_hosts(jobs, hosts, tmp_path, deadline_s=200)
    assert res["failed_jobs"] == []
    (row,) = res["agreement"]
    assert row["job"] == "job0" and row["relative_error"] is not None
    # no WAN delay on localhost: the no-delay timing is the floor, and a working
    # pipeline stays within the same order (how close: bench/bench_workers.py)
    nd = time_schedule(jobs[0].problem.no_delay(), jobs[0].schedule).iteration_time_ms / 1e3
    assert nd * 0.97 <= row["emulated_iteration_time_s"] < nd * 2.0, (row, nd)
    assert (tmp_path / "iterations.csv").read_text().count("\n") == 1 + 4
    # each boundary's messages against the model's link: on localhost none of the
    # lightpaths' delay is there, so their messages arrive before the model has them
    tr = res["worker_jobs"][0]["transfers"]
    prob = jobs[0].problem
    assert tr["iterations"] >= 1 and len(tr["boundaries"]) == 2 * (prob.stages - 1)
    assert sum(b["seen"] for b in tr["boundaries"]) > 0
    for b in tr["boundaries"]:
        if b["seen"] and not b["inside_dc"]:
            assert b["excess_ms_median"] < 0, b
    # stage 0 bound the rendezvous port itself (port 0) and published it
    rv = json.loads((tmp_path / "workers" / "job0" / "rendezvous.json").read_text())
    assert rv["port"] > 0
    assert (tmp_path / "trace.json").stat().st_size > 100


def test_emulated_hosts_tcp_windows_fit_the_lightpath_queue() -> None:
    from testbed.emu.plan import build_plan
    from testbed.emu.tcp_tuning import (
        TCP_GOODPUT,
        WIRE_BYTES_PER_SEGMENT,
        host_routes,
        lightpath_queue_bytes,
        window_segments,
    )

    assert TCP_GOODPUT == pytest.approx(1448 / 1518)
    for rate, delay in ((50.0, 90.0), (25.0, 100.0), (1.0, 5.0)):
        w = window_segments(rate, delay)
        queue = lightpath_queue_bytes(rate, delay)
        bdp = rate * 1e6 / 8 * 2 * delay / 1e3
        assert w * WIRE_BYTES_PER_SEGMENT >= bdp  # the window fills the pipe
        # a whole window burst fits the pacer queue with room for a 64 KB GSO frame
        assert w * WIRE_BYTES_PER_SEGMENT + 65536 <= queue
    sc = load_scenario(ROOT / "scenarios" / "calib-bandwidth-1f1b.yaml")
    plan = build_plan(sc, prefix="lp0000")
    routes = dict(host_routes(plan, "dc-a"))
    assert set(routes) == {plan.dc_subnets["dc-b"], plan.dc_subnets["dc-c"]}
    lp = next(x for x in plan.lightpaths if {x.dc_a, x.dc_b} == {"dc-a", "dc-c"})
    assert routes[plan.dc_subnets["dc-c"]] == window_segments(lp.rate_mbps, lp.delay_ms)


def test_simulated_side_uses_the_emulated_lightpaths() -> None:
    from testbed.emu.plan import build_plan
    from testbed.emu.tcp_tuning import TCP_GOODPUT
    from testbed.orchestrate.pp_jobs import on_emulated_links

    sc = load_scenario(ROOT / "scenarios" / "calib-bandwidth-1f1b.yaml")
    plan = build_plan(sc, prefix="lp0000")
    by_pair = {frozenset((lp.dc_a, lp.dc_b)): lp for lp in plan.lightpaths}
    jobs = plan_emulated_jobs(sc)
    # not vacuous: some boundary crosses DCs, so the lightpath branch below is checked
    assert any(a != c for job in jobs for a, c in itertools.pairwise(job.stage_dcs))
    for job in jobs:
        j = on_emulated_links(job, plan, sc)
        for b, hop in enumerate(j.problem.hops):
            a, c = j.stage_dcs[b], j.stage_dcs[b + 1]
            if a == c:
                assert hop == job.problem.hops[b]  # DC fabric unchanged
            else:
                lp = by_pair[frozenset((a, c))]
                assert hop.latency_ms == pytest.approx(lp.delay_ms / sc.emulation.time_factor)
                assert hop.bandwidth_gbps == pytest.approx(lp.real_gbps * TCP_GOODPUT)
        timing = time_schedule(j.problem, j.schedule, check_memory_cap=False, record=False)
        assert j.simulated_iteration_time_s == pytest.approx(timing.iteration_time_ms / 1e3)


def test_self_reach_check() -> None:
    from workloads.worker import check_self_reach, iface_ipv4

    assert iface_ipv4("lo") == "127.0.0.1"
    assert iface_ipv4("no-such-if0") is None
    check_self_reach("127.0.0.1")
    with pytest.raises(OSError):
        check_self_reach("192.0.2.77")  # not ours: bind fails


def test_controller_job_requests_and_route_delay() -> None:
    from testbed.emu.plan import build_plan
    from testbed.errors import RuntimeFailure
    from testbed.jobs.sim import resolve_jobs
    from testbed.orchestrate.ctl_jobs import job_request, route_delay_ms
    from testbed.traces import generate_jobs

    sc = load_scenario(ROOT / "scenarios" / "calib-latency-gpipe.yaml")
    plan = build_plan(sc, prefix="lp0000")
    f = {frozenset((x.u, x.v)): x.delay_ms for x in plan.fibres}
    assert route_delay_ms(plan, [["B", "A"]]) == f[frozenset("AB")]
    assert route_delay_ms(plan, [["A", "B"], ["B", "C"]]) == pytest.approx(
        f[frozenset("AB")] + f[frozenset("BC")])
    with pytest.raises(RuntimeFailure, match="unknown fibre"):
        route_delay_ms(plan, [["A", "Z"]])
    job = resolve_jobs(sc.workload, generate_jobs(sc.workload))[0]  # type: ignore[arg-type]
    req = job_request(sc, job, "shadow")
    assert req == {"model": "calib-lat", "stages": 4, "gpus_per_stage": 1, "microbatches": 8,
                   "iterations": 10, "policy": "sp-ff", "schedule": "gpipe"}


def test_agreement_spread_and_starvation_verdict() -> None:
    """p10/p90 errors come from the job's measured iterations; a starved job or too few
    iterations make the run's agreement unreliable, with the reason named."""
    from testbed.metrics.agreement import MIN_ITERATIONS, agreement_verdict, verdict_line

    details = {
        "a": {"iterations_measured": 25, "emulated_p10_s": 1.9, "emulated_p90_s": 2.2,
              "cpu_share_median": 0.97, "op_overrun_median": 0.01},
        "b": {"iterations_measured": 25, "emulated_p10_s": 1.0, "emulated_p90_s": 1.3,
              "cpu_share_median": 0.55, "op_overrun_median": 0.12},
    }
    rows = agreement_rows({"a": 2.0, "b": 1.0}, {"a": 2.04, "b": 1.1}, details)
    assert rows[0]["relative_error_p10"] == pytest.approx(-0.05)
    assert rows[0]["relative_error_p90"] == pytest.approx(0.10)
    assert rows[0]["starved"] == []
    assert len(rows[1]["starved"]) == 2 and "55 %" in rows[1]["starved"][0]
    v = agreement_verdict(rows, {"steal_frac": 0.0})
    assert v["worst_job"] == "b" and v["worst_relative_error"] == pytest.approx(0.1)
    assert v["median_relative_error"] == pytest.approx(0.06)
    assert not v["reliable"] and all(r.startswith("b: ") for r in v["reasons"])
    assert "UNRELIABLE" in verdict_line(v)
    ok = agreement_verdict(rows[:1], {"steal_frac": 0.0})
    assert ok["reliable"] and "UNRELIABLE" not in verdict_line(ok)
    assert not agreement_verdict(rows[:1], {"steal_frac": 0.2})["reliable"]
    few = agreement_rows({"a": 2.0}, {"a": 2.0}, {"a": {"iterations_measured": 3}})
    v = agreement_verdict(few)
    assert not v["reliable"] and f"< {MIN_ITERATIONS}" in v["reasons"][0]
    table = markdown_table(rows)
    assert "+10.0 %" in table and "55 %" in table and "CPU starvation" in table


def test_summarize_job_percentiles_cpu_share_and_overrun() -> None:
    """Per job: p10/p90 over measured iterations; the least CPU share of any stage and
    the slowest stage's op overrun (op wall time / asked compute time - 1), medians."""
    from testbed.orchestrate.results import quantile, summarize_job

    assert quantile([1.0, 2.0, 3.0, 4.0, 5.0], 0.1) == pytest.approx(1.4)
    assert quantile([7.0], 0.9) == 7.0

    def rec(it: int, t0: float, dur: float, share: float, asked: float) -> dict:
        return {"type": "iteration", "iteration": it, "warmup": it == 0,
                "ops": [["F0", t0, t0 + dur]], "compute_s": asked, "sent_bytes": 1,
                "cpu_share": share}

    stages = [[rec(i, 10.0 * i, 1.0 + 0.1 * i, 0.9, 1.0) for i in range(11)],
              [rec(i, 10.0 * i, 1.0, 0.6 if i % 2 else 0.95, 1.0) for i in range(11)]]
    s = summarize_job("j", stages, Scale(time_factor=2.0))
    assert s["iterations_measured"] == 10
    times = [1.0 + 0.1 * i for i in range(1, 11)]  # stage 0's op sets the iteration's span
    assert s["emulated_iteration_time_s"] == pytest.approx(sum(times[4:6]) / 2 / 2.0)
    assert s["emulated_p10_s"] == pytest.approx(quantile(times, 0.1) / 2.0)
    assert s["emulated_p90_s"] == pytest.approx(quantile(times, 0.9) / 2.0)
    assert s["cpu_share_median"] == pytest.approx((0.6 + 0.9) / 2)  # 5 of 10 at 0.6
    assert s["op_overrun_median"] == pytest.approx(0.55)


def test_host_load_reads_proc_stat() -> None:
    from testbed.metrics.hostload import HostLoad, parse_proc_stat

    t = parse_proc_stat("cpu  100 5 50 800 20 3 2 10 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\n")
    assert (t.busy, t.idle, t.steal) == (160, 820, 10)
    with pytest.raises(ValueError):
        parse_proc_stat("intr 1 2 3\n")
    h = HostLoad(min_interval_s=0.0)
    h.start()
    sum(i * i for i in range(200_000))
    out = h.summary()
    assert out["cores"] >= 1 and 0.0 <= out.get("steal_frac", 0.0) <= 1.0
    assert "load1_max" in out


def test_rendezvous_port_published_by_stage_0(tmp_path: Path) -> None:
    """Stage 0 binds port 0 and publishes the port; a waiting stage names the file when
    stage 0 never does (issue 17: no port picked, released and bound later)."""
    from workloads.worker import rendezvous_store

    port_file = tmp_path / "rendezvous.json"
    master = rendezvous_store("127.0.0.1:0", 0, 2, port_file, timeout_s=5.0)
    port = json.loads(port_file.read_text())["port"]
    assert port == master.port > 0
    client = rendezvous_store("127.0.0.1:0", 1, 2, port_file, timeout_s=5.0)
    client.set("k", "v")
    assert master.get("k") == b"v"
    with pytest.raises(TimeoutError, match="did not publish"):
        rendezvous_store("127.0.0.1:0", 1, 2, tmp_path / "never.json", timeout_s=0.2)


def test_worker_time_limits_scale_with_the_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    """The workers' time-out and the jobs' deadline grow with the measured slowness (a
    software-emulated VM measures ~10), never below the reference figures."""
    from testbed.envprobe import machine_slowness
    from testbed.orchestrate.jobs import JOBS_DEADLINE_S, WORKER_TIMEOUT_S, worker_time_limits_s

    assert worker_time_limits_s(1.0) == (WORKER_TIMEOUT_S, JOBS_DEADLINE_S)
    assert worker_time_limits_s(0.5) == (WORKER_TIMEOUT_S, JOBS_DEADLINE_S)
    assert worker_time_limits_s(10.0) == (10 * WORKER_TIMEOUT_S, 10 * JOBS_DEADLINE_S)
    monkeypatch.setenv("LIGHTPIPE_TIMEOUT_SCALE", "8")
    machine_slowness.cache_clear()
    try:
        assert worker_time_limits_s() == (8 * WORKER_TIMEOUT_S, 8 * JOBS_DEADLINE_S)
    finally:
        machine_slowness.cache_clear()


def test_burner_calibration_is_short_where_products_are_slow(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Under software emulation a 64x64 product takes ~0.1 s: the start-up calibration
    then times a handful of products, not a fixed 270 (minutes for 8 workers on 2 vCPUs)."""
    import time

    from workloads.compute import Burner

    done = []

    def slow_mm(self: Burner, reps: int) -> None:
        for _ in range(reps):
            time.sleep(0.02)  # one product, as slow as under emulation (order of magnitude)
            done.append(1)

    monkeypatch.setattr(Burner, "_mm", slow_mm)
    cal = Burner().cal
    assert len(done) <= 10, f"{len(done)} products timed"
    assert cal.mm_per_chunk == 1 and cal.chunk_s >= 0.02


def test_burner_spreads_the_asked_work_and_does_no_more() -> None:
    """Below duty 1 an op runs round(duration x duty / chunk) chunks at most, however its
    last pause falls (it used to work through the last pause: 110-127 % of the asked work
    at duty 0.06), never ends before its deadline, and a starved op stops at it."""
    import time

    from workloads.compute import Burner

    burner = Burner(duty=0.06)
    chunk = burner.cal.chunk_s
    for duration in (0.001, 0.01, 0.037, 0.1, 0.2):
        asked = max(1, round(duration * 0.06 / chunk))
        t0 = time.perf_counter()
        chunks = burner.burn(duration)
        assert time.perf_counter() - t0 >= duration
        assert chunks <= asked, (duration, chunks, asked)  # fewer only when starved
    assert 0 < burner.chunks_run <= sum(max(1, round(d * 0.06 / chunk))
                                        for d in (0.001, 0.01, 0.037, 0.1, 0.2))

    calls = []
    real_mm = Burner._mm

    def starved(self: Burner, reps: int) -> None:  # each chunk takes 10 x its time
        calls.append(1)
        real_mm(self, reps)
        time.sleep(9 * chunk)

    slow = Burner(duty=0.5)
    slow._mm = starved.__get__(slow)  # type: ignore[method-assign]
    done = slow.burn(40 * chunk)  # 20 chunks asked, 200 chunks' time needed for them
    assert done < 20 and done == len(calls)  # stopped at the deadline: the share shows it


def test_device_compute_plan_spec_and_refusals(tmp_path: Path) -> None:
    """worker_compute: device reaches the workers' plans; model mode refuses it, and an
    unknown compute is named."""
    prob = _problem()
    sched = build_schedule("gpipe", prob)
    plan = shadow_plan("j", prob, sched, iterations=1, bandwidth_divisor=10, time_factor=1,
                       compute="device")
    assert plan.compute == "device" and JobPlan.from_dict(json.loads(plan.to_json())) == plan
    with pytest.raises(InputError, match="compute"):
        shadow_plan("j", prob, sched, iterations=1, bandwidth_divisor=10, time_factor=1,
                    compute="gpu")  # type: ignore[arg-type]
    with pytest.raises(InputError, match="compute"):
        JobPlan("j", "model", sched.to_dict(), (0.0,) * 4, (0.0,) * 4, (1,) * 3, 4, 1,
                model=TinyGPTConfig(), compute="device")
    text = (ROOT / "scenarios" / "calib-latency-1f1b.yaml").read_text()
    spec = tmp_path / "dev.yaml"
    spec.write_text(text.replace("emulation:\n", "emulation:\n  worker_compute: device\n", 1))
    jobs = plan_emulated_jobs(load_scenario(spec))
    assert jobs and all(j.plan.compute == "device" for j in jobs)
    assert all(j.plan.compute == "cpu" for j in plan_emulated_jobs(
        load_scenario(ROOT / "scenarios" / "calib-latency-1f1b.yaml")))
    spec.write_text(text.replace("emulation:\n", "emulation:\n  worker_compute: device\n"
                                 "  workers: model\n", 1))
    from testbed.errors import SpecError
    with pytest.raises(SpecError, match="worker_compute"):
        load_scenario(spec)


def test_device_stand_in_waits_without_the_cpu() -> None:
    """A device op lasts at least its time and leaves the host CPU free: the calling
    thread's CPU time over a 0.3 s op is a small part of it (a busy-waiting stand-in would
    use all of it); it asks for no CPU share, and its wake-ups are recorded."""
    import resource

    from workloads.compute import Burner, DeviceStandIn, make_compute

    dev = make_compute("device", 0.5)
    assert isinstance(dev, DeviceStandIn) and isinstance(make_compute("cpu", 0.5), Burner)
    with pytest.raises(ValueError, match="compute"):
        make_compute("gpu", 0.5)
    assert dev.timer_slack_ns in (1, -1)  # set where prctl exists
    import time

    before = resource.getrusage(resource.RUSAGE_THREAD)
    t0 = time.perf_counter()
    assert dev.burn(0.3) == 0
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_THREAD)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    assert wall >= 0.3 and cpu < 0.1 * wall, (wall, cpu)
    assert dev.ops == 1 and dev.asked_s == 0.3 and dev.late_s >= 0
    assert dev.cpu_share(10.0, 0) is None and dev.as_dict()["compute"] == "device"
    assert dev.burn(0) == 0 and dev.ops == 1
