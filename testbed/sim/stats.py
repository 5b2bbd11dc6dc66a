"""Statistics for the simulator: Erlang B, batches, and the batch-means 95 % interval."""

from __future__ import annotations

from testbed.analysis.stats import mean_ci95


def erlang_b(load_erlang: float, servers: int) -> float:
    """Blocking probability B(A, S) of an M/M/S/S loss system (stable recursion)."""
    if servers < 0 or load_erlang < 0:
        raise ValueError("load and servers must be >= 0")
    b = 1.0
    for s in range(1, servers + 1):
        b = load_erlang * b / (s + load_erlang * b)
    return b


def batch_means_ci95(values: list[float]) -> tuple[float, float, float]:
    """(mean, low, high): 95 % CI of the mean of (approximately independent) batch means."""
    mean, half = mean_ci95(values)
    return (mean, mean - half, mean + half)


def batch_sizes(total: int, batches: int) -> list[int]:
    """Split total requests into up to `batches` consecutive batches of near-equal size."""
    batches = max(1, min(batches, total))
    base, extra = divmod(total, batches)
    return [base + (1 if i < extra else 0) for i in range(batches)]
