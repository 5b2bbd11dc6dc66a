"""Faults: the new event kinds (prometheus_kill, worker_kill, link_flap) in the spec and
the simulators (no root), the fault injector against a real Prometheus and an in-process
controller (no root), and one emulation per bundled fault scenario (root, slow): the
expected outcome, a `faults` row in summary.json, and every finished iteration kept."""

from __future__ import annotations

import csv
import json
import logging
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from testbed.errors import SpecError
from testbed.spec import Scenario, load_scenario, parse_scenario
from testbed.spec.faults import expand_flap, flap_steps, network_events, sim_fault_rows

from .conftest import load_yaml
from .emu_skip import emulation_skip_reason
from .waiting import scaled, wait_until

ROOT = Path(__file__).resolve().parent.parent
ENTRY = "import sys; from testbed.cli.main import main; sys.exit(main(sys.argv[1:]))"
FAULT_SCENARIOS = ("fault-prometheus", "fault-worker", "fault-link-flap")


def _with_events(base: str, events: list[dict[str, Any]], **emulation: Any) -> dict[str, Any]:
    data = load_yaml(base)
    data["events"] = events
    data.setdefault("emulation", {}).update(emulation)
    return data


# ---- spec -------------------------------------------------------------------------------
GOOD = [
    {"at_s": 1, "kind": "prometheus_kill", "down_s": 2},
    {"at_s": 1, "kind": "worker_kill", "job": 0, "stage": 1},
    {"at_s": 1, "kind": "worker_kill", "job": "job0", "stage": 0},
    {"at_s": 1, "kind": "link_flap", "link": ["1", "2"], "period_s": 4, "count": 3},
]


@pytest.mark.parametrize("event", GOOD, ids=[f"{e['kind']}-{i}" for i, e in enumerate(GOOD)])
def test_new_kinds_validate(event: dict[str, Any]) -> None:
    sc = parse_scenario(_with_events("pp-jobs.yaml", [event]))
    (ev,) = sc.events
    assert ev.kind == event["kind"]


BAD: list[tuple[str, dict[str, Any], str, str]] = [
    ("prom-no-down", {"at_s": 1, "kind": "prometheus_kill"}, "events[0]",
     "prometheus_kill needs down_s"),
    ("prom-link", {"at_s": 1, "kind": "prometheus_kill", "down_s": 1, "link": ["1", "2"]},
     "events[0]", "prometheus_kill takes no link"),
    ("prom-zero-down", {"at_s": 1, "kind": "prometheus_kill", "down_s": 0},
     "events[0].down_s", "> 0"),
    ("worker-no-stage", {"at_s": 1, "kind": "worker_kill", "job": 0}, "events[0]",
     "worker_kill needs stage"),
    ("worker-no-job", {"at_s": 1, "kind": "worker_kill", "stage": 0}, "events[0]",
     "worker_kill needs job"),
    ("worker-slots", {"at_s": 1, "kind": "worker_kill", "job": 0, "stage": 0, "slots": 2},
     "events[0]", "worker_kill takes no slots"),
    ("worker-job-index", {"at_s": 1, "kind": "worker_kill", "job": 5, "stage": 0},
     "events[0].job", "outside the emulated jobs"),
    ("worker-stage", {"at_s": 1, "kind": "worker_kill", "job": 0, "stage": 8},
     "events[0].stage", "outside the jobs' stages"),
    ("worker-bool-job", {"at_s": 1, "kind": "worker_kill", "job": True, "stage": 0},
     "events[0].job", "job index"),
    ("flap-no-count", {"at_s": 1, "kind": "link_flap", "link": ["1", "2"], "period_s": 2},
     "events[0]", "link_flap needs count"),
    ("flap-no-link", {"at_s": 1, "kind": "link_flap", "period_s": 2, "count": 1},
     "events[0]", "link_flap needs link"),
    ("flap-unknown-fibre", {"at_s": 1, "kind": "link_flap", "link": ["1", "5"],
     "period_s": 2, "count": 1}, "events[0].link", "no fibre 1-5"),
    ("flap-down-s", {"at_s": 1, "kind": "link_flap", "link": ["1", "2"], "period_s": 2,
     "count": 1, "down_s": 1}, "events[0]", "link_flap takes no down_s"),
    ("cut-period", {"at_s": 1, "kind": "fiber_cut", "link": ["1", "2"], "period_s": 2},
     "events[0]", "fiber_cut takes no period_s"),
    ("cut-no-link", {"at_s": 1, "kind": "fiber_cut"}, "events[0]", "fiber_cut needs link"),
]


@pytest.mark.parametrize("case,event,path,fragment", BAD, ids=[b[0] for b in BAD])
def test_bad_events_name_the_field(case: str, event: dict[str, Any], path: str,
                                   fragment: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_scenario(_with_events("pp-jobs.yaml", [event]))
    assert info.value.path == path, info.value.line()
    assert fragment in info.value.message, info.value.line()
    assert "\n" not in info.value.line()


def test_worker_kill_needs_pipeline_workers() -> None:
    data = _with_events("quickstart.yaml", [{"at_s": 1, "kind": "worker_kill", "job": 0,
                                             "stage": 0}])
    with pytest.raises(SpecError) as info:
        parse_scenario(data)
    assert info.value.path == "events[0].kind" and "pp_jobs" in info.value.message


def test_validate_cli_exits_2_with_one_line(cli: Any, tmp_path: Path) -> None:
    import yaml

    p = tmp_path / "bad.yaml"
    p.write_text(yaml.safe_dump(_with_events("pp-jobs.yaml", [
        {"at_s": 1, "kind": "link_flap", "link": ["1", "2"], "period_s": 2}])))
    res = cli("validate", str(p))
    assert res.code == 2
    lines = [ln for ln in res.err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "events[0]" in lines[0] and "count" in lines[0]


@pytest.mark.parametrize("name", (*FAULT_SCENARIOS, "fault-controller", "fault-wavelength"))
def test_bundled_fault_scenarios_validate(name: str) -> None:
    sc = load_scenario(ROOT / "scenarios" / f"{name}.yaml")
    assert sc.events and sc.workload.kind == "pp_jobs"


# ---- expansion and simulators -----------------------------------------------------------
def test_flap_expands_to_cuts_and_repairs() -> None:
    sc = parse_scenario(_with_events("pp-jobs.yaml", [
        {"at_s": 10, "kind": "link_flap", "link": ["1", "2"], "period_s": 4, "count": 3}]))
    (flap,) = sc.events
    assert flap_steps(flap) == [(10, False), (12, True), (14, False), (16, True),
                                (18, False), (20, True)]
    steps = expand_flap(flap)
    assert [e.kind for e in steps] == ["fiber_cut", "fiber_repair"] * 3
    assert all(e.link == ["1", "2"] for e in steps)


def test_network_events_leave_testbed_faults_out_and_sort() -> None:
    sc = parse_scenario(_with_events("pp-jobs.yaml", [
        {"at_s": 30, "kind": "fiber_cut", "link": ["2", "3"]},
        {"at_s": 5, "kind": "prometheus_kill", "down_s": 1},
        {"at_s": 10, "kind": "link_flap", "link": ["1", "2"], "period_s": 40, "count": 1},
        {"at_s": 1, "kind": "worker_kill", "job": 0, "stage": 0}]))
    got = [(e.at_s, e.kind) for e in network_events(sc.events)]
    assert got == [(10, "fiber_cut"), (30, "fiber_cut"), (30, "fiber_repair")]
    rows = sim_fault_rows(sc.events)
    assert [r["kind"] for r in rows] == ["worker_kill", "prometheus_kill", "link_flap",
                                         "fiber_cut"]
    assert [r["simulated"] for r in rows] == [False, False, True, True]


def _explicit(data: dict[str, Any]) -> dict[str, Any]:
    """The same scenario with each link_flap written out as its cuts and repairs."""
    out = json.loads(json.dumps(data))
    events = []
    for ev in out["events"]:
        if ev["kind"] == "link_flap":
            sc = parse_scenario({**out, "events": [ev]})
            events += [e.model_dump(mode="json", exclude_none=True)
                       for e in expand_flap(sc.events[0])]
        elif ev["kind"] not in ("prometheus_kill", "worker_kill"):
            events.append(ev)
    out["events"] = events
    return out


def test_lightpath_sim_runs_a_flap_as_its_cuts_and_repairs() -> None:
    from testbed.sim.engine import simulate_lightpaths

    data = _with_events("quickstart.yaml", [
        {"at_s": 2, "kind": "link_flap", "link": ["1", "2"], "period_s": 3, "count": 4},
        {"at_s": 3, "kind": "prometheus_kill", "down_s": 1}])
    data["workload"]["requests"] = 3000
    flap = simulate_lightpaths(parse_scenario(data))
    plain = simulate_lightpaths(parse_scenario(_explicit(data)))
    assert flap["events_applied"] == 8 and flap["lightpaths_lost"] + flap[
        "lightpaths_restored"] > 0
    for key in ("blocked", "lightpaths_lost", "lightpaths_restored", "events_applied",
                "mean_spectrum_utilization"):
        assert flap[key] == plain[key], key
    kinds = {r["kind"]: r for r in flap["faults"]}
    assert kinds["prometheus_kill"]["simulated"] is False
    assert "not applicable" in kinds["prometheus_kill"]["note"]


def test_jobs_sim_runs_the_bundled_fault_scenarios(cli: Any, tmp_path: Path) -> None:
    from testbed.jobs.sim import simulate

    for name in FAULT_SCENARIOS:
        res = cli("sim", f"scenarios/{name}.yaml", "--out", str(tmp_path / name), "-q")
        assert res.code == 0, res.err
        summary = json.loads((tmp_path / name / "summary.json").read_text())
        (row,) = summary["faults"]
        assert row["simulated"] is (name == "fault-link-flap")
    data = load_yaml("fault-link-flap.yaml")
    _, flap = simulate(parse_scenario(data))
    _, plain = simulate(parse_scenario(_explicit(data)))
    assert flap["lightpaths_lost"] == plain["lightpaths_lost"] >= 1
    assert flap["lightpaths_restored"] == plain["lightpaths_restored"] >= 1
    assert flap["mean_iteration_time_s"] == plain["mean_iteration_time_s"]


def test_jobs_sim_runs_the_wavelength_scenario(cli: Any, tmp_path: Path) -> None:
    out = tmp_path / "wl"
    res = cli("sim", "scenarios/fault-wavelength.yaml", "--out", str(out), "-q")
    assert res.code == 0, res.err
    summary = json.loads((out / "summary.json").read_text())
    assert [(r["kind"], r["simulated"]) for r in summary["faults"]] == [
        ("wavelength_loss", True), ("wavelength_repair", True)]
    assert summary["lightpaths_restored"] == 1
    with open(out / "lightpaths.csv", encoding="utf-8", newline="") as fh:
        held = [(r["path"], r["first_slot"]) for r in csv.DictReader(fh)]
    assert held == [("A-B", "0"), ("A-B", "8")]  # moved past the lost slots 0-7


# ---- the injector without root: a real Prometheus, an in-process controller --------------
@pytest.mark.slow
def test_prometheus_kill_and_restart_records_the_gap(tmp_path: Path) -> None:
    if shutil.which("prometheus") is None or shutil.which("promtool") is None:
        pytest.skip("needs the prometheus package")
    from testbed.monitor.run import RunMonitor
    from testbed.orchestrate.faults import FaultInjector

    sc = parse_scenario(_with_events("fault-prometheus.yaml", [
        {"at_s": 1.5, "kind": "prometheus_kill", "down_s": 2}]))
    mon = RunMonitor(sc, tmp_path / "stage", tmp_path / "run").start()
    try:
        assert mon.prom is not None and mon.prom.proc is not None
        first_pid = mon.prom.proc.pid
        # the run exporter scraped once: there is data to have a gap in
        wait_until(lambda: mon.last_scrape_time() is not None,
                   "Prometheus's first scrape of the run exporter", timeout_s=120,
                   interval_s=0.2)
        inj = FaultInjector(sc.events, scale=1.0, monitor=mon).start()
        wait_until(lambda: inj.rows and "recovery_s" in inj.rows[0],
                   "the restarted Prometheus to scrape again (recovery_s)", timeout_s=120,
                   interval_s=0.1)
        out = inj.stop()
        (row,) = out["faults"]
        assert row["applied"] and row["pid_killed"] == first_pid
        assert row["pid_restarted"] != first_pid and mon.prom.proc is not None
        assert mon.prom.proc.pid == row["pid_restarted"]
        with pytest.raises(ProcessLookupError):
            os.kill(first_pid, 0)
        assert row["down_wall_s"] >= 2.0
        assert row["recovery_s"] is not None and row["recovery_s"] >= 0
        # The gap in the scraped data spans the outage: last scrape before the kill to
        # the first after the restart.
        assert row["lost"]["prometheus_gap_s"] >= row["down_wall_s"]
        # The times are the samples' own (a scrape's), not the query's evaluation time.
        from testbed.metrics.query import query

        last = mon.last_scrape_time()
        assert last is not None  # it scrapes again, same TSDB
        got = query(mon.prom.url, f'up{{run="{mon.run_id}"}}[5m]')
        stamps = {round(float(t), 3) for series in got for t, _v in series["values"]}
        assert round(last, 3) in stamps
        # The TSDB holds scrapes from before the kill and after the restart, none between.
        from datetime import datetime

        def unix(iso: str) -> float:
            return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()

        killed, restarted = unix(row["wall_time"]), unix(row["restart_time"])
        assert any(t < killed for t in stamps) and any(t >= restarted for t in stamps)
        assert not [t for t in stamps if killed + 0.2 < t < restarted]
        assert unix(row["first_scrape_after"]) >= restarted
        tsdb_gap = min(t for t in stamps if t >= restarted) - max(t for t in stamps
                                                                   if t < killed + 0.2)
        assert tsdb_gap >= row["lost"]["prometheus_gap_s"] - 0.01
        assert mon.prom.data_dir == tmp_path / "stage" / "prometheus" / "data"
    finally:
        mon.stop()


@contextmanager
def _rest_controller(sc: Scenario, tmp_path: Path
                     ) -> Iterator[tuple[Any, Callable[[str, str, Any], tuple[int, Any]]]]:
    """An in-process controller core for sc behind its REST API, and a client of it."""
    from controllers.api import RestApi
    from controllers.core import ControllerCore
    from controllers.layout import default_layout
    from controllers.store import Store
    from testbed.orchestrate.ctl_process import rest_call

    api = RestApi(ControllerCore(sc, Store(tmp_path / "s.db"), layout=default_layout(sc)),
                  port=0, token="tok")
    api.serve()
    try:
        def client(m: str, p: str, b: Any) -> tuple[int, Any]:
            return rest_call(api.url, m, p, b, "tok", timeout_s=10)

        yield api, client
    finally:
        api.close()


def test_injector_flaps_a_fibre_through_the_controller(tmp_path: Path) -> None:
    from testbed.orchestrate.faults import FaultInjector

    data = load_yaml("quickstart.yaml")
    data["events"] = [{"at_s": 0.0, "kind": "link_flap", "link": ["1", "3"], "period_s": 0.2,
                       "count": 2},
                      {"at_s": 0.05, "kind": "prometheus_kill", "down_s": 1}]
    sc = parse_scenario(data)
    with _rest_controller(sc, tmp_path) as (_api, client):
        status, lp = client("POST", "/lightpaths", {"src_dc": "dc-a", "dst_dc": "dc-b",
                                                    "slots": 2})
        assert status == 201 and lp["nodes"][:2] == ["1", "3"]
        inj = FaultInjector(sc.events, scale=1.0, client=client).start()
        wait_until(lambda: len(inj.steps) >= 4, "4 fault events applied",
                   interval_s=0.01)
        out = inj.stop()
    assert [s["kind"] for s in out["events"]] == ["fiber_cut", "fiber_repair"] * 2
    flap, prom = out["faults"]
    assert flap["kind"] == "link_flap" and flap["applied"] and len(flap["cuts"]) == 2
    assert flap["cuts"][0]["restored"] == [lp["id"]]  # the first cut hits, re-routed
    assert flap["cuts"][1]["lost"] == []  # the lightpath no longer crosses 1-3
    assert len(flap["cut_to_restored_s"]) == 2 and flap["recovery_s"] == max(
        flap["cut_to_restored_s"])
    assert prom["applied"] is False and "no Prometheus" in prom["note"]


def test_injector_applies_a_wavelength_loss_through_the_controller(tmp_path: Path) -> None:
    from testbed.orchestrate.faults import FaultInjector, replay_rows

    data = load_yaml("quickstart.yaml")
    data["events"] = [
        {"at_s": 0.0, "kind": "wavelength_loss", "link": ["3", "1"], "first_slot": 1,
         "slots": 2},
        {"at_s": 0.05, "kind": "wavelength_repair", "link": ["1", "3"], "first_slot": 2,
         "slots": 1}]
    sc = parse_scenario(data)
    with _rest_controller(sc, tmp_path) as (api, client):
        status, lp = client("POST", "/lightpaths", {"src_dc": "dc-a", "dst_dc": "dc-b",
                                                    "slots": 2})
        assert status == 201 and lp["nodes"][:2] == ["1", "3"] and lp["slots"] == [0, 1]
        inj = FaultInjector(sc.events, scale=1.0, client=client).start()
        wait_until(lambda: len(inj.steps) >= 2, "2 fault events applied",
                   interval_s=0.01)
        out = inj.stop()
        assert api.core.net.lost_slots("1", "3") == [1]
        after = api.core.lightpath(lp["id"])
    loss, repair = out["faults"]
    assert loss["kind"] == "wavelength_loss" and loss["applied"] and loss["via"] == "rest"
    assert (loss["target"], loss["first_slot"], loss["slots"]) == ("3-1", 1, 2)
    assert loss["lost"] == {"lightpaths": [], "restored": [lp["id"]]}
    assert loss["recovery_s"] == loss["controller_restoration_s"] >= 0
    assert loss["detection_s"] is None and loss["wall_time"] and loss["run_s"] >= 0
    assert loss["moved"] == [{"id": lp["id"], "from": f"{'-'.join(lp['nodes'])}:0+2",
                              "to": f"{'-'.join(after['nodes'])}:{after['first_slot']}+2"}]
    assert after["nodes"] == lp["nodes"] and after["first_slot"] >= 3  # past the lost 1..2
    assert repair["kind"] == "wavelength_repair" and repair["applied"]
    assert repair["lost_slots"] == [1]
    assert out["cut_to_restored_s"] == [] and out["events_applied"] == 2
    # the same records as rows of a run without the injector (request replay)
    assert [r["kind"] for r in replay_rows(sc.events, out["events"])] == [
        "wavelength_loss", "wavelength_repair"]
    # static forwarding: no controller, skipped with the reason
    static = FaultInjector(sc.events, scale=1.0).start()
    wait_until(lambda: len(static.steps) >= 2, "2 fault events applied",
               interval_s=0.01)
    rows = static.stop()["faults"]
    assert [r["applied"] for r in rows] == [False, False]
    assert all("static forwarding" in r["skipped"] for r in rows)


class _Training:
    """What FaultInjector asks of a launcher before its clock starts (a stand-in for
    Launcher.training_started, whose worker records tests/test_launch* cover)."""

    def __init__(self) -> None:
        self.started = False

    def training_started(self) -> bool:
        return self.started

    def not_ready(self) -> list[str]:
        return [] if self.started else ["j0/stage1"]


def test_events_clock_starts_with_training(caplog: pytest.LogCaptureFixture) -> None:
    """pp_jobs events are timed from the start of training, not from the launch: a cut
    at 0.1 s does not fire while the workers start up, then fires 0.1 s after training
    starts; the offset is recorded."""
    from testbed.orchestrate.faults import FaultInjector

    now = [0.0]
    sc = parse_scenario(_with_events("monitor-demo.yaml", [
        {"at_s": 0.1, "kind": "fiber_cut", "link": ["A", "B"]}]))
    inj = FaultInjector(sc.events, scale=1.0, clock=lambda: now[0]).start(on_training=True)
    training = _Training()
    inj.attach_launcher(training)
    caplog.set_level(logging.INFO, logger="testbed.orchestrate.faults")
    now[0] = 30.0  # a slow start-up: far past the event's time, but no training yet
    time.sleep(0.3)
    assert inj.steps == [] and inj.now_s() == 0.0
    # the log says what the clock waits for, every GATE_LOG_S
    assert "clock not started, 30 s in: waiting for training: j0/stage1 not joined yet" \
        in caplog.text
    training.started = True
    wait_until(lambda: inj.clock_offset_s is not None, "the clock to start",
               interval_s=0.01)
    assert inj.clock_offset_s == 30.0
    time.sleep(0.3)
    assert inj.steps == []  # due 0.1 s after training started: not yet
    now[0] = 30.2
    wait_until(lambda: len(inj.steps) == 1, "the cut", interval_s=0.01)
    out = inj.stop()
    assert out["events_clock"] == "training" and out["events_clock_offset_s"] == 30.0
    assert out["faults"][0]["run_s"] == 0.2
    # training that never starts: nothing fires, and the rows say why
    never = FaultInjector(sc.events, scale=1.0).start(on_training=True)
    never.attach_launcher(_Training())
    time.sleep(0.3)
    out = never.stop()
    assert out["events_clock_offset_s"] is None and out["events_applied"] == 0
    assert out["faults"][0]["note"] == "not reached: the jobs' training never started"
    # a held network's clock starts with start()
    held = FaultInjector([], scale=1.0).start()
    assert held.stop()["events_clock_offset_s"] == 0.0


def test_an_injector_that_fails_says_so_and_still_stops(
        caplog: pytest.LogCaptureFixture) -> None:
    """An exception in the injector's thread is logged with its traceback and kept in
    the summary's errors (it once ended the thread unseen: no event ran, nothing said)."""
    from testbed.orchestrate.faults import FaultInjector

    class Broken(_Training):
        def training_started(self) -> bool:
            raise OSError("records unreadable")

    sc = parse_scenario(_with_events("monitor-demo.yaml", [
        {"at_s": 0.1, "kind": "fiber_cut", "link": ["A", "B"]}]))
    inj = FaultInjector(sc.events, scale=1.0)
    inj.attach_launcher(Broken())
    inj.start(on_training=True)
    wait_until(lambda: inj.errors, "the injector's error", interval_s=0.01)
    assert inj.errors == ["injector: records unreadable"]
    assert "events: the injector stopped: records unreadable" in caplog.text
    assert "Traceback" in caplog.text
    assert inj.stop()["events_applied"] == 0


def test_the_done_file_follows_the_last_event_and_the_settle_time(tmp_path: Path) -> None:
    """emulation.iterate_through_events: the injector writes its done file only once
    every event has run and `settle_s` more have passed, on the events' clock."""
    from testbed.orchestrate.faults import FaultInjector

    now = [0.0]
    sc = parse_scenario(_with_events("monitor-demo.yaml", [
        {"at_s": 0.1, "kind": "fiber_cut", "link": ["A", "B"]},
        {"at_s": 0.5, "kind": "fiber_repair", "link": ["A", "B"]}]))
    done = tmp_path / "events-done"
    inj = FaultInjector(sc.events, scale=1.0, clock=lambda: now[0])
    inj.set_done_file(done, settle_s=2.0)
    training = _Training()
    inj.attach_launcher(training)
    inj.start(on_training=True)
    time.sleep(0.3)
    assert not done.exists()  # no training yet: nothing has run
    training.started = True
    wait_until(lambda: inj.clock_offset_s is not None, "the clock to start",
               interval_s=0.01)
    now[0] = 0.2
    wait_until(lambda: len(inj.steps) == 1, "the cut", interval_s=0.01)
    time.sleep(1.2)
    assert not done.exists()  # the repair is still due
    now[0] = 0.6
    wait_until(lambda: len(inj.steps) == 2, "the repair", interval_s=0.01)
    time.sleep(1.2)
    now[0] = 2.0
    time.sleep(1.2)
    assert not done.exists()  # 1.4 s after the repair: settling
    now[0] = 2.7
    wait_until(done.exists, "the done file", interval_s=0.05)
    inj.stop()


# ---- emulation (root) -------------------------------------------------------------------
def _skip_reason() -> str | None:
    return emulation_skip_reason(modules=(("os_ken", "needs os_ken"), ("torch", "needs torch")))


def _emulation_test(test: Callable[[Path], None]) -> Callable[[Path], None]:
    """The marks of a test that emulates a bundled fault scenario: root, slow, 600 s."""
    return pytest.mark.root(pytest.mark.slow(pytest.mark.timeout(600)(test)))


def _one_job_and_fault(summary: dict[str, Any], kind: str
                       ) -> tuple[dict[str, Any], dict[str, Any]]:
    """The run's one worker job, which finished, and its one fault row, of `kind`, applied."""
    (job,) = summary["worker_jobs"]
    assert job["ok"], job["failure"]
    (row,) = summary["faults"]
    assert row["kind"] == kind and row["applied"], row
    return job, row


def _emulate(name: str, tmp_path: Path) -> tuple[dict[str, Any], Path]:
    why = _skip_reason()
    if why:
        pytest.skip(why)
    out = tmp_path / name
    env = {**os.environ, "PYTHONPATH": str(ROOT),
           "LIGHTPIPE_MONITOR_DIR": str(tmp_path / "monitor")}
    res = subprocess.run([sys.executable, "-c", ENTRY, "run", f"scenarios/{name}.yaml",
                          "--backend", "emu", "--out", str(out), "-q"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=400)
    assert res.returncode == 0, res.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["events_clock"] == "training" and summary["events_clock_offset_s"] > 0
    return summary, out


def _finished_iterations(out: Path, job: str) -> set[int]:
    """Iterations every stage of the job recorded (its workers' own JSON lines)."""
    from testbed.orchestrate.results import read_records

    stages = sorted((out / "workers" / job).glob("stage*.jsonl"))
    assert stages
    sets = [{r["iteration"] for r in read_records(p) if r.get("type") == "iteration"}
            for p in stages]
    return set.intersection(*sets)


def _assert_records_keep_every_finished_iteration(summary: dict[str, Any], out: Path) -> None:
    with open(out / "iterations.csv", encoding="utf-8", newline="") as fh:
        rows = list(csv.DictReader(fh))
    for job in summary["worker_jobs"]:
        name = job["job"]
        recorded = {int(r["iteration"]) for r in rows if r["job"] == name}
        assert recorded == _finished_iterations(out, name), name


@_emulation_test
def test_emulation_survives_prometheus_kill(tmp_path: Path) -> None:
    summary, out = _emulate("fault-prometheus", tmp_path)
    job, row = _one_job_and_fault(summary, "prometheus_kill")
    assert row["pid_restarted"] != row["pid_killed"]
    assert row["recovery_s"] is not None and row["lost"]["prometheus_gap_s"] >= 3.0
    assert row["down_wall_s"] >= 3.0  # down_s 0.3 x time_factor 10
    _assert_records_keep_every_finished_iteration(summary, out)
    n = job["iterations_measured"]
    assert n == 200  # worker_iterations: all of them, the kill lost none
    assert any((out / "prometheus" / "data").iterdir())


@_emulation_test
def test_emulation_survives_a_killed_worker(tmp_path: Path) -> None:
    summary, out = _emulate("fault-worker", tmp_path)
    (row,) = summary["faults"]
    assert row["kind"] == "worker_kill" and row["applied"], row
    jobs = {j["job"]: j for j in summary["worker_jobs"]}
    killed = jobs[row["job"]]
    others = [j for name, j in jobs.items() if name != row["job"]]
    assert not killed["ok"] and killed["failure"].startswith("worker stage 1 killed at 0.15 s")
    assert summary["failed_jobs"] == [row["job"]]
    assert others and all(j["ok"] for j in others)
    assert all(j["iterations_measured"] == 30 for j in others)
    assert row["detection_s"] is not None and 0 <= row["detection_s"] < 5
    lost = row["lost"]
    assert lost["iterations_finished"] >= 1 and lost["iterations"] >= 1
    assert lost["iterations_finished"] + lost["iterations"] == lost["iterations_planned"] == 31
    _assert_records_keep_every_finished_iteration(summary, out)
    assert len(_finished_iterations(out, row["job"])) == lost["iterations_finished"]


@_emulation_test
def test_emulation_restores_a_flapping_fibre(tmp_path: Path) -> None:
    summary, out = _emulate("fault-link-flap", tmp_path)
    job, row = _one_job_and_fault(summary, "link_flap")
    assert [s["kind"] for s in summary["events"]] == ["fiber_cut", "fiber_repair"] * 2
    assert all(s["via"] == "port_status" for s in summary["events"])
    assert len(row["cut_to_restored_s"]) == 2
    assert row["cuts"][0]["lost"] == [] and len(row["cuts"][0]["restored"]) >= 1
    assert job["iterations_measured"] == 220
    _assert_records_keep_every_finished_iteration(summary, out)


@_emulation_test
# what the run keeps through the outage, not how fast packets go (rtt_check auto on
# user-space links only warns): the rootlane, so that the serial lane, the suite's tail
# (710 s of 719 on 2026-11-29), is not the only lane running emulations
@pytest.mark.untimed
def test_emulation_survives_a_killed_controller(tmp_path: Path) -> None:
    summary, out = _emulate("fault-controller", tmp_path)
    job, row = _one_job_and_fault(summary, "controller_kill")
    assert job["iterations_measured"] == 200  # the data plane forwarded through the outage
    assert row["pid_restarted"] != row["pid_killed"]
    assert row["down_wall_s"] >= 3.0  # down_s 0.3 x time_factor 10
    assert row["lightpaths_before"] >= 1
    assert row["lightpaths_kept"] == row["lightpaths_before"] == row["lightpaths_after"]
    assert row["lost"] == {"lightpaths": [], "requests_refused": 0}
    assert row["recovery_s"] is not None and row["outage_s"] >= row["down_wall_s"]
    _assert_records_keep_every_finished_iteration(summary, out)


@_emulation_test
def test_emulation_restores_lightpaths_after_a_wavelength_loss(tmp_path: Path) -> None:
    summary, out = _emulate("fault-wavelength", tmp_path)
    (job,) = summary["worker_jobs"]
    assert job["ok"], job["failure"]
    assert job["iterations_measured"] == 200
    loss, repair = summary["faults"]
    assert loss["kind"] == "wavelength_loss" and loss["applied"], loss
    assert (loss["target"], loss["first_slot"], loss["slots"], loss["via"]) == (
        "A-B", 0, 8, "rest")
    # the DC-pair lightpath (slots 0-1) and the job's (slot 2) both hit, both re-placed
    # on A-B past the lost block, none lost
    assert loss["lost"]["lightpaths"] == [] and len(loss["lost"]["restored"]) == 2
    assert sorted(m["to"] for m in loss["moved"]) == ["A-B:10+1", "A-B:8+2"]
    assert loss["recovery_s"] == loss["controller_restoration_s"] >= 0
    assert loss["wall_time"] and loss["run_s"] >= 10.0  # at_s 1.0 x time_factor 10
    assert repair["kind"] == "wavelength_repair" and repair["applied"], repair
    assert repair["lost_slots"] == [4, 5, 6, 7]
    assert summary["event_errors"] == [] and summary["cut_to_restored_s"] == []
    _assert_records_keep_every_finished_iteration(summary, out)


def _flow_lines(sw: str, env: dict[str, str]) -> list[str]:
    import subprocess

    r = subprocess.run(["ovs-ofctl", "-O", "OpenFlow13", "--no-stats", "dump-flows", sw],
                       capture_output=True, text=True, check=True, env=env)
    return [line for line in r.stdout.splitlines() if "cookie=" in line]


@pytest.mark.root
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_pings_cross_a_controller_restart_without_loss(tmp_path: Path) -> None:
    """SIGKILL the controller and start it again while one DC pings the other every
    20 ms: the switches keep forwarding on their rules (fail-mode secure), and the
    restarted controller's re-sync does not tear the working lightpath down: it writes
    its rules over the ones in place and deletes only what it no longer wants (a flow
    planted while it was dead)."""
    import os
    import subprocess
    import threading

    why = _skip_reason()
    if why:
        pytest.skip(why)
    from testbed.emu.network import EmuNetwork
    from testbed.emu.plan import build_plan
    from testbed.emu.probes import icmp_ping
    from testbed.orchestrate.controller import ControllerRestarter, start_run_controller
    from testbed.orchestrate.glue import controller_address
    from testbed.spec import load_scenario

    sc = load_scenario(ROOT / "scenarios" / "fault-controller.yaml")
    with EmuNetwork(build_plan(sc), controller=controller_address()) as net:
        ctl = start_run_controller(net, sc, tmp_path / "ctl")
        try:
            a, b = (next(h for h in net.plan.hosts if h.dc == dc) for dc in ("dc-a", "dc-b"))
            ns = f"/proc/{net.host_pid(a.name)}/ns/net"
            dst = b.ip.split("/")[0]
            assert all(r is not None for r in icmp_ping(ns, dst, count=5, interval_s=0.02))
            got: list[float | None] = []
            pinger = threading.Thread(target=lambda: got.extend(
                icmp_ping(ns, dst, count=750, interval_s=0.02)))  # 15 s
            restarter = ControllerRestarter(ctl, net, tmp_path / "ctl")
            before = restarter.lightpaths()
            pinger.start()
            time.sleep(0.5)
            old = restarter.kill()
            sw = net.plan.switches[0].node
            ofctl = ["ovs-ofctl", "-O", "OpenFlow13"]
            env = {**os.environ, **net.ovs.env}
            stale = "cookie=0x5e1f,table=0,priority=7,udp,tp_dst=9999"
            subprocess.run([*ofctl, "add-flow", sw, f"{stale},actions=drop"], env=env,
                           check=True)
            rules_before = _flow_lines(sw, env)
            assert any("0x5e1f" in line for line in rules_before)
            time.sleep(1.0)
            allowed = os.sched_getaffinity(0)
            if len(allowed) >= 2:  # a run with CPU isolation: the new one pinned as the old
                from testbed.emu.cpuset import split

                net.cpu_split = split(allowed)
            new = restarter.restart()
            if len(allowed) >= 2:
                assert os.sched_getaffinity(new) == set(net.cpu_split.network)
            pinger.join(scaled(120))
            rules_after = _flow_lines(sw, env)
            assert not any("0x5e1f" in line for line in rules_after), rules_after
            assert len(rules_after) == len(rules_before) - 1 and rules_after
            assert old is not None and new != old and ctl.proc.pid == new
            assert restarter.lightpaths() == before and before
            lost = [i for i, r in enumerate(got) if r is None]
            assert len(got) == 750 and not lost, f"{len(lost)} echoes lost: {lost[:20]}"
        finally:
            ctl.stop()
