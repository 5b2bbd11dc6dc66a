"""EmuBackend: bring the scenario's network up in Mininet/OVS, verify it, run it, tear down.

Every run verifies the lightpaths and measures each DC pair with iperf3 (TCP goodput)
and ICMP (RTT) into probes.csv; then the workload runs: lightpath requests replayed
through the SDN controller, or pipeline jobs on the PyTorch workers. Records use the
simulation backend's layout (manifest.json, summary.json, requests.csv / jobs records)
plus network.json.
"""

from __future__ import annotations

import contextlib
import csv
import io
import logging
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from testbed.atomicio import atomic_write_json, atomic_write_text, staged_dir
from testbed.errors import RuntimeFailure
from testbed.records import write_manifest
from testbed.spec import Scenario

log = logging.getLogger(__name__)

PROBE_SECONDS = 4.0
PROBE_WARMUP_S = 1.5
PROBE_FIELDS = ("vlan", "src", "dst", "src_dc", "dst_dc", "rate_mbps", "delay_ms",
                "goodput_mbps", "goodput_ratio", "retransmits", "rtt_median_ms",
                "rtt_expected_ms")


class EmuBackend:
    """Runs a scenario on emulation (root, Mininet's mnexec and Open vSwitch needed)."""

    name = "emu"

    def available(self) -> tuple[bool, str]:
        from testbed.envprobe import probe

        rep = probe()
        if not rep.emulation_possible:
            return False, "; ".join(rep.reasons)
        if not rep.iperf3:
            return False, "iperf3 not installed"
        return True, ""

    def supports(self, scenario: Scenario) -> tuple[bool, str]:
        """Whether this scenario can be emulated at all (e.g. links not too fast), and why not.

        `lightpipe run --backend auto` can use it to fall back to simulation.
        """
        from testbed.emu.plan import build_plan
        from testbed.errors import InputError

        try:
            build_plan(scenario, prefix="lp0000")
        except InputError as exc:
            return False, str(exc)
        if scenario.emulation.forwarding == "controller":
            from controllers.emu_run import controller_available

            return controller_available()
        return True, ""

    def run(self, scenario: Scenario, out_dir: Path, quiet: bool = False, *,
            hold: bool = False, link_mode: str | None = None,
            probe_seconds: float = PROBE_SECONDS,
            ready: threading.Event | None = None,
            on_hold: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
        """Build, verify and measure; with hold, keep the network up until SIGINT/SIGTERM."""
        from controllers.emu_run import describe
        from testbed.emu.netinfo import network_info
        from testbed.emu.network import EmuNetwork, sigterm_as_interrupt
        from testbed.emu.plan import build_plan
        from testbed.emu.verify import verify
        from testbed.envprobe import netem_available, ovs_kernel_datapath

        t0 = time.monotonic()
        plan = build_plan(scenario)  # InputError before anything is created
        mode = link_mode or scenario.emulation.link_mode
        out_dir = Path(out_dir)
        interrupted = False
        jobs_result: dict[str, Any] = {}
        use_ctl = scenario.emulation.forwarding == "controller"
        fallback = None
        if use_ctl:
            from controllers.emu_run import controller_available, plan_lightpaths_refused

            ok, why = controller_available()
            if not ok:
                raise RuntimeFailure(why)
            fallback = plan_lightpaths_refused(scenario, plan)
            if fallback is not None:  # e.g. beyond reach: the static plan regenerates
                log.warning("the controller would refuse the DC-pair lightpath %s; emulating "
                            "with static forwarding", fallback)
                use_ctl = False
        ctl: Any = None
        with staged_dir(out_dir) as stage, sigterm_as_interrupt():
            controller = None
            if use_ctl:
                from controllers.emu_glue import controller_address

                controller = controller_address()
            net = EmuNetwork(plan, link_mode=mode, datapath=scenario.emulation.datapath,
                             seed=getattr(scenario.workload, "seed", 1), controller=controller)
            with net, contextlib.ExitStack() as ctl_stack:  # controller stops before the net
                if use_ctl:
                    from controllers.emu_run import start_run_controller

                    ctl = start_run_controller(net, scenario, stage / "controller")
                    ctl_stack.callback(ctl.stop)
                plan = net.plan  # with a controller: its lightpaths
                info = network_info(net)
                if ctl is not None:
                    info["controller"] = describe(ctl)
                atomic_write_json(net.state_dir / "network.json", info)
                check = verify(net)
                if not check["ok"]:
                    raise RuntimeFailure("network verification failed: "
                                         + _first_failure(check))
                if hold:
                    out_dir.mkdir(parents=True, exist_ok=True)
                    atomic_write_json(out_dir / "network.json", info)
                    assert net.state is not None
                    net.state.out_dir = str(out_dir.resolve())
                    net.state.phase = "holding"
                    net.state.save()
                    if ready is not None:
                        ready.set()
                    if on_hold is not None:
                        on_hold(info)
                    try:
                        while True:
                            signal.pause()
                    except KeyboardInterrupt:
                        interrupted = True
                    probes: list[dict[str, Any]] = []
                elif scenario.workload.kind == "pp_jobs":
                    from workloads.emu_jobs import run_pp_jobs  # PyTorch workers (issue 8)

                    events = _event_replayer(ctl, net, scenario)  # fibre cuts meanwhile
                    jobs_result = run_pp_jobs(scenario, net, stage, quiet)
                    if events is not None:
                        jobs_result = {**jobs_result, **events.stop()}
                    probes = []
                else:
                    probes = measure_lightpaths(net, probe_seconds, quiet)
                    if ctl is not None:  # requests (and fibre events) through the controller
                        from controllers.emu_run import run_replay

                        jobs_result = run_replay(ctl, net, scenario, stage)
            timings = dict(net.timings_s)
            atomic_write_json(stage / "network.json", info)
            atomic_write_text(stage / "probes.csv", _csv(probes))
            atomic_write_json(stage / "verification.json", check)
            summary = _summary(plan, net.link_mode, net.datapath, check, probes, timings,
                               time.monotonic() - t0, interrupted)
            summary["forwarding"] = "controller" if ctl is not None else "static"
            if fallback is not None:
                summary["forwarding_fallback"] = f"controller refuses {fallback}"
            summary["controller"] = describe(ctl, with_token=False) if ctl else None
            summary.update(jobs_result)
            atomic_write_json(stage / "summary.json", summary)
            write_manifest(stage, scenario, self.name, link_mode=net.link_mode,
                           datapath=net.datapath,
                           bandwidth_divisor=scenario.emulation.bandwidth_divisor,
                           time_factor=scenario.emulation.time_factor,
                           kernel_features={"netem": netem_available(),
                                            "ovs_kernel_datapath": ovs_kernel_datapath()},
                           forwarding=summary["forwarding"],
                           controller=describe(ctl, with_token=False) if ctl else None,
                           records=["summary.json", "probes.csv", "network.json",
                                    "verification.json"]
                           + (["requests.csv"] if (stage / "requests.csv").exists() else []))
        return summary


def _event_replayer(ctl: Any, net: Any, scenario: Scenario) -> Any:
    """pp_jobs with a controller: the spec's fibre events on the emulated clock (at_s x
    emulation.time_factor), as real port-downs the controller restores; else None."""
    if ctl is None or not scenario.events:
        return None
    from controllers.replay import EventReplayer
    from testbed.emu.events import link_switch

    return EventReplayer(scenario.events, lambda m, p, b: ctl.request(m, p, b),
                         scale=scenario.emulation.time_factor,
                         set_link=link_switch(net)).start()


def measure_lightpaths(net: Any, seconds: float, quiet: bool) -> list[dict[str, Any]]:
    """iperf3 (TCP, receiver-side goodput after a warm-up) and ping per lightpath."""
    from testbed.emu.probes import PingStats, icmp_ping, run_iperf3
    from testbed.emu.verify import first_host
    from testbed.progress import progress

    rows = []
    plan = net.plan
    with progress(len(plan.lightpaths), "iperf3 per lightpath", quiet) as bar:
        for lp in plan.lightpaths:
            src, dst = plan.host(first_host(net, lp.dc_a)), plan.host(first_host(net, lp.dc_b))
            dst_ip = dst.ip.split("/")[0]
            st = PingStats.of(icmp_ping(f"/proc/{net.host_pid(src.name)}/ns/net", dst_ip,
                                        count=10, interval_s=0.02))
            res = run_iperf3(["mnexec", "-a", str(net.host_pid(dst.name))],
                             ["mnexec", "-a", str(net.host_pid(src.name))], dst_ip,
                             seconds=seconds, warmup_s=min(PROBE_WARMUP_S, seconds / 2))
            rows.append({
                "vlan": lp.vlan, "src": src.name, "dst": dst.name, "src_dc": lp.dc_a,
                "dst_dc": lp.dc_b, "rate_mbps": round(lp.rate_mbps, 6),
                "delay_ms": lp.delay_ms, "goodput_mbps": round(res.goodput_mbps, 3),
                "goodput_ratio": round(res.goodput_mbps / lp.rate_mbps, 4),
                "retransmits": res.retransmits,
                "rtt_median_ms": None if st.median_ms is None else round(st.median_ms, 3),
                "rtt_expected_ms": round(2 * lp.delay_ms, 3)})
            bar.advance(1)
    return rows


def _csv(rows: list[dict[str, Any]]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=PROBE_FIELDS, lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow(r)
    return buf.getvalue()


def _first_failure(check: dict[str, Any]) -> str:
    for x in check["pings"]:
        if x["received"] != x["sent"]:
            return f"ping {x['src']} -> {x['dst']}: {x['received']}/{x['sent']} replies"
    for x in check["probes"]:
        if not x["ok"]:
            return (f"lightpath VLAN {x['vlan']} {x['src_host']} -> {x['dst_host']}: "
                    f"delivered={x['delivered']} hops={x['hops_seen']} (expected "
                    f"{x['hops_expected']}) one-way={x['one_way_ms']} ms (expected "
                    f"{x['expected_ms']} +- {x['tolerance_ms']})")
    return "unknown"


def _summary(plan: Any, mode: str, datapath: str, check: dict[str, Any],
             probes: list[dict[str, Any]], timings: dict[str, float], wall_s: float,
             interrupted: bool) -> dict[str, Any]:
    ratios = [p["goodput_ratio"] for p in probes]
    return {
        "backend": "emu",
        "scenario": plan.scenario,
        "link_mode": mode,
        "datapath": datapath,
        "bandwidth_divisor": plan.bandwidth_divisor,
        "time_factor": plan.time_factor,
        "hosts": len(plan.hosts),
        "switches": len(plan.switches),
        "fibres": len(plan.fibres),
        "lightpaths": len(plan.lightpaths),
        "verified": check["ok"],
        "probes": len(probes),
        "mean_goodput_ratio": round(sum(ratios) / len(ratios), 4) if ratios else None,
        "min_goodput_ratio": min(ratios) if ratios else None,
        "setup_s": round(timings.get("up", 0.0), 3),
        "teardown_s": round(timings.get("down", 0.0), 3),
        "held": interrupted,
        "wall_s": round(wall_s, 3),
    }
