"""POST /jobs without root: placement on the controller's optical state, lightpaths, 4xx."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from controllers.api import RestApi
from controllers.core import ControllerCore
from controllers.jobs import JobService
from controllers.layout import default_layout
from controllers.store import Store
from testbed.jobs.cluster import Cluster
from testbed.jobs.model import model_catalog
from testbed.jobs.policies import Job, Placed, Planner
from testbed.orchestrate.ctl_process import rest_call
from testbed.spec import parse_scenario
from testbed.traces import JobRequest
from tests.test_controller_core import Recorder


def scenario(**policy: object) -> Any:
    return parse_scenario({
        "name": "ctl-jobs",
        "topology": {"links": [
            {"u": "A", "v": "B", "length_km": 400}, {"u": "B", "v": "C", "length_km": 400},
            {"u": "A", "v": "D", "length_km": 600}, {"u": "D", "v": "C", "length_km": 600}]},
        "dcs": [{"name": "dc-a", "node": "A", "gpus": 16},
                {"name": "dc-b", "node": "B", "gpus": 16},
                {"name": "dc-c", "node": "C", "gpus": 16}],
        "optical": {"slots": 32, "k_paths": 2},
        "workload": {"kind": "lightpath_requests"},
        "policy": {"placement": "sp-ff", "fixed_slots": 4, **policy},
        "emulation": {"hosts_per_dc": 2, "bandwidth_divisor": 1000},
    })


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[tuple[RestApi, ControllerCore, Recorder]]:
    sc = scenario()
    rec = Recorder()
    core = ControllerCore(sc, Store(tmp_path / "s.db"), layout=default_layout(sc),
                          southbound=rec)
    server = RestApi(core, port=0, token="tok", jobs=JobService(core))
    server.serve()
    yield server, core, rec
    server.close()


def call(api: RestApi, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    return rest_call(api.url, method, path, body, "tok", timeout_s=10)


JOB = {"model": "llama2-7b", "stages": 4, "gpus_per_stage": 8, "microbatches": 8,
       "iterations": 10, "policy": "sp-ff"}


def test_job_placed_with_lightpaths_and_released(setup: Any) -> None:
    api, core, rec = setup
    status, job = call(api, "POST", "/jobs", JOB)
    assert status == 201, job
    # 4 stages x 8 GPUs over DCs of 16 GPUs: two DCs, one cross-DC boundary.
    assert len(job["dcs"]) == 4 and len(set(job["dcs"])) == 2
    cross = [b for b in job["boundaries"] if b["src_dc"] != b["dst_dc"]]
    assert len(cross) == 1 and all(b["lightpath"] is None for b in job["boundaries"]
                                   if b["src_dc"] == b["dst_dc"])
    lp = cross[0]["lightpath"]
    for key in ("nodes", "slots", "modulation", "capacity_gbps", "vid"):
        assert key in lp
    assert lp["n_slots"] == 4 and lp["job_id"] == job["id"]  # sp-ff: fixed_slots
    assert lp["src_host"] == cross[0]["src_host"] and lp["dst_host"] == cross[0]["dst_host"]
    hosts = [s["host"] for s in job["stages_placement"]]
    assert all(h is not None and h.startswith(dc) for h, dc in zip(hosts, job["dcs"], strict=True))
    assert job["iteration_ms"] > 0 and 0 <= job["bubble_ratio"] < 1
    # GPUs and spectrum are the core's: one place.
    svc = api.jobs
    assert sum(svc.cluster.free) == 48 - 32
    assert svc.cluster.network is core.net
    used = {(f["u"], f["v"]): f["used"] for f in core.spectrum()}
    assert any(u == lp["slots"] for u in used.values())
    # Its rules went southbound (push at the edge for the host pair).
    assert rec.syncs and any(r.cookie & 0xFFFF == lp["id"] for rules in rec.syncs[-1].values()
                             for r in rules.values() if r.cookie)
    assert call(api, "GET", "/jobs")[1]["jobs"][0]["id"] == job["id"]
    assert call(api, "GET", f"/jobs/{job['id']}")[0] == 200
    status, gone = call(api, "DELETE", f"/jobs/{job['id']}")
    assert status == 200 and gone["removed"]
    assert sum(svc.cluster.free) == 48 and core.rows == {}
    assert all(not f["used"] for f in core.spectrum())
    assert call(api, "DELETE", f"/jobs/{job['id']}")[0] == 404


def test_same_decisions_as_the_job_layer(setup: Any) -> None:
    """The controller's placement equals testbed.jobs' on a fresh cluster."""
    api, _core, _rec = setup
    sc = scenario()
    for policy in ("sp-ff", "cba", "delay-first"):
        cluster = Cluster.from_scenario(sc)
        planner = Planner(cluster, sc.policy.model_copy(update={"placement": policy}))
        arch = model_catalog()["llama2-7b"]
        ref = planner.place(Job(JobRequest(1, 0.0, "llama2-7b", 4, 8, 8, 10), arch), 0.0)
        assert isinstance(ref, Placed)
        status, job = call(api, "POST", "/jobs", {**JOB, "policy": policy})
        assert status == 201, job
        assert job["dcs"] == [cluster.dcs[d].name for d in ref.alloc.stage_dcs]
        assert job["iteration_ms"] == pytest.approx(ref.timing.iteration_ms)
        got = [(tuple(b["lightpath"]["nodes"]), b["lightpath"]["first_slot"],
                b["lightpath"]["n_slots"]) if b["lightpath"] else None
               for b in job["boundaries"]]
        want = [(lp.nodes, lp.first_slot, lp.n_slots) if lp else None
                for lp in ref.alloc.lightpaths]
        assert got == want
        assert call(api, "DELETE", f"/jobs/{job['id']}")[0] == 200


@pytest.mark.parametrize("body,status,needle", [
    ({**JOB, "model": "nope"}, 404, "unknown model"),
    ({**JOB, "policy": "magic"}, 400, "unknown placement policy"),
    ({**JOB, "stages": 0}, 422, "stages"),
    ({**JOB, "gpus_per_stage": 64}, 409, "GPUs"),
    ({**JOB, "extra": 1}, 422, "extra"),
    ({**JOB, "schedule": "nope"}, 422, "schedule"),
    ({**JOB, "stages": 1000}, 400, "layer"),
])
def test_bad_jobs_get_4xx(setup: Any, body: dict[str, Any], status: int, needle: str) -> None:
    api, core, _ = setup
    got, reply = call(api, "POST", "/jobs", body)
    assert got == status and needle in reply["error"], reply
    assert core.rows == {} and sum(api.jobs.cluster.free) == 48


def test_no_gpus_left_is_409_and_nothing_leaks(setup: Any) -> None:
    api, core, _ = setup
    a = call(api, "POST", "/jobs", {**JOB, "stages": 4})
    b = call(api, "POST", "/jobs", {**JOB, "stages": 2})
    assert a[0] == 201 and b[0] == 201
    status, reply = call(api, "POST", "/jobs", {**JOB, "stages": 1})
    assert status == 409 and reply["reason"] == "no_gpus"
    n_rows = len(core.rows)
    assert sum(api.jobs.cluster.free) == 0 and len(core.rows) == n_rows
    text = call(api, "GET", "/metrics")[1]
    assert "lightpipe_jobs_active 2.0" in text
    assert 'lightpipe_job_refusals_total{reason="no_gpus"} 1.0' in text
    assert "lightpipe_job_setup_seconds_count 2.0" in text


def test_jobs_survive_a_restart(tmp_path: Path) -> None:
    sc = scenario()
    core = ControllerCore(sc, Store(tmp_path / "s.db"), layout=default_layout(sc))
    svc = JobService(core)
    server = RestApi(core, port=0, token="tok", jobs=svc)
    server.serve()
    try:
        status, job = call(server, "POST", "/jobs", JOB)
        assert status == 201
    finally:
        server.close()
    core2 = ControllerCore(sc, Store(tmp_path / "s.db"), layout=default_layout(sc))
    svc2 = JobService(core2)
    assert svc2.cluster.free == svc.cluster.free
    assert [j["id"] for j in svc2.list()] == [job["id"]]
    assert svc2.remove(job["id"])["removed"] and sum(svc2.cluster.free) == 48
    assert core2.rows == {}


def test_max_stages_per_dc_spreads_stages_like_the_simulator(setup: Any) -> None:
    """The request's (or scenario's) max_stages_per_dc limits stages per DC, as in sim."""
    api, _core, _rec = setup
    status, packed = call(api, "POST", "/jobs", {**JOB, "gpus_per_stage": 4})
    assert status == 201, packed
    assert len(set(packed["dcs"])) == 1  # 16 GPUs in dc-a hold all four 4-GPU stages
    assert call(api, "DELETE", f"/jobs/{packed['id']}")[0] == 200
    status, spread = call(api, "POST", "/jobs",
                          {**JOB, "gpus_per_stage": 4, "max_stages_per_dc": 2})
    assert status == 201, spread
    counts = {d: spread["dcs"].count(d) for d in spread["dcs"]}
    assert max(counts.values()) == 2 and len(counts) == 2
    assert sum(b["lightpath"] is not None for b in spread["boundaries"]) == 1


@pytest.mark.parametrize("event", ["fiber_cut", "wavelength_loss"])
def test_job_lightpaths_restored_or_lost_alike_on_cut_and_slot_loss(setup: Any,
                                                                    event: str) -> None:
    """A job's lightpath (POST /jobs) hit by a cut or a lost slot block: re-placed with its
    slot count (same VLAN, same job), then, with nowhere to go, shown lost; the job stays
    and DELETE frees everything either way."""
    api, core, _ = setup
    status, job = call(api, "POST", "/jobs", JOB)
    assert status == 201, job
    (b,) = [b for b in job["boundaries"] if b["lightpath"]]
    lp = b["lightpath"]
    u, v = lp["nodes"][:2]

    def hit(a: str, z: str, first: int, n: int) -> dict[str, Any]:
        body: dict[str, Any] = {"link": [a, z]}
        if event == "wavelength_loss":
            body.update(first_slot=first, slots=n)
        status, res = call(api, "POST", "/failures", body)
        assert status == 200, res
        return res

    res = hit(u, v, lp["first_slot"] + 1, 1)
    assert res["restored"] == [lp["id"]] and res["lost"] == []
    now = call(api, "GET", f"/jobs/{job['id']}")[1]
    (b2,) = [b for b in now["boundaries"] if b.get("lightpath_id") == lp["id"]]
    moved = b2["lightpath"]
    assert moved["vid"] == lp["vid"] and moved["job_id"] == job["id"]
    assert moved["n_slots"] == lp["n_slots"] and moved["restored"] == 1
    if event == "fiber_cut":
        assert [u, v] != moved["nodes"][:2]
    else:  # same route, past the lost slot
        assert moved["nodes"] == lp["nodes"] and moved["first_slot"] > lp["first_slot"] + 1
    # every route between the job's DCs loses its first fibre (or all its slots)
    for path in core.net.candidate_paths(*moved["nodes"][::len(moved["nodes"]) - 1]):
        a, z = path.nodes[:2]
        if not core.net.is_failed(a, z):
            hit(a, z, 0, core.net.slots)
    now = call(api, "GET", f"/jobs/{job['id']}")[1]
    (b3,) = [b for b in now["boundaries"] if b.get("lightpath_id") == lp["id"]]
    assert b3["lightpath"] is None and b3["lost"] is True
    assert lp["id"] not in core.rows and not core.net.lightpaths
    assert call(api, "DELETE", f"/jobs/{job['id']}")[0] == 200
    assert sum(api.jobs.cluster.free) == 48 and core.rows == {}
