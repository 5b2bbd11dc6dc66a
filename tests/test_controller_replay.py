"""Request replay through the controller's REST API (no root): same decisions as the simulator."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

import pytest

from controllers.api import RestApi
from controllers.core import ControllerCore
from controllers.layout import default_layout
from controllers.store import Store
from testbed.orchestrate.ctl_process import rest_call
from testbed.orchestrate.replay import agreement, reference, replay, requests_csv, sample_requests
from testbed.sim.engine import REQUESTS_COLUMNS
from testbed.spec import load_scenario, parse_scenario
from tests.waiting import wait_until

REPO = Path(__file__).resolve().parents[1]


def _serve(sc: Any, tmp: Path) -> RestApi:
    core = ControllerCore(sc, Store(tmp / "s.db"), layout=default_layout(sc))
    api = RestApi(core, port=0, token="tok")
    api.serve()
    return api


def _client(api: RestApi) -> Any:
    return lambda m, p, b: rest_call(api.url, m, p, b, "tok", timeout_s=10)


def _scenario(policy: str = "first_fit", events: list[dict[str, Any]] | None = None,
              endpoints: str = "all_nodes") -> Any:
    data = load_scenario(REPO / "scenarios/quickstart.yaml").model_dump(mode="json",
                                                                          exclude_none=True)
    data["workload"].update(load_erlang=60, mean_holding_s=1.0, endpoints=endpoints)
    data["optical"]["slots"] = 24
    data["policy"]["spectrum"] = policy
    data["events"] = events or []
    return parse_scenario(data)


@pytest.mark.parametrize("policy", ["first_fit", "last_fit", "random_fit", "best_fit"])
def test_replay_agrees_with_simulator(tmp_path: Path, policy: str) -> None:
    sc = _scenario(policy)
    sample = sample_requests(sc, 120)
    assert len(sample) == 120
    sim_summary, sim_rows = reference(sc, sample, tmp_path / "ref")
    api = _serve(sc, tmp_path)
    try:
        res = replay(sc, sample, _client(api), replay_s=1e-6)
    finally:
        api.close()
    agr = agreement(res.rows, sim_rows)
    assert agr["ratio"] == 1.0, agr
    assert res.summary["requests"] == sim_summary["requests"] == 120
    assert res.summary["blocked"] == sim_summary["blocked"] > 0  # the sample does block
    assert res.summary["blocked_by_reason"] == sim_summary["blocked_by_reason"]
    # requests.csv is byte-identical to the simulator's
    text = requests_csv(res.rows)
    assert text == (tmp_path / "ref" / "sim-requests.csv").read_text()
    assert next(csv.reader(io.StringIO(text))) == list(REQUESTS_COLUMNS)


def test_replay_with_fibre_cut_and_repair_agrees(tmp_path: Path) -> None:
    sc = _scenario(events=[{"at_s": 0.6, "kind": "fiber_cut", "link": ["1", "3"]},
                           {"at_s": 1.2, "kind": "fiber_repair", "link": ["1", "3"]},
                           {"at_s": 1e6, "kind": "fiber_cut", "link": ["1", "2"]}],
                   endpoints="dcs")
    sample = sample_requests(sc, 100)
    sim_summary, sim_rows = reference(sc, sample, tmp_path / "ref")
    api = _serve(sc, tmp_path)
    try:
        res = replay(sc, sample, _client(api), replay_s=1e-6)
        assert api.core.rows == {}  # everything torn down at the end
    finally:
        api.close()
    assert agreement(res.rows, sim_rows)["ratio"] == 1.0
    assert res.summary["events_applied"] == 2 and res.summary["events_after_last_arrival"] == 1
    cut = res.events[0]
    assert cut["kind"] == "fiber_cut" and cut["via"] == "rest" and cut["cut_to_restored_s"] >= 0
    assert len(cut["restored"]) + len(cut["lost"]) > 0
    assert res.summary["lightpaths_restored"] == sim_summary["lightpaths_restored"]
    assert res.summary["lightpaths_lost"] == sim_summary["lightpaths_lost"]


@pytest.mark.parametrize("policy", ["first_fit", "random_fit"])
def test_replay_with_wavelength_loss_and_repair_agrees(tmp_path: Path, policy: str) -> None:
    """The simulator and the controller, same sample, same slot-block events: the same
    decision for every request and the same lightpaths restored and lost."""
    sc = _scenario(policy, events=[
        {"at_s": 0.6, "kind": "wavelength_loss", "link": ["13", "14"], "first_slot": 0,
         "slots": 4},
        {"at_s": 0.61, "kind": "wavelength_loss", "link": ["5", "6"], "first_slot": 2,
         "slots": 2},
        {"at_s": 1.2, "kind": "wavelength_repair", "link": ["14", "13"], "first_slot": 0,
         "slots": 2}], endpoints="dcs")
    sample = sample_requests(sc, 100)
    sim_summary, sim_rows = reference(sc, sample, tmp_path / "ref")
    api = _serve(sc, tmp_path)
    try:
        res = replay(sc, sample, _client(api), replay_s=1e-6)
        assert api.core.net.lost_slots("13", "14") == [2, 3]
        assert api.core.net.lost_slots("5", "6") == [2, 3]
    finally:
        api.close()
    assert agreement(res.rows, sim_rows)["ratio"] == 1.0
    assert [e["kind"] for e in res.events] == ["wavelength_loss"] * 2 + ["wavelength_repair"]
    first = res.events[0]
    assert first["via"] == "rest" and first["controller_restoration_s"] >= 0
    assert first["restored"] and first["moved"]  # the block really hit a live lightpath
    for m in first["moved"]:  # off the lost slots 0..3 of 13-14 (or off 13-14)
        route, block = m["to"].split(":")
        assert ("13-14" not in route and "14-13" not in route) or int(block.split("+")[0]) >= 4
    assert res.summary["lightpaths_restored"] == sim_summary["lightpaths_restored"] > 0
    assert res.summary["lightpaths_lost"] == sim_summary["lightpaths_lost"]
    assert res.summary["events_applied"] == sim_summary["events_applied"] == 3


def test_replay_clock_is_scaled(tmp_path: Path) -> None:
    sc = _scenario()
    sample = sample_requests(sc, 10)
    now = [0.0]
    waits: list[float] = []

    def sleep(s: float) -> None:
        waits.append(s)
        now[0] += s

    api = _serve(sc, tmp_path)
    try:
        res = replay(sc, sample, _client(api), replay_s=12.0, clock=lambda: now[0], sleep=sleep)
    finally:
        api.close()
    assert now[0] == pytest.approx(12.0)  # last arrival lands at replay_s
    assert res.summary["replay_time_scale"] == pytest.approx(12.0 / sample[-1][1])


def test_fault_injector_cuts_and_repairs_in_background(tmp_path: Path) -> None:
    """The run path's FaultInjector plays fibre events through the controller's REST API
    on its clock; what is not due when it stops is counted as not reached."""
    from testbed.orchestrate.faults import FaultInjector

    sc = _scenario(events=[{"at_s": 0.0, "kind": "fiber_cut", "link": ["1", "3"]},
                           {"at_s": 0.01, "kind": "fiber_repair", "link": ["1", "3"]},
                           {"at_s": 1000.0, "kind": "fiber_cut", "link": ["1", "2"]}])
    api = _serve(sc, tmp_path)
    try:
        client = _client(api)
        status, lp = client("POST", "/lightpaths", {"src_dc": "dc-a", "dst_dc": "dc-b",
                                                    "slots": 2})
        assert status == 201 and ["1", "3"] == lp["nodes"][:2]
        ev = FaultInjector(sc.events, scale=1.0, client=client).start()
        wait_until(lambda: len(ev.steps) >= 2, "2 fault events applied",
                   interval_s=0.01)
        out = ev.stop()
        assert out["events_applied"] == 2 and out["events_not_reached"] == 1
        assert out["events"][0]["restored"] == [lp["id"]]
        rows = {(r["kind"], r["at_s"]): r for r in out["faults"]}
        assert rows[("fiber_cut", 0.0)]["applied"] and \
            rows[("fiber_cut", 0.0)]["lost"] == {"lightpaths": [], "restored": [lp["id"]]}
        assert not rows[("fiber_cut", 1000.0)]["applied"]
        assert not api.core.net.is_failed("1", "3")
        assert api.core.lightpath(lp["id"])["nodes"][:2] != ["1", "3"]  # re-routed
    finally:
        api.close()


def test_plan_lightpaths_refused_names_the_pair() -> None:
    from testbed.emu.plan import build_plan
    from testbed.orchestrate.controller import plan_lightpaths_refused

    quick = load_scenario(REPO / "scenarios/quickstart.yaml")
    assert plan_lightpaths_refused(quick, build_plan(quick)) is None
    regions = load_scenario(REPO / "scenarios/bace-regions.yaml")  # beyond modulation reach
    why = plan_lightpaths_refused(regions, build_plan(regions))
    assert why is not None and "no_reach" in why
