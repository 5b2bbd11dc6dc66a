"""Workers on the emulated network (root): two concurrent 4-stage jobs over 3 DCs, both
modes, every worker and link metric queried from the live Prometheus, a worker killed
mid-run, and the loopback regression behind the first cross-DC rendezvous failure."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from testbed.spec import parse_scenario

ROOT = Path(__file__).resolve().parent.parent

pytestmark = [pytest.mark.root, pytest.mark.timeout(420)]

WORKER_METRICS = ("lightpipe_worker_iteration_duration_seconds_count",
                  "lightpipe_worker_bubble_ratio", "lightpipe_worker_sent_bytes_total",
                  "lightpipe_worker_received_bytes_total",
                  "lightpipe_worker_compute_seconds_total")
LINK_METRICS = ("lightpipe_fibre_rx_bytes_total", "lightpipe_fibre_tx_bytes_total",
                "lightpipe_fibre_queue_drops_total", "lightpipe_fibre_loss_drops_total",
                "lightpipe_fibre_queue_depth_bytes", "lightpipe_lightpath_bytes_total",
                "lightpipe_lightpath_drops_total", "lightpipe_lightpath_rate_bits_per_second")


def _skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "needs root (network namespaces, Open vSwitch)"
    if shutil.which("mnexec") is None:
        return "needs Mininet's mnexec"
    if shutil.which("prometheus") is None:
        return "needs the prometheus server binary"
    from testbed.envprobe import probe

    rep = probe()
    if not rep.emulation_possible:
        return "emulation not possible here: " + "; ".join(rep.reasons)
    return None


SCENARIO: dict[str, Any] = {
    "version": 1, "name": "workers-emu-test",
    "topology": {"nodes": ["A", "B", "C"], "links": [
        {"u": "A", "v": "B", "length_km": 400}, {"u": "B", "v": "C", "length_km": 600},
        {"u": "A", "v": "C", "length_km": 800}]},
    "dcs": [{"name": "dc-a", "node": "A", "gpus": 3, "gpu": "h100"},
            {"name": "dc-b", "node": "B", "gpus": 3, "gpu": "h100"},
            {"name": "dc-c", "node": "C", "gpus": 3, "gpu": "h100"}],
    "optical": {"grid": "flex", "slots": 16, "k_paths": 2},
    "workload": {"kind": "pp_jobs", "jobs": 2, "mean_interarrival_s": 1,
                 "max_stages_per_dc": 2,
                 "models": [{"name": "t", "layers": 8, "hidden": 2048, "seq_len": 1024,
                             "micro_batch": 1, "vocab": 8000}],
                 "mix": [{"model": "t", "stages": 4, "gpus_per_stage": 1, "microbatches": 4,
                          "iterations": 10}], "seed": 1},
    "policy": {"placement": "sp-ff", "schedule": "1f1b", "fixed_slots": 1},
    "emulation": {"bandwidth_divisor": 1000, "time_factor": 10, "hosts_per_dc": 2,
                  "forwarding": "static", "max_jobs": 2, "worker_iterations": 4,
                  "worker_warmup_iterations": 1},
}


@pytest.fixture(scope="module")
def live_net(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The network, with the os-ken controller placing jobs (POST /jobs) where os-ken
    is installed, else static forwarding (placement computed beside it)."""
    why = _skip_reason()
    if why:
        pytest.skip(why)
    from testbed.emu.network import EmuNetwork
    from testbed.emu.plan import build_plan
    from testbed.orchestrate.controller import controller_available

    use_ctl = controller_available()[0]
    spec = {**SCENARIO, "emulation": {**SCENARIO["emulation"],
                                      "forwarding": "controller" if use_ctl else "static"}}
    scenario = parse_scenario(spec)
    controller = None
    if use_ctl:
        from testbed.orchestrate.glue import controller_address

        controller = controller_address()
    net = EmuNetwork(build_plan(scenario), link_mode="userspace", controller=controller)
    with net:
        ctl = None
        if use_ctl:
            from testbed.orchestrate.controller import start_run_controller

            ctl = start_run_controller(net, scenario, tmp_path_factory.mktemp("controller"))
        try:
            yield scenario, net
        finally:
            if ctl is not None:
                ctl.stop()


def _query_all(url: str, names: tuple[str, ...]) -> dict[str, list[dict[str, Any]]]:
    from testbed.metrics.query import query

    return {n: query(url, f"last_over_time({n}[1h])") for n in names}


def test_hosts_reach_their_own_address(live_net: Any) -> None:
    """Regression: with a host's `lo` down, stage 0 cannot reach its own rendezvous."""
    _, net = live_net
    code = "import sys; from workloads.worker import check_self_reach as c; c(sys.argv[1])"
    for h in net.plan.hosts:
        res = subprocess.run(["mnexec", "-a", str(net.host_pid(h.name)), sys.executable,
                              "-c", code, h.ip.split("/")[0]], cwd=ROOT,
                             capture_output=True, text=True, timeout=30)
        assert res.returncode == 0, (h.name, res.stderr[-500:])


def test_shadow_jobs_across_dcs_every_metric_live(live_net: Any, tmp_path: Path) -> None:
    from testbed.orchestrate.pp_jobs import run_pp_jobs

    scenario, net = live_net
    seen: dict[str, Any] = {}
    res = run_pp_jobs(scenario, net, tmp_path, quiet=True, mode="shadow",
                      on_metrics=lambda url: seen.update(_query_all(
                          url, WORKER_METRICS + LINK_METRICS)))
    jobs = res["worker_jobs"]
    assert len(jobs) == 2 and all(j["ok"] for j in jobs), [j["failure"] for j in jobs]
    ctl = getattr(net, "controller_client", None) is not None
    assert res["placement_from"] == ("controller" if ctl else "emulator")
    assert res["lightpath_congestion_control"] == "reno"
    if ctl:  # every cross-DC boundary has its own controller lightpath (other VLANs than
        # the DC pairs' 101+), and is timed on the one its flow takes: its own, or where
        # the WAN routing (ECMP) put it, another (a DC pair's default, another job's)
        lps = [lp for j in jobs for lp in j["lightpaths"] if lp is not None]
        assert lps and all(lp["own_lightpath_id"] and lp["lightpath_id"] for lp in lps)
        assert all(lp["vlan"] < 101 or lp["lightpath_id"] != lp["own_lightpath_id"]
                   for lp in lps)
        assert all(lp["vlan"] < 101 or lp["vlan"] in {x.vlan for x in net.plan.lightpaths}
                   for lp in lps)
        # a job's own lightpath that carries a flow was pinged and corrected on its own
        checked = {r["vlan"] for r in res["job_lightpath_rtt"]}
        assert {lp["vlan"] for lp in lps if lp["vlan"] < 101} <= checked
    assert all(len(set(j["stage_dcs"])) >= 2 for j in jobs)  # across DCs
    assert all(j["mode"] == "shadow" and len(j["exit_codes"]) == 4 for j in jobs)
    for name in WORKER_METRICS:
        got = {(r["metric"]["training_job"], r["metric"]["stage"]) for r in seen[name]}
        assert got == {(j["job"], str(s)) for j in jobs for s in range(4)}, name
    for name in ("lightpipe_worker_sent_bytes_total", "lightpipe_worker_compute_seconds_total"):
        assert sum(float(r["value"][1]) for r in seen[name]) > 0
    fibres = {f"{f.u}-{f.v}" for f in net.plan.fibres}
    for name in LINK_METRICS:
        assert {r["metric"]["fibre"] for r in seen[name]} == fibres, name
    vlans = {str(lp.vlan) for lp in net.plan.lightpaths}
    if ctl:
        vlans |= {str(lp["vlan"]) for j in jobs for lp in j["lightpaths"] if lp}
    assert {r["metric"]["vlan"] for r in seen["lightpipe_lightpath_bytes_total"]} >= vlans
    carried = sum(float(r["value"][1]) for r in seen["lightpipe_lightpath_bytes_total"])
    assert carried > 1e5
    rows = res["agreement"]
    assert [r["job"] for r in rows] == [j["job"] for j in jobs]
    # sanity, not calibration: a job's time is within 50 % of the model's, or the run says
    # why it does not measure the network (its CPU-starvation invariants failed; CI of
    # c90a7f1: 50.8 % with three pytest lanes on a 2-core machine 1.7x slower)
    assert all(r["relative_error"] is not None for r in rows), rows
    assert all(r["relative_error"] < 0.5 or r["starved"] for r in rows), rows
    assert (tmp_path / "trace.json").exists() and (tmp_path / "iterations.csv").exists()


def test_model_jobs_and_a_killed_worker(live_net: Any, tmp_path: Path) -> None:
    """Model mode on both jobs; stage 1 of the second job is SIGKILLed after its
    first iteration: that job is recorded as failed, the other one finishes."""
    from testbed.orchestrate.pp_jobs import run_pp_jobs

    scenario, net = live_net
    victim: dict[str, Any] = {}

    def killer() -> None:
        end = time.monotonic() + 240
        while time.monotonic() < end:
            recs = sorted((tmp_path / "workers").glob("job*/stage1.jsonl"))
            if len(recs) == 2:
                lines = [json.loads(x) for x in recs[1].read_text().splitlines() if x]
                start = [r for r in lines if r["type"] == "start"]
                if start and any(r["type"] == "iteration" for r in lines):
                    victim["job"] = recs[1].parent.name
                    os.kill(start[0]["pid"], signal.SIGKILL)
                    return
            time.sleep(0.2)

    t = threading.Thread(target=killer, daemon=True)
    t.start()
    seen: dict[str, Any] = {}
    res = run_pp_jobs(scenario, net, tmp_path, quiet=True, mode="model",
                      on_metrics=lambda url: seen.update(_query_all(
                          url, (*WORKER_METRICS, "lightpipe_worker_loss"))))
    t.join(1)
    by_job = {j["job"]: j for j in res["worker_jobs"]}
    assert victim, "the second job never finished an iteration"
    dead = by_job[victim["job"]]
    assert not dead["ok"] and "stage 1" in dead["failure"] and "SIGKILL" in dead["failure"]
    assert res["failed_jobs"] == [victim["job"]]
    alive = next(j for j in by_job.values() if j["job"] != victim["job"])
    assert alive["ok"] and alive["mode"] == "model"
    assert alive["losses"][-1] < alive["losses"][0]
    assert dead["iterations_measured"] >= 0  # recorded iterations kept (may be warm-up only)
    for name in WORKER_METRICS:
        assert {r["metric"]["training_job"] for r in seen[name]} == set(by_job), name
    assert any(float(r["value"][1]) > 0 for r in seen["lightpipe_worker_loss"])
