"""One emulation run, top to bottom: plan -> network -> controller -> workload -> records.

`run_emulation` is the whole life cycle as a sequence of steps, each a function with
typed inputs and outputs:

    build_run_plan      scenario -> RunPlan (emulation plan + forwarding decision)
    bring_network_up    RunPlan -> EmuNetwork (entered by the caller's `with`)
    start_controller    network -> ControllerProcess | None (lightpaths provisioned)
    calibrate_delays    network -> calibration record (each path's processing time taken
                        off its fibres' emulated delays; emulation.delay_calibration)
    apply_time_factor   time_factor auto: compute burst, factor chosen from both, network
                        stretched to it and calibrated again (testbed.orchestrate.timescale)
    verify_network      network -> verification record (raises if the data plane is wrong,
                        or a DC pair's RTT is off 2 x its configured delay by > 1 ms)
    run_workload        hold (faults from `lightpipe fault` meanwhile: the channel of
                        testbed.orchestrate.faultctl) | pp_jobs workers (+ fibre events
                        and faults, on the run's clock: testbed.orchestrate.faults) |
                        probes + request replay
    judge_run           the run's fidelity verdict before teardown (testbed.emu.fidelity:
                        RTT per lightpath, CPU of its own processes, timer slack, drops,
                        retransmissions), exported and put in the summary
    collect_records     -> summary.json, probes.csv, network.json, verification.json,
                           manifest.json ("finished") in the run directory, which is
                           there from the start, marked running (testbed.runs.rundir); worker
                           records (workers/JOB/stageN.jsonl) are appended as they come
Teardown is the `with` blocks: the controller stops before the network, the network
before the records are written (its teardown time is part of the summary).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from testbed.analysis.tables import rows_to_csv
from testbed.emu.calibrate import calibrate_network, disabled_record
from testbed.emu.fidelity_probe import judge_run
from testbed.emu.netinfo import network_info
from testbed.emu.network import EmuNetwork, sigterm_as_interrupt
from testbed.emu.plan import EmuPlan, build_plan
from testbed.emu.verify import answered, checks_pass, dc_pair_rtts, verify
from testbed.envprobe import netem_available, ovs_kernel_datapath
from testbed.errors import RuntimeFailure
from testbed.io.atomic import atomic_write_json, atomic_write_text
from testbed.io.signals import until_signalled
from testbed.monitor.run import RunMonitor
from testbed.orchestrate.controller import (
    controller_available,
    describe,
    plan_lightpaths_refused,
    run_replay,
    start_run_controller,
)
from testbed.orchestrate.ctl_process import ControllerProcess
from testbed.orchestrate.glue import controller_address
from testbed.orchestrate.probes import PROBE_FIELDS, PROBE_SECONDS, measure_lightpaths
from testbed.orchestrate.timescale import apply_time_factor
from testbed.progress import say
from testbed.runs.rundir import RunDir, run_dir
from testbed.spec import Scenario
from testbed.spec.models import EventSpec

log = logging.getLogger(__name__)
BACKEND = "emu"


@dataclass
class RunOptions:
    """How to run: hold the network up, link mode override, probe length, callbacks."""

    quiet: bool = False
    hold: bool = False
    link_mode: str | None = None
    probe_seconds: float = PROBE_SECONDS
    ready: threading.Event | None = None
    on_hold: Callable[[dict[str, Any]], None] | None = None
    # time_factor auto: the runs before this one that were not faithful at their factor
    # (testbed.backends.emu reruns; summary.json time_factor_reruns)
    earlier: tuple[dict[str, Any], ...] = ()


@dataclass(frozen=True)
class RunPlan:
    """What will be built: the emulation plan and whether a controller forwards."""

    scenario: Scenario
    plan: EmuPlan
    use_controller: bool
    fallback: str | None  # why the controller was not used although asked for


@dataclass
class WorkloadResult:
    """What the workload step measured."""

    probes: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    held: bool = False


def run_emulation(scenario: Scenario, out_dir: Path, opts: RunOptions) -> dict[str, Any]:
    """Build, verify and run the scenario's workload on the emulated network; records."""
    t0 = time.monotonic()
    rp = build_run_plan(scenario)  # InputError before anything is created
    out_dir = Path(out_dir)
    with run_dir(out_dir, scenario, BACKEND) as rd, sigterm_as_interrupt():
        stage = out_dir = rd.path  # the run's directory from the start (testbed.runs.rundir)
        net = bring_network_up(rp, opts.link_mode)
        say(f"emu: build: {len(rp.plan.lightpaths)} lightpaths, hosts and switches ...",
            opts.quiet)
        with net, contextlib.ExitStack() as ctl_stack:  # controller stops before the net
            ctl = start_controller(rp, net, stage / "controller", ctl_stack)
            isolate_cpus(rp, net)  # before calibrating: the delays as the workers will see
            calibration = calibrate_delays(rp, net, opts.quiet)
            # time_factor auto: measured and chosen here; rp (and net.plan) carry the number
            rp, calibration, _ = apply_time_factor(rp, net, calibration, opts.quiet)
            mon = start_monitor(rp, net, ctl, stage, out_dir, ctl_stack)
            info = network_record(net, ctl, mon, calibration)
            say("emu: verify: reachability and RTT between the DCs ...", opts.quiet)
            check = verify_network(net, calibration, rp.scenario.emulation.rtt_check,
                                   opts.quiet)
            work = run_workload(rp, net, ctl, stage, info, out_dir, opts, mon)
            judge_run(net, check, work.summary, mon)  # summary `fidelity` (testbed.emu.fidelity)
            mon.flush()  # the last state scraped before Prometheus stops
        say("emu: teardown: network removed", opts.quiet)
        return collect_records(rp, net, ctl, rd, info, check, work, time.monotonic() - t0,
                               opts.earlier)


def build_run_plan(scenario: Scenario) -> RunPlan:
    """The emulation plan and the forwarding decision (controller, or static if the
    controller would refuse a DC-pair lightpath, e.g. beyond reach)."""
    plan = build_plan(scenario)
    if scenario.emulation.forwarding != "controller":
        return RunPlan(scenario, plan, False, None)
    ok, why = controller_available()
    if not ok:
        raise RuntimeFailure(why)
    fallback = plan_lightpaths_refused(scenario, plan)
    if fallback is not None:  # the static plan regenerates; the controller does not
        log.warning("the controller would refuse the DC-pair lightpath %s; emulating "
                    "with static forwarding", fallback)
    return RunPlan(scenario, plan, fallback is None, fallback)


def bring_network_up(rp: RunPlan, link_mode: str | None) -> EmuNetwork:
    """The network object (started by the caller's `with`)."""
    em = rp.scenario.emulation
    return EmuNetwork(rp.plan, link_mode=link_mode or em.link_mode, datapath=em.datapath,
                      seed=getattr(rp.scenario.workload, "seed", 1),
                      controller=controller_address() if rp.use_controller else None,
                      startup_timeout_s=em.startup_timeout_s)


def start_controller(rp: RunPlan, net: EmuNetwork, run_dir: Path,
                     stack: contextlib.ExitStack) -> ControllerProcess | None:
    """With controller forwarding: start it, program the switches, set up the plan's
    DC-pair lightpaths (net.plan then holds the controller's answers)."""
    if not rp.use_controller:
        return None
    ctl = start_run_controller(net, rp.scenario, run_dir)
    stack.callback(ctl.stop)
    return ctl


def start_monitor(rp: RunPlan, net: EmuNetwork, ctl: ControllerProcess | None,
                  stage: Path, out_dir: Path, stack: contextlib.ExitStack) -> RunMonitor:
    """Every run is scraped: its own Prometheus (TSDB in the run directory), the link and
    run exporters, the controller; registered with the long-lived Prometheus if up."""
    mon = RunMonitor(rp.scenario, stage, out_dir, home_fd=net.home_netns_fd)
    mon.start(net, ctl)
    stack.callback(mon.stop)  # before the controller stops (LIFO)
    return mon


def isolate_cpus(rp: RunPlan, net: EmuNetwork) -> None:
    """A run with CPU workers (pp_jobs, worker_compute cpu): the network's processes on
    cores of their own, the workers on the others (testbed.emu.cpuset); the split is
    kept on net (`cpu_split`, `cpu_isolation`) for the compute burst and the launcher."""
    from testbed.emu import cpuset

    sc = rp.scenario
    cpu_workers = sc.workload.kind == "pp_jobs" and sc.emulation.worker_compute == "cpu"
    # only a network that forwards in processes: netem and the kernel datapath forward
    # in the kernel's softirqs, wherever the packets are, and would only confine workers
    user_space = net.datapath == "user" or net.link_mode == "userspace"
    got = cpuset.wanted(cpu_workers and user_space)
    net.cpu_split = got
    net.cpu_isolation = {"choice": cpuset.choice(), "split": False}
    if got is None:
        return
    pinned = cpuset.isolate_network(net.state, got.network)
    net.cpu_isolation = {"choice": cpuset.choice(), "split": True, **got.as_record(pinned)}
    log.info("CPU isolation: %d network processes on CPUs %s, CPU workers on %s", pinned,
             list(got.network), list(got.workers))


def calibrate_delays(rp: RunPlan, net: EmuNetwork, quiet: bool) -> dict[str, Any]:
    """Ping every DC pair; take each path's processing time off its fibres' emulated
    delays (testbed.emu.calibrate); the record ({"enabled": false} when turned off)."""
    if not rp.scenario.emulation.delay_calibration:
        return disabled_record()
    say(f"emu: calibrate: RTT of {len(net.plan.lightpaths)} DC pair(s) against the "
        "configured delays ...", quiet)
    return calibrate_network(net)


def network_record(net: EmuNetwork, ctl: ControllerProcess | None, mon: RunMonitor,
                   calibration: dict[str, Any] | None = None) -> dict[str, Any]:
    """network.json (also written into the run's state directory for `lightpipe exec`)."""
    info = network_info(net)
    info["prometheus"] = mon.describe()
    if calibration is not None:
        info["delay_calibration"] = calibration
    if ctl is not None:
        info["controller"] = describe(ctl)
    atomic_write_json(net.state_dir / "network.json", info, mode=secret_mode(info))
    return info


RTT_RECHECKS = 2  # calibrations again when DC pairs are out of the RTT band


def rtt_enforced(rtt_check: str, net: EmuNetwork) -> bool:
    """Whether a DC pair out of the RTT band fails the run (emulation.rtt_check)."""
    if rtt_check == "auto":
        return net.link_mode == "netem" and net.datapath == "kernel"
    return rtt_check == "enforce"


def verify_network(net: EmuNetwork, calibration: dict[str, Any] | None = None,
                   rtt_check: str = "warn", quiet: bool = True) -> dict[str, Any]:
    """Pings, every DC pair's RTT, per-lightpath probes; RuntimeFailure naming the first
    failure of reachability or route.

    A DC pair's RTT outside 2 x delay +- 1 ms after the calibration: the network is
    calibrated again and the pairs pinged again (up to RTT_RECHECKS times: the
    processing time of user-space bridges drifts); still outside, it fails the run where
    rtt_enforced, else it is recorded (verification.json `rtts` and `rtt_rechecks`,
    summary `rtt_ok` / `rtt_failures`) with a warning naming the pair. Where the RTT is
    not enforced, a calibration that did not settle in its own rounds is not run again
    (`rtt_recheck_skipped`): it has just shown that it cannot bring the pairs into the band
    (timer noise, not drift), and each try cost ~20 s of a busy 2-core machine. A lightpath
    probe held outside its fibres' tolerance follows the same setting (summary `delays_ok` /
    `delay_failures`); a probe off its route always fails the run."""
    check = verify(net, rtt_enforced=False, delays_enforced=False)
    check["calibration"] = calibration or disabled_record()
    enforce = rtt_enforced(rtt_check, net)
    rechecks: list[dict[str, Any]] = []
    check["rtt_recheck_skipped"] = None
    while (not check["rtt_ok"] and check["calibration"].get("enabled")
           and len(rechecks) < RTT_RECHECKS):
        last = rechecks[-1]["calibration"] if rechecks else check["calibration"]
        if not enforce and last.get("settled") is False:
            check["rtt_recheck_skipped"] = (
                "the last calibration did not settle in its rounds; the RTT is recorded, "
                f"not enforced (emulation.rtt_check: {rtt_check})")
            say("note: DC pairs outside the RTT band; not calibrating again: "
                + check["rtt_recheck_skipped"], quiet)
            break
        out = [x for x in check["rtts"] if not x["ok"]]
        say(f"warning: {len(out)} DC pair(s) outside the RTT band after calibration ("
            + ", ".join(f"{x['pair']} {rtt_error(x)}" for x in out)
            + "): calibrating again", quiet)
        record = calibrate_network(net)
        _pings, rtts = dc_pair_rtts(net)
        rechecks.append({"out_of_band": [x["pair"] for x in out], "calibration": record,
                         "rtts": rtts})
        check["rtts"] = rtts
        check["rtt_ok"] = all(x["ok"] for x in rtts)
    check["rtt_rechecks"] = rechecks
    check["rtt_check"] = rtt_check
    check["rtt_enforced"] = check["delays_enforced"] = enforce
    for x in check["rtts"]:
        if not x["ok"] and not enforce:
            say(f"warning: DC pair {x['pair']} ({x['hops']} fibre hops): RTT "
                f"median {x['median_ms']} ms, expected {x['expected_rtt_ms']} +- "
                f"{x['tolerance_ms']} ms (emulation.rtt_check: {rtt_check}: recorded, "
                "not enforced)", False)
    for x in check["probes"]:  # the same setting holds the probes' delays
        if x["route_ok"] and not x["delay_ok"] and not enforce:
            say(f"warning: {probe_words(x)} (emulation.rtt_check: {rtt_check}: recorded, "
                "not enforced)", False)
    check["ok"] = checks_pass(check, enforce, enforce)
    if not check["ok"]:
        raise RuntimeFailure("network verification failed: " + first_failure(check))
    return check


def rtt_error(row: dict[str, Any]) -> str:
    """A DC pair's RTT median against 2 x its delay, as '+1.38 ms' (or 'no reply')."""
    if row["median_ms"] is None:
        return "no reply"
    return f"{row['median_ms'] - row['expected_rtt_ms']:+.2f} ms"


def run_workload(rp: RunPlan, net: EmuNetwork, ctl: ControllerProcess | None, stage: Path,
                 info: dict[str, Any], out_dir: Path, opts: RunOptions,
                 mon: RunMonitor) -> WorkloadResult:
    """Hold the network up, or run pp_jobs workers, or probe and replay requests."""
    if opts.hold:
        return hold_network(rp.scenario, net, info, out_dir, opts,
                            fault_injector(ctl, net, mon, stage / "controller"))
    if rp.scenario.workload.kind == "pp_jobs":
        from testbed.orchestrate.pp_jobs import run_pp_jobs  # torch-free until here

        say("emu: workers: PyTorch pipeline jobs in the emulated hosts ...", opts.quiet)
        faults = start_event_replay(ctl, net, rp.scenario, mon,  # cuts, kills meanwhile
                                    stage / "controller")
        try:
            result = run_pp_jobs(rp.scenario, net, stage, opts.quiet, monitor=mon,
                                 faults=faults)
        finally:
            summary = faults.stop() if faults is not None else {}
        if summary:  # the jobs' side of the network events (docs/faults.md)
            from testbed.orchestrate.impact import record_fault_impact

            routes = {frozenset((lp.dc_a, lp.dc_b)): lp.path for lp in net.plan.lightpaths}
            summary.update(record_fault_impact(rp.scenario, stage, result, summary, routes))
        return WorkloadResult(summary={**result, **summary})
    if rp.scenario.workload.kind == "allreduce_jobs":  # routing policies on the DC fabric
        from testbed.orchestrate.allreduce import run_allreduce_jobs

        result = run_allreduce_jobs(rp.scenario, net, ctl, stage, opts.quiet)
        return WorkloadResult(summary=with_fault_rows(
            result, rp.scenario, "all-reduce runs replay no fibre events"))
    probes = measure_lightpaths(net, opts.probe_seconds, opts.quiet)
    replayed: dict[str, Any] = {}
    if ctl is not None:  # requests (and fibre events) through the controller
        say(f"emu: replay: requests through the SDN controller (about "
            f"{rp.scenario.emulation.replay_s:g} s) ...", opts.quiet)
        from testbed.emu.events import link_switch

        replayed = run_replay(ctl, link_switch(net), rp.scenario, stage)
        if rp.scenario.events:  # DC-pair lightpaths the replayed events moved: their RTT
            from testbed.emu.reroute import check_lightpaths, moved_lightpaths

            live = ctl

            def client(m: str, path: str, body: Any) -> Any:
                return live.request(m, path, body)

            checked = check_lightpaths(net, client, moved_lightpaths(net, client))
            replayed["rtt_after_reroute"] = checked
            replayed["reroute_rtt_out"] = [r.get("pair", r["id"]) for r in checked
                                           if not r["ok"]]
    return WorkloadResult(probes=probes, summary=with_fault_rows(
        replayed, rp.scenario, "not reached: after the replay's last request" if ctl is not None
        else "static forwarding: no controller replays events"))


def with_fault_rows(summary: dict[str, Any], scenario: Scenario, not_reached: str
                    ) -> dict[str, Any]:
    """summary.json `faults` of a workload without the fault injector: a row per applied
    fibre step of the request replay, the other events as not applied."""
    if not scenario.events:
        return summary
    from testbed.orchestrate.faults import replay_rows

    return {**summary, "faults": replay_rows(scenario.events, summary.get("events", []),
                                             not_reached)}


def hold_network(scenario: Scenario, net: EmuNetwork, info: dict[str, Any], out_dir: Path,
                 opts: RunOptions, faults: Any) -> WorkloadResult:
    """Keep the network up (state phase `holding`) until SIGINT/SIGTERM, serving the
    fault channel (`lightpipe fault`, testbed.orchestrate.faultctl) with `faults` (a
    started FaultInjector); the faults applied go into the summary."""
    from testbed.orchestrate.faultctl import SOCKET_NAME, FaultServer, apply_timeout_s

    out_dir.mkdir(parents=True, exist_ok=True)
    assert net.state is not None

    def apply(ev: Any) -> dict[str, Any]:
        row: dict[str, Any] = faults.apply_now(ev, apply_timeout_s(ev, faults.scale))
        row["source"] = "lightpipe fault"
        return row

    def publish(_row: dict[str, Any] | None = None) -> None:
        """network.json (run and state directory) as the network is now (a restarted
        controller has a new PID)."""
        ctl = getattr(faults.controller, "ctl", None)
        if ctl is not None:
            info["controller"] = describe(ctl)
        for where in (out_dir, net.state_dir):
            atomic_write_json(where / "network.json", info, mode=secret_mode(info))

    try:
        # SIGINT/SIGTERM is the normal end from the moment network.json is published (a
        # caller that waits for it may stop the run at once): not "interrupted" (rc 130)
        with FaultServer(net.state_dir / SOCKET_NAME, scenario, apply, after=publish) as server, \
                contextlib.suppress(KeyboardInterrupt):
            info["fault_socket"] = str(server.path)
            publish()
            net.state.out_dir = str(out_dir.resolve())
            net.state.phase = "holding"
            net.state.save()
            if opts.ready is not None:
                opts.ready.set()
            if opts.on_hold is not None:
                opts.on_hold(info)
            until_signalled()
    finally:
        info.pop("fault_socket", None)  # gone with the channel
        summary = faults.stop()  # a killed controller or Prometheus is restarted first
        for row in summary["faults"]:  # also one whose request timed out
            row.setdefault("source", "lightpipe fault")
    return WorkloadResult(held=True, summary=summary if summary["faults"] else {})


def fault_injector(ctl: ControllerProcess | None, net: EmuNetwork, mon: RunMonitor | None,
                   ctl_dir: Path | None, events: Sequence[EventSpec] = (),
                   on_training: bool = False) -> Any:
    """A started FaultInjector for this network: fibre cuts and flaps as real port-downs
    the controller restores, the run's Prometheus, SDN controller (restarted from ctl_dir)
    and workers killed (testbed.orchestrate.faults); `events` on the emulated clock, which
    starts now or, `on_training`, when the workers' training starts."""
    from testbed.emu.events import link_switch
    from testbed.orchestrate.faults import FaultInjector

    client = None if ctl is None else (lambda m, p, b: ctl.request(m, p, b))
    restarter = None
    if ctl is not None and ctl_dir is not None:
        from testbed.orchestrate.controller import ControllerRestarter

        restarter = ControllerRestarter(ctl, net, ctl_dir)
    after_reroute = None
    if client is not None:  # each restored lightpath's RTT on its new route, recorded
        from testbed.emu.reroute import check_lightpaths

        def after_reroute(ids: list[int]) -> list[dict[str, Any]]:
            assert client is not None
            return check_lightpaths(net, client, ids)

    return FaultInjector(events, scale=net.plan.scale.time_factor, client=client,
                         set_link=link_switch(net),
                         monitor=mon, controller=restarter,
                         after_reroute=after_reroute).start(on_training)


def start_event_replay(ctl: ControllerProcess | None, net: EmuNetwork, scenario: Scenario,
                       mon: RunMonitor | None = None, ctl_dir: Path | None = None) -> Any:
    """pp_jobs: the spec's events on the emulated clock (at_s x the time scale), played
    by fault_injector from the start of training; None without events."""
    if not scenario.events:
        return None
    return fault_injector(ctl, net, mon, ctl_dir, scenario.events, on_training=True)


def collect_records(rp: RunPlan, net: EmuNetwork, ctl: ControllerProcess | None,
                    rd: RunDir, info: dict[str, Any], check: dict[str, Any],
                    work: WorkloadResult, wall_s: float,
                    earlier: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
    """Write the run records into the run directory, mark it finished; the summary
    (with `time_factor_reruns`: the earlier runs of an auto factor that were rerun)."""
    stage = rd.path
    atomic_write_json(stage / "network.json", info, mode=secret_mode(info))
    atomic_write_text(stage / "probes.csv", rows_to_csv(work.probes, PROBE_FIELDS))
    atomic_write_json(stage / "verification.json", check)
    summary = run_summary(net, check, work, wall_s)
    summary["forwarding"] = "controller" if ctl is not None else "static"
    if rp.fallback is not None:
        summary["forwarding_fallback"] = f"controller refuses {rp.fallback}"
    summary["controller"] = describe(ctl, with_token=False) if ctl else None
    summary["prometheus"] = info["prometheus"]
    summary.update(work.summary)
    if earlier:
        summary["time_factor_reruns"] = list(earlier)
    atomic_write_json(stage / "summary.json", summary)
    rd.finish(link_mode=net.link_mode, datapath=net.datapath, **net.plan.scale.as_record(),
              kernel_features={"netem": netem_available(),
                               "ovs_kernel_datapath": ovs_kernel_datapath()},
              forwarding=summary["forwarding"], controller=summary["controller"],
              records=["summary.json", "probes.csv", "network.json", "verification.json"]
              + (["requests.csv"] if (stage / "requests.csv").exists() else []))
    return summary


def secret_mode(info: dict[str, Any]) -> int | None:
    """0o600 for a network.json that holds the controller's bearer token, else None."""
    ctl = info.get("controller")
    return 0o600 if isinstance(ctl, dict) and ctl.get("token") else None


def first_failure(check: dict[str, Any]) -> str:
    """The first failed ping or lightpath probe of a verification record, in words."""
    for x in check["pings"]:
        if not answered(x, bool(check.get("lossy"))):
            return f"ping {x['src']} -> {x['dst']}: {x['received']}/{x['sent']} replies"
    for x in check.get("rtts", []):
        if not x["ok"] and check.get("rtt_enforced", True):
            return (f"DC pair {x['pair']} ({x['hops']} fibre hops): RTT median "
                    f"{x['median_ms']} ms over {x['replies']} echoes, expected "
                    f"{x['expected_rtt_ms']} +- {x['tolerance_ms']} ms")
    for x in check["probes"]:
        if not x.get("route_ok", x["ok"]) or (not x["ok"]
                                              and check.get("delays_enforced", True)):
            return probe_words(x)
    return "unknown"


def probe_words(x: dict[str, Any]) -> str:
    """A lightpath probe's row of a verification record, in words."""
    return (f"lightpath VLAN {x['vlan']} {x['src_host']} -> {x['dst_host']}: "
            f"delivered={x['delivered']} hops={x['hops_seen']} (expected "
            f"{x['hops_expected']}) one-way={x['one_way_ms']} ms (expected "
            f"{x['expected_ms']} +- {x['tolerance_ms']}) fibres held it "
            f"{x.get('fibre_delay_ms')} ms")


def run_summary(net: EmuNetwork, check: dict[str, Any], work: WorkloadResult,
                wall_s: float) -> dict[str, Any]:
    """The network part of summary.json (plan sizes, verification, probes, timings)."""
    plan, timings = net.plan, net.timings_s
    ratios = [p["goodput_ratio"] for p in work.probes]
    return {
        "backend": BACKEND,
        "scenario": plan.scenario,
        "link_mode": net.link_mode,
        "datapath": net.datapath,
        **plan.scale.as_record(),
        "hosts": len(plan.hosts),
        "switches": len(plan.switches),
        "fibres": len(plan.fibres),
        "lightpaths": len(plan.lightpaths),
        "verified": check["ok"],
        "rtt_ok": check.get("rtt_ok"),
        "rtt_enforced": check.get("rtt_enforced"),
        "rtt_recalibrations": len(check.get("rtt_rechecks", [])),
        "rtt_failures": [f"{x['pair']}: {x['median_ms']} ms vs {x['expected_rtt_ms']}"
                         for x in check.get("rtts", []) if not x["ok"]],
        "delays_ok": check.get("delays_ok"),
        "delay_failures": [f"VLAN {x['vlan']} {x['src_host']} -> {x['dst_host']}: "
                           f"{x['one_way_ms']} ms vs {x['expected_ms']}"
                           for x in check.get("probes", [])
                           if x.get("route_ok", True) and not x.get("delay_ok", True)],
        "delay_calibrated": bool(check.get("calibration", {}).get("enabled")),
        # emulation.time_factor: auto or fixed, the factor and why (testbed.emu.timefactor)
        "time_factor_choice": (check.get("calibration") or {}).get("time_factor_choice"),
        "probes": len(work.probes),
        "mean_goodput_ratio": round(sum(ratios) / len(ratios), 4) if ratios else None,
        "min_goodput_ratio": min(ratios) if ratios else None,
        "setup_s": round(timings.get("up", 0.0), 3),
        "teardown_s": round(timings.get("down", 0.0), 3),
        "held": work.held,
        "wall_s": round(wall_s, 3),
    }
