"""Emulation benchmarks (root): NSFNET 4 DCs x 4 hosts set-up/tear-down time, forwarder CPU
per Gb/s, and an accuracy table of rate, delay and loss for the userspace link emulator.

    sudo .venv/bin/python bench/bench_emu.py [--quick]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from testbed.emu.linkbench import LinkTestbed
from testbed.emu.network import EmuNetwork, choose_link_mode
from testbed.emu.plan import build_plan
from testbed.emu.probes import udp_loss
from testbed.emu.verify import verify
from testbed.spec import parse_scenario


def nsfnet_4x4() -> object:
    return parse_scenario({
        "name": "bench-nsfnet", "topology": {"library": "nsfnet"},
        "dcs": [{"name": f"dc-{c}", "node": n, "gpus": 8}
                for c, n in zip("abcd", ("1", "6", "9", "13"), strict=True)],
        "workload": {"kind": "lightpath_requests"},
        "emulation": {"bandwidth_divisor": 10000, "hosts_per_dc": 4}})


def bench_lifecycle(runs: int) -> None:
    print("== NSFNET (14 ROADMs, 22 fibres), 4 DCs x 4 hosts, userspace links ==")
    print(f"{'run':>3} {'up_s':>7} {'verify_s':>9} {'down_s':>7} {'verified':>9}")
    for i in range(runs):
        plan = build_plan(nsfnet_4x4())  # type: ignore[arg-type]
        net = EmuNetwork(plan, link_mode="userspace")
        with net:
            t0 = time.monotonic()
            ok = verify(net)["ok"]
            t_verify = time.monotonic() - t0
        print(f"{i:>3} {net.timings_s['up']:>7.2f} {t_verify:>9.2f} "
              f"{net.timings_s['down']:>7.2f} {ok!s:>9}")


def bench_cpu(mode: str) -> None:
    print(f"\n== forwarder CPU per Gb/s ({mode}, 1 fibre, TCP iperf3) ==")
    print(f"{'rate_mbps':>9} {'goodput':>9} {'cpu_core':>9} {'core_per_gbps':>14}")
    for rate in (100, 500, 1000):
        with LinkTestbed(rate, 5, link_mode=mode) as lt:
            c0, t0 = lt.forwarder_cpu_s(), time.monotonic()
            res = lt.iperf(seconds=6.0, warmup_s=1.5)
            cpu = (lt.forwarder_cpu_s() - c0) / (time.monotonic() - t0)
        gbps = res.goodput_mbps / 1000
        print(f"{rate:>9} {res.goodput_mbps:>9.1f} {cpu:>9.3f} {cpu / gbps:>14.3f}")


def bench_accuracy(mode: str, quick: bool) -> None:
    print(f"\n== accuracy ({mode}): goodput/rate (target 0.90-0.97), RTT median vs 2 x delay ==")
    print(f"{'rate_mbps':>9} {'delay_ms':>8} {'goodput':>9} {'ratio':>6} {'rtt_med':>8} "
          f"{'rtt_p99':>8} {'2xdelay':>8}")
    rates = (10, 1000) if quick else (10, 100, 1000)
    delays = (5, 50) if quick else (5, 20, 50)
    for rate in rates:
        for delay in delays:
            warm = 2.5 if rate >= 1000 or delay >= 50 else 1.5
            with LinkTestbed(rate, delay, link_mode=mode) as lt:
                ping = lt.ping(count=50, interval_s=0.02)
                res = lt.iperf(seconds=warm + 4.0, warmup_s=warm)
            print(f"{rate:>9} {delay:>8} {res.goodput_mbps:>9.2f} "
                  f"{res.goodput_mbps / rate:>6.3f} {ping.median_ms or 0:>8.2f} "
                  f"{ping.p99_ms or 0:>8.2f} {2 * delay:>8}")
    print(f"\n{'loss_set':>8} {'datagrams':>10} {'lost':>7} {'measured':>9}")
    for loss in (0.001, 0.01, 0.05):
        with LinkTestbed(100, 5, loss=loss, link_mode=mode, seed=3) as lt:
            lost, total = udp_loss(lt.iperf(seconds=3.0, warmup_s=0.0, udp_mbps=40).raw)
        print(f"{loss:>8.3f} {total:>10} {lost:>7} {lost / total:>9.4f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer cases")
    ap.add_argument("--link-mode", default="userspace", choices=["userspace", "netem"])
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("bench_emu needs root (namespaces, Open vSwitch)", file=sys.stderr)
        return 2
    mode = choose_link_mode(args.link_mode)
    bench_lifecycle(1 if args.quick else 3)
    bench_cpu(mode)
    bench_accuracy(mode, args.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
