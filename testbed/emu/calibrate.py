"""Delay calibration of a live network: ping every DC pair's path and take the path's own
processing time (switches, veths, link emulators) off its fibres' emulated delays.

    record = calibrate_network(net)          # after the lightpaths are set up
    record = link_testbed.calibrate()        # one fibre (testbed.emu.linkbench)

Each round pings every path (median of N echoes), stops once every path's median RTT is
within SETTLE_MS of 2 x its configured one-way delay, else solves the corrections
(testbed.emu.delaycal) and sets every fibre's emulator to delay - correction at runtime
(the forwarder's control socket; `tc change` of the netem leaves), and, where the
emulator can (the forwarder; netem where the lightpath has its cap class), each
lightpath's frames a further per-path correction
for what the shared per-fibre values leave of that path's processing. The record (rounds,
corrections, before/after per path) goes into network.json and verification.json.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from testbed.emu.batches import ping_parallel, run_batched
from testbed.emu.delaycal import (
    SETTLE_MS,
    PathRtt,
    path_corrections,
    path_row,
    pooled,
    settled,
    solve_corrections,
)
from testbed.emu.links import LinkEmulator
from testbed.emu.live import LiveNetwork
from testbed.emu.probes import icmp_ping

log = logging.getLogger(__name__)

MIN_REPLIES_FRACTION = 0.5  # a path with fewer replies is left out of the solve
WARMUP_PINGS = 3  # flows and caches first: the first echoes of a path are slow


@dataclass(frozen=True)
class CalibrationConfig:
    """How hard to calibrate: pings per path and round, rounds, bounds."""

    pings: int = 20
    interval_s: float = 0.02
    rounds: int = 3           # corrections applied at most this many times
    settle_ms: float = SETTLE_MS
    max_fraction: float = 1.0  # a fibre gives back at most this share of its delay
    per_path: bool = True      # each lightpath corrected on its own, where the emulator can
    dense_pings: int = 100     # and a dense stream per path and round (0: sparse pings only)
    dense_interval_s: float = 0.002
    parallel: int | None = None  # paths pinged at a time (only paths that share no
    # fibre; None: testbed.emu.batches.ping_parallel of the number of paths)

    @classmethod
    def for_link_mode(cls, link_mode: str) -> CalibrationConfig:
        """The default for a link mode. netem links (the VM's kernel path) keep the
        calibration CI measured them with, sparse echoes on each fibre: the per-lightpath
        centred correction was measured on user-space links only, and in the TCG guest it
        took the netem link's processing off twice (RTT 17.95 ms for a planned 20)."""
        if link_mode == "netem":
            return cls(per_path=False, dense_pings=0)
        return cls()


@dataclass(frozen=True)
class PathProbe:
    """How to ping one path: from a host namespace to an address, across these fibres."""

    pair: str
    src_ns: str
    dst_ip: str
    fibres: tuple[str, ...]
    configured_ms: float
    vlan: int | None = None


def ping_path(probe: PathProbe, count: int, interval_s: float, dense_count: int = 0,
              dense_interval_s: float = 0.002) -> PathRtt:
    """The path's RTTs over count echoes (after a short warm-up), and over dense_count
    echoes dense_interval_s apart."""
    icmp_ping(probe.src_ns, probe.dst_ip, count=WARMUP_PINGS, interval_s=interval_s)
    got = icmp_ping(probe.src_ns, probe.dst_ip, count=count, interval_s=interval_s)
    dense = icmp_ping(probe.src_ns, probe.dst_ip, count=dense_count,
                      interval_s=dense_interval_s) if dense_count else []
    return PathRtt(probe.pair, probe.fibres, probe.configured_ms,
                   tuple(r for r in got if r is not None), probe.vlan,
                   dense_rtts_ms=tuple(r for r in dense if r is not None))


def measure(probes: list[PathProbe], cfg: CalibrationConfig) -> list[PathRtt]:
    """Every path; paths that share no fibre side by side (cfg.parallel at a time, by
    default one at a time on small networks; 1: one after the other).

    The dense stream (its median is the other end of the centre that is corrected) only
    where paths are pinged one at a time: side by side, eight dense streams load the one
    user-space switch daemon they all cross, and one at a time they are measured under
    other conditions than the verification's side-by-side sparse echoes (NSFNET-14 at load
    ~9: 18/91 pairs in the band against 56/91 calibrated on sparse echoes alone). There,
    the sparse echoes as before, and the traffic dependence is left to the time factor."""
    parallel = cfg.parallel if cfg.parallel is not None else ping_parallel(len(probes))
    dense = cfg.dense_pings if parallel <= 1 else 0
    return run_batched(probes, [frozenset(p.fibres) for p in probes],
                       lambda p: ping_path(p, cfg.pings, cfg.interval_s, dense,
                                           cfg.dense_interval_s), parallel)


def calibrate(emulators: Mapping[str, LinkEmulator], measure_paths: Callable[[],
              list[PathRtt]], cfg: CalibrationConfig | None = None) -> dict[str, Any]:
    """Measure, correct, re-measure (up to cfg.rounds corrections); the record."""
    cfg = cfg or CalibrationConfig()
    t0 = time.monotonic()
    delay = {k: e.fibre.delay_ms for k, e in emulators.items()}
    rounds: list[dict[str, Any]] = []
    on_path: set[str] = set()
    per_path: dict[str, dict[str, float]] = {}
    error = None

    measured_any: list[bool] = []

    def take() -> list[PathRtt]:
        # What each path's frames run at now (its lightpath's own correction included).
        got = [dataclasses.replace(p, emulated_ms=sum(
            emulators[f].emulated_delay_ms(p.vlan) for f in p.fibres))
            for p in measure_paths()]
        measured_any.append(bool(got))
        usable = [p for p in got if len(p.rtts_ms) >= MIN_REPLIES_FRACTION * cfg.pings]
        for p in got:
            if p not in usable:
                log.warning("delay calibration: path %s: %d of %d echoes answered; left out",
                            p.pair, len(p.rtts_ms), cfg.pings)
        rounds.append({"round": len(rounds),
                       "emulated_delay_ms": {k: round(e.emulated_delay_ms(), 4)
                                             for k, e in emulators.items()},
                       "paths": [path_row(p) for p in usable]})
        _log_round(rounds[-1])
        return usable

    paths = take()
    history = [paths]
    for p in paths:
        on_path.update(p.fibres)
    probed = any(measured_any)
    if not paths and probed:
        error = "no DC-pair path answered enough echoes"
    settings = [_settings(emulators)]  # what each round ran at
    # Each lightpath on its own (its VLAN's frames on its own fibres), where every path is
    # a lightpath and its emulators can delay it apart; else one shared value per fibre,
    # solved over the measured paths, and fibres on none of them left as they are.
    own = cfg.per_path and bool(paths) and all(p.vlan is not None for p in paths)
    for _ in range(cfg.rounds):
        if not paths or settled(paths, cfg.settle_ms):
            break
        emulated = {k: e.emulated_delay_ms() for k, e in emulators.items()}
        # Each path's processing averaged over the rounds so far (noise shrinks).
        est = pooled([[p for p in r if p.pair in {q.pair for q in paths}] for r in history])
        if own:
            own = _own_corrections(emulators, est, delay, emulated, cfg, per_path)
            if own:
                paths = take()
                history.append(paths)
                settings.append(_settings(emulators))
                continue
            log.info("delay calibration: an emulator cannot delay a lightpath apart; "
                     "one shared correction per fibre")
        measured = {f for p in est for f in p.fibres}
        corr = solve_corrections(est, {f: delay[f] for f in measured}, emulated,
                                 cfg.max_fraction)
        for k in measured:
            emulators[k].set_delay_correction(corr[k])
        if cfg.per_path:
            shares = path_corrections(est, delay, corr, emulated, cfg.max_fraction)
            for p in est:
                if p.vlan is None:
                    continue
                for f, r in shares[p.pair].items():
                    if emulators[f].set_vlan_correction(p.vlan, r):
                        per_path.setdefault(p.pair, {})[f] = r
        paths = take()
        history.append(paths)
        settings.append(_settings(emulators))
    # Noise on a busy machine can make a later round worse than an earlier one: keep the
    # settings of the round whose worst path was closest.
    best = min(range(len(history)), key=lambda i: (_worst_ms(history[i]), -i))
    kept = len(history) - 1
    if history[best] and _worst_ms(history[best]) < _worst_ms(history[-1]):
        _restore(emulators, settings[best])
        kept = best
        paths = history[best]
    fibres = [{"middle": k, "fibre": f"{e.fibre.u}-{e.fibre.v}", "delay_ms": delay[k],
               # What is taken off in all (netem's start-up guess where not corrected).
               "correction_ms": round(delay[k] - e.emulated_delay_ms(), 4),
               "emulated_delay_ms": round(e.emulated_delay_ms(), 4),
               "on_measured_path": k in on_path}
              for k, e in emulators.items()]
    done = settled(paths, cfg.settle_ms) if paths else not probed  # no DC pair: nothing to do
    if kept != len(history) - 1:  # the per-lightpath corrections as that round ran
        vlan_of = {p.pair: p.vlan for r in history for p in r}
        ran = settings[kept][1]
        per_path = {pair: {f: ran[f][vlan_of[pair]] for f in shares  # type: ignore[index]
                           if vlan_of[pair] in ran[f]}
                    for pair, shares in per_path.items()}
    record = {"enabled": True, "config": asdict(cfg), "settled": done, "error": error,
              "mode": "per_lightpath" if own else "per_fibre",
              "corrections_applied": len(rounds) - 1, "rounds": rounds, "fibres": fibres,
              "path_corrections_ms": per_path, "kept_round": kept,
              "before": rounds[0]["paths"], "after": rounds[kept]["paths"],
              "wall_s": round(time.monotonic() - t0, 3)}
    log.info("delay calibration: %d correction round(s) in %.1f s, %s; corrections %s",
             record["corrections_applied"], record["wall_s"],
             "settled" if done else "not settled",
             {f["fibre"]: f["correction_ms"] for f in fibres if f["correction_ms"]})
    return record


def _own_corrections(emulators: Mapping[str, LinkEmulator], est: list[PathRtt],
                     delay: Mapping[str, float], emulated: Mapping[str, float],
                     cfg: CalibrationConfig, per_path: dict[str, dict[str, float]]) -> bool:
    """Each lightpath's measured processing as its own correction, spread over its fibres
    in proportion to their delays; False (nothing kept) where an emulator cannot."""
    shares = path_corrections(est, delay, {}, emulated, cfg.max_fraction)
    for p in est:
        assert p.vlan is not None
        for f, r in shares[p.pair].items():
            if not emulators[f].set_vlan_correction(p.vlan, r):
                return False
            per_path.setdefault(p.pair, {})[f] = r
    return True


Settings = tuple[dict[str, float], dict[str, dict[int, float]]]


def _settings(emulators: Mapping[str, LinkEmulator]) -> Settings:
    """What every emulator takes off its fibre's delay now (the correction, or netem's
    start-up guess before any), and its per-lightpath corrections."""
    return ({k: e.fibre.delay_ms - e.emulated_delay_ms() for k, e in emulators.items()},
            {k: dict(e.vlan_corrections_ms) for k, e in emulators.items()})


def _restore(emulators: Mapping[str, LinkEmulator], s: Settings) -> None:
    """Put every emulator back to the settings s (as a round ran at them)."""
    fibre, per_vlan = s
    for k, e in emulators.items():
        if abs((e.fibre.delay_ms - e.emulated_delay_ms()) - fibre[k]) > 1e-9:
            e.set_delay_correction(fibre[k])
        for vlan in set(e.vlan_corrections_ms) | set(per_vlan[k]):
            want = per_vlan[k].get(vlan, 0.0)
            if e.vlan_corrections_ms.get(vlan, 0.0) != want:
                e.set_vlan_correction(vlan, want)


def _worst_ms(paths: list[PathRtt]) -> float:
    return max((abs(p.error_ms) for p in paths), default=float("inf"))


def _log_round(rnd: dict[str, Any]) -> None:
    for row in rnd["paths"]:
        log.info("delay calibration round %d: %s (%d hops) RTT median %.2f ms max %.2f "
                 "(expected %.2f, error %+.2f)", rnd["round"], row["pair"], row["hops"],
                 row["median_ms"], row["max_ms"], row["expected_rtt_ms"], row["error_ms"])


def network_probes(net: LiveNetwork) -> list[PathProbe]:
    """One probe per DC-pair lightpath of a live EmuNetwork: first host to first host."""
    p = net.plan
    out = []
    for lp in p.lightpaths:
        ha = next(h for h in p.hosts if h.dc == lp.dc_a)
        hb = next(h for h in p.hosts if h.dc == lp.dc_b)
        fibres = tuple(p.fibre(u, v).middle for u, v in itertools.pairwise(lp.path))
        configured = sum(p.fibre(u, v).delay_ms for u, v in itertools.pairwise(lp.path))
        out.append(PathProbe(f"{lp.dc_a}~{lp.dc_b}", f"/proc/{net.host_pid(ha.name)}/ns/net",
                             hb.ip.split("/")[0], fibres, configured, lp.vlan))
    return out


def calibrate_network(net: LiveNetwork, cfg: CalibrationConfig | None = None) -> dict[str, Any]:
    """Calibrate every fibre of a live EmuNetwork on its DC-pair lightpaths."""
    cfg = cfg or CalibrationConfig.for_link_mode(net.link_mode)
    probes = network_probes(net)
    record = calibrate(net.emulators, lambda: measure(probes, cfg), cfg)
    record["link_mode"] = net.link_mode
    record["datapath"] = net.datapath
    return record


def disabled_record() -> dict[str, Any]:
    """What the records hold when the scenario turns the calibration off."""
    return {"enabled": False}
