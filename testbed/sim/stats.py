"""Statistics for the simulator: Erlang B and batch-means 95 % confidence intervals."""

from __future__ import annotations

import math
from statistics import NormalDist

# Two-sided 95 % Student t quantiles t_{0.975, df}, df = 1..30.
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
         2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
         2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def erlang_b(load_erlang: float, servers: int) -> float:
    """Blocking probability B(A, S) of an M/M/S/S loss system (stable recursion)."""
    if servers < 0 or load_erlang < 0:
        raise ValueError("load and servers must be >= 0")
    b = 1.0
    for s in range(1, servers + 1):
        b = load_erlang * b / (s + load_erlang * b)
    return b


def t975(df: int) -> float:
    """Student t 97.5 % quantile (table to df 30, then Cornish-Fisher from the normal)."""
    if df < 1:
        return math.inf
    if df <= len(_T975):
        return _T975[df - 1]
    z = NormalDist().inv_cdf(0.975)
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


def batch_means_ci95(values: list[float]) -> tuple[float, float, float]:
    """(mean, low, high): 95 % CI of the mean of (approximately independent) batch means."""
    b = len(values)
    if b == 0:
        return (math.nan, math.nan, math.nan)
    mean = sum(values) / b
    if b == 1:
        return (mean, math.nan, math.nan)
    var = sum((v - mean) ** 2 for v in values) / (b - 1)
    half = t975(b - 1) * math.sqrt(var / b)
    return (mean, mean - half, mean + half)


def batch_sizes(total: int, batches: int) -> list[int]:
    """Split total requests into up to `batches` consecutive batches of near-equal size."""
    batches = max(1, min(batches, total))
    base, extra = divmod(total, batches)
    return [base + (1 if i < extra else 0) for i in range(batches)]
