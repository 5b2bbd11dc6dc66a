"""Check a freshly started network: pings between DCs, and a scapy probe per lightpath.

A lightpath probe is a UDP frame sent from a host of one DC to a host of the other; it
must appear tagged with the lightpath's VLAN id on every fibre of the lightpath's route
in order (sniffed in each fibre's middle namespace) and reach the far host within
tolerance of the configured one-way delay.
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import asdict
from typing import Any

from testbed.emu.network import EmuNetwork
from testbed.emu.plan import EmuPlan
from testbed.emu.probes import PingStats, ProbeResult, icmp_ping, lightpath_probe

log = logging.getLogger(__name__)

# Each fibre's delay is measured inside its middle namespace (kernel stamps where the
# probe enters and leaves), so Open vSwitch latency does not blur it: it must be within
# [-FIBRE_EARLY_MS, FIBRE_TOL_MS + FIBRE_TOL_FRAC x delay] of the configured delay.
# End to end the probe also crosses fibres + 3 userspace-datapath bridges, each adding
# 0.1-1 ms on a busy 2-core machine (measured): that bound is looser.
FIBRE_TOL_MS = 1.0
FIBRE_TOL_FRAC = 0.05
FIBRE_EARLY_MS = 0.3
PATH_TOL_PER_SWITCH_MS = 1.5
PROBE_TRIES = 5


def fibre_tolerance_ms(delay_ms: float) -> float:
    return FIBRE_TOL_MS + FIBRE_TOL_FRAC * delay_ms


def path_tolerance_ms(expected_ms: float, fibres: int) -> float:
    """How much later than the sum of fibre delays a probe may arrive end to end."""
    return fibre_tolerance_ms(expected_ms) + PATH_TOL_PER_SWITCH_MS * (fibres + 3)


def within(measured_ms: float | None, expected_ms: float, tol_ms: float) -> bool:
    return measured_ms is not None and -FIBRE_EARLY_MS <= measured_ms - expected_ms <= tol_ms


def probe_ok(res: ProbeResult, plan: EmuPlan, path: tuple[str, ...]) -> tuple[bool, bool]:
    """(route and tags right, delays within tolerance) for one probe result."""
    fibres = [plan.fibre(u, v) for u, v in itertools.pairwise(path)]
    delays = res.fibre_delay_ms or {}
    fibre_ok = all(within(delays.get(f.middle), f.delay_ms, fibre_tolerance_ms(f.delay_ms))
                   for f in fibres)
    expected = sum(f.delay_ms for f in fibres)
    path_ok = within(res.one_way_ms, expected, path_tolerance_ms(expected, len(fibres)))
    return res.ok, fibre_ok and path_ok


def _ns(net: EmuNetwork, host: str) -> str:
    return f"/proc/{net.host_pid(host)}/ns/net"


def first_host(net: EmuNetwork, dc: str) -> str:
    return next(h.name for h in net.plan.hosts if h.dc == dc)


def verify(net: EmuNetwork, ping_count: int = 5) -> dict[str, Any]:
    """Run the checks; returns {"ok": bool, "pings": [...], "probes": [...]}."""
    p = net.plan
    pings = []
    dcs = list(p.dc_subnets)
    pairs = [(a, b) for i, a in enumerate(dcs) for b in dcs[i + 1:]]
    for dc in dcs:  # inside each DC: first host to every other host
        hs = [h for h in p.hosts if h.dc == dc]
        pairs_in = [(hs[0], h) for h in hs[1:]]
        for a, b in pairs_in:
            st = PingStats.of(icmp_ping(_ns(net, a.name), b.ip.split("/")[0], count=2,
                                        interval_s=0.01))
            pings.append({"src": a.name, "dst": b.name, **asdict(st)})
    for a, b in pairs:
        ha, hb = p.host(first_host(net, a)), p.host(first_host(net, b))
        st = PingStats.of(icmp_ping(_ns(net, ha.name), hb.ip.split("/")[0], count=ping_count,
                                    interval_s=0.02))
        pings.append({"src": ha.name, "dst": hb.name, **asdict(st)})
    probes = []
    for lp in p.lightpaths:
        for src_dc, dst_dc, path in ((lp.dc_a, lp.dc_b, lp.path),
                                     (lp.dc_b, lp.dc_a, tuple(reversed(lp.path)))):
            hs, hd = p.host(first_host(net, src_dc)), p.host(first_host(net, dst_dc))
            hops = []
            for u, v in itertools.pairwise(path):
                f = p.fibre(u, v)
                emu = net.emulators[f.middle]
                # The side the probe enters the middle node from.
                ifname = emu.intf_u if u == f.u else emu.intf_v
                out_if = emu.intf_v if u == f.u else emu.intf_u
                hops.append((f.middle, f"/proc/{emu.ns_pid}/ns/net", ifname, out_if))
            tol = path_tolerance_ms(lp.delay_ms, len(hops))
            res = None
            for _ in range(PROBE_TRIES):  # a busy machine may delay one probe: retry
                res = lightpath_probe(
                    _ns(net, hs.name), str(net.nodes[hs.node].defaultIntf()), hs.mac,
                    hs.ip.split("/")[0], _ns(net, hd.name),
                    str(net.nodes[hd.node].defaultIntf()), hd.mac, hd.ip.split("/")[0],
                    lp.vlan, hops, lp.delay_ms, timeout_s=1.0 + 4 * lp.delay_ms / 1000)
                route_ok, in_time = probe_ok(res, p, path)
                if route_ok and in_time:
                    break
            assert res is not None
            probes.append({**asdict(res), "src_host": hs.name, "dst_host": hd.name,
                           "tolerance_ms": round(tol, 3), "delay_ok": in_time,
                           "ok": res.ok and in_time})
    ok = all(x["received"] == x["sent"] for x in pings) and all(x["ok"] for x in probes)
    if not ok:
        log.warning("verification failed: %s",
                    [x for x in pings if x["received"] != x["sent"]]
                    + [x for x in probes if not x["ok"]])
    return {"ok": ok, "pings": pings, "probes": probes}
