"""The largest emulation here (root): NSFNET with a DC on all 14 nodes, 2 hosts each,
91 DC-pair lightpaths; time per phase (up, calibration, verification, down), memory.

    sudo .venv/bin/python bench/bench_big_emu.py                  # side by side (default)
    sudo .venv/bin/python bench/bench_big_emu.py --serial         # one probe/ping at a time
    sudo .venv/bin/python bench/bench_big_emu.py --dcs 4          # first N nodes only

Side by side: lightpath probes, and the pings of the calibration and the verification,
run together where their routes share no fibre (testbed.emu.batches).
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from testbed.emu.batches import SIDE_BY_SIDE
from testbed.emu.calibrate import CalibrationConfig, calibrate_network
from testbed.emu.census import take
from testbed.emu.network import EmuNetwork
from testbed.emu.plan import build_plan
from testbed.emu.verify import verify
from testbed.spec import parse_scenario


def nsfnet_dcs(n: int, hosts: int) -> object:
    nodes = [str(k) for k in range(1, 15)][:n]
    return parse_scenario({
        "name": "bench-big", "topology": {"library": "nsfnet"},
        "dcs": [{"name": f"dc-{k}", "node": k, "gpus": 8} for k in nodes],
        "workload": {"kind": "lightpath_requests"},
        "emulation": {"bandwidth_divisor": 10000, "hosts_per_dc": hosts}})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dcs", type=int, default=14)
    ap.add_argument("--hosts", type=int, default=2)
    ap.add_argument("--serial", action="store_true", help="no side-by-side probes or pings")
    ap.add_argument("--link-mode", default="userspace", choices=["userspace", "netem"])
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("bench_big_emu needs root (namespaces, Open vSwitch)", file=sys.stderr)
        return 2
    parallel = 1 if args.serial else SIDE_BY_SIDE
    plan = build_plan(nsfnet_dcs(args.dcs, args.hosts))  # type: ignore[arg-type]
    before = take()
    print(f"== NSFNET, {args.dcs} DCs x {args.hosts} hosts: {len(plan.hosts)} hosts, "
          f"{len(plan.switches)} switches, {len(plan.fibres)} fibres, "
          f"{len(plan.lightpaths)} lightpaths; {args.link_mode} links; "
          f"{'serial' if parallel == 1 else f'side by side (<= {parallel})'} ==")
    t_all = time.monotonic()
    net = EmuNetwork(plan, link_mode=args.link_mode)
    with net:
        during = take()
        t0 = time.monotonic()
        cal = calibrate_network(net, CalibrationConfig(parallel=parallel))
        t_cal = time.monotonic() - t0
        t0 = time.monotonic()
        check = verify(net, rtt_enforced=False, probe_parallel=parallel,
                       pings_parallel=parallel)
        t_verify = time.monotonic() - t0
    total = time.monotonic() - t_all
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    errs = [r["median_ms"] - r["expected_rtt_ms"] for r in check["rtts"]
            if r["median_ms"] is not None]
    print(f"{'up_s':>7} {'calibrate_s':>11} {'verify_s':>9} {'down_s':>7} {'total_s':>8} "
          f"{'verified':>8} {'rtt_in_band':>11}")
    print(f"{net.timings_s['up']:>7.1f} {t_cal:>11.1f} {t_verify:>9.1f} "
          f"{net.timings_s['down']:>7.1f} {total:>8.1f} {check['ok']!s:>8} "
          f"{sum(r['ok'] for r in check['rtts']):>5}/{len(check['rtts']):<5}")
    print(f"calibration: {cal['corrections_applied']} correction round(s), "
          f"{'settled' if cal['settled'] else 'not settled'}; RTT - 2 x delay after it: "
          f"{min(errs):+.2f} .. {max(errs):+.2f} ms (median "
          f"{sorted(errs)[len(errs) // 2]:+.2f}); probes ok "
          f"{sum(p['ok'] for p in check['probes'])}/{len(check['probes'])}")
    print(f"memory while up: {during.mem_used_mb - before.mem_used_mb:+.0f} MB machine-wide, "
          f"{during.processes - before.processes:+d} processes, {during.netns} namespaces, "
          f"{during.veths} veths; this process peak RSS {rss_mb:.0f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
