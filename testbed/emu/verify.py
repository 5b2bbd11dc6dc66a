"""Check a freshly started network: pings between DCs, the RTT of every DC pair, and a
scapy probe per lightpath.

Every DC pair with a lightpath: the median RTT of RTT_PINGS echoes between the DCs'
first hosts must be within 2 x the configured one-way delay +- RTT_TOL_MS (1 ms), whatever
the hop count (the delay calibration, testbed.emu.calibrate, makes it so). verify()
fails on it unless rtt_enforced=False; the run path records and warns instead (it can
be out of reach: a fibre shorter than its path's processing time).

A lightpath probe is a UDP frame sent from a host of one DC to a host of the other; it
must appear tagged with the lightpath's VLAN id on every fibre of the lightpath's route
in order (sniffed in each fibre's middle namespace), each fibre must hold it for its
emulated delay (the configured delay less the calibration's correction), and it must
reach the far host within a (single-frame, so looser) tolerance of the configured
one-way delay.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from testbed.emu.batches import SIDE_BY_SIDE, ping_parallel, run_batched
from testbed.emu.delaycal import RTT_TOL_MS, rtt_ok
from testbed.emu.network import EmuNetwork
from testbed.emu.plan import EmuPlan, LightpathPlan
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
RTT_PINGS = 20  # echoes per DC pair for the RTT check (its median)


def fibre_tolerance_ms(delay_ms: float) -> float:
    return FIBRE_TOL_MS + FIBRE_TOL_FRAC * delay_ms


def path_tolerance_ms(expected_ms: float, fibres: int) -> float:
    """How much later than the sum of fibre delays a probe may arrive end to end."""
    return fibre_tolerance_ms(expected_ms) + PATH_TOL_PER_SWITCH_MS * (fibres + 3)


def within(measured_ms: float | None, expected_ms: float, tol_ms: float) -> bool:
    return measured_ms is not None and -FIBRE_EARLY_MS <= measured_ms - expected_ms <= tol_ms


def probe_ok(res: ProbeResult, plan: EmuPlan, path: tuple[str, ...],
             emulated_ms: Mapping[str, float] | None = None) -> tuple[bool, bool]:
    """(route and tags right, delays within tolerance) for one probe result; each fibre
    against the delay its emulator runs at (emulated_ms by middle node; default: the
    configured delay), the whole path against the configured delays."""
    return res.ok, (fibres_in_time(res, plan, path, emulated_ms)
                    and path_in_time(res, plan, path, emulated_ms))


def fibres_in_time(res: ProbeResult, plan: EmuPlan, path: tuple[str, ...],
                   emulated_ms: Mapping[str, float] | None = None) -> bool:
    """Each fibre of the path held the probe for the delay its emulator runs at (within
    its tolerance; emulated_ms by middle node, default the configured delay)."""
    delays = res.fibre_delay_ms or {}
    emulated_ms = emulated_ms or {}
    for u, v in itertools.pairwise(path):
        f = plan.fibre(u, v)
        runs_at = float(emulated_ms.get(f.middle, f.delay_ms))
        if not within(delays.get(f.middle), runs_at, fibre_tolerance_ms(runs_at)):
            return False
    return True


def path_in_time(res: ProbeResult, plan: EmuPlan, path: tuple[str, ...],
                 emulated_ms: Mapping[str, float] | None = None) -> bool:
    """The probe reached the far host no earlier than its fibres hold it (the calibration
    shortened them for the hosts' and bridges' time, which an injected frame partly
    skips) and no later than the configured delays + the path's tolerance."""
    fibres = [plan.fibre(u, v) for u, v in itertools.pairwise(path)]
    emulated_ms = emulated_ms or {}
    expected = sum(f.delay_ms for f in fibres)
    floor = min(expected, sum(float(emulated_ms.get(f.middle, f.delay_ms)) for f in fibres))
    one_way = res.one_way_ms
    return (one_way is not None and floor - FIBRE_EARLY_MS <= one_way
            and one_way - expected <= path_tolerance_ms(expected, len(fibres)))


def answered(ping: dict[str, Any], lossy: bool) -> bool:
    """Every echo answered (some, where the fibres are set to lose packets)."""
    return ping["received"] > 0 if lossy else ping["received"] == ping["sent"]


def _ns(net: EmuNetwork, host: str) -> str:
    return f"/proc/{net.host_pid(host)}/ns/net"


def first_host(net: EmuNetwork, dc: str) -> str:
    return next(h.name for h in net.plan.hosts if h.dc == dc)


@dataclass(frozen=True)
class ProbeJob:
    """One lightpath probe: a lightpath in one direction, from src_dc along path."""

    lp: LightpathPlan
    src_dc: str
    dst_dc: str
    path: tuple[str, ...]

    def fibres(self) -> frozenset[frozenset[str]]:
        return frozenset(frozenset(e) for e in itertools.pairwise(self.path))


def probe_jobs(plan: EmuPlan) -> list[ProbeJob]:
    """Both directions of every lightpath, in plan order."""
    return [job for lp in plan.lightpaths
            for job in (ProbeJob(lp, lp.dc_a, lp.dc_b, tuple(lp.path)),
                        ProbeJob(lp, lp.dc_b, lp.dc_a, tuple(reversed(lp.path))))]


def run_probe(net: EmuNetwork, job: ProbeJob) -> dict[str, Any]:
    """Probe one lightpath direction (up to PROBE_TRIES times); its verification row."""
    p = net.plan
    lp = job.lp
    hs, hd = p.host(first_host(net, job.src_dc)), p.host(first_host(net, job.dst_dc))
    hops = []
    for u, v in itertools.pairwise(job.path):
        f = p.fibre(u, v)
        emu = net.emulators[f.middle]
        # The side the probe enters the middle node from.
        ifname = emu.intf_u if u == f.u else emu.intf_v
        out_if = emu.intf_v if u == f.u else emu.intf_u
        hops.append((f.middle, f"/proc/{emu.ns_pid}/ns/net", ifname, out_if))
    tol = path_tolerance_ms(lp.delay_ms, len(hops))
    emulated = {m: net.emulators[m].emulated_delay_ms(lp.vlan) for m, *_ in hops}
    res = None
    in_time = False
    for _ in range(PROBE_TRIES):  # a busy machine may delay one probe: retry
        res = lightpath_probe(
            _ns(net, hs.name), str(net.nodes[hs.node].defaultIntf()), hs.mac,
            hs.ip.split("/")[0], _ns(net, hd.name),
            str(net.nodes[hd.node].defaultIntf()), hd.mac, hd.ip.split("/")[0],
            lp.vlan, hops, lp.delay_ms, timeout_s=1.0 + 4 * lp.delay_ms / 1000)
        route_ok, in_time = probe_ok(res, p, job.path, emulated)
        if route_ok and in_time:
            break
    assert res is not None
    return {**asdict(res), "src_host": hs.name, "dst_host": hd.name,
            "tolerance_ms": round(tol, 3), "route_ok": res.ok, "delay_ok": in_time,
            "ok": res.ok and in_time}


def dc_pair_rtts(net: EmuNetwork, ping_count: int = RTT_PINGS, parallel: int | None = None
                 ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Ping every DC pair, first host to first host: (ping rows, RTT rows of the pairs
    with a lightpath, each checked against 2 x its path's delay +- RTT_TOL_MS).
    parallel > 1: pairs whose lightpaths share no fibre are pinged side by side (None:
    as the calibration does, testbed.emu.batches.ping_parallel)."""
    p = net.plan
    lp_of = {frozenset((lp.dc_a, lp.dc_b)): lp for lp in p.lightpaths}
    dcs = list(p.dc_subnets)
    pairs = [(a, b) for i, a in enumerate(dcs) for b in dcs[i + 1:]]

    def route(a: str, b: str) -> frozenset[object]:
        lp = lp_of.get(frozenset((a, b)))
        return frozenset() if lp is None else frozenset(
            frozenset(e) for e in itertools.pairwise(lp.path))

    def ping(pair: tuple[str, str]) -> list[float | None]:
        ha, hb = p.host(first_host(net, pair[0])), p.host(first_host(net, pair[1]))
        return icmp_ping(_ns(net, ha.name), hb.ip.split("/")[0], count=ping_count,
                         interval_s=0.02)

    if parallel is None:
        parallel = ping_parallel(len(p.lightpaths))
    results = run_batched(pairs, [route(a, b) for a, b in pairs], ping, parallel)
    tol_ms = p.scale.delay_ms(RTT_TOL_MS)  # the band is +-1 ms in scenario time
    pings: list[dict[str, Any]] = []
    rtts: list[dict[str, Any]] = []
    for (a, b), got in zip(pairs, results, strict=True):
        ha, hb = p.host(first_host(net, a)), p.host(first_host(net, b))
        st = PingStats.of(got)
        pings.append({"src": ha.name, "dst": hb.name, **asdict(st)})
        lp = lp_of.get(frozenset((a, b)))
        if lp is not None:
            fibres = [p.fibre(u, v) for u, v in itertools.pairwise(lp.path)]
            one_way = sum(f.delay_ms for f in fibres)
            replies = [r for r in got if r is not None]
            rtts.append({"pair": f"{a}~{b}", "src": ha.name, "dst": hb.name,
                         "hops": len(fibres), "expected_rtt_ms": round(2 * one_way, 4),
                         "tolerance_ms": round(tol_ms, 4), "pings": st.sent,
                         "replies": st.received,
                         "median_ms": None if st.median_ms is None else round(st.median_ms, 4),
                         "max_ms": round(max(replies), 4) if replies else None,
                         "samples_ms": [round(x, 4) for x in replies],  # (fidelity's p99)
                         "ok": rtt_ok(st.median_ms, one_way, tol_ms)})
    return pings, rtts


def verify(net: EmuNetwork, ping_count: int = RTT_PINGS, rtt_enforced: bool = True,
           probe_parallel: int = SIDE_BY_SIDE, pings_parallel: int | None = None,
           delays_enforced: bool = True) -> dict[str, Any]:
    """Run the checks; returns {"ok": bool, "pings": [...], "rtts": [...], "probes": [...]}
    and each part's verdict (reach_ok, routes_ok, rtt_ok, delays_ok).

    rtt_enforced: a DC pair's RTT outside the band fails the verification (else it is
    only recorded); delays_enforced: so does a lightpath probe held outside its fibres'
    tolerance (a probe off its route, untagged or lost always fails it).
    probe_parallel, pings_parallel: at most this many lightpath probes (DC-pair pings) at
    a time, only those whose routes share no fibre together; 1: one after the other;
    pings None: as the calibration (testbed.emu.batches.ping_parallel)."""
    p = net.plan
    pings = []
    for dc in p.dc_subnets:  # inside each DC: first host to every other host
        hs = [h for h in p.hosts if h.dc == dc]
        pairs_in = [(hs[0], h) for h in hs[1:]]
        for a, b in pairs_in:
            st = PingStats.of(icmp_ping(_ns(net, a.name), b.ip.split("/")[0], count=2,
                                        interval_s=0.01))
            pings.append({"src": a.name, "dst": b.name, **asdict(st)})
    between, rtts = dc_pair_rtts(net, ping_count, pings_parallel)
    pings.extend(between)
    jobs = probe_jobs(p)
    probes = run_batched(jobs, [j.fibres() for j in jobs], lambda j: run_probe(net, j),
                         probe_parallel)
    rtt_fine = all(x["ok"] for x in rtts)
    lossy = any(f.loss > 0 for f in p.fibres)  # then an echo may be lost: any reply will do
    parts = {"reach_ok": all(answered(x, lossy) for x in pings),
             "routes_ok": all(x["route_ok"] for x in probes), "rtt_ok": rtt_fine,
             "delays_ok": all(x["delay_ok"] for x in probes)}
    ok = checks_pass(parts, rtt_enforced, delays_enforced)
    for x in rtts:
        if not x["ok"]:
            # Not enforced: the caller decides what to say (the run path recalibrates).
            log.log(logging.WARNING if rtt_enforced else logging.INFO,
                    "DC pair %s (%d hops): RTT median %s ms, expected %.2f +- %.1f ms%s",
                    x["pair"], x["hops"], x["median_ms"], x["expected_rtt_ms"],
                    RTT_TOL_MS, "" if rtt_enforced else " (not enforced)")
    if not ok:
        log.warning("verification failed: %s",
                    [x for x in pings if not answered(x, lossy)]
                    + [x for x in rtts if not x["ok"]] + [x for x in probes if not x["ok"]])
    return {"ok": ok, **parts, "rtt_enforced": rtt_enforced,
            "delays_enforced": delays_enforced, "lossy": lossy, "pings": pings,
            "rtts": rtts, "probes": probes}


def checks_pass(parts: Mapping[str, bool], rtt_enforced: bool, delays_enforced: bool
                ) -> bool:
    """Whether a verification's parts pass it: every host reached and every probe on its
    route always; the DC pairs' RTTs and the probes' delays where enforced."""
    return (parts["reach_ok"] and parts["routes_ok"]
            and (parts["rtt_ok"] or not rtt_enforced)
            and (parts["delays_ok"] or not delays_enforced))
