"""A cluster run's services and workload: its controller, pipeline jobs, events and replay."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from testbed.cluster.agentlink import ClusterWorkers
from testbed.cluster.bringup import UpRun
from testbed.cluster.checks import Echo, check_pairs, log_line, machine_steps
from testbed.cluster.ctlrun import ClusterController, start_cluster_controller, stop_cap_relay
from testbed.cluster.reroute import check_lightpaths
from testbed.cluster.sharedoc import pair_probes
from testbed.emu.delaycal import RTT_TOL_MS
from testbed.emu.plan import EmuPlan
from testbed.emu.reroute import moved_from_plan
from testbed.envprobe import startup_timeout_s
from testbed.errors import RuntimeFailure
from testbed.monitor.run import RunMonitor
from testbed.orchestrate.controller import run_replay
from testbed.orchestrate.ctl_process import ControllerProcess
from testbed.orchestrate.faults import FaultInjector
from testbed.orchestrate.jobs import assign_hosts, plan_emulated_jobs, run_jobs_on_hosts
from testbed.orchestrate.launch import FaultPolicy, Host
from testbed.orchestrate.pp_jobs import EVENTS_DONE_FILE
from testbed.orchestrate.replay import Client, LinkSwitch
from testbed.progress import say


def cluster_hosts(record: dict[str, Any]) -> dict[str, list[Host]]:
    """The hosts of every machine's share per DC (cluster_run.json's readiness records),
    as the launcher starts workers on them (`Host.machine`)."""
    by_dc: dict[str, list[Host]] = {}
    for machine, ready in sorted(record["machines"].items()):
        for node, h in sorted(ready.get("hosts", {}).items()):
            by_dc.setdefault(str(h["dc"]), []).append(
                Host(node, str(h["ip"]), str(h.get("iface", f"{node}-eth0")), (),
                     machine=machine))
    for hosts in by_dc.values():
        hosts.sort(key=lambda h: h.name)
    return by_dc


def start_controller(up: UpRun, cw: ClusterWorkers, stage: Path, quiet: bool = False,
                     echo: Echo = log_line) -> ClusterController:
    """The run's controller across the machines (testbed.cluster.ctlrun.ClusterController:
    the process, the plan with its lightpaths, the record, the caps relay) and every DC
    pair pinged on its rules (their lines to `echo`, the progress lines to
    testbed.progress)."""
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
                                   tol_ms=plan.scale.delay_ms(RTT_TOL_MS), echo=echo)
        rec["pairs_answered"] = doc["pairs_answered"]
        rec["pairs_within_band"] = doc["pairs_within_band"]
        rec["pairs_planned"] = doc["pairs_planned"]
        if failure:
            raise RuntimeFailure(f"on the controller's rules: {failure}")
    except BaseException:
        cc.ctl.stop()
        stop_cap_relay(cc.relay)
        raise
    return cc


def run_jobs(up: UpRun, cw: ClusterWorkers, plan: EmuPlan, stage: Path, mon: RunMonitor,
             cc: ClusterController | None, quiet: bool = False) -> dict[str, Any]:
    """pp_jobs: the jobs planned on the plan's lightpaths, their stages on the DCs' hosts
    wherever they run (the agents start the remote ones); the scenario's events played
    meanwhile (fibre steps on the machine emulating the fibre, controller_kill restarting
    the controller here, prometheus_kill, worker_kill wherever the stage runs)."""
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
            go_on_until=go_on_until,
            fault_policy=FaultPolicy.of(getattr(up.scenario.policy, "workers", None),
                                        plan.scale.time_factor))
    finally:
        events = faults.stop() if faults is not None else {}
    result.update(events)
    mon.record_jobs(result)
    result["stage_machines"] = {j.job: [h.machine for h in row]
                                for j, row in zip(jobs, placement, strict=True)}
    return result


def _events(up: UpRun, cw: ClusterWorkers, cc: ClusterController | None, mon: RunMonitor
            ) -> FaultInjector | None:
    """The scenario's events on the training clock (testbed.orchestrate.faults, as on one
    machine), started; None without events. Without a controller only the testbed's own
    faults apply (the fibre steps need it to restore)."""
    if not up.scenario.events:
        return None
    if cc is None:
        return FaultInjector(up.scenario.events, scale=up.plan.scale.time_factor,
                             client=None, set_link=None, monitor=mon, controller=None,
                             after_reroute=None).start(on_training=True)
    ctl = cc.ctl

    def client(m: str, p: str, b: Any) -> tuple[int, Any]:
        return ctl.request(m, p, b)

    def after(ids: list[int]) -> list[dict[str, Any]]:  # each restored lightpath's RTT
        return check_moved(up, cc.plan, client, ids)       # on its new route, recorded

    return FaultInjector(
        up.scenario.events, scale=up.plan.scale.time_factor, client=client,
        set_link=link_switch(up, cw), monitor=mon, controller=cc.restarter(),
        after_reroute=after).start(on_training=True)


def check_moved(up: UpRun, plan: EmuPlan, client: Client, ids: list[int]
                ) -> list[dict[str, Any]]:
    """testbed.cluster.reroute.check_lightpaths on the run's machines: each moved
    lightpath pinged from its first DC's machine and corrected on its new fibres there."""
    apply, ping = machine_steps(up.cluster, plan.prefix)
    return check_lightpaths(plan, up.placement.dc_machine, up.fibre_machine(), client, ids,
                            apply, ping, up.link_mode())


def link_switch(up: UpRun, cw: ClusterWorkers) -> LinkSwitch:
    """set_link(u, v, up) for a fibre of the plan: its emulator's links set down or up by
    the machine that emulates it (through that machine's agent)."""
    machine_of = up.fibre_machine()

    def set_link(u: str, v: str, link_up: bool) -> None:
        m = machine_of.get(up.plan.fibre(u, v).middle)
        if m is None or m not in cw.sessions:
            raise RuntimeFailure(f"fibre {u}-{v}: no machine emulates it")
        reply = cw.sessions[m].fibre_event(u, v, link_up)
        if not reply.get("ok"):
            raise RuntimeFailure(f"machine {m}: fibre {u}-{v} "
                                 f"{'repair' if link_up else 'cut'}: {reply.get('why')}")
    return set_link


def replay(up: UpRun, cw: ClusterWorkers, ctl: ControllerProcess, plan: EmuPlan,
           stage: Path, quiet: bool = False) -> dict[str, Any]:
    """lightpath_requests: the scenario's requests and fibre events replayed through the
    controller as on one machine; a fibre cut is its emulator's links set down by the
    machine that emulates it (through that machine's agent)."""
    say(f"emu: replay: requests through the SDN controller (about "
        f"{up.scenario.emulation.replay_s:g} s) ...", quiet)
    replayed = run_replay(ctl, link_switch(up, cw), up.scenario, stage)
    if up.scenario.events:  # DC-pair lightpaths the replayed events moved: their RTT

        def client(m: str, path: str, body: Any) -> tuple[int, Any]:
            return ctl.request(m, path, body)

        checked = check_moved(up, plan, client, moved_from_plan(plan, client))
        replayed["rtt_after_reroute"] = checked
        replayed["reroute_rtt_out"] = [r.get("pair", r["id"]) for r in checked
                                       if not r["ok"]]
    return replayed
