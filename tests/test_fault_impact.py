"""The job's side of network events (issue 58): stall, recovery, survival.

Simulator figures against hand-derived formulas on a fault scenario with a known outage
(the fibre A-B of scenarios/outage-sweep.yaml cut at 100 s): the steady iteration T and
the detour's T' come from runs without the event (the detour: the same scenario with
no fibre A-B), the phase from the job's start; the TCP resume time from Linux's
retransmission rule written out by hand. Then the pure analysis on hand-made
iterations, the report's figure, the outage reproduction, and bad input through the CLI.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from testbed.analysis.faultimpact import (
    EventMark,
    IterationMark,
    impact_rows,
    job_event_impact,
    resume_wait_s,
    tcp_give_up_s,
    tcp_retransmits_s,
)
from testbed.spec import parse_scenario

from .conftest import load_yaml

CUT_S = 100.0
RTT_S = 2 * 400 * 5e-6  # A-B: 400 km at 5 us/km, both ways
RTT_DETOUR_S = 2 * 600 * 5e-6  # A-C-B
RTO0_S = RTT_S + 0.2


def _scenario(events: list[dict[str, Any]] | None, protection: dict[str, Any] | None = None,
              workers: dict[str, Any] | None = None, drop_ab: bool = False) -> Any:
    data = load_yaml("outage-sweep.yaml")
    data["events"] = events or []
    if protection is not None:
        data["policy"]["protection"] = protection
    if workers is not None:
        data["policy"]["workers"] = workers
    if drop_ab:
        data["topology"]["links"] = [lk for lk in data["topology"]["links"]
                                     if {lk["u"], lk["v"]} != {"A", "B"}]
    return parse_scenario(data)


def _cut(repair_after_s: float | None = None) -> list[dict[str, Any]]:
    ev: list[dict[str, Any]] = [{"at_s": CUT_S, "kind": "fiber_cut", "link": ["A", "B"]}]
    if repair_after_s is not None:
        ev.append({"at_s": CUT_S + repair_after_s, "kind": "fiber_repair",
                   "link": ["A", "B"]})
    return ev


@pytest.fixture(scope="module")
def steady() -> dict[str, float]:
    """T (A-B), T' (A-C-B), the job's start and its phase at the cut, without events."""
    from testbed.jobs.sim import simulate

    (st,), _ = simulate(_scenario(None))
    (det,), _ = simulate(_scenario(None, drop_ab=True))
    t, t2 = st.iteration_ms / 1000.0, det.iteration_ms / 1000.0
    start = st.start_s
    done = (CUT_S - start) / t
    return {"T": t, "T2": t2, "start": start, "phase": done - math.floor(done),
            "done": math.floor(done), "planned": st.job.req.iterations}


def _row(scen: Any) -> tuple[dict[str, Any], dict[str, Any], list[Any]]:
    from testbed.jobs.sim import simulate

    states, summ = simulate(scen)
    (row,) = summ["fault_impact"]
    return row, summ, states


def test_tcp_model_by_hand() -> None:
    # probe at 2 RTT, then rto0, 2 rto0, 4 rto0 apart
    r = tcp_retransmits_s(RTT_S, 0.2)
    assert r[:4] == pytest.approx([2 * RTT_S, 2 * RTT_S + RTO0_S, 2 * RTT_S + 3 * RTO0_S,
                                   2 * RTT_S + 7 * RTO0_S])
    assert resume_wait_s(0.3, "tcp", RTT_S, 0.2) == pytest.approx(2 * RTT_S + 3 * RTO0_S)
    assert resume_wait_s(0.005, "tcp", RTT_S, 0.2) == pytest.approx(2 * RTT_S)
    assert resume_wait_s(0.3, "ideal", RTT_S, 0.2) == 0.3
    assert tcp_give_up_s(0.2) == pytest.approx(924.6)  # Linux tcp_retries2 = 15


def test_restoration_stall_and_recovery_match_the_formula(steady: dict[str, float]) -> None:
    d = 0.3  # a set restoration time: the detour carries traffic 300 ms after the cut
    row, summ, _ = _row(_scenario(_cut(30.0), {"scheme": "restoration",
                                               "restoration_s": d}))
    t, t2, phi = steady["T"], steady["T2"], steady["phase"]
    freeze = (2 * RTT_S + 3 * RTO0_S) + 2 * RTT_DETOUR_S  # resume at 620 ms + 2 RTTs
    assert row["outage_s"] == d and row["survived"] and row["hit"]
    assert row["steady_iteration_s"] == pytest.approx(t, rel=1e-12)
    assert row["after_iteration_s"] == pytest.approx(t2, rel=1e-9)
    assert row["model"]["phase"] == pytest.approx(phi, abs=1e-9)
    assert row["iterations_touched"] == 1
    assert row["touched_iteration_s"][0] == pytest.approx(phi * t + freeze + (1 - phi) * t2,
                                                          abs=1e-9)
    assert row["stall_s"] == pytest.approx(freeze + (1 - phi) * (t2 - t), abs=1e-9)
    assert t2 < 1.05 * t  # the detour stays within 5 %: back to steady after one
    assert row["recovery_s"] == pytest.approx(freeze + (1 - phi) * t2, abs=1e-9)
    assert row["iterations_redone"] == 0 and row["iterations_lost"] == 0
    assert summ["faults"][0]["jobs_hit"] == ["job0"]
    # the job's run: longer by the stall and the detour's extra time per iteration left
    assert summ["fault_impact"][0]["error"] is None


def test_no_protection_waits_for_the_repair(steady: dict[str, float]) -> None:
    row, _, states = _row(_scenario(_cut(0.3), {"scheme": "none"}))
    t, phi = steady["T"], steady["phase"]
    freeze = (2 * RTT_S + 3 * RTO0_S) + 2 * RTT_S  # back on A-B after the repair
    assert row["outage_s"] == pytest.approx(0.3)
    assert row["stall_s"] == pytest.approx(freeze, abs=1e-9)
    assert row["after_iteration_s"] == pytest.approx(t, rel=1e-9)
    assert row["recovery_s"] == pytest.approx(freeze + (1 - phi) * t, abs=1e-9)
    (st,) = states
    assert st.end_s == pytest.approx(st.start_s + steady["planned"] * t + freeze, abs=1e-6)


def test_ideal_transport_charges_the_outage_only(steady: dict[str, float]) -> None:
    row, _, _ = _row(_scenario(_cut(2.0), {"scheme": "none"},
                               {"transport": "ideal"}))
    assert row["stall_s"] == pytest.approx(2.0, abs=1e-9)


def test_time_out_fails_the_job(steady: dict[str, float]) -> None:
    row, summ, states = _row(_scenario(_cut(1.0), {"scheme": "none"},
                                       {"collective_timeout_s": 0.5}))
    assert not row["survived"]
    assert row["error"] == "Timed out waiting 500ms for recv operation to complete"
    assert row["failed_at_s"] == pytest.approx(CUT_S + 0.5)
    assert row["recovery_s"] is None
    lost = steady["planned"] - (steady["done"] + steady["phase"])
    assert row["iterations_lost"] == pytest.approx(lost, abs=1e-6)
    (st,) = states
    assert st.reason == "collective_timeout" and st.end_s == pytest.approx(CUT_S + 0.5)
    assert summ["jobs_failed_collective"] == 1


def test_retry_restarts_and_redoes_the_iteration(steady: dict[str, float]) -> None:
    row, _, states = _row(_scenario(_cut(1.0), {"scheme": "none"},
                                    {"collective_timeout_s": 0.5, "on_fault": "retry",
                                     "restart_s": 2.0}))
    t, phi = steady["T"], steady["phase"]
    freeze = max(0.5, 1.0) + 2.0
    assert row["survived"] and row["restarts"] == 1 and row["iterations_redone"] == 1
    assert row["iterations_lost"] == pytest.approx(phi, abs=1e-9)
    assert row["touched_iteration_s"][0] == pytest.approx(phi * t + freeze + t, abs=1e-9)
    assert row["stall_s"] == pytest.approx(phi * t + freeze, abs=1e-9)
    (st,) = states
    assert st.reason == "" and st.iterations_done == pytest.approx(steady["planned"])


def test_one_plus_one_holds_a_disjoint_standby(tmp_path: Path, cli: Any) -> None:
    import csv

    import yaml

    data = load_yaml("outage-sweep.yaml")
    data["policy"]["protection"] = {"scheme": "1+1", "switch_s": 0.005}
    p = tmp_path / "p.yaml"
    p.write_text(yaml.safe_dump(data))
    res = cli("sim", str(p), "--out", str(tmp_path / "run"), "-q")
    assert res.code == 0, res.err
    with open(tmp_path / "run" / "lightpaths.csv", encoding="utf-8", newline="") as fh:
        lps = list(csv.DictReader(fh))
    roles = [(r["path"], r["role"]) for r in lps]
    assert roles[:2] == [("A-B", "working"), ("A-C-B", "standby")]
    assert ("A-C-B", "working") in roles  # switched to at the cut
    summ = json.loads((tmp_path / "run" / "summary.json").read_text())
    (row,) = summ["fault_impact"]
    assert row["outage_s"] == 0.005 and row["model"]["route"] == "standby"
    # 5 ms is under the tail-loss probe (2 RTT): resumed at the probe, 2 RTTs to recover
    assert row["model"]["freeze_s"] == pytest.approx(2 * RTT_S + 2 * RTT_DETOUR_S)
    assert summ["lightpaths_switched"] == 1


# ---- the pure analysis on hand-made iterations (an emulation's records) ----------------
def _marks(gaps: list[float], start: float = 0.0, redone: int | None = None
           ) -> list[IterationMark]:
    out, t = [], start
    for i, g in enumerate(gaps):
        t += g
        out.append(IterationMark("job0", i, t, redone=i == redone))
    return out


def test_analysis_of_measured_iterations() -> None:
    gaps = [1.0] * 10 + [3.5] + [1.2, 1.0, 1.0, 1.0, 1.0]  # the event at 10.2 s
    row = job_event_impact("job0", _marks(gaps), EventMark(0, "fiber_cut", "A-B", 10.2,
                                                           0.5))
    assert row["steady_iteration_s"] == 1.0
    assert row["iterations_touched"] == 2  # 3.5, then 1.2 still > 1.05 x 1.0
    assert row["stall_s"] == pytest.approx(2.5 + 0.2)
    assert row["after_iteration_s"] == 1.0
    assert row["recovery_s"] == pytest.approx(10 + 3.5 + 1.2 - 10.2)
    assert row["survived"] and row["error"] is None


def test_analysis_of_a_slower_detour_and_a_failure() -> None:
    gaps = [1.0] * 10 + [2.0] + [1.2] * 6
    row = job_event_impact("job0", _marks(gaps), EventMark(0, "fiber_cut", "A-B", 10.5))
    assert row["after_iteration_s"] == pytest.approx(1.2)
    assert row["slowdown_after"] == pytest.approx(0.2)
    assert row["recovery_s"] is None  # never within 5 % of the steady 1.0 s again
    assert row["settle_s"] == pytest.approx(12.0 - 10.5)
    rows = impact_rows({"job0": _marks([1.0] * 10)},
                       [EventMark(3, "fiber_cut", "A-B", 10.5, None)],
                       {"job0": {"failed": True, "error": "Timed out waiting 5000ms for "
                                 "recv operation to complete", "failed_at_s": 15.5,
                                 "planned_iterations": 30}})
    (r,) = rows
    assert r["event"] == 3 and not r["survived"] and r["stall_s"] == pytest.approx(5.0)
    assert r["iterations_lost"] == 20 and r["error"].startswith("Timed out")


# ---- the prediction for the emulation ---------------------------------------------------
def test_predict_outage_uses_the_given_outage(steady: dict[str, float]) -> None:
    from testbed.jobs.outage import predict_outage

    scen = _scenario(_cut(30.0))
    pred = predict_outage(scen, {0: 0.3})
    (row,) = pred["fault_impact"]
    assert pred["source"] == "sim" and row["outage_s"] == 0.3
    # as emulated: the job starts at the events' zero, so its phase follows from T alone
    done = CUT_S / steady["T"]
    assert row["model"]["phase"] == pytest.approx(done - math.floor(done), abs=1e-9)
    assert row["model"]["freeze_s"] == pytest.approx(2 * RTT_S + 3 * RTO0_S
                                                     + 2 * RTT_DETOUR_S)
    assert {r["job"] for r in pred["iterations"]} == {"job0"}


# ---- records, report, reproduction, bad input through the CLI ---------------------------
def test_sim_run_records_and_report_figure(cli: Any, tmp_path: Path) -> None:
    out = tmp_path / "run"
    res = cli("sim", "scenarios/outage-sweep.yaml", "--out", str(out), "-q", "--report")
    assert res.code == 0, res.err
    summ = json.loads((out / "summary.json").read_text())
    (row,) = summ["fault_impact"]
    assert row["source"] == "sim" and row["stall_s"] > 0
    lines = (out / "fault_iterations.csv").read_text().splitlines()
    assert lines[0] == "source,job,event,iteration,end_s,iteration_time_s,redone"
    assert len(lines) > 40
    html = (out / "report.html").read_text()
    at = html.index("sim: the jobs through the network events")
    section = html[at:at + 400_000]
    assert "iteration time through each network event" in section
    assert "data:image/svg+xml" in section


def test_reproduce_outage_quick(cli: Any, tmp_path: Path) -> None:
    out = tmp_path / "outage"
    res = cli("reproduce", "outage", "--quick", "-q", "--out", str(out), "--report",
              "--set", "faults_s=[0.01, 0.1, 1, 10]", "--set", "timeouts_s=[1, 1800]")
    assert res.code == 0, res.err
    summ = json.loads((out / "summary.json").read_text())
    assert summ["experiment"] == "outage" and "absent" in summ["emu_points"]
    b = {(x["protection"], x["collective_timeout_s"]): x for x in summ["boundaries"]}
    # without protection a 1 s time-out fails past the retransmission at 620 ms
    assert b[("none", 1.0)]["longest_survived_s"] == 0.1
    assert b[("none", 1.0)]["shortest_failed_s"] == 1.0
    assert summ["model_failure_boundary_s"]["1.0"] == pytest.approx(2 * RTT_S + 3 * RTO0_S)
    assert b[("restoration", 1.0)]["shortest_failed_s"] is None
    assert all(p["source"] == "sim" for p in summ["rows"])
    assert (out / "outage.png").stat().st_size > 0
    html = (out / "report.html").read_text()
    assert "outage.png" in html and "outage_ablation.png" in html
    assert "a 100 ms outage, no protection: stall" in html  # the headline table
    from .test_report import browser, check_in_browser

    if browser.available():
        check_in_browser(out / "report.html", "reproduce-outage", 2)


def _one_error_line(res: Any) -> str:
    lines = [ln for ln in res.err.splitlines() if ln.strip()]
    assert res.code == 2 and len(lines) == 1, res.err
    return lines[0]


def test_bad_input_exit_2_one_line(cli: Any, tmp_path: Path) -> None:
    import yaml

    data = load_yaml("outage-sweep.yaml")
    data["policy"]["workers"] = {"collective_timeout_s": 0}
    p = tmp_path / "t0.yaml"
    p.write_text(yaml.safe_dump(data))
    line = _one_error_line(cli("sim", str(p), "--out", str(tmp_path / "r"), "-q"))
    assert "policy.workers.collective_timeout_s" in line
    line = _one_error_line(cli("reproduce", "outage", "--quick", "-q", "--out",
                               str(tmp_path / "o1"), "--set", "timeouts_s=[0]"))
    assert "timeouts_s" in line and "> 0" in line
    line = _one_error_line(cli("reproduce", "outage", "--quick", "-q", "--out",
                               str(tmp_path / "o2"), "--set", "faults_s=[1, 1000]"))
    assert "faults_s" in line and "longer than the run" in line


def test_fault_figure_loads_in_a_browser(cli: Any, tmp_path: Path) -> None:
    from .test_report import browser, check_in_browser

    if not browser.available():
        pytest.skip("needs chromium, chromium-driver and selenium (scripts/setup.sh)")
    out = tmp_path / "run"
    assert cli("sim", "scenarios/outage-sweep.yaml", "--out", str(out), "-q").code == 0
    assert cli("report", str(out)).code == 0
    page = check_in_browser(out / "report.html", "sim-fault-impact", 4)
    assert "jobs through the network events" in (out / "report.html").read_text()
    assert page.images
