"""Confidence intervals: one Student-t interval of a mean, used by every summary and table."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from scipy.special import stdtrit  # the t quantile, without loading all of scipy.stats


def t975(df: int) -> float:
    """Two-sided 95 % Student t quantile t_{0.975, df} (scipy); inf for df < 1."""
    if df < 1:
        return math.inf
    return float(stdtrit(df, 0.975))


def mean_ci95(values: Sequence[float]) -> tuple[float, float]:
    """(mean, half-width of its 95 % confidence interval), Student t for len(values).

    No values: (nan, nan); one value: (value, nan), there is no spread to measure.
    """
    n = len(values)
    if n == 0:
        return math.nan, math.nan
    mean = statistics.fmean(values)
    if n == 1:
        return mean, math.nan
    return mean, t975(n - 1) * statistics.stdev(values) / math.sqrt(n)


def batch_means(values: Sequence[float], batches: int) -> list[float]:
    """Means of `batches` consecutive equal batches (the tail that does not fill one is
    left out), for an interval over correlated samples of one run."""
    size = len(values) // batches
    return [statistics.fmean(values[i * size:(i + 1) * size]) for i in range(batches)]
