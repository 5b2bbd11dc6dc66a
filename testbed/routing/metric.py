"""The two-layer max-min metric (jobs by bottleneck, then flows) and completion times."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import networkx as nx
import numpy as np

from testbed.routing.flows import Flow, Job
from testbed.routing.maxmin import max_min_rates

# Rates are compared after rounding to this many decimals (Gb/s), so that float noise in
# progressive filling never decides between two routings.
RATE_DECIMALS = 6


@dataclass(frozen=True)
class JobResult:
    """One job under a routing: its slowest flow's rate and its collective's time."""

    job: str
    bottleneck_gbps: float
    allreduce_time_s: float


@dataclass(frozen=True)
class Evaluation:
    """A routing rated: flow rates, per-job results, the metric key and the summaries."""

    rates_gbps: dict[str, float]
    jobs: tuple[JobResult, ...]
    key: tuple[tuple[float, ...], tuple[float, ...]]
    mean_allreduce_time_s: float
    max_allreduce_time_s: float
    effective_gpu_utilization: float

    @property
    def bottleneck_gbps(self) -> float:
        """The metric's first component: the slowest job's bottleneck."""
        return self.key[0][0] if self.key[0] else float("inf")

    @property
    def metric(self) -> list[float]:
        """The first layer as a list: job bottlenecks sorted ascending."""
        return list(self.key[0])


def metric_key(job_bottlenecks_gbps: Sequence[float], flow_rates_gbps: Sequence[float]
               ) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Sortable key: larger is better. Jobs' bottlenecks sorted ascending (compared
    lexicographically, the slowest job first), ties broken by the sorted flow rates."""
    jb = np.round(np.sort(np.asarray(job_bottlenecks_gbps, dtype=float)), RATE_DECIMALS)
    fr = np.round(np.sort(np.asarray(flow_rates_gbps, dtype=float)), RATE_DECIMALS)
    return tuple(jb.tolist()), tuple(fr.tolist())


def better(a: tuple, b: tuple) -> bool:
    """True if metric key `a` is strictly better than `b`."""
    return a > b


def job_bottlenecks(flows: Sequence[Flow], rates: Mapping[str, float]) -> dict[str, float]:
    """Per job, the rate of its slowest flow."""
    out: dict[str, float] = {}
    for f in flows:
        r = rates[f.id]
        if f.job not in out or r < out[f.job]:
            out[f.job] = r
    return out


def collective_time_s(flows: Sequence[Flow], rates: Mapping[str, float],
                      hops: Mapping[str, int], hop_latency_us: float = 1.0,
                      steps: int | None = None) -> float:
    """A collective's completion time: its slowest flow's bytes / rate, plus latency terms
    (`steps` sequential exchanges, each one path latency = hops x hop latency; ring
    all-reduce: 2(n-1) steps)."""
    if not flows:
        return 0.0
    if steps is None:
        steps = 2 * (len(flows) - 1)
    transfer = max(f.demand_bytes * 8.0 / (rates[f.id] * 1e9) for f in flows)
    latency = steps * max(hops[f.id] for f in flows) * hop_latency_us * 1e-6
    return transfer + latency


def evaluate(graph: nx.DiGraph, flows: Sequence[Flow], paths: Mapping[str, Sequence[str]],
             jobs: Sequence[Job] | None = None, *, hop_latency_us: float = 1.0,
             overlap: float = 0.0, rates_gbps: Mapping[str, float] | None = None
             ) -> Evaluation:
    """Rate a routing: max-min rates, per-job bottleneck and collective time, the metric,
    mean/max completion time and effective GPU utilisation = compute / (compute + exposed
    communication), exposed = max(0, communication - overlap x compute), mean over jobs
    (compute per iteration from `jobs`, 0.2 s where a job is not given)."""
    rates = dict(rates_gbps) if rates_gbps is not None else max_min_rates(graph, paths)
    by_job: dict[str, list[Flow]] = {}
    for f in flows:
        by_job.setdefault(f.job, []).append(f)
    hops = {f.id: len(paths[f.id]) - 1 for f in flows}
    compute = {j.name: j.compute_s for j in jobs or ()}
    results, utils = [], []
    for name, fl in by_job.items():
        bott = min(rates[f.id] for f in fl)
        pattern = next((j.pattern for j in jobs or () if j.name == name), "ring")
        steps = 2 * (len(fl) - 1) if pattern == "ring" else 1
        t = collective_time_s(fl, rates, hops, hop_latency_us, steps)
        results.append(JobResult(name, bott, t))
        c = compute.get(name, 0.2)
        exposed = max(0.0, t - overlap * c)
        utils.append(c / (c + exposed) if c + exposed > 0 else 1.0)
    key = metric_key([r.bottleneck_gbps for r in results], [rates[f.id] for f in flows])
    times = [r.allreduce_time_s for r in results]
    return Evaluation(rates, tuple(results), key,
                      float(np.mean(times)) if times else 0.0,
                      float(max(times)) if times else 0.0,
                      float(np.mean(utils)) if utils else 1.0)
