"""The run step for `emulation.time_factor: auto`: measure, choose (testbed.emu.timefactor),
stretch the live network to the chosen factor, and calibrate again.

    rp, calibration, choice = apply_time_factor(rp, net, calibration, quiet)

Before the workload starts: the calibration has measured every DC pair's processing time
(sparse and dense echoes) at the start factor; a compute burst (testbed.emu.loadprobe)
runs one stand-in per worker stage of the scenario's jobs while every DC pair carries a
dense ping stream and a bulk TCP stream (iperf3, at its lightpath's rate: the load the
workers' transfers put on the forwarders and the switch, which sparse pings do not), and
the forwarders' wake-ups over the burst are read from their slack histograms. The factor
chosen becomes a number in the run's scenario and plan, so
that every later reader (workers' JobPlans, the exporter, events, records) uses it. A
fixed number in the spec is left as it is (its record says so).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
from typing import Any

from testbed.emu.batches import run_batched
from testbed.emu.calibrate import PathProbe, calibrate_network, network_probes
from testbed.emu.forwarder import default_queue_bytes
from testbed.emu.live import LiveNetwork
from testbed.emu.plan import EmuPlan
from testbed.emu.probes import icmp_ping
from testbed.emu.scale import Scale
from testbed.emu.slack import BOUNDS_S, quantile_s
from testbed.emu.timefactor import ComputeCost, SlackCost, choose, path_costs
from testbed.progress import say

log = logging.getLogger(__name__)
BURST_S = 1.5
LOAD_PATHS = 8  # DC pairs carrying a dense stream during the burst (fibre-disjoint ones)
BULK_LEAD_S = 1.0  # the bulk streams start this long before the burst (connect, ramp up)
BULK_PORT = 5301   # iperf3 servers in the DC hosts' own namespaces: port + k for pair k
# Workloads whose every time goes through Scale (workers' ops and transfers, events and
# replays on the scaled clock); all_reduce rounds compare emulated seconds as they are.
DILATED_WORKLOADS = ("pp_jobs", "lightpath_requests")


def worker_ops(scenario: Any) -> tuple[int, float] | None:
    """(worker stages, mean op in real ms) of the jobs the run will emulate; None without
    pp_jobs workers."""
    if getattr(scenario.workload, "kind", "") != "pp_jobs":
        return None
    from testbed.orchestrate.jobs import plan_emulated_jobs

    jobs = plan_emulated_jobs(scenario)
    ops = [x for j in jobs for x in (*j.problem.forward_ms, *j.problem.backward_ms) if x > 0]
    stages = sum(j.problem.stages for j in jobs)
    return (stages, sum(ops) / len(ops)) if ops else None


def measure_compute(scenario: Any, net: LiveNetwork) -> tuple[ComputeCost | None,
                                                               dict[str, Any]]:
    """The compute burst beside a dense ping stream on every DC pair; its record."""
    from testbed.emu.loadprobe import burst
    from testbed.metrics.hostload import free_cores
    from testbed.orchestrate.launch import FREE_CORES_WINDOW_S, fitting_duty

    got = worker_ops(scenario)
    if got is None:
        return None, {"workers": 0}
    stages, op_ms = got
    start = Scale.of(scenario.emulation)
    probes = network_probes(net)[:LOAD_PATHS]

    def stream(p: PathProbe) -> None:  # the dense stream the calibration pings with
        icmp_ping(p.src_ns, p.dst_ip, count=int(BURST_S / 0.002), interval_s=0.002)

    load = threading.Thread(target=lambda: run_batched(
        probes, [frozenset(p.fibres) for p in probes], stream, LOAD_PATHS), daemon=True)
    compute = scenario.emulation.worker_compute  # the stand-in the workers will be
    split = getattr(net, "cpu_split", None)  # on the workers' cores, as they will run
    duty = fitting_duty(stages, free_cores(FREE_CORES_WINDOW_S) if compute == "cpu" else None,
                        None if split is None else len(split.workers))
    bulk, bulk_rec = bulk_streams(net, BULK_LEAD_S + BURST_S + 0.5)
    for t in bulk:
        t.start()
    threading.Event().wait(BULK_LEAD_S if bulk else 0.0)
    before = forwarder_slack(net)
    load.start()
    rec = burst(stages, start.delay_ms(op_ms), BURST_S, float(duty["duty"]),
                compute=compute, cpus=None if split is None else split.workers)
    rec["worker_duty"] = duty
    rec["cpu_isolation"] = getattr(net, "cpu_isolation", None)
    load.join(timeout=60)
    rec["forwarder_slack"] = slack_since(before, forwarder_slack(net))
    for t in bulk:
        t.join(timeout=60)
    rec["bulk_streams"] = bulk_rec
    rec["mean_op_real_ms"] = op_ms
    rec["cores"] = os.cpu_count()
    if not rec.get("ops"):
        return None, rec
    return ComputeCost(op_ms, rec["miss_mean_ms"], stages), rec


def bulk_streams(net: Any, seconds: float) -> tuple[list[threading.Thread], list[dict[str, Any]]]:
    """Threads (not started) that each run one iperf3 TCP stream across a DC-pair lightpath
    (first host to first host, the first LOAD_PATHS pairs) for `seconds`, and the list
    their results land in (pair, goodput, retransmits, or the error); none without
    iperf3 or mnexec."""
    import shutil

    from testbed.emu.probes import run_iperf3
    from testbed.emu.verify import first_host

    plan = getattr(net, "plan", None)
    if plan is None or not hasattr(net, "host_pid") or not (
            shutil.which("iperf3") and shutil.which("mnexec")):
        return [], []
    got: list[dict[str, Any]] = []
    threads = []
    for k, lp in enumerate(plan.lightpaths[:LOAD_PATHS]):
        src, dst = plan.host(first_host(net, lp.dc_a)), plan.host(first_host(net, lp.dc_b))
        pair = f"{lp.dc_a}~{lp.dc_b}"

        def one(src: Any = src, dst: Any = dst, pair: str = pair, port: int = BULK_PORT + k
                ) -> None:
            try:
                res = run_iperf3(["mnexec", "-a", str(net.host_pid(dst.name))],
                                 ["mnexec", "-a", str(net.host_pid(src.name))],
                                 dst.ip.split("/")[0], seconds=seconds, warmup_s=BULK_LEAD_S,
                                 port=port)
                got.append({"pair": pair, "goodput_mbps": round(res.goodput_mbps, 3),
                            "retransmits": res.retransmits})
            except Exception as exc:  # the burst goes on without this stream's load
                log.warning("time factor auto: bulk stream %s: %s", pair, exc)
                got.append({"pair": pair, "error": str(exc)[:200]})

        threads.append(threading.Thread(target=one, name=f"bulk-{k}", daemon=True))
    return threads, got


def forwarder_slack(net: Any) -> dict[str, Any] | None:
    """The forwarders' timer slack histograms (testbed.emu.slack) merged; None without
    user-space forwarders."""
    from testbed.emu.fidelity_probe import forwarder_stats
    from testbed.emu.slack import merge

    got = [st["timer_slack"] for st in forwarder_stats(net) if st.get("timer_slack")]
    try:
        return merge(got) if got else None
    except (ValueError, KeyError, TypeError) as exc:
        log.warning("time factor auto: forwarders' timer slack unreadable: %s", exc)
        return None


EMPTY_SLACK: dict[str, Any] = {"counts": [0] * (len(BOUNDS_S) + 1)}


def slack_since(before: dict[str, Any] | None, after: dict[str, Any] | None
                ) -> dict[str, Any] | None:
    """What the forwarders' wake-ups were between two forwarder_slack() readings: the
    wake-ups and the p99 of their lateness (ms); None when nothing was read."""
    if before is None or after is None:
        return None
    counts = [max(0, int(a) - int(b)) for a, b in zip(after["counts"], before["counts"],
                                                       strict=True)]
    n = sum(counts)
    if n == 0:
        return None
    q = quantile_s({**after, "counts": counts}, 0.99)
    return {"wakeups": n, "p99_ms": None if q is None else round(1e3 * q, 4)}


def slack_cost(burst_rec: dict[str, Any]) -> SlackCost | None:
    got = burst_rec.get("forwarder_slack") or {}
    if not isinstance(got.get("p99_ms"), (int, float)):
        return None
    return SlackCost(float(got["p99_ms"]), int(got.get("wakeups", 0)))


def rescaled_plan(plan: EmuPlan, factor: float) -> EmuPlan:
    """The plan at another time factor: every emulated delay stretched by the ratio."""
    ratio = factor / plan.scale.time_factor
    fibres = tuple(dataclasses.replace(f, delay_ms=round(f.delay_ms * ratio, 6))
                   for f in plan.fibres)
    lps = tuple(dataclasses.replace(lp, delay_ms=round(lp.delay_ms * ratio, 6))
                for lp in plan.lightpaths)
    return dataclasses.replace(plan, scale=plan.scale.with_time_factor(factor), fibres=fibres,
                               lightpaths=lps)


def stretch_network(net: Any, factor: float) -> None:
    """Run the live network at `factor`: its plan, each fibre's delay (keeping what the
    calibration takes off) and, for the forwarder, its queue (bandwidth x RTT)."""
    net.plan = rescaled_plan(net.plan, factor)
    for e in net.emulators.values():
        e.fibre = net.plan.fibre(e.fibre.u, e.fibre.v)
        e.set_delay_correction(e.correction_ms or 0.0)
        if hasattr(e, "request"):  # the user-space forwarder: its FIFO grows with the delay
            e.request({"cmd": "set", "queue_bytes": default_queue_bytes(e.fibre.rate_mbps,
                                                                        e.fibre.delay_ms)})


def apply_time_factor(rp: Any, net: Any, calibration: dict[str, Any], quiet: bool
                      ) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """Choose and apply the factor of an auto run; (run plan, calibration record, the
    choice's record). A fixed factor: all unchanged, the record says fixed."""
    em = rp.scenario.emulation
    start = Scale.of(em)
    if not Scale.is_auto(em):
        return rp, calibration, {"mode": "fixed", "factor": start.time_factor}
    kind = getattr(rp.scenario.workload, "kind", "")
    if kind not in DILATED_WORKLOADS:
        why = (f"the {kind} workload does not stretch its own times by the factor: "
               f"running at {start.time_factor:g}")
        say(f"emu: time factor auto: {why}", quiet)
        return rp, calibration, {"mode": "auto", "factor": start.time_factor,
                                 "reasons": [why]}
    if not calibration.get("enabled"):
        say("emu: time factor auto without the delay calibration: nothing measured, "
            f"running at {start.time_factor:g}", False)
        return rp, calibration, {"mode": "auto", "factor": start.time_factor,
                                 "reasons": ["delay calibration off: nothing measured"]}
    say("emu: time factor auto: compute burst under load ...", quiet)
    compute, burst_rec = measure_compute(rp.scenario, net)
    paths = path_costs(calibration, start.time_factor)
    if not burst_rec.get("forwarder_slack"):  # no burst (no workers): the calibration's
        burst_rec["forwarder_slack"] = slack_since(EMPTY_SLACK, forwarder_slack(net))
    choice = choose(paths, compute, em.time_factor_max, start.time_factor,
                    slack=slack_cost(burst_rec))
    say(f"emu: time factor {choice.factor:g} (auto):", quiet and choice.fits)
    for line in choice.reasons:
        say(f"  {line}", quiet and choice.fits)
    record = {"mode": "auto", **choice.as_record(), "start": start.time_factor,
              "paths": [dataclasses.asdict(p) for p in paths], "compute": burst_rec,
              "first_calibration": {k: calibration.get(k) for k in ("settled", "after",
                                                                    "wall_s")}}
    if choice.factor != start.time_factor:
        stretch_network(net, choice.factor)
        say(f"emu: calibrate again at time factor {choice.factor:g} ...", quiet)
        calibration = calibrate_network(net)
        scenario = rp.scenario.model_copy(update={"emulation": em.model_copy(
            update={"time_factor": choice.factor})})
        rp = dataclasses.replace(rp, scenario=scenario, plan=net.plan)
    calibration["time_factor_choice"] = record
    log.info("time factor %g (auto): %s", choice.factor, " | ".join(choice.reasons))
    return rp, calibration, record
