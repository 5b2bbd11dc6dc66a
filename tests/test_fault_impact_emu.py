"""The emulation's side of issue 58 without root: the jobs' fault impact from worker
records (testbed.orchestrate.impact), the emulation points (testbed.emu.outage), the
workers' fault options, the network-event metric and the Workers dashboard's annotation;
and, with a real Prometheus and an in-process SDN controller, the fault injector's
events scraped and the annotation's query answered."""

from __future__ import annotations

import itertools
import json
import math
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from testbed.errors import InputError
from testbed.orchestrate.impact import (
    agreement_band_s,
    emu_fault_impact,
    event_marks,
    job_fibres,
    job_marks,
    record_fault_impact,
)
from testbed.orchestrate.launch import FaultPolicy
from testbed.spec import load_scenario, parse_scenario

from .conftest import load_yaml
from .waiting import wait_until

ROOT = Path(__file__).resolve().parent.parent
OUTAGE = ROOT / "scenarios" / "fault-outage.yaml"
TF = 10.0
ZERO = 1000.0  # the events' clock zero on the (made-up) monotonic clock of these records


def _stage(it_ends: list[tuple[int, float, float]], *, redone: set[int] = frozenset(),
           attempts: dict[int, int] | None = None) -> list[dict[str, Any]]:
    """A stage's records as workloads.worker writes them (only the fields used here)."""
    recs: list[dict[str, Any]] = [{"type": "start", "ready_s": ZERO - 1.0}]
    for it, start, end in it_ends:
        recs.append({"type": "iteration", "iteration": it, "start_s": start, "end_s": end,
                     "ops": [["F0", start, end]], "waits": [], "compute_s": 0.0,
                     "sent_bytes": 0, "received_bytes": 0, "redone": it in redone,
                     "attempt": (attempts or {}).get(it, 0)})
    return recs


def _steady(n: int, t0: float, cycle: float) -> list[tuple[int, float, float]]:
    return [(i, t0 + i * cycle, t0 + i * cycle + 0.7 * cycle) for i in range(n)]


def _static_faults(cut_s: float, repair_s: float) -> dict[str, Any]:
    """The injector's summary part of a static run: a cut and a repair of A-B."""
    return {"events_clock_zero_monotonic_s": ZERO, "faults": [
        {"kind": "fiber_cut", "target": "A-B", "at_s": 0.5, "applied": True,
         "via": "data_plane", "monotonic_s": ZERO + cut_s * TF, "run_s": cut_s * TF,
         "lost": {"lightpaths": [], "restored": []},
         "note": "static forwarding: the fibre's lightpaths stay down until it is repaired"},
        {"kind": "fiber_repair", "target": "A-B", "at_s": 0.8, "applied": True,
         "via": "data_plane", "monotonic_s": ZERO + repair_s * TF, "run_s": repair_s * TF}]}


def test_a_static_outage_is_cut_to_repair_and_the_repair_hits_nothing() -> None:
    sc = load_scenario(OUTAGE)
    marks = event_marks(sc, _static_faults(0.5002, 0.8003), ZERO, TF, static=True)
    (cut, at_cut, _), (rep, at_rep, _) = marks
    assert (cut.index, cut.kind, at_cut) == (0, "fiber_cut", 0.5)
    assert cut.at_s == pytest.approx(0.5002) and cut.outage_s == pytest.approx(0.3001)
    assert rep.kind == "fiber_repair" and rep.outage_s == 0.0 and at_rep == 0.8
    # a controller's cut: its restoration; a lost lightpath: never back (None)
    ctl = {"events_clock_zero_monotonic_s": ZERO, "faults": [
        {"kind": "fiber_cut", "target": "A-B", "at_s": 0.5, "applied": True,
         "monotonic_s": ZERO + 5.0, "cut_to_restored_s": 0.025,
         "lost": {"lightpaths": [], "restored": [1]}}]}
    (m, _, _), = event_marks(sc, ctl, ZERO, TF)
    assert m.outage_s == pytest.approx(0.0025)
    ctl["faults"][0]["lost"] = {"lightpaths": [1], "restored": []}
    (m, _, _), = event_marks(sc, ctl, ZERO, TF)
    assert m.outage_s is None
    # not applied, or not a network event: no mark
    ctl["faults"][0]["applied"] = False
    assert event_marks(sc, ctl, ZERO, TF) == []


def test_job_marks_take_the_last_run_of_a_redone_iteration() -> None:
    cycle = 0.14
    s0 = _steady(6, ZERO, cycle)
    s1 = _steady(5, ZERO + 0.01, cycle)  # stage 1 never finished iteration 5 at first
    # a restart: both stages run iteration 5 again, 4 s later
    s0.append((5, ZERO + 4.0, ZERO + 4.1))
    s1.append((5, ZERO + 4.0, ZERO + 4.12))
    marks = job_marks("job0", [_stage(s0, redone={5}), _stage(s1, redone={5})], ZERO, TF)
    assert [m.iteration for m in marks] == [0, 1, 2, 3, 4, 5]
    last = marks[-1]
    assert last.redone and last.end_s == pytest.approx(0.412)  # (4.12 - 0) / 10
    assert marks[0].start_s == 0.0 and not marks[0].redone


def test_fault_impact_of_a_stall_and_of_a_failure() -> None:
    sc = load_scenario(OUTAGE)
    cycle = 0.14  # wall s: 14 ms of scenario time
    before = [(i, ZERO + i * cycle, ZERO + (i + 1) * cycle) for i in range(40)]
    # iteration 40 starts at 5.6 s wall, the cut at 5.002 ... stalls until 11.8 s
    stalled = [(40, ZERO + 5.6, ZERO + 11.8)]
    after = [(40 + k, ZERO + 11.8 + (k - 1) * cycle, ZERO + 11.8 + k * cycle)
             for k in range(1, 20)]
    stages = [_stage(before + stalled + after)] * 2
    faults = _static_faults(0.5002, 0.8003)
    per_job = [{"job": "job0", "failure": None, "stage_dcs": ["dc-a", "dc-b"],
                "lightpaths": [{"boundary": 0, "route": ["A", "B"]}]}]
    fibres = {"job0": job_fibres(per_job[0]["lightpaths"], {frozenset(("dc-a", "dc-b")):
                                                            ("A", "B")}, ["dc-a", "dc-b"])}
    out = emu_fault_impact(sc, {"job0": stages}, faults, per_job, TF, fibres, {"job0": 41})
    cut, rep = out["fault_impact"]
    assert cut["hit"] and not rep["hit"] and cut["survived"]
    assert cut["at_s"] == 0.5 and cut["applied_at_s"] == pytest.approx(0.5002)
    assert cut["steady_iteration_s"] == pytest.approx(0.014)
    # the touched iteration: 6.2 s wall after the previous completion = 0.62 s; - steady
    assert cut["stall_s"] == pytest.approx(0.62 - 0.014, abs=1e-6)
    # the hit's window only (the repair's would show the cut's stall again)
    assert out["fault_iterations"] and {r["event"] for r in out["fault_iterations"]} == {0}
    # the same job failing at 4 s wall after the cut (gloo's time-out)
    err = ("stage 1 (pid 9, host dc-b-h0) exited with code 1: RuntimeError: [...] Timed "
           "out waiting 4000ms for recv operation to complete")
    bad = [*_stage(before), {"type": "error", "error": "RuntimeError: ...", "t_s": ZERO + 9.0}]
    out = emu_fault_impact(sc, {"job0": [bad, bad]}, faults,
                           [{**per_job[0], "failure": err}], TF, fibres, {"job0": 41})
    cut = out["fault_impact"][0]
    assert not cut["survived"] and "Timed out waiting 4000ms" in cut["error"]
    assert cut["failed_at_s"] == pytest.approx(0.9)
    assert cut["iterations_lost"] == 1.0  # 41 planned, 40 finished


def test_no_clock_or_no_network_event_means_no_impact_records(tmp_path: Path) -> None:
    sc = load_scenario(OUTAGE)
    assert emu_fault_impact(sc, {}, {"events_clock_zero_monotonic_s": None}, [], TF) == {}
    assert record_fault_impact(sc, tmp_path, {"worker_jobs": []},
                               {"events_clock_zero_monotonic_s": ZERO, "faults": []}, {}) == {}
    assert not (tmp_path / "fault_iterations.csv").exists()


def test_agreement_band_is_ten_percent_or_twenty_ms() -> None:
    assert agreement_band_s(0.628) == pytest.approx(0.0628)
    assert agreement_band_s(0.05) == pytest.approx(0.020)


def test_fault_policy_scales_with_the_time_factor_and_gives_the_worker_options() -> None:
    sc = load_scenario(OUTAGE)
    pol = FaultPolicy.of(sc.policy.workers, 10.0)
    assert pol.collective_timeout_s == pytest.approx(20.0) and pol.restart_s == pytest.approx(1.0)
    argv = pol.argv()
    assert argv[argv.index("--collective-timeout-s") + 1] == "20"
    assert argv[argv.index("--on-fault") + 1] == "fail"
    assert "--collective-timeout-s" not in FaultPolicy().argv()  # null: the launcher's


def test_worker_refuses_bad_fault_options(capsys: pytest.CaptureFixture[str]) -> None:
    from workloads.worker import parse_args

    base = ["--plan", "p.json", "--rank", "0", "--master", "127.0.0.1:0", "--out", "o"]
    assert parse_args([*base, "--collective-timeout-s", "1.5"]).collective_timeout_s == 1.5
    for bad in (["--collective-timeout-s", "0"], ["--collective-timeout-s", "inf"],
                ["--restart-s", "-1"], ["--on-fault", "ignore"]):
        with pytest.raises(SystemExit) as exc:
            parse_args(base + bad)
        assert exc.value.code == 2
        assert bad[0] in capsys.readouterr().err


def test_outage_variant_moves_the_repair_and_sets_the_workers() -> None:
    from testbed.emu.outage import outage_variant

    base = load_yaml("fault-outage.yaml")
    v = outage_variant(base, 1.5, collective_timeout_s=0.4, on_fault="retry", restart_s=0.2)
    cut, rep = v["events"]
    assert rep["at_s"] == pytest.approx(cut["at_s"] + 1.5)
    assert v["policy"]["workers"] == {**base["policy"]["workers"],
                                      "collective_timeout_s": 0.4, "on_fault": "retry",
                                      "restart_s": 0.2}
    assert v["name"] == "fault-outage-1500ms"
    parse_scenario(v)  # still a valid scenario
    assert base["events"][1]["at_s"] == 0.8  # the base is left as it was
    for bad in (0, -1, math.inf, math.nan, True, "1", 1e6):
        with pytest.raises(InputError, match="outage_s"):
            outage_variant(base, bad)  # type: ignore[arg-type]
    no_repair = {**base, "events": base["events"][:1]}
    with pytest.raises(InputError, match="fiber_repair"):
        outage_variant(no_repair, 1.0)


def _summary(stall: float, survived: bool, sim: float, fault_s: float,
             error: str | None = None) -> dict[str, Any]:
    return {"backend": "emu", "scenario": "fault-outage", "forwarding": "static",
            "time_factor": 10.0,
            "worker_fault_policy": {"collective_timeout_s": 4.0, "on_fault": "fail"},
            "faults": [{"kind": "fiber_cut", "target": "A-B", "run_s": 5.0},
                       {"kind": "fiber_repair", "target": "A-B", "run_s": 5.0 + fault_s * 10}],
            "fault_impact": [
                {"job": "job0", "event": 0, "kind": "fiber_cut", "target": "A-B",
                 "hit": True, "outage_s": fault_s, "stall_s": stall, "survived": survived,
                 "error": error, "recovery_s": stall},
                {"job": "job0", "event": 1, "kind": "fiber_repair", "target": "A-B",
                 "hit": False, "stall_s": stall, "survived": survived}],
            "fault_agreement": {"rows": [
                {"job": "job0", "event": 0, "emu_stall_s": stall, "sim_stall_s": sim,
                 "within": abs(stall - sim) <= agreement_band_s(sim),
                 "band_s": agreement_band_s(sim), "sim_survived": True}]}}


def test_sweep_points_group_runs_by_variant(tmp_path: Path) -> None:
    from testbed.emu.outage import sweep_points

    runs = {"a/run-0": _summary(0.65, True, 0.628, 0.3), "a/run-1": _summary(0.80, True,
                                                                             0.628, 0.3),
            "b/run-0": _summary(0.0, False, 0.0, 1.0, "Timed out waiting 4000ms for recv"),
            "c/run-0": {"backend": "sim", "fault_impact": []}}
    for d, s in runs.items():
        (tmp_path / d).mkdir(parents=True)
        (tmp_path / d / "summary.json").write_text(json.dumps(s))
    short, long_ = sweep_points(tmp_path)
    assert (short["fault_s"], short["runs"], short["survived"]) == (0.3, 2, 1.0)
    assert short["stall_s"] == pytest.approx(0.725) and short["stall_ci95_s"] > 0
    assert short["within"] == 1 and short["sim_stall_s"] == 0.628
    assert (short["source"], short["protection"], short["collective_timeout_s"]) == (
        "emu", "none", 0.4)
    assert long_["fault_s"] == 1.0 and long_["survived"] == 0.0 and long_["stall_s"] is None
    assert "Timed out waiting 4000ms" in long_["error"]


def test_network_event_metric_and_the_workers_annotation() -> None:
    from prometheus_client import generate_latest

    from grafana.lightpipe_dashboards import NETWORK_EVENT_ANNOTATION, build
    from testbed.monitor.exporter import RunExporter
    from testbed.monitor.producible import why_not

    ex = RunExporter({"backend": "emu"})
    ex.record_network_event(0, "link_flap", "fiber_repair", "A-B", 1, 1_700_000_000.25)
    text = generate_latest(ex.registry).decode()
    (line,) = [ln for ln in text.splitlines()
               if ln.startswith("lightpipe_network_event_timestamp_seconds{")]
    assert 'action="fiber_repair"' in line and 'step="1"' in line and 'event="0"' in line
    assert float(line.rsplit(" ", 1)[1]) == pytest.approx(1_700_000_000.25)
    workers = build("workers")
    (ann,) = [a for a in workers["annotations"]["list"] if a["name"] == "Network events"]
    assert ann["useValueForTime"] is True and ann["expr"].endswith("* 1000")
    assert "lightpipe_network_event_timestamp_seconds" in ann["expr"]
    assert '$run' in ann["expr"] and ann["titleFormat"] == NETWORK_EVENT_ANNOTATION[
        "titleFormat"]
    assert [a["name"] for a in build("overview")["annotations"]["list"]] == ["Fibre cuts"]
    # a run without network events cannot fill it, and says why
    assert "no network event" in (why_not(ann["expr"], {"events": "prometheus_kill",
                                                         "workload": "pp_jobs"}) or "")
    assert why_not(ann["expr"], {"events": "fiber_cut,fiber_repair",
                                 "workload": "pp_jobs"}) is None


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_injected_events_are_scraped_and_the_annotation_query_finds_them(
        tmp_path: Path) -> None:
    """A real Prometheus (RunMonitor) and an in-process SDN controller: a flap of fibre
    1-3 through the fault injector gives one series per step, each valued at its step's
    time, and the Workers dashboard's annotation query (its $run substituted) returns them."""
    if shutil.which("prometheus") is None:
        pytest.skip("needs the prometheus package")
    from controllers.api import RestApi
    from controllers.core import ControllerCore
    from controllers.layout import default_layout
    from controllers.store import Store
    from grafana.lightpipe_dashboards import NETWORK_EVENT_ANNOTATION
    from testbed.metrics.query import query
    from testbed.monitor.run import RunMonitor
    from testbed.orchestrate.ctl_process import rest_call
    from testbed.orchestrate.faults import FaultInjector

    data = load_yaml("quickstart.yaml")
    data["events"] = [{"at_s": 0.0, "kind": "link_flap", "link": ["1", "3"],
                       "period_s": 0.4, "count": 2}]
    sc = parse_scenario(data)
    api = RestApi(ControllerCore(sc, Store(tmp_path / "s.db"), layout=default_layout(sc)),
                  port=0, token="tok")
    api.serve()
    mon = RunMonitor(sc, tmp_path / "stage", tmp_path / "run").start()
    try:
        def client(m: str, p: str, b: Any) -> tuple[int, Any]:
            return rest_call(api.url, m, p, b, "tok", timeout_s=10)

        status, _lp = client("POST", "/lightpaths", {"src_dc": "dc-a", "dst_dc": "dc-b",
                                                     "slots": 2})
        assert status == 201
        inj = FaultInjector(sc.events, scale=1.0, client=client, monitor=mon).start()
        wait_until(lambda: len(inj.steps) >= 4, "the flap's 4 steps", interval_s=0.02)
        out = inj.stop()
        assert mon.prom is not None
        expr = re.sub(r'\$(run|scenario)', ".*", NETWORK_EVENT_ANNOTATION["expr"])

        def got() -> list[Any]:
            return query(mon.prom.url, expr)

        wait_until(lambda: len(got()) == 4, "4 network-event series scraped",
                   timeout_s=60, interval_s=0.5)
        res = got()
    finally:
        mon.stop()
        api.close()
    (flap,) = out["faults"]
    steps = sorted((int(r["metric"]["step"]), r["metric"]["action"], float(r["value"][1]))
                   for r in res)
    assert [s[:2] for s in steps] == [(0, "fiber_cut"), (1, "fiber_repair"),
                                      (2, "fiber_cut"), (3, "fiber_repair")]
    assert all(r["metric"]["kind"] == "link_flap" and r["metric"]["target"] == "1-3"
               and r["metric"]["event"] == "0" for r in res)
    # each value is its step's time (ms): the steps 0.2 s apart, the first at the row's
    from datetime import datetime

    first = datetime.fromisoformat(flap["wall_time"].replace("Z", "+00:00")).timestamp()
    assert steps[0][2] / 1e3 == pytest.approx(first, abs=0.05)
    # each later step at its own applied time (the injector's record of it), in order:
    # no bound on the gaps, which a loaded machine stretches or squeezes
    stamps = [datetime.fromisoformat(r["wall_time"].replace("Z", "+00:00")).timestamp()
              for r in out["events"]]
    assert len(stamps) == 4
    assert [v / 1e3 for _, _, v in steps] == pytest.approx(stamps, abs=0.05)
    assert all(a[2] < b[2] for a, b in itertools.pairwise(steps))
