"""`lightpipe emu SPEC --cluster FILE` over real SSH (root, opt-in; tests/cluster/run.sh).

The two stand-in machines of test_cluster_up (each a network namespace with a Dropbear
server, a state root of its own, a data network for the tunnels). A ring of 4 optical
nodes, a DC of one host on each, two DCs per stand-in, and one 4-stage pipeline job with
a stage in every DC: its workers run on both machines through their worker agents, a
real Prometheus here scrapes them at the machines' addresses, one os-ken controller here
programs both machines' switches through the agents' sessions, the records come back on
one clock in the one-machine shape, and nothing is left on either machine afterwards,
also when the driver (and with it the controller) is killed with SIGKILL while the
workers run.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from tests.cluster.test_cluster_ssh import servers
from tests.cluster.test_cluster_up import PLACE, VENV, StandIn, _cluster_subset, machines, need
from tests.test_cluster import ring
from tests.waiting import wait_until

pytestmark = [pytest.mark.root, pytest.mark.slow]
__all__ = ["machines", "servers"]  # the fixtures


def _pp_ring(path: Path, iterations: int = 6) -> Path:
    """The stand-ins' ring as a pp_jobs scenario: one job of 4 one-GPU stages, so every
    DC (one GPU each) gets a stage, two on each machine."""
    sc = ring(4, [("a", "n1", 1), ("b", "n2", 1), ("c", "n3", 1), ("d", "n4", 1)])
    data = sc.model_dump(mode="json", exclude_none=True)
    for d in data["dcs"]:
        d["gpus"] = 1
    data["workload"] = {
        "kind": "pp_jobs", "jobs": 1, "mean_interarrival_s": 1,
        "models": [{"name": "tiny", "layers": 8, "hidden": 1024, "seq_len": 512,
                    "micro_batch": 1, "vocab": 32000}],
        "mix": [{"model": "tiny", "stages": 4, "gpus_per_stage": 1, "microbatches": 4,
                 "iterations": 10}], "seed": 1}
    data["policy"] = {"placement": "sp-ff", "schedule": "1f1b", "fixed_slots": 8}
    data["emulation"] = {**data.get("emulation", {}), "hosts_per_dc": 1, "max_jobs": 1,
                         "worker_iterations": iterations, "worker_warmup_iterations": 1,
                         "bandwidth_divisor": 4000, "time_factor": 10}
    path.write_text(yaml.safe_dump(data))
    return path


def _emu(*argv: str) -> subprocess.Popen[str]:
    return subprocess.Popen([f"{VENV}/bin/lightpipe", "emu", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def _run_on_both(cluster_file: Path, spec: Path, out: Path) -> None:
    """`emu SPEC --cluster` on the two stand-ins (two DCs each, user-space links and
    datapath), to its end; its output printed, exit 0 asserted."""
    two = _cluster_subset(cluster_file, ["m-a", "m-b"])
    place = [w for p in PLACE for w in ("--place", p)]
    t0 = time.monotonic()
    p = _emu(str(spec), "--cluster", str(two), "--out", str(out), *place, "--link-mode",
             "userspace", "--datapath", "user", "-q")
    so, se = p.communicate(timeout=900)
    print(f"\n{so}{se}emu --cluster {spec.name}, 2 stand-ins: {time.monotonic() - t0:.1f} s "
          f"(load {os.getloadavg()[0]:.1f})")
    assert p.returncode == 0, (so, se)


@need
def test_emu_cluster_runs_a_job_on_both_machines(machines: tuple[list[StandIn], Path],
                                                  tmp_path: Path) -> None:
    (a, b), f = machines
    out = tmp_path / "out"
    _run_on_both(f, _pp_ring(tmp_path / "pp-ring.yaml"), out)
    s = json.loads((out / "summary.json").read_text())
    assert s["backend"] == "emu" and s["forwarding"] == "controller"
    # One controller here; both machines' switches reached it through their agents,
    # it synced them all and set up the plan's lightpaths, and every DC pair answered
    # again on its rules.
    cr = s["controller_run"]
    assert sorted(cr["switches"]) == ["m-a", "m-b"] and all(cr["switches"].values())
    assert cr["lightpaths"] == 6 and cr["pairs_answered"] == cr["pairs_planned"] == 6, cr
    for m, st in cr["relay_stats"].items():
        assert st["channels_opened"] >= len(cr["switches"][m]), (m, st)
        assert st["bytes_from_switches"] > 0 and st["bytes_to_switches"] > 0, (m, st)
    # Every lightpath's rate set by the controller on each fibre of its route, on the
    # machine emulating that fibre (the relay here, each holder there), none refused.
    caps = cr["caps"]
    assert caps["fibres"] == 4 and caps["failed"] == 0 and caps["mismatch"] == [], caps
    assert caps["requests"] >= cr["lightpaths"] and len(caps["caps_mbps"]) == 4, caps
    assert not (out / ".caps").exists()
    assert s["controller"]["pid"] > 0 and "token" not in s["controller"]
    assert (out / "cluster_rtt_controller.json").is_file() and (out / "controller.log"
                                                                ).is_file()
    cl = s["cluster"]
    assert cl["machines"] == ["m-a", "m-b"] and cl["pairs_within_band"] == 6
    assert set(cl["clock_offsets"]) == {"m-a", "m-b"}
    for c in cl["clock_offsets"].values():  # one host: the same clock, within its error
        assert abs(c["offset_s"]) * 1e3 <= c["error_ms"] + 0.05, c
    job = s["worker_jobs"][0]
    assert job["ok"] and s["failed_jobs"] == []
    machines_of = cl["stage_machines"][job["job"]]
    assert sorted(set(machines_of)) == ["m-a", "m-b"] and len(machines_of) == 4
    assert job["emulated_iteration_time_s"] > 0
    # The one-machine records: per-stage JSON lines (start, iterations, done), the
    # iteration table, the trace; the cluster's own files beside them.
    for st in range(4):
        recs = [json.loads(x) for x in
                (out / "workers" / job["job"] / f"stage{st}.jsonl").read_text().splitlines()]
        kinds = [r["type"] for r in recs]
        assert kinds[0] == "start" and kinds[-1] == "done" and kinds.count("iteration") == 7
        # the launcher's fault options through the agents (null: gloo's 1800 s x 10)
        col = recs[0]["collective"]
        assert (col["timeout_ms"], col["on_fault"], col["max_restarts"]) == (
            18_000_000, "fail", 3), col
    assert s["worker_fault_policy"]["collective_timeout_scenario_s"] == 1800.0
    rows = list(csv.DictReader((out / "iterations.csv").open()))
    assert len(rows) == 7 and all(float(r["wall_time_s"]) > 0 for r in rows)
    for name in ("trace.json", "cluster_run.json", "cluster_rtt.json",
                 "cluster_calibration.json", "manifest.json"):
        assert (out / name).is_file(), name
    assert json.loads((out / "manifest.json").read_text())["status"] == "finished"
    # Each machine's holder serves its fibres' counters at its address.
    assert {m: x["fibres"] for m, x in s["link_exporters"].items()} == {
        "m-a": ["n1-n2", "n2-n3"], "m-b": ["n3-n4", "n4-n1"]}, s["link_exporters"]
    series = s.get("prometheus_series")
    if series is not None:  # a Prometheus here scraped both machines: workers and fibres
        assert series["lightpipe_worker_sent_bytes_total"] == 4, series
        assert series["lightpipe_fibre_tx_bytes_total"] == 8, series  # 4 fibres x 2 ways
    # One fidelity verdict from both machines' own measurements: each machine's
    # forwarders, switch and stages read on it, the pairs' RTTs with their echoes.
    fid = s["fidelity"]
    assert set(fid["machines"]) == {"m-a", "m-b"}, fid.get("reasons")
    for m, got in fid["machines"].items():
        assert got["ok"] and got["forwarders"] == 2 and got["workers"] == 2, (m, got)
    assert {p["machine"] for p in fid["processes"] if p["role"] == "switch"} == {"m-a", "m-b"}
    assert sorted(p["name"] for p in fid["processes"] if p["role"] == "forwarder") == [
        "n1-n2", "n2-n3", "n3-n4", "n4-n1"]
    assert len(fid["lightpaths"]) == 6 and all(e["replies"] for e in fid["lightpaths"])
    assert {i["name"] for i in fid["invariants"] if i["measured"]} >= {
        "rtt_median_error", "forwarder_sched_delay", "forwarder_cpu_share",
        "switch_sched_delay", "switch_cpu_share", "worker_cpu_share",
        "host_steal", "clock_offset_error"}, fid["invariants"]
    assert len(fid["tcp"]) == s["hosts"], fid["tcp"]  # every host's, on its machine
    assert all(v == "ok" for v in s["teardown"].values()), s["teardown"]
    assert a.left() == [] and b.left() == []


@need
def test_emu_cluster_plays_events_during_training(machines: tuple[list[StandIn], Path],
                                                  tmp_path: Path) -> None:
    """The job's events across machines, on the training clock: a cut and repair of n2-n3
    (the fibre that crosses to m-b, set down by m-a's holder; the controller restores the
    lightpaths it carried), then the controller SIGKILLed and started again here on the
    same database, ports and caps relay, both machines' switches back to it through their
    agents; the workers go on until the events are done."""
    (a, b), f = machines
    spec = _pp_ring(tmp_path / "pp-ring.yaml")
    data = yaml.safe_load(spec.read_text())
    data["events"] = [{"at_s": 0.1, "kind": "fiber_cut", "link": ["n2", "n3"]},
                      {"at_s": 0.3, "kind": "fiber_repair", "link": ["n2", "n3"]},
                      {"at_s": 0.5, "kind": "controller_kill", "down_s": 0.2}]
    data["emulation"]["iterate_through_events"] = True
    data["policy"]["workers"] = {"collective_timeout_s": 30, "on_fault": "retry",
                                 "max_restarts": 2, "restart_s": 0.1}
    spec.write_text(yaml.safe_dump(data))
    out = tmp_path / "out"
    _run_on_both(f, spec, out)
    s = json.loads((out / "summary.json").read_text())
    assert s["events_clock"] == "training" and s["event_errors"] == [], s["event_errors"]
    cut, repair = s["events"][:2]
    assert cut["kind"] == "fiber_cut" and cut["restored"] and cut["lost"] == [], cut
    assert repair["kind"] == "fiber_repair" and "repair_seen_s" in repair, repair
    # Each restored lightpath pinged on its new route from its first DC's machine and
    # corrected on its new fibres on the machines emulating them, as on one machine.
    checked = cut["rtt_after_reroute"]
    assert len(checked) == len(cut["restored"]) == s["reroute_rtt_checks"] > 0, cut
    for row in checked:
        assert row.get("after_error_ms") is not None, row
        assert "n2" not in row["route"] or "n3" not in row["route"][
            row["route"].index("n2") + 1:row["route"].index("n2") + 2], row
    assert any(r["machines"] == ["m-a", "m-b"] for r in checked), checked
    kill = next(r for r in s["faults"] if r["kind"] == "controller_kill")
    assert kill["applied"] and kill["pid_restarted"] != kill["pid_killed"], kill
    assert kill["lightpaths_after"] == kill["lightpaths_before"] > 0, kill
    assert s["controller"]["pid"] == kill["pid_restarted"], (s["controller"], kill)
    assert s["controller_run"]["caps"]["failed"] == 0, s["controller_run"]["caps"]
    job = s["worker_jobs"][0]
    assert job["ok"] and s["failed_jobs"] == [], job
    for st in range(4):  # the scenario's fault options reached every stage's worker
        start = json.loads((out / "workers" / job["job"] / f"stage{st}.jsonl"
                            ).read_text().splitlines()[0])
        col = start["collective"]
        assert (col["timeout_ms"], col["on_fault"], col["max_restarts"],
                col["restart_s"]) == (300_000, "retry", 2, 1.0), col
    assert all(v == "ok" for v in s["teardown"].values()), s["teardown"]
    assert a.left() == [] and b.left() == []


def _requests_ring(path: Path) -> Path:
    """The stand-ins' ring with the quickstart's workload (lightpath requests through the
    controller) and a cut and repair of n2-n3, the fibre that crosses to m-b."""
    sc = ring(4, [("a", "n1", 1), ("b", "n2", 1), ("c", "n3", 1), ("d", "n4", 1)])
    data = sc.model_dump(mode="json", exclude_none=True)
    data["workload"] = {**data["workload"], "requests": 400}
    data["events"] = [{"at_s": 0.5, "kind": "fiber_cut", "link": ["n2", "n3"]},
                      {"at_s": 1.5, "kind": "fiber_repair", "link": ["n2", "n3"]}]
    data["emulation"] = {**data.get("emulation", {}), "hosts_per_dc": 1,
                         "max_requests": 30, "replay_s": 6}
    path.write_text(yaml.safe_dump(data))
    return path


@need
def test_emu_cluster_replays_requests_and_a_cut_through_one_controller(
        machines: tuple[list[StandIn], Path], tmp_path: Path) -> None:
    """The quickstart's workload across the stand-ins: its requests through the one
    controller, which programs both machines' switches; the cut of the crossing fibre is
    its emulator's links set down on the machine that emulates it, and the controller
    hears it from that machine's switch (through the relay) and restores."""
    (a, b), f = machines
    out = tmp_path / "out-req"
    _run_on_both(f, _requests_ring(tmp_path / "req-ring.yaml"), out)
    s = json.loads((out / "summary.json").read_text())
    assert s["forwarding"] == "controller" and s["workload"] == "lightpath_requests"
    assert s["controller_run"]["pairs_answered"] == 6
    rows = list(csv.DictReader((out / "requests.csv").open()))
    assert len(rows) == 30 and any(r["accepted"] in ("1", "True", "true") for r in rows)
    cut, repair = s["events"]
    assert cut["kind"] == "fiber_cut" and cut["via"] == "port_status", cut
    assert cut["cut_to_restored_s"] > 0 and repair["via"] == "port_status", repair
    assert s["agreement"] is not None
    # The plan's lightpaths the cut moved: their RTT on the route they are on now.
    for row in s["rtt_after_reroute"]:
        assert row.get("after_error_ms") is not None and row["machines"], row
    assert isinstance(s["reroute_rtt_out"], list)
    assert s["fidelity"]["machines"].keys() == {"m-a", "m-b"}
    assert all(v == "ok" for v in s["teardown"].values()), s["teardown"]
    assert a.left() == [] and b.left() == []


def _records(out: Path) -> tuple[list[str], list[str], dict[str, object]]:
    """A run directory's files (top level), its summary's keys and its manifest."""
    files = sorted(p.name for p in out.iterdir() if not p.name.startswith("."))
    summary = json.loads((out / "summary.json").read_text())
    return files, sorted(summary), json.loads((out / "manifest.json").read_text())


@need
def test_run_backend_cluster_writes_what_emu_cluster_writes(
        machines: tuple[list[StandIn], Path], tmp_path: Path) -> None:
    """`lightpipe run SPEC --backend cluster --cluster FILE` on the stand-ins: the run
    `emu --cluster` makes (the quickstart's workload through one controller), the same
    records (files, summary keys, the manifest's backend and status)."""
    (a, b), f = machines
    two = _cluster_subset(f, ["m-a", "m-b"])
    spec = _requests_ring(tmp_path / "req-ring.yaml")
    place = [w for p in PLACE for w in ("--place", p)]
    t0 = time.monotonic()
    ran = subprocess.run([f"{VENV}/bin/lightpipe", "run", str(spec), "--backend", "cluster",
                          "--cluster", str(two), "--out", str(tmp_path / "run"), *place,
                          "-q"], capture_output=True, text=True, timeout=900, check=False)
    print(f"\n{ran.stdout}{ran.stderr}run --backend cluster: {time.monotonic() - t0:.1f} s "
          f"(load {os.getloadavg()[0]:.1f})")
    assert ran.returncode == 0, (ran.stdout, ran.stderr)
    assert "lightpipe: running the cluster backend (asked for)" in ran.stdout
    assert "cluster: scenario" in ran.stdout and "on the cluster backend" in ran.stdout
    assert a.left() == [] and b.left() == []
    _run_on_both(f, spec, tmp_path / "emu")
    files, keys, manifest = _records(tmp_path / "run")
    emu_files, emu_keys, emu_manifest = _records(tmp_path / "emu")
    assert files == emu_files and keys == emu_keys, (files, emu_files, keys, emu_keys)
    for m in (manifest, emu_manifest):
        assert m["backend"] == "emu" and m["status"] == "finished", m
    assert manifest.get("records") == emu_manifest.get("records")
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert s["backend"] == "emu" and s["workload"] == "lightpath_requests"
    assert s["cluster"]["machines"] == ["m-a", "m-b"]
    assert all(v == "ok" for v in s["teardown"].values()), s["teardown"]
    assert a.left() == [] and b.left() == []


@need
def test_emu_cluster_kill_9_of_the_driver_leaves_nothing(
        machines: tuple[list[StandIn], Path], tmp_path: Path) -> None:
    """SIGKILL of `emu --cluster` while its workers run: each machine's agent sees its
    session end and takes its share down (workers, holder, then its own clean)."""
    (a, b), f = machines
    two = _cluster_subset(f, ["m-a", "m-b"])
    spec, out = _pp_ring(tmp_path / "pp-ring.yaml", iterations=200), tmp_path / "out-kill"
    place = [w for p in PLACE for w in ("--place", p)]
    p = _emu(str(spec), "--cluster", str(two), "--out", str(out), *place, "--link-mode",
             "userspace", "--datapath", "user", "-q", "--no-calibrate")
    try:
        def training() -> bool:
            assert p.poll() is None, p.communicate()
            return any((out / "workers").glob("*/stage3.jsonl")) and any(
                '"type": "iteration"' in x.read_text()
                for x in (out / "workers").glob("*/stage*.jsonl"))

        wait_until(training, "the workers on both machines iterating", timeout_s=600)
        assert a.runs() and b.runs()
        assert any("controllers.launcher" in x for x in _naming(out)), _naming(out)
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
    wait_until(lambda: a.left() == [] and b.left() == [], "both machines left with nothing",
               timeout_s=180)
    # The driver's own Prometheus and controller (no run state records them) end with the
    # driver too.
    wait_until(lambda: _naming(out) == [], "no process left that names the run directory",
               timeout_s=60)


def _naming(path: Path) -> list[str]:
    """The command lines of the processes that name path (or a path under it)."""
    want = str(path)
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            args = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if any(want in a for a in args):
            found.append(" ".join(args)[:200])
    return found
