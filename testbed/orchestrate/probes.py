"""Measure every lightpath of a live network: iperf3 TCP goodput and ICMP RTT (probes.csv)."""

from __future__ import annotations

from typing import Any

from testbed.emu.network import EmuNetwork
from testbed.emu.probes import PingStats, icmp_ping, run_iperf3
from testbed.emu.verify import first_host
from testbed.progress import progress

PROBE_SECONDS = 4.0
PROBE_WARMUP_S = 1.5
PROBE_FIELDS = ("vlan", "src", "dst", "src_dc", "dst_dc", "rate_mbps", "delay_ms",
                "goodput_mbps", "goodput_ratio", "retransmits", "rtt_median_ms",
                "rtt_expected_ms")


def measure_lightpaths(net: EmuNetwork, seconds: float, quiet: bool) -> list[dict[str, Any]]:
    """iperf3 (TCP, receiver-side goodput after a warm-up) and ping per lightpath."""
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
