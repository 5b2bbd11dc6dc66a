"""Fidelity verdict of one emulated run: invariants measured on the run, each against a bound.

In the spirit of Mininet-HiFi's monitors (Handigol et al., CoNEXT'12): a run's figures
are worth something only while the emulator kept up, so every emulated run measures
whether it did and says so (docs/emulation.md "Fidelity verdict"). Pure: the measuring
is testbed.emu.fidelity_probe's; this module turns the measurements into invariants
(value, threshold, pass/fail, what gave the value) and the verdict.

Every time is judged in scenario time (emulated / time_factor, testbed.emu.scale.Scale):
the emulator's own lateness shrinks by the dilation factor, as in time-dilated
emulation. A quantity that was not measured in a run (no workers, netem links without
user-space counters) gives an invariant with value None: listed, never a failure.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from testbed.emu.scale import Scale
from testbed.emu.slack import merge, quantile_s
from testbed.errors import RuntimeFailure

# Each DC pair's RTT in scenario time: within 2 x its one-way delay +- RTT_BAND_MS
# (median), and its tail (p99) within twice that.
RTT_BAND_MS = 1.0
RTT_P99_BAND_MS = 2.0
# CPU: share of the time a process wanted a CPU that it had one (schedstat run / (run +
# wait)). Workers whose job has no direct measure of its compute (model mode) are judged
# by it, as the simulator assumes their compute (the agreement's long-standing
# MIN_CPU_SHARE, docs/workers.md); shadow workers by their work done and ops' overrun
# (worker_share_invariant). Forwarders and the software
# switch hold every delay: what a frame waits on them is how long each waited for a CPU
# each time it woke (schedstat wait / time slices, scenario time), judged against
# MAX_SCHED_DELAY_MS; their shares are measured and listed (judged: False). A share is no
# measure of a frame's delay for a process that runs a few microseconds per wake-up: 20 us
# behind another real-time process at each of them is a share of 80 % and 0.02 ms.
MIN_FORWARDER_SHARE = 0.9
MIN_SWITCH_SHARE = 0.9
MIN_WORKER_SHARE = 0.8
# A DC pair's RTT crosses the switch's bridges up to four times (two DCs, each way) and a
# forwarder per fibre each way: at 0.1 ms each, a two-fibre path's median gains at most
# 0.8 ms of the 1 ms band (RTT_BAND_MS) in scenario time.
MAX_SCHED_DELAY_MS = 0.1
# A process that ran less than this (s of CPU) over the run is judged with its role's
# others: its share is a few wake-ups' latency, noise rather than starvation.
MIN_RUN_S = 0.1
# The workers' own figures (their records; docs/workers.md "Agreement"): the CPU they got
# for their tensor work, and how much longer their ops ran than asked (they woke late).
MIN_COMPUTE_SHARE = 0.8
# An op overrun adds about as much to the iteration (every stage's ops are on its path in
# turn): half of the 5 % a faithful run may be off, the other half left to the network.
MAX_OP_OVERRUN = 0.025
# How late the forwarders' timed wake-ups came (p99, scenario time): a late wake-up
# delays every frame due then; half the RTT band, since a path crosses several.
MAX_FORWARDER_SLACK_MS = 0.5
# Frames the emulator lost outside its model (kernel socket drops: the forwarder did not
# read in time; send errors), as a share of the frames it received.
MAX_EMULATOR_DROP_SHARE = 0.001
# TCP retransmissions the modelled drops do not explain, as a share of segments sent:
# each dropped segment may be sent again RETRANSMITS_PER_DROP times (a tail drop's
# recovery resends what followed it).
RETRANSMITS_PER_DROP = 2.0
MAX_UNEXPLAINED_RETRANSMIT_SHARE = 0.01
# ... and at most this many per window of data in flight (the fastest lightpath's rate x
# the longest planned RTT, in segments): a loss the model did not make holds its message
# back about a round trip, so a share that is small next to the segments sent can still
# cost whole iterations where the window is large. Measured on 28 calib-* runs with CPU
# workers and a busy core (2026-12-03, docs/workers.md): of the 16 that every other
# invariant judged faithful, the 11 with <= 0.18 per window were within 4.8 % of the
# simulator (10 within 1.5 %), the 5 with >= 0.30 were 9-20 % off.
MAX_UNEXPLAINED_LOSSES_PER_WINDOW = 0.25
MAX_STEAL = 0.05  # share of the machine's CPU time a hypervisor took


@dataclass(frozen=True)
class Invariant:
    """One measured quantity against its bound ("max": value <= threshold, "min": >=)."""

    name: str
    value: float | None
    threshold: float
    bound: str
    unit: str
    detail: str = ""  # what gave the value (the worst lightpath, process, job)
    why: str = ""     # what the bound protects
    missing: str = ""  # a part that should have been measured and gave nothing: fails
    judged: bool = True  # False: measured and listed, never a failure (a proxy of another)

    @property
    def measured(self) -> bool:
        return self.value is not None and math.isfinite(self.value)

    @property
    def ok(self) -> bool:
        if self.missing:
            return False
        if not self.measured or not self.judged:
            return True
        assert self.value is not None
        return self.value <= self.threshold if self.bound == "max" else \
            self.value >= self.threshold

    def reason(self) -> str:
        """The failure in words: name, value, bound, where."""
        if self.missing:
            return f"{self.name}: {self.missing}"
        op = ">" if self.bound == "max" else "<"
        where = f" ({self.detail})" if self.detail else ""
        return f"{self.name} {fmt(self.value, self.unit)} {op} {fmt(self.threshold, self.unit)}" \
            + where

    def as_record(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok, "measured": self.measured}


def fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "n/a"
    if unit == "share":  # two significant digits below 0.1 % (a per-window bound: 0.016 %)
        return f"{100 * value:.2g} %" if 0 < abs(value) < 0.001 else f"{100 * value:.1f} %"
    return f"{value:.3g} {unit}"


# ---- RTTs per lightpath (verify's rows) ---------------------------------------------------
def p99(samples: Sequence[float]) -> float:
    """Nearest-rank 99th percentile (of 20 echoes: the largest)."""
    s = sorted(samples)
    return s[max(0, math.ceil(0.99 * len(s)) - 1)]


def lightpath_rtt_errors(rows: Iterable[Mapping[str, Any]], scale: Scale
                         ) -> list[dict[str, Any]]:
    """Per DC pair (lightpath) of testbed.emu.verify's RTT rows: the error of its median and
    p99 RTT against 2 x its planned delay, in scenario ms (emulated / time_factor). A row
    carries its echoes (`samples_ms`) or at least `median_ms` (and `max_ms` as its p99)."""
    out = []
    for r in rows:
        expected = float(r["expected_rtt_ms"])
        samples = [float(x) for x in r.get("samples_ms") or () if x is not None]
        med = statistics.median(samples) if samples else r.get("median_ms")
        tail = p99(samples) if samples else r.get("max_ms", med)
        out.append({"pair": str(r["pair"]), "hops": r.get("hops"),
                    "expected_rtt_ms": scale.real_ms(expected),
                    "median_error_ms": None if med is None else scale.real_ms(med - expected),
                    "p99_error_ms": None if tail is None else scale.real_ms(tail - expected),
                    "replies": len(samples) if samples else r.get("replies")})
    return out


def rtt_invariants(errors: Sequence[Mapping[str, Any]]) -> list[Invariant]:
    def worst(key: str, name: str, band: float, why: str) -> Invariant:
        got = [(abs(e[key]), e["pair"], e[key]) for e in errors if e.get(key) is not None]
        lost = [e["pair"] for e in errors if e.get(key) is None]
        if lost:  # a lightpath without a reply is as far off as can be
            return Invariant(name, None, band, "max", "ms", ", ".join(lost), why,
                             missing=f"{len(lost)} DC pair(s) without an echo reply "
                             f"({', '.join(lost[:5])})")
        if not got:
            return Invariant(name, None, band, "max", "ms", "no lightpath measured", why)
        _, pair, signed = max(got)
        return Invariant(name, abs(signed), band, "max", "ms", f"{pair} {signed:+.3f} ms", why)

    return [worst("median_error_ms", "rtt_median_error", RTT_BAND_MS,
                  "each DC pair's median RTT within 2 x its delay +- 1 ms (scenario time)"),
            worst("p99_error_ms", "rtt_p99_error", RTT_P99_BAND_MS,
                  "its tail too: p99 within 2 x the band")]


# ---- CPU of the run's processes ---------------------------------------------------------
def _idle_name(idle: Sequence[Mapping[str, Any]]) -> str:
    names = [str(p.get("name") or p.get("pid")) for p in idle]
    return ", ".join(names[:3]) + (" ..." if len(names) > 3 else "") + (
        " (nearly idle, together)" if len(names) > 1 else " (nearly idle)")


def share_invariant(name: str, procs: Sequence[Mapping[str, Any]], role: str,
                    threshold: float, why: str, judged: bool = True) -> Invariant:
    """Least CPU share (run / (run + wait)) of the processes of one role that ran at least
    MIN_RUN_S; those that ran less are judged together (their summed run and wait)."""
    mine = [p for p in procs if p.get("role") == role and p.get("cpu_share") is not None]
    got = [(p["cpu_share"], p.get("name") or str(p.get("pid"))) for p in mine
           if p.get("run_s", 0.0) >= MIN_RUN_S]
    idle = [p for p in mine if p.get("run_s", 0.0) < MIN_RUN_S]
    run = sum(p.get("run_s", 0.0) for p in idle)
    wait = sum(p.get("wait_s", 0.0) for p in idle)
    if run + wait > 0:
        got.append((run / (run + wait), _idle_name(idle)))
    if not got:
        return Invariant(name, None, threshold, "min", "share", f"no {role} measured", why,
                         judged=judged)
    share, who = min(got)
    return Invariant(name, share, threshold, "min", "share", f"{role} {who}", why,
                     judged=judged)


def sched_delay_invariant(name: str, procs: Sequence[Mapping[str, Any]], role: str,
                          scale: Scale, why: str) -> Invariant:
    """Largest scheduling delay (wait / time slices: how long each waited for a CPU each
    time it became runnable), scenario ms, of the processes of one role that ran at least
    MIN_RUN_S over the run, those that ran less together (their summed wait and slices
    over the run), and every one's worst window of the sampler's readings
    (worst_wait_per_slice_ms, procstat.worst_window: at least MIN_WINDOW_SLICES
    wake-ups), so that a starved second is not spread over the whole run. A record
    without slices (an older run's) is not measured."""
    mine = [p for p in procs if p.get("role") == role
            and isinstance(p.get("slices"), int) and p["slices"] > 0]
    got: list[tuple[float, str, str]] = []
    for p in mine:
        who = str(p.get("name") or p.get("pid"))
        worst = p.get("worst_wait_per_slice_ms")  # (windows of >= MIN_WINDOW_SLICES: not noise)
        if isinstance(worst, int | float) and not isinstance(worst, bool):
            got.append((worst / 1000, who, f"its worst window of {p.get('worst_window_slices')} "
                        f"wake-ups"))  # (a starved episode, not spread over the run)
        if p.get("run_s", 0.0) >= MIN_RUN_S:
            got.append((p.get("wait_s", 0.0) / p["slices"], who,
                        f"mean of {p['slices']} wake-ups"))
    idle = [p for p in mine if p.get("run_s", 0.0) < MIN_RUN_S]
    if idle:
        slices = sum(p["slices"] for p in idle)
        got.append((sum(p.get("wait_s", 0.0) for p in idle) / slices, _idle_name(idle),
                    f"mean of {slices} wake-ups"))
    if not got:
        return Invariant(name, None, MAX_SCHED_DELAY_MS, "max", "ms", f"no {role} measured",
                         why)
    delay_s, who, over = max(got)
    return Invariant(name, scale.real_ms(1000 * delay_s), MAX_SCHED_DELAY_MS, "max", "ms",
                     f"{role} {who}, {over}", why)


def worker_share_invariant(procs: Sequence[Mapping[str, Any]],
                           jobs: Sequence[Mapping[str, Any]] = ()) -> Invariant:
    """share_invariant of the workers whose compute is work on the host CPU, judged where
    nothing better measures it. A device stand-in (emulation.worker_compute: device) asks
    the CPU for no compute: it sleeps to each op's deadline, so its run / (run + wait) is
    a few wake-ups' latency against almost no run time; how late those wake-ups came is
    worker_timer_slack. A shadow worker's duty-cycled tensor work (0.25 ms chunks between
    sleeps) has a share made of the same latency (each chunk waits about as long as it
    runs: 16-45 % whatever the factor, duty or nice, with its work done and its ops on
    time), while its job's records say what it got directly: worker_compute_share (work
    done / asked) and worker_timer_slack. Such workers are listed (judged: False); those of
    a job without that measure (model mode) are judged by their share."""
    why = "the workers had a CPU when they wanted one"
    cpu = [p for p in procs if p.get("role") == "worker" and p.get("compute") != "device"]
    measured = {str(j.get("job")) for j in jobs
                if _is_number(j.get("cpu_share_median"))}
    judged = [p for p in cpu if str(p.get("name", "")).rsplit("/stage", 1)[0] not in measured]
    if judged:
        return share_invariant("worker_cpu_share", judged, "worker", MIN_WORKER_SHARE, why)
    if cpu:
        return share_invariant("worker_cpu_share", cpu, "worker", MIN_WORKER_SHARE,
                               "listed: duty-cycled tensor work's share is its wake-ups' "
                               "latency (judged by worker_compute_share and "
                               "worker_timer_slack)", judged=False)
    if procs and any(p.get("role") == "worker" for p in procs):
        return Invariant("worker_cpu_share", None, MIN_WORKER_SHARE, "min", "share",
                         "device stand-ins only (their compute asks for no CPU; their "
                         "wake-ups: worker_timer_slack)", why)
    return Invariant("worker_cpu_share", None, MIN_WORKER_SHARE, "min", "share",
                     "no worker measured", why)


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def worker_job_invariants(job: Mapping[str, Any]) -> list[Invariant]:
    """A job's own figures from its workers' records (summary.json worker_jobs or an
    agreement row): CPU share of its tensor work and its ops' overrun (timer slack)."""
    name = str(job.get("job", ""))
    return [
        Invariant("worker_compute_share", job.get("cpu_share_median"), MIN_COMPUTE_SHARE,
                  "min", "share", name, "its workers got the CPU they asked for (median over "
                  "iterations of the least-served stage)"),
        Invariant("worker_timer_slack", job.get("op_overrun_median"), MAX_OP_OVERRUN, "max",
                  "share", name, "its ops ran no longer than asked: its workers woke on time "
                  "(median over iterations of the slowest stage)")]


def starvation_reason(inv: Invariant) -> str:
    """A failed worker_job_invariants() member as the agreement table words it."""
    assert inv.value is not None
    if inv.name == "worker_compute_share":
        return (f"its workers got {100 * inv.value:.0f} % of the CPU they asked for "
                f"(< {100 * inv.threshold:g} %)")
    return (f"its ops ran {100 * inv.value:.1f} % longer than asked "
            f"(> {100 * inv.threshold:g} %)")


def steal_invariant(host: Mapping[str, Any] | None) -> Invariant:
    return Invariant("host_steal", (host or {}).get("steal_frac"), MAX_STEAL, "max", "share",
                     "", "the hypervisor left this machine its CPU time")


def _worst_job(jobs: Sequence[Mapping[str, Any]], k: int) -> Invariant:
    invs = [worker_job_invariants(j)[k] for j in jobs]
    measured = [i for i in invs if i.measured]
    if not measured:
        return worker_job_invariants({})[k]
    key = (lambda i: i.value) if invs[0].bound == "max" else (lambda i: -i.value)  # type: ignore[operator]
    return max(measured, key=key)


# ---- the link emulators ------------------------------------------------------------------
def forwarder_totals(stats: Sequence[Mapping[str, Any]],
                     cut_fibres: Iterable[frozenset[str]] = ()) -> dict[str, Any]:
    """Summed counters of every forwarder's stats() (testbed.emu.forwarder), and their
    timer slack histograms merged. `cut_fibres`: the fibres a fault took down during the
    run (fault_fibres): the send errors of their forwarders (`fibre`, set by
    testbed.emu.fidelity_probe.forwarder_stats) are the frames on the fibre when its link
    went down (ENETDOWN), a loss the model makes (`cut_drops`, in modelled_drops), not
    the emulator's."""
    keys = ("rx_packets", "tx_segments", "queue_drops", "loss_drops", "down_drops",
            "socket_drops", "send_errors")
    cut = {frozenset(f) for f in cut_fibres}
    tot: dict[str, Any] = dict.fromkeys(keys, 0)
    tot["lightpath_drops"] = 0
    tot["cut_drops"] = 0
    slacks = []
    rates: list[float] = []  # the lightpaths' caps, those held and those released
    for st in stats:
        fibre = st.get("fibre")
        was_cut = isinstance(fibre, str) and frozenset(fibre.split("-", 1)) in cut
        for d in (st.get("directions") or {}).values():
            for k in keys:
                if k == "send_errors" and was_cut:
                    tot["cut_drops"] += int(d.get(k, 0))
                    continue
                tot[k] += int(d.get(k, 0))
            vlans = (d.get("vlans") or {}).values()
            # caps removed before the counters were read (a job's lightpath released)
            released = d.get("released_lightpaths") or {}
            tot["lightpath_drops"] += (sum(int(v.get("drops", 0)) for v in vlans)
                                       + int(released.get("drops", 0)))
            rates += [float(v["rate_mbps"]) for v in vlans if v.get("rate_mbps")]
            if released.get("max_rate_mbps"):
                rates.append(float(released["max_rate_mbps"]))
        if st.get("timer_slack"):
            slacks.append(st["timer_slack"])
    rates = rates or [float(st["rate_mbps"]) for st in stats if st.get("rate_mbps")]
    tot["max_rate_mbps"] = max(rates) if rates else None  # a lightpath's cap, else a fibre's
    tot["forwarders"] = len(stats)
    tot["timer_slack"] = merge(slacks) if slacks else None
    tot["modelled_drops"] = (tot["queue_drops"] + tot["loss_drops"] + tot["down_drops"]
                             + tot["lightpath_drops"] + tot["cut_drops"])
    return tot


# ---- the network faults' windows (docs/faults.md) ------------------------------------------
FAULT_KINDS = ("fiber_cut", "link_flap", "wavelength_loss")
"""The events that take lightpaths down: TCP resends what they dropped, as the model says
(the simulator's outage model: the tail loss probe, then the back-off's retransmissions)."""


def fault_fibres(summary: Mapping[str, Any]) -> set[frozenset[str]]:
    """The fibres an applied cut or flap took down during the run (summary.json
    `faults`, a held network's `lightpipe fault` rows included)."""
    out: set[frozenset[str]] = set()
    for r in summary.get("faults") or []:
        if isinstance(r, Mapping) and r.get("applied") and r.get("kind") in (
                "fiber_cut", "link_flap") and isinstance(r.get("target"), str):
            out.add(frozenset(str(r["target"]).split("-", 1)))
    return out


def fault_windows(summary: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The spans, on the machine's monotonic clock, from each network event that hit a
    job until that job's iterations were back within 5 % of their steady time
    (fault_impact's `recovery_s`; never back or failed: to the end of the run): the
    TCP retransmissions in them are the fault's, which the model explains. From
    summary.json `fault_impact` (hit rows), `events_clock_zero_monotonic_s` and the
    time factor; [] without them."""
    zero = summary.get("events_clock_zero_monotonic_s")
    jobs = summary.get("worker_jobs") or [{}]
    first = jobs[0] if isinstance(jobs, list) and isinstance(jobs[0], Mapping) else {}
    try:
        tf = Scale.of_record(first or summary, "summary.json").time_factor
    except RuntimeFailure:
        return []
    if not _is_number(zero):
        return []
    out = []
    for r in summary.get("fault_impact") or []:
        if not isinstance(r, Mapping) or not r.get("hit") or r.get("kind") not in FAULT_KINDS:
            continue
        at = r.get("applied_at_s", r.get("at_s"))
        if not _is_number(at):
            continue
        rec = r.get("recovery_s")
        end = math.inf if not _is_number(rec) or not r.get("survived", True) else \
            zero + (at + max(0.0, rec)) * tf
        out.append({"start_s": zero + at * tf, "end_s": end,
                    "what": f"{r.get('kind')} {r.get('target')} ({r.get('job')})"})
    return out


def window_tcp_segments(samples: Mapping[str, Sequence[tuple[float, int, int]]],
                        windows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """TCP segments sent and retransmitted inside `windows` (fault_windows), summed over
    the network namespaces of `samples` ({namespace: [(monotonic s, OutSegs,
    RetransSegs)]}, the workers' records: workloads.faulttol.tcp_segments). A window is
    widened to the samples around it (the last at or before its start, the first at or
    after its end, else the last), the windows of one namespace merged where they
    overlap, so no segment is counted twice."""
    out_w = retrans_w = 0
    spans = 0
    for series in samples.values():
        pts = sorted(series)
        if len(pts) < 2:
            continue
        idx = []
        for w in windows:
            a = max((k for k, p in enumerate(pts) if p[0] <= w["start_s"]), default=0)
            b = next((k for k, p in enumerate(pts) if p[0] >= w["end_s"]), len(pts) - 1)
            if b > a:
                idx.append((a, b))
        merged: list[list[int]] = []
        for a, b in sorted(idx):
            if merged and a <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], b)
            else:
                merged.append([a, b])
        for a, b in merged:
            out_w += max(0, pts[b][1] - pts[a][1])
            retrans_w += max(0, pts[b][2] - pts[a][2])
        spans += len(merged)
    return {"out_segs": out_w, "retrans_segs": retrans_w, "windows": len(windows),
            "namespaces": len(samples), "spans": spans}


def record_tcp_samples(records_by_stage: Iterable[Sequence[Mapping[str, Any]]]
                       ) -> dict[str, list[tuple[float, int, int]]]:
    """{namespace: [(monotonic s, OutSegs, RetransSegs)]} from workers' records (the
    start record's `netns` and `tcp_segs` at ready_s, each iteration's at its end_s, the
    done record's at its end_s); stages without them are left out."""
    out: dict[str, list[tuple[float, int, int]]] = {}
    for recs in records_by_stage:
        ns = next((r.get("netns") for r in recs if r.get("type") == "start"), None)
        if not isinstance(ns, str):
            continue
        for r in recs:
            t = r.get("ready_s") if r.get("type") == "start" else r.get("end_s")
            segs = r.get("tcp_segs")
            if (_is_number(t) and isinstance(segs, list) and len(segs) == 2
                    and all(isinstance(x, int) and not isinstance(x, bool) for x in segs)):
                out.setdefault(ns, []).append((float(t), int(segs[0]), int(segs[1])))
    return out


def window_segments(rate_mbps: float | None, rtt_ms: float | None) -> float | None:
    """TCP segments in flight on a path of rate_mbps and rtt_ms (emulated, as the hosts see
    them): its bandwidth-delay product; None where either is unknown."""
    from testbed.emu.tcp_tuning import MSS_BYTES

    if not rate_mbps or not rtt_ms:
        return None
    return rate_mbps * 1e6 / 8 * rtt_ms / 1000 / MSS_BYTES


# What a host's nstat counters say about why TCP resent (testbed.emu.fidelity_probe's
# TCP_FIDELITY_COUNTERS), in the order the detail names them.
RETRANSMIT_CAUSES = (("TcpExtTCPTimeouts", "time-outs"),
                     ("TcpExtTCPSpuriousRTOs", "spurious time-outs"),
                     ("TcpExtTCPLossProbes", "loss probes"),
                     ("TcpExtTCPFastRetrans", "fast retransmits"),
                     ("TcpExtTCPLostRetransmit", "retransmits lost again"),
                     ("TcpExtTCPDSACKRecv", "D-SACKs (already received)"),
                     ("TcpExtTCPSACKReorder", "reorderings"))
RECEIVER_DROPS = ("TcpExtTCPRcvQDrop", "TcpExtTCPOFODrop", "TcpExtTCPBacklogDrop",
                  "TcpExtTCPZeroWindowDrop")


def retransmit_causes(tcp: Mapping[str, Mapping[str, int]]) -> str:
    """The hosts' counters that tell a retransmission's cause, summed, those above 0:
    e.g. "12 time-outs, 300 fast retransmits, 4 dropped by the receivers (their queues
    full)"; "" where none is."""
    parts = []
    for key, what in RETRANSMIT_CAUSES:
        n = sum(int(h.get(key, 0)) for h in tcp.values())
        if n:
            parts.append(f"{n} {what}")
    drops = sum(int(h.get(k, 0)) for h in tcp.values() for k in RECEIVER_DROPS)
    if drops:
        parts.append(f"{drops} dropped by the receivers (their queues full)")
    return ", ".join(parts)


def link_invariants(tot: Mapping[str, Any] | None, tcp: Mapping[str, Mapping[str, int]],
                    scale: Scale, fabric: Mapping[str, int] | None = None,
                    switch: Mapping[str, int] | None = None,
                    max_rtt_ms: float | None = None,
                    in_faults: Mapping[str, Any] | None = None) -> list[Invariant]:
    """The forwarders' timer slack and the emulator's own drops (the forwarders' and the
    user-space switch's receive sockets: `switch`, frames of at most segments_per_frame
    segments each), and TCP's retransmissions against what was dropped: by the model
    (the forwarders' queues and loss, the shaped fabric links' queues: `fabric`) and by
    the emulator (counted against it above, so not a second time here). Their bound is
    the tighter of MAX_UNEXPLAINED_RETRANSMIT_SHARE and MAX_UNEXPLAINED_LOSSES_PER_WINDOW
    per window of the fastest lightpath at max_rtt_ms (the longest planned RTT, scenario
    time), where both are known. `in_faults` (window_tcp_segments): the segments sent
    and retransmitted while a network fault had a job stalled (the cut until its
    iterations were back within 5 %), left out of the bound: the model explains them
    (the lost window resent, the back-off's retransmissions into the dead path)."""
    tot = tot or {}
    slack = tot.get("timer_slack")
    q = quantile_s(slack, 0.99) if slack else None
    slack_inv = Invariant("forwarder_timer_slack", None if q is None else
                          scale.real_ms(1000 * q), MAX_FORWARDER_SLACK_MS, "max", "ms",
                          f"p99 of {sum(slack['counts'])} timed wake-ups" if slack else
                          "no forwarder measured",
                          "frames leave when due: the forwarders woke on time (scenario time)")
    switch = switch or {}
    switch_frames = int(switch.get("frames", 0))
    lost = tot.get("socket_drops", 0) + tot.get("send_errors", 0) + switch_frames
    frames = tot.get("rx_packets", 0) + switch_frames
    at_switch = (f" ({switch_frames} at the user-space switch's receive sockets)"
                 if switch_frames else "")
    if tot.get("cut_drops"):
        at_switch += (f"; not counted: {tot['cut_drops']} send errors of forwarders whose "
                      f"fibre a fault took down (the frames on it: the model's loss)")
    drop_inv = Invariant("emulator_drops", lost / frames if frames else None,
                         MAX_EMULATOR_DROP_SHARE, "max", "share",
                         f"{lost} of {frames} frames{at_switch}" if frames else
                         "no forwarder traffic",
                         "no frame lost outside the modelled queues and loss (kernel socket "
                         "drops at the forwarders and the user-space switch, send errors)")
    out_segs = sum(int(h.get("TcpOutSegs", 0)) for h in tcp.values())
    retrans = sum(int(h.get("TcpRetransSegs", 0)) for h in tcp.values())
    in_faults = in_faults or {}
    fault_retrans = min(retrans, int(in_faults.get("retrans_segs", 0)))
    fault_out = min(out_segs, int(in_faults.get("out_segs", 0)))
    judged_out = out_segs - fault_out
    fabric = fabric or {}
    fabric_frames = int(fabric.get("frames", 0))
    dropped = tot.get("modelled_drops", 0) + fabric_frames * int(
        fabric.get("segments_per_frame", 1)) + switch_frames * int(
        switch.get("segments_per_frame", 1))
    allowed = RETRANSMITS_PER_DROP * dropped
    unexplained = max(0.0, retrans - fault_retrans - allowed)
    by_fabric = (f" ({fabric_frames} frames of up to {fabric.get('segments_per_frame')} "
                 f"segments by the fabric's queues)" if fabric_frames else "")
    by_fabric += (f" ({switch_frames} frames of up to {switch.get('segments_per_frame')} "
                  f"segments by the switch's sockets)" if switch_frames else "")
    rtt_ms = scale.delay_ms(max_rtt_ms) if max_rtt_ms else None
    window = window_segments(tot.get("max_rate_mbps"), rtt_ms)
    bound = MAX_UNEXPLAINED_RETRANSMIT_SHARE
    per_window = ""
    if window:
        bound = min(bound, MAX_UNEXPLAINED_LOSSES_PER_WINDOW / window)
        per_window = (f"; {unexplained / judged_out * window if judged_out else 0:.2f} "
                      f"unexplained per window of {window:.0f} segments "
                      f"({tot['max_rate_mbps']:g} Mbit/s x {rtt_ms:g} ms, bound "
                      f"{MAX_UNEXPLAINED_LOSSES_PER_WINDOW:g})")
    causes = retransmit_causes(tcp) if retrans else ""
    causes = f" [{causes}]" if causes else ""
    if tot.get("cut_drops"):
        by_fabric += (f" ({tot['cut_drops']} frames on fibres when a fault took them down, "
                      f"their forwarders' send errors)")
    faults = ""
    if in_faults.get("windows"):
        faults = (f"; {fault_retrans} retransmitted and {fault_out} sent in "
                  f"{in_faults['windows']} fault window(s) left out (a network event "
                  f"that hit a job until its iterations were back within 5 %: the model "
                  f"explains them; {in_faults.get('namespaces', 0)} hosts' counters from "
                  f"their workers' records)")
    tcp_inv = Invariant("tcp_retransmits", unexplained / judged_out if judged_out else None,
                        bound, "max", "share",
                        f"{retrans} retransmitted{causes}, {dropped} dropped by the model"
                        f"{by_fabric}, of {out_segs} segments{per_window}{faults}"
                        if out_segs else "no TCP segments sent",
                        "TCP retransmits only what the rates and queues dropped (else "
                        "delay spikes fired time-outs, or frames were lost uncounted: each "
                        "holds its message back about a round trip)")
    return [slack_inv, drop_inv, tcp_inv]


def send_socket_invariant(sndbuf: Mapping[str, Any] | None) -> Invariant:
    """The user-space switch's send socket holds what its shaped ports' FIFOs hold
    (testbed.emu.sockbuf; `sndbuf` is the network's `switch_sndbuf`): else ovs-vswitchd
    drops, counted nowhere, what they queue past its buffer. Not measured where nothing
    needed it (no shaped switch port, kernel datapath); failed where it could not be done."""
    sndbuf = sndbuf or {}
    want = sndbuf.get("wanted_bytes")
    have = sndbuf.get("bytes")
    value = have / want if want and have is not None else None
    return Invariant("switch_send_socket", value, 1.0, "min", "share",
                     f"{have} of {want} bytes" if value is not None else "",
                     "no frame a shaped switch port queues is dropped uncounted by the "
                     "switch's one send socket",
                     missing=(f"not sized ({sndbuf['error']})" if sndbuf.get("error") else ""))


# ---- the verdict -------------------------------------------------------------------------
def verdict(scale: Scale, rtt_rows: Iterable[Mapping[str, Any]],
            procs: Sequence[Mapping[str, Any]] = (),
            forwarder_stats: Sequence[Mapping[str, Any]] = (),
            tcp: Mapping[str, Mapping[str, int]] | None = None,
            jobs: Sequence[Mapping[str, Any]] = (),
            host: Mapping[str, Any] | None = None,
            fabric: Mapping[str, int] | None = None,
            switch: Mapping[str, int] | None = None,
            send_socket: Mapping[str, Any] | None = None,
            receive_sockets: Mapping[str, Any] | None = None,
            faults: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """summary.json `fidelity`: faithful or not, the reasons (failed invariants), every
    invariant as a record, and what was measured (per lightpath, per process).

    rtt_rows: each lightpath's (DC pair's) RTTs as testbed.emu.verify records them (the
    run's final rows, after any re-calibration); procs: testbed.emu.procstat records of
    the run's forwarders (role "forwarder"), software switch ("switch") and workers
    ("worker"); forwarder_stats: each forwarder's stats() at the end; tcp: per host nstat
    counters (TcpOutSegs, TcpRetransSegs); jobs: summary.json worker_jobs; host: the
    machine's load (testbed.metrics.hostload summary: steal_frac); fabric: the shaped DC
    fabric links' queue drops (testbed.emu.fidelity_probe.fabric_drops); switch: the
    user-space switch's receive socket drops (testbed.emu.fidelity_probe.
    switch_socket_drops); send_socket: its send socket's sizing (the network's
    switch_sndbuf, testbed.emu.sockbuf); receive_sockets: its ports' receive sockets'
    sizing (switch_rcvbuf; recorded, their drops are `switch`'s); faults: the network
    faults the run lived through (fault_accounting: the fibres cut, the segments of the
    fault windows), whose losses the model explains."""
    faults = faults or {}
    errors = lightpath_rtt_errors(rtt_rows, scale)
    tot = forwarder_totals(forwarder_stats, faults.get("cut_fibres") or ()) \
        if forwarder_stats else None
    invs = [*rtt_invariants(errors),
            sched_delay_invariant("forwarder_sched_delay", procs, "forwarder", scale,
                                  "a woken forwarder got a CPU at once: its frames wait "
                                  "that long (scenario time)"),
            share_invariant("forwarder_cpu_share", procs, "forwarder", MIN_FORWARDER_SHARE,
                            "listed: the forwarders' share of the time they wanted a CPU "
                            "(judged by forwarder_sched_delay)", judged=False),
            sched_delay_invariant("switch_sched_delay", procs, "switch", scale,
                                  "so did the software switch (user-space datapath)"),
            share_invariant("switch_cpu_share", procs, "switch", MIN_SWITCH_SHARE,
                            "listed: the switch's share (judged by switch_sched_delay)",
                            judged=False),
            worker_share_invariant(procs, jobs),
            _worst_job(jobs, 0), _worst_job(jobs, 1),
            *link_invariants(tot, tcp or {}, scale, fabric, switch,
                             max((float(r["expected_rtt_ms"]) for r in errors
                                  if r.get("expected_rtt_ms")), default=None),
                             faults.get("tcp")),
            send_socket_invariant(send_socket),
            steal_invariant(host)]
    failed = [i for i in invs if not i.ok]
    return {"faithful": not failed, "reasons": [i.reason() for i in failed],
            "invariants": [i.as_record() for i in invs],
            **scale.as_record(),
            "lightpaths": errors, "processes": list(procs),
            "forwarders": {k: v for k, v in (tot or {}).items() if v is not None},
            "tcp": dict(tcp or {}), "fabric_drops": dict(fabric or {}),
            **({"faults": fault_record(faults)} if faults else {}),
            "switch_socket_drops": dict(switch or {}),
            **({"switch_send_buffers": dict(send_socket)} if send_socket else {}),
            **({"switch_receive_buffers": dict(receive_sockets)} if receive_sockets else {})}


def fault_accounting(summary: Mapping[str, Any],
                     records_by_stage: Iterable[Sequence[Mapping[str, Any]]] = ()
                     ) -> dict[str, Any]:
    """verdict()'s `faults` of a run: the fibres its faults took down (fault_fibres), its
    fault windows (fault_windows) and the TCP segments in them from the workers' records
    (window_tcp_segments); {} for a run without network faults."""
    cut = fault_fibres(summary)
    windows = fault_windows(summary)
    if not cut and not windows:
        return {}
    out: dict[str, Any] = {"cut_fibres": sorted(cut, key=sorted), "windows": windows}
    if windows:
        out["tcp"] = window_tcp_segments(record_tcp_samples(records_by_stage), windows)
    return out


def fault_record(faults: Mapping[str, Any]) -> dict[str, Any]:
    """The verdict's `faults` part, JSON-ready (fibres as `A-B`, an open window's end as
    null)."""
    return {"cut_fibres": ["-".join(sorted(f)) for f in faults.get("cut_fibres") or ()],
            "windows": [{**w, "end_s": w["end_s"] if math.isfinite(w["end_s"]) else None}
                        for w in faults.get("windows") or ()],
            **({"tcp": dict(faults["tcp"])} if faults.get("tcp") else {})}


def with_fidelity(verdict: Mapping[str, Any], fidelity: Mapping[str, Any]) -> dict[str, Any]:
    """The agreement verdict (testbed.metrics.agreement) with the fidelity verdict folded
    in: every failed invariant the agreement does not already name per job (its workers'
    CPU and timer slack, host steal) becomes a reason, so an unfaithful run's agreement
    is UNRELIABLE."""
    own = {"worker_compute_share", "worker_timer_slack", "host_steal"}
    out = dict(verdict)
    extra = [f"fidelity: {r}" for i, r in zip(
        [i for i in fidelity.get("invariants", []) if not i.get("ok", True)],
        fidelity.get("reasons", []), strict=False) if i.get("name") not in own]
    out["reasons"] = [*verdict.get("reasons", []), *extra]
    out["reliable"] = not out["reasons"]
    out["faithful"] = bool(fidelity.get("faithful"))
    return out


def verdict_line(v: Mapping[str, Any]) -> str:
    """One line for the end of the console output."""
    n = len(v.get("invariants", []))
    measured = sum(1 for i in v.get("invariants", []) if i.get("measured"))
    if v.get("faithful"):
        return f"fidelity: faithful ({measured} of {n} invariants measured, all within bounds)"
    return "fidelity: NOT FAITHFUL: " + "; ".join(v.get("reasons", []))
