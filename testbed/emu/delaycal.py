"""Pure delay calibration: per-fibre corrections from measured DC-pair RTTs (no I/O).

A packet between two DCs crosses hosts, switches and link emulators that each take some
time of their own, so a path's measured RTT exceeds 2 x its configured one-way delay. The
calibration (testbed.emu.calibrate) pings every DC pair, and this module turns the
medians into one correction per fibre: how much of its configured delay the fibre's
emulator leaves out so that the path's processing time fills it.

    x_p = RTT_p - 2 x sum(emulated delay of p's fibres)     processing per round trip
    c   = argmin || A c - x / 2 ||^2 + w || c - h ||^2,  0 <= c_f <= max_fraction x d_f

A[p, f] = 1 where path p crosses fibre f (a fibre shared by paths gets one value), h is
the per-hop estimate sum(x / 2) / sum(hops) (it decides what the measurements leave
open: more fibres than paths, and fibres on no measured path), and w is small so the
measurements decide the rest. Solved by bounded least squares (scipy lsq_linear). The
emulator then runs each fibre at d_f - c_f.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

# Relative weight of the per-hop prior against one measured path.
PRIOR_WEIGHT = 0.05
# A path whose median RTT is within this of 2 x its configured delay needs no correction.
SETTLE_MS = 0.25
# The verification's bound on every DC pair's median RTT: 2 x configured one-way +- this.
RTT_TOL_MS = 1.0


@dataclass(frozen=True)
class PathRtt:
    """One DC pair's path and the RTTs measured along it."""

    pair: str                      # "dc-a~dc-b"
    fibres: tuple[str, ...]        # fibre keys (middle node names) along the path
    configured_ms: float           # one-way: the sum of the fibres' configured delays
    rtts_ms: tuple[float, ...]     # replies received (lost echoes left out)
    vlan: int | None = None        # the lightpath's VLAN id, where the path is one
    # One-way: the sum of what the fibres ran this path's frames at while measured (None:
    # the fibres' emulated delays as given to the solve).
    emulated_ms: float | None = None
    # A dense stream's RTTs on the same path (echoes 2 ms apart; empty: not measured). The
    # user-space bridges take less time per packet when they are kept busy, so the path's
    # processing lies between what sparse and dense echoes see: the centre is corrected.
    dense_rtts_ms: tuple[float, ...] = ()

    @property
    def sparse_median_ms(self) -> float:
        return statistics.median(self.rtts_ms)

    @property
    def dense_median_ms(self) -> float | None:
        return statistics.median(self.dense_rtts_ms) if self.dense_rtts_ms else None

    @property
    def median_ms(self) -> float:
        """The centre of the sparse and dense echoes' medians (the sparse one alone where
        no dense stream was measured)."""
        dense = self.dense_median_ms
        sparse = self.sparse_median_ms
        return sparse if dense is None else (sparse + dense) / 2

    @property
    def spread_ms(self) -> float:
        """Half the gap between the sparse and dense medians: what the centre leaves."""
        dense = self.dense_median_ms
        return 0.0 if dense is None else abs(self.sparse_median_ms - dense) / 2

    @property
    def error_ms(self) -> float:
        """Median RTT (the centre) minus 2 x the configured one-way delay."""
        return self.median_ms - 2 * self.configured_ms


def excess_ms(path: PathRtt, emulated_ms: Mapping[str, float]) -> float:
    """Processing time per round trip: median RTT - 2 x the sum of the emulated delays."""
    if path.emulated_ms is not None:
        return path.median_ms - 2 * path.emulated_ms
    return path.median_ms - 2 * sum(emulated_ms[f] for f in path.fibres)


def per_hop_ms(paths: Sequence[PathRtt], emulated_ms: Mapping[str, float]) -> float:
    """Processing per fibre pass, all paths pooled: sum(x / 2) / sum(hops), >= 0."""
    hops = sum(len(p.fibres) for p in paths)
    if not hops:
        return 0.0
    return max(0.0, sum(excess_ms(p, emulated_ms) / 2 for p in paths) / hops)


def solve_corrections(paths: Sequence[PathRtt], delay_ms: Mapping[str, float],
                      emulated_ms: Mapping[str, float], max_fraction: float = 1.0,
                      prior_weight: float = PRIOR_WEIGHT) -> dict[str, float]:
    """Correction c_f (ms per pass) of every fibre of delay_ms (its configured one-way
    delay) from the paths measured while each fibre ran at emulated_ms[f]."""
    import numpy as np
    from scipy.optimize import lsq_linear

    if not 0 <= max_fraction <= 1:
        raise ValueError(f"max_fraction must be in [0, 1], not {max_fraction}")
    for p in paths:
        missing = [f for f in p.fibres if f not in delay_ms or f not in emulated_ms]
        if missing:
            raise ValueError(f"path {p.pair}: unknown fibre(s) {missing}")
        if not p.rtts_ms:
            raise ValueError(f"path {p.pair}: no RTT measured")
    h = per_hop_ms(paths, emulated_ms)
    # Fibres without delay cannot give any back: c_f = 0, left out of the solve.
    free = [f for f in sorted(delay_ms) if max_fraction * delay_ms[f] > 0]
    out = {f: 0.0 for f in delay_ms}
    if not free:
        return out
    col = {f: i for i, f in enumerate(free)}
    rows, rhs = [], []
    for p in paths:
        row = np.zeros(len(free))
        for f in p.fibres:
            if f in col:
                row[col[f]] = 1.0
        rows.append(row)
        rhs.append(excess_ms(p, emulated_ms) / 2)
    s = float(np.sqrt(prior_weight))
    for f in free:
        row = np.zeros(len(free))
        row[col[f]] = s
        rows.append(row)
        rhs.append(s * min(h, max_fraction * delay_ms[f]))
    hi = np.array([max_fraction * delay_ms[f] for f in free])
    res = lsq_linear(np.array(rows), np.array(rhs), bounds=(np.zeros(len(free)), hi),
                     method="bvls")
    for f, c in zip(free, res.x, strict=True):
        out[f] = round(float(min(max(c, 0.0), max_fraction * delay_ms[f])), 4)
    return out


def pooled(rounds: Sequence[Sequence[PathRtt]]) -> list[PathRtt]:
    """The latest round's paths with each path's processing time averaged over every
    round it was measured in (processing does not depend on the corrections; its
    measurement noise does shrink with rounds): one RTT, 2 x the latest emulated delay +
    the mean of x_p. Paths need emulated_ms."""
    seen: dict[str, list[float]] = {}
    spread: dict[str, list[float]] = {}
    for paths in rounds:
        for p in paths:
            if p.emulated_ms is None:
                raise ValueError(f"path {p.pair}: pooling needs emulated_ms")
            seen.setdefault(p.pair, []).append(p.median_ms - 2 * p.emulated_ms)
            spread.setdefault(p.pair, []).append(p.spread_ms)
    out = []
    for p in rounds[-1]:
        x = statistics.fmean(seen[p.pair])
        assert p.emulated_ms is not None
        s = statistics.fmean(spread[p.pair])  # kept: the sparse and dense medians +- s
        centre = 2 * p.emulated_ms + x
        out.append(PathRtt(p.pair, p.fibres, p.configured_ms, (centre + s,), p.vlan,
                           p.emulated_ms, (centre - s,) if s else ()))
    return out


def path_corrections(paths: Sequence[PathRtt], delay_ms: Mapping[str, float],
                     corrections_ms: Mapping[str, float], emulated_ms: Mapping[str, float],
                     max_fraction: float = 1.0) -> dict[str, dict[str, float]]:
    """Per path and fibre: what the shared corrections leave of the path's processing,
    r_p = x_p / 2 - sum(c_f), for an emulator that delays lightpaths apart (the DCs' ends
    are a cost per path that per-fibre values cannot fit: shared fibres, 1-3 hops).

    r_p > 0 is spread in proportion to the room each fibre has left (max_fraction x d_f
    - c_f; never more in all), r_p < 0 (the shared values overshoot) evenly: a longer
    delay has no bound."""
    out: dict[str, dict[str, float]] = {}
    for p in paths:
        r = excess_ms(p, emulated_ms) / 2 - sum(corrections_ms.get(f, 0.0) for f in p.fibres)
        if r >= 0:
            room = {f: max(0.0, max_fraction * delay_ms[f] - corrections_ms.get(f, 0.0))
                    for f in p.fibres}
            total = sum(room.values())
            take = min(r, total)
            out[p.pair] = {f: round(take * room[f] / total, 4) if total else 0.0
                           for f in p.fibres}
        else:
            out[p.pair] = {f: round(r / len(p.fibres), 4) for f in p.fibres}
    return out


def emulated_delays(delay_ms: Mapping[str, float],
                    corrections_ms: Mapping[str, float]) -> dict[str, float]:
    """What each fibre's emulator runs at: d_f - c_f (never below 0)."""
    return {f: max(0.0, d - corrections_ms.get(f, 0.0)) for f, d in delay_ms.items()}


def settled(paths: Sequence[PathRtt], settle_ms: float = SETTLE_MS) -> bool:
    """Every path's median RTT within settle_ms of 2 x its configured delay."""
    return all(abs(p.error_ms) <= settle_ms for p in paths)


def rtt_ok(median_ms: float | None, configured_one_way_ms: float,
           tol_ms: float = RTT_TOL_MS) -> bool:
    """The verification's bound: median RTT within 2 x configured one-way +- tol_ms."""
    return median_ms is not None and abs(median_ms - 2 * configured_one_way_ms) <= tol_ms


def path_row(p: PathRtt) -> dict[str, object]:
    """One path's figures for the records (ms, rounded)."""
    got = sorted(p.rtts_ms)
    dense = p.dense_median_ms
    return {"pair": p.pair, "hops": len(p.fibres), "fibres": list(p.fibres),
            "expected_rtt_ms": round(2 * p.configured_ms, 4), "pings": len(got),
            "median_ms": round(p.median_ms, 4), "max_ms": round(got[-1], 4),
            "error_ms": round(p.error_ms, 4),
            "sparse_median_ms": round(p.sparse_median_ms, 4),
            "dense_median_ms": None if dense is None else round(dense, 4),
            "dense_pings": len(p.dense_rtts_ms), "spread_ms": round(p.spread_ms, 4),
            # The path's own processing per round trip at what its fibres ran it at.
            "excess_ms": None if p.emulated_ms is None else round(
                p.median_ms - 2 * p.emulated_ms, 4)}
