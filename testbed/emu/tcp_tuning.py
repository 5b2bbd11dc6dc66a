"""TCP and pacer tuning for long-lived pipeline transfers over emulated lightpaths.

Per host: no slow-start restart after idle, and per destination a route whose initial
congestion window is the lightpath's bandwidth-delay product (its locked cwnd does not
act on these hosts: see the comment below) and whose congestion control is Reno, which
time dilation leaves as it is; per lightpath: its pacers' queue deepened to
LIGHTPATH_QUEUE_BDPS x the BDP.
"""

from __future__ import annotations

import json
import math
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

from testbed.emu.forwarder import default_queue_bytes
from testbed.emu.live import LiveNetwork
from testbed.emu.plan import EmuPlan


class ExecHost(Protocol):
    """A host commands run in: its argv prefix, address and interface."""

    name: str
    ip: str
    iface: str | None
    prefix: tuple[str, ...]


# TCP as long-lived training connections see it. The simulator times a transfer as
# latency + size / bandwidth on a FIFO link; a default Linux TCP instead (1) restarts
# slow start after every idle gap longer than an RTO (RFC 2861; the stages idle between
# activations and the WAN RTT is stretched by time_factor), adding whole RTTs per
# activation, and (2) probes the window up until the lightpath pacer's queue overflows,
# then runs window-limited below the lightpath rate. Both were measured here (latency
# calibration 10-17 % slow; bandwidth calibration up to 2x per transfer). So each host
# keeps its window across idle gaps and gets, per destination DC, a route whose initial
# and clamped congestion window is the lightpath's bandwidth-delay product, and the
# lightpath's pacers queue up to 2 BDPs (deep-buffered WAN ingress; the emulator's
# default is 1 BDP, which a burst of one window plus whole 64 KB GSO frames overflows:
# measured tail drops and RTO stalls). So the pipe is full from the first byte. Hosts:
# per network namespace only. The locked `cwnd` does not clamp these hosts' flows
# (measured 2026-12-04: 2,972 segments on a route locked at 1,182): the kernel applies it
# only through its TCP metrics cache, which the hosts do not keep
# (net.ipv4.tcp_no_metrics_save=1, testbed.emu.network.HOST_SYSCTLS). Priming the cache
# so that it did made calib-bandwidth-gpipe 6-10 % slower than the simulator in every
# iteration (window-limited under BBR), so the flows stay unclamped.
#
# The congestion control of these routes is Reno (LIGHTPATH_CONGESTION_CONTROL, the
# route's `congctl`), whatever the machine's default. Time dilation stretches every RTT
# but not the kernel's clock, and BBR keeps wall-clock constants: every 10 s it drops
# its window to 4 segments for 200 ms (ProbeRTT), which at time_factor 11.5 is once per
# 0.87 s of scenario time for 17 ms, and its gain cycle paces one round in eight at
# 0.75. Measured 2026-12-04 (tcp:tcp_probe): ProbeRTT in the middle of the jobs' bulk
# transfers, stalls of 20-50 ms wall in most iterations, calib-bandwidth-gpipe 3.4-6.8 %
# over the simulator (11 runs). Reno is clocked by ACKs alone: its window moves per
# round trip, so a dilated run sees what the scenario would. After its one slow-start
# overshoot in the first iteration (tail drops at the 2-BDP queue: the model's,
# counted), it halves to about 1.5 BDPs and then grows one segment per round trip, so
# the pipe stays full and a window sent as one burst after an idle gap fits in the
# queue: 0.3-1.2 % over the simulator (3 runs). Cubic's growth is a function of wall
# time, so time dilation would distort it as it does BBR.
#
# The retransmission time-out is dilated too (the route's rto_min, which iproute2 locks):
# a lost segment is sent again no sooner than RTO = srtt + max(4 x mdev, rto_min) after
# it left, and each time-out doubles the next. Linux's rto_min is 200 ms of the kernel's
# clock, which at time_factor 10 would be 20 ms of scenario time: a fibre outage then
# cost the workers a tenth of the real back-off. Measured 2026-12-07 (a 2-DC job, one
# fibre cut for 300 ms of scenario time, time_factor 10, undilated): the stall was
# 402 ms, the retransmissions at 0.12 (loss probe), 0.38, 0.90, 1.94 and 4.02 s wall after
# the loss. With rto_min = 200 ms x time_factor the back-off is a real WAN's in scenario
# time (docs/workers.md, "Training through faults").
LINUX_RTO_MIN_MS = 200
MSS_BYTES = 1448              # 1500 MTU - 20 IP - 32 TCP (with timestamps)
WIRE_BYTES_PER_SEGMENT = 1518  # + 14 Ethernet + 4 802.1Q tag, as the pacer counts them
TCP_GOODPUT = MSS_BYTES / WIRE_BYTES_PER_SEGMENT  # 0.954 of a lightpath's rate
MIN_WINDOW_SEGMENTS = 64
WINDOW_MARGIN_SEGMENTS = 8
LIGHTPATH_QUEUE_BDPS = 2.0
HOST_TCP_SYSCTLS = ("net.ipv4.tcp_slow_start_after_idle=0",)
LIGHTPATH_CONGESTION_CONTROL = "reno"  # every kernel has it built in (see above)


def lightpath_queue_bytes(rate_mbps: float, one_way_delay_ms: float) -> int:
    """Per-lightpath pacer queue for pp_jobs runs: LIGHTPATH_QUEUE_BDPS x the BDP."""
    bdp = rate_mbps * 1e6 / 8 * 2 * one_way_delay_ms / 1e3
    return max(default_queue_bytes(rate_mbps, one_way_delay_ms),
               int(LIGHTPATH_QUEUE_BDPS * bdp))


def window_segments(rate_mbps: float, one_way_delay_ms: float) -> int:
    """Congestion window (segments) for a lightpath: its BDP plus a few segments.

    The window fills the pipe (window / RTT >= rate) and, sent as one burst after an
    idle gap (no slow-start restart), fits in the lightpath's pacer queue
    (lightpath_queue_bytes) with one BDP to spare for whole GSO frames and ACK timing.
    """
    bdp = rate_mbps * 1e6 / 8 * 2 * one_way_delay_ms / 1e3
    return max(MIN_WINDOW_SEGMENTS, math.ceil(bdp / WIRE_BYTES_PER_SEGMENT)
               + WINDOW_MARGIN_SEGMENTS)


def deepen_lightpath_queues(net: LiveNetwork) -> dict[int, int]:
    """Give each DC-pair lightpath's pacers a queue of lightpath_queue_bytes (in place).

    Sets the limit of the lightpath's existing cap (same rate) on every fibre of its
    route over the forwarder's control channel; returns {vlan: limit_bytes}.
    """
    plan = net.plan
    fibre_of = {frozenset((f.u, f.v)): f for f in plan.fibres}
    out: dict[int, int] = {}
    for lp in plan.lightpaths:
        limit = lightpath_queue_bytes(lp.rate_mbps, lp.delay_ms)
        for u, v in zip(lp.path, lp.path[1:], strict=False):
            emu = net.emulators.get(fibre_of[frozenset((u, v))].middle)
            if emu is None or not emu.counters:
                continue  # netem links: no user-space pacer
            caps = {vid: c for d in emu.stats().get("directions", {}).values()  # type: ignore[attr-defined]
                    for vid, c in d.get("vlans", {}).items()}
            cap = caps.get(str(lp.vlan))
            if cap is None:
                continue
            emu.set_queue(lp.vlan, cap["rate_mbps"], limit)
            out[lp.vlan] = limit
    return out


def host_routes(emu_plan: EmuPlan, dc: str) -> list[tuple[str, int]]:
    """(destination DC subnet, window segments) for every lightpath leaving `dc`."""
    out = []
    for lp in emu_plan.lightpaths:
        if dc not in (lp.dc_a, lp.dc_b):
            continue
        other = lp.dc_b if lp.dc_a == dc else lp.dc_a
        out.append((emu_plan.dc_subnets[other], window_segments(lp.rate_mbps, lp.delay_ms)))
    return out


def dilated_rto_min_ms(time_factor: float) -> int:
    """The lightpath routes' minimum retransmission time-out, wall-clock ms: Linux's
    200 ms x time_factor, so that it is 200 ms in scenario time (see below)."""
    return max(LINUX_RTO_MIN_MS, round(LINUX_RTO_MIN_MS * time_factor))


def tune_host_tcp(emu_plan: EmuPlan, hosts_by_dc: Mapping[str, Sequence[ExecHost]]) -> None:
    """Apply HOST_TCP_SYSCTLS and per-destination-DC window routes in every host (with
    the retransmission time-out dilated by the plan's time factor)."""
    rto_min_ms = dilated_rto_min_ms(emu_plan.scale.time_factor)
    for dc, hosts in hosts_by_dc.items():
        routes = host_routes(emu_plan, dc)
        for h in hosts:
            sysctls = [a for s in HOST_TCP_SYSCTLS for a in ("-w", s)]
            subprocess.run([*h.prefix, "sysctl", "-q", *sysctls], check=True,
                           stdout=subprocess.DEVNULL, timeout=10)
            for subnet, win in routes:
                window_route(h, subnet, win, rto_min_ms)


def window_route(h: ExecHost, dest: str, window: int, rto_min_ms: int | None = None) -> None:
    """In host h: a route to dest whose initial (and nominally clamped) window is
    `window` segments, whose connections use LIGHTPATH_CONGESTION_CONTROL and, given
    rto_min_ms, retransmit no sooner than that after a loss (dilated_rto_min_ms)."""
    assert h.iface is not None
    win = str(window)
    rto = [] if rto_min_ms is None else ["rto_min", f"{int(rto_min_ms)}ms"]
    subprocess.run([*h.prefix, "ip", "route", "replace", dest, "dev", h.iface, "src", h.ip,
                    "initcwnd", win, "initrwnd", win, "cwnd", "lock", win, *rto,
                    "congctl", LIGHTPATH_CONGESTION_CONTROL],
                   check=True, timeout=10)


TCP_COUNTERS = ("TcpRetransSegs", "TcpExtTCPTimeouts", "TcpExtTCPLossProbes")


def tcp_counters(hosts: Iterable[ExecHost]) -> dict[str, dict[str, int]]:
    """Per host: TCP retransmitted segments, RTO time-outs and loss probes (nstat)."""
    out: dict[str, dict[str, int]] = {}
    for h in hosts:
        try:
            res = subprocess.run([*h.prefix, "nstat", "-az", "--json", *TCP_COUNTERS],
                                 capture_output=True, text=True, timeout=10, check=True)
            kernel = json.loads(res.stdout).get("kernel", {})
            out[h.name] = {k: int(kernel.get(k, 0)) for k in TCP_COUNTERS}
        except (OSError, subprocess.SubprocessError, ValueError):
            continue
    return out


