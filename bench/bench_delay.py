"""RTT error per DC pair by fibre hop count, before and after the delay calibration.

    sudo .venv/bin/python bench/bench_delay.py                          # quickstart, this kernel
    sudo .venv/bin/python bench/bench_delay.py --scenario line          # DCs 1, 2, 3 hops apart
    sudo .venv/bin/python bench/bench_delay.py --scenario my.yaml --pings 50 --json out.json
    sudo bash tests/vm/run.sh --cmd "python bench/bench_delay.py --scenario line"  # netem, VM
    sudo .venv/bin/python bench/bench_delay.py --ring --runs 20   # traffic kinds, a cut
    sudo .venv/bin/python bench/bench_delay.py --nsfnet 14 --hosts 2   # time factor auto

--ring: the hidden ring x-y 300 km with the detour x-z-y (controller forwarding): 20
runs each of sparse pings (20 ms apart), a dense stream (2 ms apart) and pings beside
bulk TCP on a lightpath of its own over the same route, before and after a cut of x-y
(the reroute check corrects the moved lightpath on its new fibres; --no-reroute-check
leaves it): per kind, runs whose median is within 2 x delay +- 1 ms, the runs' median
and worst error, and every echo's median and p99 error.
--nsfnet N: NSFNET with a DC on the first N nodes: the run path's calibration, time
factor (--time-factor auto or a number) and verification; DC pairs in the band (goal:
all), the factor and its reasons, wall times.

Brings the scenario's network up (static forwarding; link mode and datapath `auto`: the
user-space forwarder and userspace datapath here, netem and the kernel datapath in the
VM), pings every DC pair (--pings echoes 20 ms apart, first host to first host) with the
configured delays, runs testbed.emu.calibrate, and pings again. Prints per pair: hops,
2 x configured one-way delay, and the median and worst RTT minus it, before and after.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
INTERVAL_S = 0.02  # between echoes: as the calibration and the verification ping
sys.path.insert(0, str(REPO))

LINE = {"name": "hops-line", "topology": {"links": [
    {"u": "A", "v": "B", "length_km": 600}, {"u": "B", "v": "C", "length_km": 400},
    {"u": "C", "v": "D", "length_km": 200}]},
    "dcs": [{"name": f"dc-{n.lower()}", "node": n, "gpus": 8} for n in "ABCD"],
    "workload": {"kind": "lightpath_requests"},
    "emulation": {"bandwidth_divisor": 10000, "hosts_per_dc": 1}}

RING = {"name": "ring-xyz", "topology": {"links": [
    {"u": "X", "v": "Y", "length_km": 300}, {"u": "X", "v": "Z", "length_km": 300},
    {"u": "Z", "v": "Y", "length_km": 300}]},
    "dcs": [{"name": "dc-x", "node": "X", "gpus": 8}, {"name": "dc-y", "node": "Y", "gpus": 8}],
    "optical": {"slots": 16, "k_paths": 2},
    "workload": {"kind": "lightpath_requests"},
    "emulation": {"bandwidth_divisor": 1000, "hosts_per_dc": 2, "link_mode": "userspace",
                  "datapath": "user", "lightpath_gbps": 100}}
KINDS = {"sparse": (25, 0.02), "dense": (250, 0.002), "tcp": (25, 0.02)}
BAND_MS = 1.0


def bulk_tcp(net: Any, src: str, dst: str, dst_ip: str, seconds: float
             ) -> subprocess.Popen[bytes]:
    """An iperf3 TCP flow src -> dst for `seconds`, as fast as it goes; the server is
    started first and ends with the client."""
    port = "5271"
    subprocess.Popen(["mnexec", "-a", str(net.host_pid(dst)), "iperf3", "-s", "-1", "-p",
                      port], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.5)
    argv = ["mnexec", "-a", str(net.host_pid(src)), "iperf3", "-c", dst_ip, "-p", port,
            "-t", f"{seconds:g}"]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def traffic_runs(net: Any, probe: Any, runs: int, one_way_ms: float) -> dict[str, Any]:
    """`runs` ping runs of each traffic kind on one path: sparse (20 ms apart), dense
    (2 ms apart), and sparse pings beside bulk TCP (iperf3, as fast as it goes) between
    the DCs' second hosts on a lightpath of their own over the same route: the same
    forwarders and bridges busy, not the pinged lightpath's own queue (a FIFO full of
    TCP adds its queueing delay, as a real one would). Per kind: each run's median
    error, and every echo's error (RTT - 2 x one_way_ms)."""
    from testbed.emu.probes import icmp_ping

    out: dict[str, Any] = {}
    two_d = 2 * one_way_ms
    dst_ip = next(h.ip for h in net.plan.hosts if h.name == "dc-y-h1").split("/")[0]
    for kind, (count, interval_s) in KINDS.items():
        bulk = None
        if kind == "tcp":
            bulk = bulk_tcp(net, "dc-x-h1", "dc-y-h1", dst_ip,
                            runs * (count * interval_s + 0.3) + 4)
            time.sleep(2.0)  # TCP up to speed
        medians, echoes = [], []
        for _ in range(runs):
            got = [r for r in icmp_ping(probe.src_ns, probe.dst_ip, count=count,
                                        interval_s=interval_s) if r is not None]
            if got:
                medians.append(statistics.median(got) - two_d)
                echoes += [r - two_d for r in got]
        if bulk is not None:
            bulk.terminate()
            bulk.wait(timeout=10)
        out[kind] = summarise(medians, echoes)
    return out


def summarise(medians: list[float], echoes: list[float]) -> dict[str, Any]:
    """Per-run median errors and all echoes' errors: median, p99, worst; runs in band."""
    def pct(xs: list[float], q: float) -> float:
        s = sorted(xs)
        return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]

    if not medians:
        return {"runs": 0}
    worst = max(medians, key=abs)
    return {"runs": len(medians), "in_band": sum(abs(m) <= BAND_MS for m in medians),
            "run_median_ms": round(statistics.median(medians), 3),
            "run_worst_ms": round(worst, 3),
            "echo_median_ms": round(statistics.median(echoes), 3),
            "echo_p99_ms": round(pct(echoes, 0.99), 3), "echoes": len(echoes)}


def ring(runs: int, after_reroute: bool) -> dict[str, Any]:
    """The hidden 3-node ring: calibrate, measure the direct path x-y; cut x-y, (check
    and correct the new path where after_reroute), measure the detour x-z-y."""
    import tempfile

    from testbed.emu.calibrate import calibrate_network, network_probes
    from testbed.emu.network import EmuNetwork
    from testbed.emu.plan import build_plan
    from testbed.orchestrate.controller import start_run_controller
    from testbed.orchestrate.glue import controller_address
    from testbed.spec import parse_scenario

    scenario = parse_scenario(RING)
    res: dict[str, Any] = {"scenario": "ring-xyz", "runs": runs, "load_before": os.getloadavg()}
    with tempfile.TemporaryDirectory() as tmp, EmuNetwork(
            build_plan(scenario), link_mode="userspace", datapath="user",
            controller=controller_address()) as net:
        ctl = start_run_controller(net, scenario, Path(tmp) / "ctl")
        try:
            cal = calibrate_network(net)
            res["calibration"] = {k: cal[k] for k in ("fibres", "path_corrections_ms",
                                                      "settled", "after")}
            probe = network_probes(net)[0]
            status, body = ctl.request("POST", "/lightpaths", {
                "src_dc": "dc-x", "dst_dc": "dc-y", "slots": 2, "src_host": "dc-x-h1",
                "dst_host": "dc-y-h1"})
            if status != 201:
                raise RuntimeError(f"bulk lightpath refused: {status} {body}")
            res["bulk_lightpath"] = {"vid": body["vid"], "nodes": body["nodes"]}
            res["direct"] = traffic_runs(net, probe, runs, probe.configured_ms)
            f = net.plan.fibre("X", "Y")
            emu = net.emulators[f.middle]
            subprocess.run(["mnexec", "-a", str(emu.ns_pid), "ip", "link", "set",
                            emu.intf_u, "down"], check=True)
            deadline = time.monotonic() + 10
            nodes: list[str] = []
            while time.monotonic() < deadline:
                lps = ctl.request("GET", "/lightpaths")[1]["lightpaths"]
                nodes = list(lps[0]["nodes"])
                if len(nodes) == 3:
                    break
                time.sleep(0.05)
            res["detour_route"] = nodes
            one_way = sum(net.plan.fibre(u, v).delay_ms for u, v in itertools.pairwise(nodes))
            if after_reroute:
                from testbed.emu.reroute import check_lightpaths, moved_lightpaths

                def client(m: str, path: str, body: Any) -> Any:
                    return ctl.request(m, path, body)

                res["reroute_check"] = check_lightpaths(net, client,
                                                        moved_lightpaths(net, client))
            res["detour"] = traffic_runs(net, probe, runs, one_way)
        finally:
            ctl.stop()
    res["load_after"] = os.getloadavg()
    return res


def ring_table(res: dict[str, Any]) -> str:
    lines = [f"== hidden ring x-y 300 km, detour x-z-y; {res['runs']} runs per kind; error = "
             f"RTT - 2 x delay (ms); goal: every run's median within +-{BAND_MS:g} ms; load "
             f"{res['load_before'][0]:.2f} -> {res['load_after'][0]:.2f} ==",
             f"{'path':<8} {'traffic':<7} {'in band':>8} {'run med':>8} {'run worst':>9} "
             f"{'echo med':>8} {'echo p99':>8}"]
    for path in ("direct", "detour"):
        for kind, s in res[path].items():
            if not s.get("runs"):
                lines.append(f"{path:<8} {kind:<7} no replies")
                continue
            lines.append(f"{path:<8} {kind:<7} {s['in_band']:>3}/{s['runs']:<4} "
                         f"{s['run_median_ms']:>+8.2f} {s['run_worst_ms']:>+9.2f} "
                         f"{s['echo_median_ms']:>+8.2f} {s['echo_p99_ms']:>+8.2f}")
    lines.append(f"detour route: {'-'.join(res['detour_route'])}")
    for r in res.get("reroute_check", []):
        lines.append(f"after reroute: {r.get('pair')} on {'-'.join(r.get('route', []))}: error "
                     f"{r.get('before_error_ms')} ms before its own correction, "
                     f"{r.get('after_error_ms')} ms after ({'ok' if r['ok'] else 'OUT'})")
    return "\n".join(lines)


def nsfnet(dcs: int, hosts: int, time_factor: str, dense_pings: int = 100) -> dict[str, Any]:
    """NSFNET with a DC on the first `dcs` nodes (`hosts` each), static forwarding: the
    run path's calibration and time factor (auto or a number), then its verification
    (RTT of every DC pair against 2 x delay +- 1 ms in scenario time, out-of-band pairs
    calibrated again up to twice)."""
    from testbed.emu.calibrate import CalibrationConfig, calibrate_network
    from testbed.emu.network import EmuNetwork
    from testbed.emu.plan import build_plan
    from testbed.orchestrate.run import RunPlan, verify_network
    from testbed.orchestrate.timescale import apply_time_factor
    from testbed.spec import parse_scenario

    t0 = time.monotonic()
    factor: Any = time_factor if time_factor == "auto" else float(time_factor)
    nodes = [str(k) for k in range(1, 15)][:dcs]
    scenario = parse_scenario({
        "name": "nsfnet-dcs", "topology": {"library": "nsfnet"},
        "dcs": [{"name": f"dc-{k}", "node": k, "gpus": 8} for k in nodes],
        "workload": {"kind": "lightpath_requests"},
        "emulation": {"bandwidth_divisor": 10000, "hosts_per_dc": hosts,
                      "forwarding": "static", "time_factor": factor}})
    res: dict[str, Any] = {"dcs": dcs, "hosts": hosts, "load_before": os.getloadavg()}
    with EmuNetwork(build_plan(scenario), link_mode="auto", datapath="auto") as net:
        res["up_s"] = round(time.monotonic() - t0, 1)
        cal = calibrate_network(net, CalibrationConfig(dense_pings=dense_pings))
        rp = RunPlan(scenario, net.plan, False, None)
        rp, cal, choice = apply_time_factor(rp, net, cal, quiet=True)
        res["calibrated_s"] = round(time.monotonic() - t0, 1)
        check = verify_network(net, cal, "warn", quiet=True)  # as the run path: rechecks
        rtts = check["rtts"]
        res["rechecks"] = len(check["rtt_rechecks"])
        res["calibration"] = {k: cal.get(k) for k in ("mode", "rounds", "after", "wall_s")}
        res["link_mode"], res["datapath"] = net.link_mode, net.datapath
    res["choice"] = {k: choice.get(k) for k in ("mode", "factor", "fits", "reasons", "paths")}
    f = choice["factor"]
    res["pairs"] = len(rtts)
    res["in_band"] = sum(bool(r["ok"]) for r in rtts)
    errs = sorted((r["median_ms"] - r["expected_rtt_ms"]) / f for r in rtts
                  if r["median_ms"] is not None)
    res["scenario_error_ms"] = {"median": round(statistics.median(errs), 3),
                                "worst": round(max(errs, key=abs), 3)} if errs else {}
    res["out"] = [r["pair"] for r in rtts if not r["ok"]]
    res["wall_s"] = round(time.monotonic() - t0, 1)
    res["load_after"] = os.getloadavg()
    return res


def nsfnet_table(res: dict[str, Any]) -> str:
    c = res["choice"]
    lines = [f"== NSFNET, {res['dcs']} DCs x {res['hosts']} hosts ({res['link_mode']} links, "
             f"{res['datapath']} datapath), time factor {c['factor']:g} ({c['mode']}); load "
             f"{res['load_before'][0]:.2f} -> {res['load_after'][0]:.2f} ==",
             f"DC pairs within 2 x delay +- 1 ms (scenario time): {res['in_band']}/"
             f"{res['pairs']}   goal: {res['pairs']}/{res['pairs']} (after "
             f"{res['rechecks']} recheck(s))",
             f"RTT error in scenario time: median {res['scenario_error_ms'].get('median')} ms,"
             f" worst {res['scenario_error_ms'].get('worst')} ms",
             f"wall: up {res['up_s']} s, calibrated (and factor chosen) {res['calibrated_s']} s,"
             f" whole bench {res['wall_s']} s"]
    lines += [f"  {r}" for r in c.get("reasons") or []]
    if res["out"]:
        lines.append("out of the band: " + ", ".join(res["out"]))
    return "\n".join(lines)


def load(name: str) -> Any:
    from testbed.spec import load_scenario, parse_scenario

    if name == "line":
        return parse_scenario(LINE)
    path = Path(name)
    if not path.exists():
        path = REPO / "scenarios" / f"{name}.yaml"
    return load_scenario(path)


def ping_pairs(net: Any, pings: int, parallel: int = 1) -> list[dict[str, Any]]:
    from testbed.emu.calibrate import CalibrationConfig, measure, network_probes

    rows = []
    cfg = CalibrationConfig(pings=pings, interval_s=INTERVAL_S, parallel=parallel)
    for p in measure(network_probes(net), cfg):
        got = sorted(p.rtts_ms)
        two_d = 2 * p.configured_ms
        rows.append({"pair": p.pair, "hops": len(p.fibres), "rtt_expected_ms": round(two_d, 3),
                     "replies": len(got),
                     "median_err_ms": round(p.median_ms - two_d, 3) if got else None,
                     "worst_err_ms": round(got[-1] - two_d, 3) if got else None})
    return rows


def run(scenario: Any, pings: int, link_mode: str, parallel: int = 1) -> dict[str, Any]:
    from testbed.emu.calibrate import CalibrationConfig, calibrate_network
    from testbed.emu.network import EmuNetwork
    from testbed.emu.plan import build_plan

    plan = build_plan(scenario)
    with EmuNetwork(plan, link_mode=link_mode, datapath="auto") as net:
        before = ping_pairs(net, pings, parallel)
        record = calibrate_network(net, CalibrationConfig(parallel=parallel))
        after = ping_pairs(net, pings, parallel)
        mode, dp = net.link_mode, net.datapath
    return {"scenario": plan.scenario, "link_mode": mode, "datapath": dp, "pings": pings,
            "parallel": parallel,
            "kernel": os.uname().release, "before": before, "after": after,
            "calibration": {k: record[k] for k in ("settled", "corrections_applied",
                                                    "fibres", "path_corrections_ms",
                                                    "rounds", "wall_s")}}


def table(res: dict[str, Any]) -> str:
    lines = [f"== {res['scenario']}: {res['link_mode']} links, {res['datapath']} datapath, "
             f"kernel {res['kernel']}; {res['pings']} pings per pair; RTT minus 2 x configured "
             f"one-way delay (ms); {res['parallel']} path(s) at a time ==",
             f"{'pair':<12} {'hops':>4} {'2xdelay':>8} {'before med':>10} {'worst':>7} "
             f"{'after med':>10} {'worst':>7}"]
    after = {r["pair"]: r for r in res["after"]}

    def f(v: float | None) -> str:
        return "-" if v is None else f"{v:+.2f}"

    for b in sorted(res["before"], key=lambda r: (r["hops"], r["pair"])):
        a = after[b["pair"]]
        lines.append(f"{b['pair']:<12} {b['hops']:>4} {b['rtt_expected_ms']:>8.2f} "
                     f"{f(b['median_err_ms']):>10} {f(b['worst_err_ms']):>7} "
                     f"{f(a['median_err_ms']):>10} {f(a['worst_err_ms']):>7}")
    for hops in sorted({r["hops"] for r in res["before"]}):
        bs = [r for r in res["before"] if r["hops"] == hops and r["median_err_ms"] is not None]
        as_ = [after[r["pair"]] for r in bs if after[r["pair"]]["median_err_ms"] is not None]
        if bs and as_:
            lines.append(f"{hops} hop(s): worst |median error| before "
                         f"{max(abs(r['median_err_ms']) for r in bs):.2f}, after "
                         f"{max(abs(r['median_err_ms']) for r in as_):.2f} ms")
    cal = res["calibration"]
    corr = ", ".join(f"{x['fibre']} {x['correction_ms']:.2f}" for x in cal["fibres"]
                     if x["on_measured_path"])
    lines.append(f"calibration: {cal['corrections_applied']} round(s), "
                 f"{'settled' if cal['settled'] else 'not settled'}, {cal['wall_s']:.1f} s; "
                 f"corrections per pass (ms): {corr}")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", default="quickstart",
                    help="a bundled scenario name, a YAML file, or 'line'")
    ap.add_argument("--pings", type=int, default=30)
    ap.add_argument("--link-mode", default="auto", choices=["auto", "userspace", "netem"])
    ap.add_argument("--parallel", type=int, default=1,
                    help="paths pinged side by side (only paths that share no fibre; the "
                    "run path pings one at a time up to 12 DC-pair paths, 8 beyond)")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--ring", action="store_true",
                    help="the hidden 3-node ring: sparse, dense and bulk-TCP pings, "
                    "before and after a cut of x-y (controller restoration)")
    ap.add_argument("--runs", type=int, default=20, help="--ring: runs per traffic kind")
    ap.add_argument("--nsfnet", type=int, metavar="DCS", default=None,
                    help="NSFNET with a DC on the first DCS nodes: pairs in the band after "
                    "calibration at --time-factor (the run path's steps)")
    ap.add_argument("--hosts", type=int, default=2, help="--nsfnet: hosts per DC")
    ap.add_argument("--time-factor", default="auto", help="--nsfnet: auto or a number")
    ap.add_argument("--dense-pings", type=int, default=100,
                    help="--nsfnet: dense echoes per path and round of the first "
                    "calibration (0: sparse echoes only, as before issue 28)")
    ap.add_argument("--no-reroute-check", action="store_true",
                    help="--ring: measure the detour without the post-reroute check")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("bench_delay needs root (namespaces)", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING)
    if args.nsfnet:
        nres = nsfnet(args.nsfnet, args.hosts, args.time_factor, args.dense_pings)
        print(nsfnet_table(nres))
        if args.json:
            args.json.write_text(json.dumps(nres, indent=1))
        return 0
    if args.ring:
        rres = ring(args.runs, not args.no_reroute_check)
        print(ring_table(rres))
        if args.json:
            args.json.write_text(json.dumps(rres, indent=1))
        return 0
    res = run(load(args.scenario), args.pings, args.link_mode, args.parallel)
    print(table(res))
    if args.json:
        args.json.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
