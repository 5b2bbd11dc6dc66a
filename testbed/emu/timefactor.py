"""Choose `emulation.time_factor: auto` from measured fidelity: the smallest factor at which
every DC pair's RTT and the workers' compute stay true in scenario time (pure, no I/O).

Time dilation (Gupta et al., NSDI'06): every delay and compute time is stretched by f and
results are divided by f, so whatever the emulator itself adds shrinks by f in scenario
time. Measured at factor f0 (the calibration, testbed.emu.calibrate; the compute burst,
testbed.emu.loadprobe), per DC pair p with real one-way delay d_p (ms):

    x_p  processing per round trip (emulated ms: bridges, hosts, link emulators; does
         not grow with f)
    u_p  what a correction cannot take off: half the gap between sparse and dense
         traffic, plus the drift left after calibrating
    at f the emulator takes min(x_p / 2, d_p f) off each way, so the RTT error in
    scenario time is  e_p(f) = (max(0, x_p - 2 d_p f) + u_p) / f      <= target_ms

and for compute, ops of mean real length t (the scenario's jobs) overrun their deadlines
by o on average (emulated ms, the burst: preemption, timer wake-ups, half a work chunk),
so a stage's compute time is off by

    o / (f t) <= compute_tolerance

and the forwarders' timed wake-ups under the same load came late by s at their p99
(emulated ms, their slack histograms over the burst), which the fidelity verdict bounds
in scenario time (testbed.emu.fidelity, forwarder_timer_slack):

    s / f <= target_share x MAX_FORWARDER_SLACK_MS

f is the smallest candidate (steps of FACTOR_STEP from 1) meeting both for every pair; at
the bound, the run goes on at the bound and says that it does not fit and the way out.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from testbed.emu.fidelity import MAX_FORWARDER_SLACK_MS, MAX_OP_OVERRUN

RTT_BAND_MS = 1.0          # every DC pair: 2 x delay +- this, in scenario time
TARGET_SHARE = 0.8         # aim inside the band: room for drift between the checks
# compute: inside the verdict's op overrun bound (worker_timer_slack), as the slack is
COMPUTE_TOLERANCE = TARGET_SHARE * MAX_OP_OVERRUN
FACTOR_STEP = 0.25
WAY_OUT = ("netem and the kernel datapath in a VM (docs/vm.md: each pass costs tens of "
           "microseconds, not a user-space bridge's), more cores for the emulation, or the "
           "scenario split over several machines")


@dataclass(frozen=True)
class PathCost:
    """One DC pair as measured at the start factor."""

    pair: str
    one_way_ms: float   # real (scenario-time) one-way delay of the path
    excess_ms: float    # x_p: processing per round trip, emulated ms
    spread_ms: float    # u_p: what no correction takes off, emulated ms


@dataclass(frozen=True)
class ComputeCost:
    """The workers' compute under the scenario's load, as the burst measured it."""

    op_ms: float       # real (scenario-time) mean length of the jobs' ops
    overrun_ms: float  # emulated ms an op missed its deadline by, on average
    workers: int = 0


@dataclass(frozen=True)
class SlackCost:
    """The forwarders' timed wake-ups under the scenario's load, as the burst saw them."""

    p99_ms: float   # emulated ms: p99 of how late they woke against their deadlines
    wakeups: int = 0


@dataclass
class Choice:
    """The factor chosen, each constraint's own minimum, and the reasons in words."""

    factor: float
    fits: bool
    bound: float
    network_factor: float
    compute_factor: float
    binding_pair: str | None = None
    reasons: list[str] = field(default_factory=list)
    slack_factor: float | None = None  # what the forwarders' wake-ups need (None: unmeasured)

    def as_record(self) -> dict[str, Any]:
        return asdict(self)


def path_error_ms(p: PathCost, factor: float) -> float:
    """|RTT error| of the path in scenario time at this factor (see the module doc)."""
    return (max(0.0, p.excess_ms - 2 * p.one_way_ms * factor) + p.spread_ms) / factor


def slack_error_ms(s: SlackCost, factor: float) -> float:
    """The forwarders' p99 wake-up lateness in scenario ms at this factor."""
    return s.p99_ms / factor


def compute_error(c: ComputeCost, factor: float) -> float:
    """Relative error of the compute time at this factor."""
    if c.op_ms <= 0:
        return 0.0
    return c.overrun_ms / (factor * c.op_ms)


def candidates(start: float, bound: float) -> list[float]:
    """start, then multiples of FACTOR_STEP above it, up to the bound (included)."""
    out = [start]
    k = math.floor(start / FACTOR_STEP) + 1
    while k * FACTOR_STEP < bound:
        out.append(round(k * FACTOR_STEP, 4))
        k += 1
    if bound > start:
        out.append(bound)
    return out


def _smallest(ok: Any, cands: Sequence[float]) -> float | None:
    return next((f for f in cands if ok(f)), None)


def choose(paths: Sequence[PathCost], compute: ComputeCost | None, bound: float,
           start: float = 1.0, band_ms: float = RTT_BAND_MS,
           target_share: float = TARGET_SHARE,
           compute_tolerance: float = COMPUTE_TOLERANCE,
           slack: SlackCost | None = None,
           slack_bound_ms: float = MAX_FORWARDER_SLACK_MS) -> Choice:
    """The smallest factor in [start, bound] for which every path's RTT error is within
    target_share x band_ms, the compute overrun within compute_tolerance and the
    forwarders' p99 wake-up lateness within target_share x slack_bound_ms."""
    if not (math.isfinite(bound) and bound >= start > 0):
        raise ValueError(f"time_factor_max must be >= {start:g}, got {bound!r}")
    target = band_ms * target_share
    cands = candidates(start, bound)
    net_f: dict[str, float | None] = {
        p.pair: _smallest(lambda f, p=p: path_error_ms(p, f) <= target, cands) for p in paths}
    comp_f = (None if compute is None else
              _smallest(lambda f: compute_error(compute, f) <= compute_tolerance, cands))
    need_net = max((f if f is not None else math.inf for f in net_f.values()), default=start)
    need_comp = start if compute is None else (comp_f if comp_f is not None else math.inf)
    slack_target = slack_bound_ms * target_share
    slack_f = (None if slack is None else
               _smallest(lambda f: slack_error_ms(slack, f) <= slack_target, cands))
    need_slack = start if slack is None else (slack_f if slack_f is not None else math.inf)
    need = max(need_net, need_comp, need_slack)
    fits = math.isfinite(need)
    factor = need if fits else bound
    binding = None
    if paths:
        binding = max(paths, key=lambda p: (net_f[p.pair] or math.inf, path_error_ms(p, start)))
    reasons = []
    if binding is not None:
        reasons.append(
            f"network: {len(paths)} DC pair(s); {binding.pair} binds: processing "
            f"{binding.excess_ms:.2f} ms per round trip, +-{binding.spread_ms:.2f} ms it "
            f"cannot correct, against 2 x {binding.one_way_ms:.2f} ms: RTT error "
            f"{path_error_ms(binding, start):.2f} ms at {start:g}, "
            f"{path_error_ms(binding, factor):.2f} ms at {factor:g} (target "
            f"{target:.2f} of the +-{band_ms:g} ms band) -> needs "
            + (f"{need_net:g}" if math.isfinite(need_net) else f"more than {bound:g}"))
    else:
        reasons.append("network: no DC-pair path measured")
    if compute is not None:
        reasons.append(
            f"compute: {compute.workers} worker(s), mean op {compute.op_ms:.2f} ms, missed "
            f"by {compute.overrun_ms:.3f} ms on average under load: "
            f"{100 * compute_error(compute, start):.1f} % at {start:g}, "
            f"{100 * compute_error(compute, factor):.1f} % at {factor:g} (limit "
            f"{100 * compute_tolerance:g} %) -> needs "
            + (f"{need_comp:g}" if math.isfinite(need_comp) else f"more than {bound:g}"))
    else:
        reasons.append("compute: no workers in this workload")
    if slack is not None:
        reasons.append(
            f"forwarders: {slack.wakeups} timed wake-ups under load, p99 "
            f"{slack.p99_ms:.3f} ms late: {slack_error_ms(slack, start):.3f} ms at "
            f"{start:g}, {slack_error_ms(slack, factor):.3f} ms at {factor:g} (target "
            f"{slack_target:.2f} of the {slack_bound_ms:g} ms bound) -> needs "
            + (f"{need_slack:g}" if math.isfinite(need_slack) else f"more than {bound:g}"))
    if fits:
        reasons.append(f"chosen {factor:g}: the smallest factor (steps of {FACTOR_STEP:g} "
                       f"from {start:g}, bound {bound:g}) that meets every constraint")
    else:
        reasons.append(f"does NOT fit: even time_factor {bound:g} (emulation."
                       f"time_factor_max) leaves the run outside its band; running at "
                       f"{bound:g}. Way out: {WAY_OUT}")
    return Choice(factor=factor, fits=fits, bound=bound,
                  network_factor=need_net if math.isfinite(need_net) else -1.0,
                  compute_factor=need_comp if math.isfinite(need_comp) else -1.0,
                  binding_pair=None if binding is None else binding.pair, reasons=reasons,
                  slack_factor=None if slack is None else (
                      need_slack if math.isfinite(need_slack) else -1.0))


def path_costs(calibration: dict[str, Any], start: float) -> list[PathCost]:
    """PathCosts from a calibration record (testbed.emu.calibrate) made at factor `start`:
    x_p averaged over its rounds (each against what the fibres ran at then), the spread
    between sparse and dense echoes of its first round, and the drift: half the range of
    x_p over the rounds, or what its kept round still had beyond the model's floor."""
    rounds = calibration.get("rounds") or []
    if not rounds:
        return []
    after = {r["pair"]: r for r in calibration.get("after") or []}
    # How much each path's processing moved between the rounds (a busy machine drifts).
    seen: dict[str, list[float]] = {}
    for rnd in rounds:
        for r in rnd["paths"]:
            if r.get("excess_ms") is not None:
                seen.setdefault(r["pair"], []).append(r["excess_ms"])
    out = []
    for r in rounds[0]["paths"]:
        excess = r.get("excess_ms")
        if excess is None:
            continue
        kept = after.get(r["pair"], r)
        # The kept round's error less what the model already has (a path whose processing
        # exceeds its delay stays above the band by the difference): the drift.
        floor = max(0.0, excess - r["expected_rtt_ms"])
        drift = max(0.0, abs(kept.get("error_ms") or 0.0) - floor) if kept is not r else 0.0
        xs = seen.get(r["pair"], [excess])
        drift = max(drift, (max(xs) - min(xs)) / 2)
        excess = sum(xs) / len(xs)  # every round's measure of it (as the correction uses)
        out.append(PathCost(r["pair"], r["expected_rtt_ms"] / 2 / start, max(0.0, excess),
                            (r.get("spread_ms") or 0.0) + drift))
    return out


# Fidelity invariants (testbed.emu.fidelity) judged in scenario time whose value shrinks
# about as 1 / time_factor: what the emulator adds (processing, late wake-ups) is the same
# in emulated time, and scenario time divides it by the factor.
DILATABLE = ("rtt_median_error", "rtt_p99_error", "worker_timer_slack",
             "forwarder_timer_slack", "forwarder_sched_delay", "switch_sched_delay")


def rerun_factor(fidelity: Mapping[str, Any], factor: float, bound: float,
                 target_share: float = TARGET_SHARE) -> tuple[float | None, list[str]]:
    """After a run at `factor` whose verdict failed: the factor a rerun needs, and why.

    Each failed invariant of DILATABLE asks for factor x value / (target_share x its
    threshold) (its value at that factor would sit at target_share of its bound), rounded
    up to FACTOR_STEP and capped at the bound. None (with the reason) when no dilatable
    invariant failed, or the run was already at the bound: a rerun would not change what
    failed. Invariants that dilation does not shrink (CPU shares, drops, retransmissions,
    steal) are named but never ask for a factor."""
    failed = [i for i in fidelity.get("invariants", []) if not i.get("ok", True)]
    if not failed:
        return None, ["faithful: no rerun"]
    asks: list[tuple[float, str]] = []
    others = []
    for inv in failed:
        value, threshold = inv.get("value"), inv.get("threshold")
        if inv.get("name") in DILATABLE and isinstance(value, (int, float)) and \
                isinstance(threshold, (int, float)) and threshold > 0 and \
                math.isfinite(value) and value > 0:
            need = factor * value / (target_share * threshold)
            need = math.ceil(need / FACTOR_STEP - 1e-9) * FACTOR_STEP
            asks.append((need, f"{inv['name']} {value:.4g} against {threshold:g} at "
                               f"{factor:g} asks for {need:g}"))
        else:
            others.append(str(inv.get("name")))
    why = [w for _, w in asks]
    if others:
        why.append("not a matter of the factor: " + ", ".join(others))
    if not asks:
        return None, why
    if factor >= bound:
        return None, [*why, f"already at time_factor_max {bound:g}: no rerun. Way out: "
                            f"{WAY_OUT}"]
    nxt = min(bound, max(need for need, _ in asks))
    if nxt <= factor:
        return None, [*why, "no larger factor asked for"]
    return nxt, why
