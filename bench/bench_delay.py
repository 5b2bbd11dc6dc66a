"""RTT error per DC pair by fibre hop count, before and after the delay calibration.

    sudo .venv/bin/python bench/bench_delay.py                          # quickstart, this kernel
    sudo .venv/bin/python bench/bench_delay.py --scenario line          # DCs 1, 2, 3 hops apart
    sudo .venv/bin/python bench/bench_delay.py --scenario my.yaml --pings 50 --json out.json
    sudo bash tests/vm/run.sh --cmd "python bench/bench_delay.py --scenario line"  # netem, VM

Brings the scenario's network up (static forwarding; link mode and datapath `auto`: the
user-space forwarder and userspace datapath here, netem and the kernel datapath in the
VM), pings every DC pair (--pings echoes 20 ms apart, first host to first host) with the
configured delays, runs testbed.emu.calibrate, and pings again. Prints per pair: hops,
2 x configured one-way delay, and the median and worst RTT minus it, before and after.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
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
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("bench_delay needs root (namespaces)", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING)
    res = run(load(args.scenario), args.pings, args.link_mode, args.parallel)
    print(table(res))
    if args.json:
        args.json.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
