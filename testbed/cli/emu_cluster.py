"""`lightpipe emu SPEC --cluster FILE`: a pp_jobs run across machines, recorded as on one.

The steps, each an existing piece:

    bring_up          testbed.cli.cluster_cmd: plan once, every machine's share over SSH,
                      delays calibrated across the machines, every DC pair checked and
                      every lightpath probed (cluster_run.json, cluster_calibration.json,
                      cluster_rtt.json, cluster_probes.json)
    worker agents     testbed.cluster.agentlink: one SSH session per machine that holds a
                      stage, each clock's offset measured; `own`: an agent whose driver
                      goes away (even kill -9) takes its machine's share down
    controller        (emulation.forwarding: controller, the default) testbed.cluster.ctlrun:
                      one os-ken controller here, every machine's switches relayed to it
                      over their agent's session, the whole plan's layout, the plan's
                      lightpaths set up through its REST API; every DC pair pinged again
                      on its rules (cluster_rtt_controller.json)
    monitor           testbed.monitor.run.RunMonitor here, on the driver's machine (the
                      first of the cluster file, or where `emu` runs): Prometheus scrapes
                      every worker at its machine's address
    workers           testbed.orchestrate.jobs.run_jobs_on_hosts with the agents: the jobs
                      planned on the whole plan's lightpaths, stages on the DCs' hosts
                      wherever they run; records mirrored here on one clock
    teardown          every machine's share stopped and cleaned (`cluster down`)

Records in the run directory, the one-machine run's shape (summary.json, iterations.csv,
trace.json, workers/JOB/stageN.jsonl, manifest.json) plus the cluster's files and a
`cluster` section in the summary (machines, placement, clock offsets, the controller's
relay). Until the controller has synced, the switches forward on the emulator's static
rules (what `cluster up` checks); with `emulation.forwarding: static` they keep them.
"""

from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path
from typing import Any

from testbed.errors import InputError

log = logging.getLogger(__name__)


def cluster_hosts(record: dict[str, Any]) -> dict[str, list[Any]]:
    """The hosts of every machine's share per DC (cluster_run.json's readiness records),
    as the launcher starts workers on them (`Host.machine`)."""
    from testbed.orchestrate.launch import Host

    by_dc: dict[str, list[Host]] = {}
    for machine, ready in sorted(record["machines"].items()):
        for node, h in sorted(ready.get("hosts", {}).items()):
            by_dc.setdefault(str(h["dc"]), []).append(
                Host(node, str(h["ip"]), str(h.get("iface", f"{node}-eth0")), (),
                     machine=machine))
    for hosts in by_dc.values():
        hosts.sort(key=lambda h: h.name)
    return by_dc


def run_cluster_emulation(args: argparse.Namespace, scenario: Any) -> dict[str, Any]:
    """The whole run (see the module docstring); the summary."""
    from testbed.cli.cluster_cmd import _report_down, bring_up, check_up_args
    from testbed.cluster.spec import load_cluster
    from testbed.emu.network import sigterm_as_interrupt
    from testbed.progress import say
    from testbed.runs.rundir import run_dir

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
    check_up_args(args)
    cluster = load_cluster(args.cluster)
    t0 = time.monotonic()
    with run_dir(Path(args.out), scenario, "emu") as rd, sigterm_as_interrupt():
        stage = rd.path
        up = bring_up(args, cluster, scenario, lambda: stage)
        try:
            work = _run_workload(up, stage, args.quiet)
        finally:
            say(f"emu: teardown: run {up.plan.prefix} on every machine", args.quiet)
            downs = up.down()
            _report_down(downs)
        bad = [r for r in downs if not r.ok]
        summary = _summary(up, work, time.monotonic() - t0, args.datapath)
        summary["teardown"] = {r.machine: ("ok" if r.ok else r.problem) for r in downs}
        from testbed.io.atomic import atomic_write_json

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
            from testbed.errors import RuntimeFailure

            raise RuntimeFailure(f"machine {bad[0].machine} ({bad[0].address}): teardown: "
                                 f"{bad[0].problem}")
        return summary


def _run_workload(up: Any, stage: Path, quiet: bool) -> dict[str, Any]:
    """Agents, controller, monitor and the workload; the workload part of the summary."""
    from testbed.cluster.agentlink import ClusterWorkers
    from testbed.monitor.run import RunMonitor
    from testbed.orchestrate.pp_jobs import prometheus_series
    from testbed.progress import say

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
        cc, ctl, plan = None, None, up.plan
        if scenario.emulation.forwarding == "controller":
            cc = _controller(up, cw, stage, quiet)
            ctl, plan, result["controller_run"] = cc.ctl, cc.plan, cc.record
        try:
            # No run state on this machine records the server: it ends with this process.
            mon = RunMonitor(scenario, stage, stage, die_with_driver=True).start(ctl=ctl)
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
                    assert ctl is not None  # checked with the input
                    result.update(_replay(up, cw, ctl, plan, stage, quiet))
                else:
                    result.update(_jobs(up, cw, plan, stage, mon, cc, quiet))
                result["fidelity"] = _fidelity(up, cw, plan, stage, result, mon)
                if mon.prom is not None:
                    mon.flush()
                    result["prometheus_series"] = prometheus_series(mon.prom.url, None)
                result["prometheus"] = mon.describe()
            finally:
                mon.stop()
        finally:
            if ctl is not None:
                from testbed.cluster.ctlrun import stop_cap_relay
                from testbed.orchestrate.controller import describe

                cw.stop_openflow()
                ctl.stop()
                result["controller"] = describe(ctl, with_token=False)
                result["controller_run"]["relay_stats"] = cw.openflow_stats()
                if cc is not None:
                    stop_cap_relay(cc.relay)
                    result["controller_run"]["caps"].update(cc.relay.record())
        result["clocks"] = cw.clocks()
        result["agent_errors"] = list(cw.errors)
    return result


def _fidelity(up: Any, cw: Any, plan: Any, stage: Path, result: dict[str, Any], mon: Any
              ) -> dict[str, Any]:
    """The run's fidelity verdict across machines (testbed.cluster.fidelity): every
    machine's measurements from its agent, the DC pairs' RTTs of the last pair check
    (on the controller's rules where it runs); exported through the monitor and folded
    into the agreement verdict, as on one machine."""
    from testbed.cluster.fidelity import cluster_verdict
    from testbed.emu.fidelity import with_fidelity

    try:
        v = cluster_verdict(plan.scale, plan, final_rtt_rows(stage), cw.fidelity(),
                            list(result.get("worker_jobs", [])), cw.clocks())
    except Exception as exc:  # the run's records must still be written
        log.warning("fidelity not measured: %s", exc, exc_info=True)
        v = {"faithful": False, "reasons": [f"fidelity not measured: {exc}"[:300]],
             "invariants": []}
    if isinstance(result.get("agreement_verdict"), dict):
        result["agreement_verdict"] = with_fidelity(result["agreement_verdict"], v)
    mon.record_fidelity(v)
    return v


def final_rtt_rows(stage: Path) -> list[dict[str, Any]]:
    """The DC pairs' rows of the run's last pair check: on the controller's rules
    (cluster_rtt_controller.json) where it ran, else cluster_rtt.json's; [] if none."""
    import json

    from testbed.io.trusted import read_regular

    for name in ("cluster_rtt_controller.json", "cluster_rtt.json"):
        try:
            doc = json.loads(read_regular(stage / name, 16 << 20))
        except FileNotFoundError:
            continue
        return [r for r in doc.get("pairs", []) if isinstance(r, dict)]
    return []


def _controller(up: Any, cw: Any, stage: Path, quiet: bool) -> Any:
    """The run's controller across the machines (testbed.cluster.ctlrun.ClusterController:
    the process, the plan with its lightpaths, the record, the caps relay) and every DC
    pair pinged on its rules."""
    from testbed.cli.cluster_cmd import check_pairs
    from testbed.cluster.ctlrun import start_cluster_controller
    from testbed.cluster.sharedoc import pair_probes
    from testbed.emu.delaycal import RTT_TOL_MS
    from testbed.envprobe import startup_timeout_s
    from testbed.errors import RuntimeFailure
    from testbed.progress import say

    timeout_s = startup_timeout_s(up.scenario.emulation.startup_timeout_s)
    cc = start_cluster_controller(up, cw, stage, timeout_s)
    plan, rec = cc.plan, cc.record
    try:
        n = sum(len(v) for v in rec["switches"].values())
        say(f"emu: controller: {n} switches on {len(rec['switches'])} machine(s) synced in "
            f"{rec['synced_s']:.2f} s through the agents; {rec['lightpaths']} lightpath(s) "
            f"set up", quiet)
        for line in rec["caps"]["mismatch"][:5]:
            say(f"emu: controller: WARNING: a lightpath cap not in force: {line}", quiet)
        failure, doc = check_pairs(up.cluster, plan.prefix, pair_probes(plan, up.placement),
                                    stage, up.calibration, name="cluster_rtt_controller.json",
                                    tol_ms=plan.scale.delay_ms(RTT_TOL_MS))
        rec["pairs_answered"] = doc["pairs_answered"]
        rec["pairs_within_band"] = doc["pairs_within_band"]
        rec["pairs_planned"] = doc["pairs_planned"]
        if failure:
            raise RuntimeFailure(f"on the controller's rules: {failure}")
    except BaseException:
        from testbed.cluster.ctlrun import stop_cap_relay

        cc.ctl.stop()
        stop_cap_relay(cc.relay)
        raise
    return cc


def _jobs(up: Any, cw: Any, plan: Any, stage: Path, mon: Any, cc: Any, quiet: bool
          ) -> dict[str, Any]:
    """pp_jobs: the jobs planned on the plan's lightpaths, their stages on the DCs' hosts
    wherever they run (the agents start the remote ones); the scenario's events played
    meanwhile (fibre steps on the machine emulating the fibre, controller_kill restarting
    the controller here, prometheus_kill, worker_kill wherever the stage runs)."""
    from testbed.orchestrate.jobs import assign_hosts, plan_emulated_jobs, run_jobs_on_hosts
    from testbed.orchestrate.pp_jobs import EVENTS_DONE_FILE
    from testbed.progress import say

    by_dc = cluster_hosts(up.record)
    jobs = plan_emulated_jobs(up.scenario, mode=up.scenario.emulation.workers, emu_plan=plan)
    placement = assign_hosts(jobs, by_dc)
    used = sorted({h.machine for row in placement for h in row if h.machine})
    say(f"emu: workers: {len(jobs)} job(s), stages on {', '.join(used)}", quiet)
    faults = _events(up, cw, cc, mon)
    go_on_until = None
    if faults is not None and up.scenario.emulation.iterate_through_events:
        go_on_until = stage / "workers" / EVENTS_DONE_FILE
        go_on_until.unlink(missing_ok=True)
        faults.set_done_file(go_on_until, on_done=cw.events_done)  # here and there
    try:
        result = run_jobs_on_hosts(
            jobs, by_dc, stage, prometheus=mon, placement=placement, remote=cw,
            on_started=None if faults is None else faults.attach_launcher,
            go_on_until=go_on_until)
    finally:
        events = faults.stop() if faults is not None else {}
    result.update(events)
    mon.record_jobs(result)
    result["stage_machines"] = {j.job: [h.machine for h in row]
                                for j, row in zip(jobs, placement, strict=True)}
    return result


def _events(up: Any, cw: Any, cc: Any, mon: Any) -> Any:
    """The scenario's events on the training clock (testbed.orchestrate.faults, as on one
    machine), started; None without events. Without a controller only the testbed's own
    faults apply (the fibre steps need it to restore)."""
    from testbed.orchestrate.faults import FaultInjector

    if not up.scenario.events:
        return None
    client = None if cc is None else (lambda m, p, b: cc.ctl.request(m, p, b))
    after = None
    if client is not None:  # each restored lightpath's RTT on its new route, recorded
        def after(ids: list[int]) -> list[dict[str, Any]]:
            return _check_moved(up, cc.plan, client, ids)

    return FaultInjector(
        up.scenario.events, scale=up.plan.scale.time_factor, client=client,
        set_link=None if cc is None else _link_switch(up, cw), monitor=mon,
        controller=None if cc is None else cc.restarter(),
        after_reroute=after).start(on_training=True)


def _check_moved(up: Any, plan: Any, client: Any, ids: list[int]) -> list[dict[str, Any]]:
    """testbed.cluster.reroute.check_lightpaths on the run's machines: each moved
    lightpath pinged from its first DC's machine and corrected on its new fibres there."""
    from testbed.cli.cluster_cmd import machine_steps
    from testbed.cluster.reroute import check_lightpaths

    apply, ping = machine_steps(up.cluster, plan.prefix)
    fibre_machine = {f.middle: m for m, sh in up.shares.items() for f in sh.fibres}
    modes = {str(m.get("link_mode")) for m in up.record["machines"].values()}
    return check_lightpaths(plan, up.placement.dc_machine, fibre_machine, client, ids,
                            apply, ping, "netem" if "netem" in modes else "userspace")


def _link_switch(up: Any, cw: Any) -> Any:
    """set_link(u, v, up) for a fibre of the plan: its emulator's links set down or up by
    the machine that emulates it (through that machine's agent)."""
    from testbed.errors import RuntimeFailure

    machine_of = {f.middle: m for m, sh in up.shares.items() for f in sh.fibres}

    def set_link(u: str, v: str, link_up: bool) -> None:
        m = machine_of.get(up.plan.fibre(u, v).middle)
        if m is None or m not in cw.sessions:
            raise RuntimeFailure(f"fibre {u}-{v}: no machine emulates it")
        reply = cw.sessions[m].fibre_event(u, v, link_up)
        if not reply.get("ok"):
            raise RuntimeFailure(f"machine {m}: fibre {u}-{v} "
                                 f"{'repair' if link_up else 'cut'}: {reply.get('why')}")
    return set_link


def _replay(up: Any, cw: Any, ctl: Any, plan: Any, stage: Path, quiet: bool
            ) -> dict[str, Any]:
    """lightpath_requests: the scenario's requests and fibre events replayed through the
    controller as on one machine; a fibre cut is its emulator's links set down by the
    machine that emulates it (through that machine's agent)."""
    from testbed.orchestrate.controller import run_replay
    from testbed.progress import say

    set_link = _link_switch(up, cw)
    say(f"emu: replay: requests through the SDN controller (about "
        f"{up.scenario.emulation.replay_s:g} s) ...", quiet)
    replayed = run_replay(ctl, set_link, up.scenario, stage)
    if up.scenario.events:  # DC-pair lightpaths the replayed events moved: their RTT
        from testbed.emu.reroute import moved_from_plan

        def client(m: str, path: str, body: Any) -> Any:
            return ctl.request(m, path, body)

        checked = _check_moved(up, plan, client, moved_from_plan(plan, client))
        replayed["rtt_after_reroute"] = checked
        replayed["reroute_rtt_out"] = [r.get("pair", r["id"]) for r in checked
                                       if not r["ok"]]
    return replayed


def _summary(up: Any, work: dict[str, Any], wall_s: float, datapath: str
             ) -> dict[str, Any]:
    """summary.json: the one-machine run's keys where they apply, and `cluster`."""
    plan = up.plan
    rtt: dict[str, Any] = {}
    if up.rtt_path is not None:
        import json

        rtt = json.loads(Path(up.rtt_path).read_text())
    modes = sorted({str(m.get("link_mode")) for m in up.record["machines"].values()})
    # Each machine's datapath as its holder chose it ("auto" resolved there).
    paths = sorted({str(m.get("datapath") or datapath) for m in up.record["machines"].values()})
    sc = up.scenario
    out: dict[str, Any] = {
        "backend": "emu",
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
        "routes_ok": (up.probes or {}).get("routes_ok"),
        "delays_ok": (up.probes or {}).get("delays_ok"),
        "delay_failures": [f"VLAN {x['vlan']} {x['src_host']} -> {x['dst_host']}: fibres "
                           f"{x['fibre_delay_ms']} ms"
                           for x in (up.probes or {}).get("probes", [])
                           if x["route_ok"] and not x["delay_ok"]],
        "probes": len((up.probes or {}).get("probes", [])),
        "delay_calibrated": bool(up.calibration.get("enabled")),
        "forwarding": sc.emulation.forwarding,
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
