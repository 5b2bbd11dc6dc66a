"""One emulation run across machines, scenario to records, in the one-machine run's shape.

The steps, each an existing piece:

    bring_up          testbed.cluster.bringup: plan once, every machine's share over SSH,
                      delays calibrated across the machines, every DC pair checked and
                      every lightpath probed (cluster_run.json, cluster_calibration.json,
                      cluster_rtt.json, cluster_probes.json)
    worker agents     testbed.cluster.agentlink: one SSH session per machine that holds a
                      stage, each clock's offset measured; `own`: an agent whose driver
                      goes away (even kill -9) takes its machine's share down
    controller        (emulation.forwarding: controller, the default) testbed.cluster.ctlrun
                      through testbed.cluster.workload: one os-ken controller here, every
                      machine's switches relayed to it over their agent's session, the
                      whole plan's layout, the plan's lightpaths set up through its REST
                      API; every DC pair pinged again on its rules
                      (cluster_rtt_controller.json)
    monitor           testbed.monitor.run.RunMonitor here, on the driver's machine (the
                      first of the cluster file, or where the run is started): Prometheus
                      scrapes every worker at its machine's address
    workload          testbed.cluster.workload: pp_jobs' workers through
                      testbed.orchestrate.jobs.run_jobs_on_hosts with the agents (stages on
                      the DCs' hosts wherever they run; records mirrored here on one
                      clock), or lightpath_requests replayed through the controller
    teardown          every machine's share stopped and cleaned (`cluster down`)

Records in the run directory, the one-machine run's shape (summary.json, iterations.csv,
trace.json, workers/JOB/stageN.jsonl, manifest.json, backend "emu") plus the cluster's
files and a `cluster` section in the summary (machines, placement, clock offsets, the
controller's relay). Until the controller has synced, the switches forward on the
emulator's static rules (what `cluster up` checks); with `emulation.forwarding: static`
they keep them.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from testbed.cluster.agentlink import ClusterWorkers
from testbed.cluster.bringup import UpOptions, UpRun, bring_up, report_down
from testbed.cluster.checks import Echo, final_rtt_rows, log_line
from testbed.cluster.ctlrun import ClusterController, stop_cap_relay
from testbed.cluster.fidelity import cluster_verdict
from testbed.cluster.spec import load_cluster
from testbed.cluster.workload import replay, run_jobs, start_controller
from testbed.emu.fidelity import fault_accounting, with_fidelity
from testbed.emu.network import sigterm_as_interrupt
from testbed.emu.plan import EmuPlan
from testbed.errors import InputError, RuntimeFailure
from testbed.io.atomic import atomic_write_json
from testbed.monitor.run import RunMonitor
from testbed.orchestrate.controller import describe
from testbed.orchestrate.pp_jobs import prometheus_series
from testbed.orchestrate.results import read_records
from testbed.progress import say
from testbed.runs.rundir import run_dir
from testbed.spec import Scenario

log = logging.getLogger(__name__)
BACKEND = "emu"  # what the records say: an emulation, here across machines


def check_workload(scenario: Scenario) -> None:
    """InputError naming the field when the scenario's workload cannot run across
    machines."""
    kind, forwarding = scenario.workload.kind, scenario.emulation.forwarding
    if kind == "allreduce_jobs":  # one DC's fabric, which placement keeps on one machine
        raise InputError("workload.kind", "allreduce_jobs runs in one DC's leaf-spine fabric, "
                         "which a cluster never splits (a DC stays on one machine): run it "
                         "with `lightpipe emu` on that machine (docs/cluster.md)")
    if kind not in ("pp_jobs", "lightpath_requests"):
        raise InputError("workload.kind", f"emu --cluster runs pp_jobs and lightpath_requests "
                         f"workloads, not {kind} (docs/cluster.md)")
    if kind == "lightpath_requests" and forwarding != "controller":
        raise InputError("emulation.forwarding", "lightpath_requests replays its requests "
                         "through the SDN controller: 'controller', not 'static'")


def run_cluster_emulation(scenario: Scenario, out_dir: Path, opts: UpOptions,
                          quiet: bool = False, echo: Echo = log_line) -> dict[str, Any]:
    """The whole run (see the module docstring) into out_dir; the summary. The lines of
    bring-up, checks and teardown go to `echo`, the progress lines to testbed.progress."""
    check_workload(scenario)
    opts.check()
    cluster = load_cluster(opts.cluster_file)
    kind = scenario.workload.kind
    t0 = time.monotonic()
    with run_dir(Path(out_dir), scenario, BACKEND) as rd, sigterm_as_interrupt():
        stage = rd.path
        up = bring_up(cluster, scenario, opts, lambda: stage, echo)
        try:
            work = _run_workload(up, stage, quiet, echo)
        finally:
            say(f"emu: teardown: run {up.plan.prefix} on every machine", quiet)
            downs = up.down()
            report_down(downs, echo)
        bad = [r for r in downs if not r.ok]
        summary = _summary(up, work, time.monotonic() - t0, opts.datapath)
        summary["teardown"] = {r.machine: ("ok" if r.ok else r.problem) for r in downs}
        atomic_write_json(stage / "summary.json", summary)
        controlled = summary["forwarding"] == "controller"
        rd.finish(link_mode=summary["link_mode"], datapath=summary["datapath"],
                  **up.plan.scale.as_record(), forwarding=summary["forwarding"],
                  controller=summary["controller"], cluster=summary["cluster"]["name"],
                  records=["summary.json", "cluster_run.json", "cluster_rtt.json",
                           "cluster_probes.json"]
                  + (["cluster_calibration.json"] if up.calibration.get("enabled") else [])
                  + (["cluster_rtt_controller.json", "controller.log"] if controlled
                     else [])
                  + (["requests.csv"] if kind == "lightpath_requests" else []))
        if bad:
            raise RuntimeFailure(f"machine {bad[0].machine} ({bad[0].address}): teardown: "
                                 f"{bad[0].problem}")
        return summary


def _run_workload(up: UpRun, stage: Path, quiet: bool, echo: Echo) -> dict[str, Any]:
    """Agents, controller, monitor and the workload; the workload part of the summary."""
    scenario = up.scenario
    result: dict[str, Any] = {}
    # An agent on every machine of the share, stages or not: each serves its machine's
    # link metrics and takes its share down if this driver goes away.
    with ClusterWorkers(up.cluster, up.plan.prefix, up.machines) as cw:
        agents = cw.open(own=True)
        for m, a in agents.items():
            c = a["clock"]
            say(f"emu: agent on {m}: clock offset {c['offset_s']:+.6f} s "
                f"(+- {c['error_ms']:.3f} ms)", quiet)
        cc: ClusterController | None = None
        plan = up.plan
        if scenario.emulation.forwarding == "controller":
            cc = start_controller(up, cw, stage, quiet, echo)
            plan, result["controller_run"] = cc.plan, cc.record
        try:
            # No run state on this machine records the server: it ends with this process.
            mon = RunMonitor(scenario, stage, stage, die_with_driver=True).start(
                ctl=None if cc is None else cc.ctl)
            try:
                links = [(a["links"]["target"], {"component": "links", "machine": m})
                         for m, a in sorted(agents.items()) if a["links"].get("ok")
                         and a["links"].get("fibres")]
                if links:
                    mon.set_targets("links", links)
                result["link_exporters"] = {m: a["links"] for m, a in agents.items()}
                if mon.prom is not None:
                    result["prometheus_url"] = mon.prom.url
                    say(f"emu: Prometheus at {mon.prom.url}", quiet)
                if scenario.workload.kind == "lightpath_requests":
                    assert cc is not None  # checked with the input (check_workload)
                    result.update(replay(up, cw, cc.ctl, plan, stage, quiet))
                else:
                    result.update(run_jobs(up, cw, plan, stage, mon, cc, quiet))
                result["fidelity"] = _fidelity(cw, plan, stage, result, mon)
                if mon.prom is not None:
                    mon.flush()
                    result["prometheus_series"] = prometheus_series(mon.prom.url, None)
                result["prometheus"] = mon.describe()
            finally:
                mon.stop()
        finally:
            if cc is not None:
                cw.stop_openflow()
                cc.ctl.stop()
                result["controller"] = describe(cc.ctl, with_token=False)
                result["controller_run"]["relay_stats"] = cw.openflow_stats()
                stop_cap_relay(cc.relay)
                result["controller_run"]["caps"].update(cc.relay.record())
        result["clocks"] = cw.clocks()
        result["agent_errors"] = list(cw.errors)
    return result


def _fidelity(cw: ClusterWorkers, plan: EmuPlan, stage: Path, result: dict[str, Any],
              mon: RunMonitor) -> dict[str, Any]:
    """The run's fidelity verdict across machines (testbed.cluster.fidelity): every
    machine's measurements from its agent, the DC pairs' RTTs of the last pair check
    (on the controller's rules where it runs); exported through the monitor and folded
    into the agreement verdict, as on one machine."""
    try:
        records = [read_records(f) for f in sorted((stage / "workers").glob("*/stage*.jsonl"))]
        v = cluster_verdict(plan.scale, plan, final_rtt_rows(stage), cw.fidelity(),
                            list(result.get("worker_jobs", [])), cw.clocks(),
                            fault_accounting(result, records))
    except Exception as exc:  # the run's records must still be written
        log.warning("fidelity not measured: %s", exc, exc_info=True)
        v = {"faithful": False, "reasons": [f"fidelity not measured: {exc}"[:300]],
             "invariants": []}
    if isinstance(result.get("agreement_verdict"), dict):
        result["agreement_verdict"] = with_fidelity(result["agreement_verdict"], v)
    mon.record_fidelity(v)
    return v


def _summary(up: UpRun, work: dict[str, Any], wall_s: float, datapath: str
             ) -> dict[str, Any]:
    """summary.json: the one-machine run's keys where they apply, and `cluster`."""
    plan = up.plan
    rtt: dict[str, Any] = {}
    if up.rtt_path is not None:
        rtt = json.loads(Path(up.rtt_path).read_text())
    modes = sorted({str(m.get("link_mode")) for m in up.record["machines"].values()})
    # Each machine's datapath as its holder chose it ("auto" resolved there).
    paths = sorted({str(m.get("datapath") or datapath) for m in up.record["machines"].values()})
    probes = up.probes or {}
    out: dict[str, Any] = {
        "backend": BACKEND,
        "scenario": plan.scenario,
        "link_mode": "+".join(modes),
        "datapath": "+".join(paths),
        **plan.scale.as_record(),
        "hosts": len(plan.hosts),
        "switches": len(plan.switches),
        "fibres": len(plan.fibres),
        "lightpaths": len(plan.lightpaths),
        "verified": rtt.get("pairs_answered") == rtt.get("pairs_planned"),
        "rtt_ok": rtt.get("pairs_within_band") == rtt.get("pairs_planned"),
        "rtt_enforced": False,
        "rtt_recalibrations": len(rtt.get("rtt_rechecks", [])),
        "rtt_failures": [f"{x['pair']}: {x.get('median_ms')} ms vs {x['expected_rtt_ms']}"
                         for x in rtt.get("pairs", []) if not x.get("within_band")],
        # the lightpath probes across machines (cluster_probes.json), as a one-machine run's
        "routes_ok": probes.get("routes_ok"),
        "delays_ok": probes.get("delays_ok"),
        "delay_failures": [f"VLAN {x['vlan']} {x['src_host']} -> {x['dst_host']}: fibres "
                           f"{x['fibre_delay_ms']} ms"
                           for x in probes.get("probes", [])
                           if x["route_ok"] and not x["delay_ok"]],
        "probes": len(probes.get("probes", [])),
        "delay_calibrated": bool(up.calibration.get("enabled")),
        "forwarding": up.scenario.emulation.forwarding,
        "controller": work.pop("controller", None),
        "wall_s": round(wall_s, 2),
    }
    clocks = work.pop("clocks", {})
    stage_machines = work.pop("stage_machines", {})
    out["cluster"] = {"name": up.cluster.name, "prefix": plan.prefix,
                      "machines": up.machines, "dcs": up.record["dcs"],
                      "crossing_fibres": up.record["crossing_fibres"],
                      "up_s": up.record["up_s"], "pairs_within_band":
                      rtt.get("pairs_within_band"), "pairs_planned": rtt.get("pairs_planned"),
                      "clock_offsets": clocks, "stage_machines": stage_machines}
    out.update(work)
    return out
