"""Flows of ML jobs (ring all-reduce, pipeline, all-to-all) and seeded job placements."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import networkx as nx

from testbed.errors import InputError
from testbed.routing.topology import hosts as host_nodes


@dataclass(frozen=True)
class Flow:
    """One long-lived transfer: `demand_bytes` from host `src` to host `dst` for `job`."""

    id: str
    job: str
    src: str
    dst: str
    demand_bytes: float


@dataclass(frozen=True)
class Job:
    """A job's hosts (ring order), its collective and its compute time per iteration."""

    name: str
    members: tuple[str, ...]
    buffer_bytes: float = 1e9
    compute_s: float = 0.2
    pattern: str = "ring"  # ring | pipeline | all_to_all


def ring_allreduce_flows(job: str, members: Sequence[str], buffer_bytes: float) -> list[Flow]:
    """Ring all-reduce: member i sends to member i+1; n flows, each 2(n-1)/n x buffer."""
    n = len(members)
    if n < 2:
        return []
    per_flow = 2.0 * (n - 1) / n * float(buffer_bytes)
    return [Flow(f"{job}/{i}", job, members[i], members[(i + 1) % n], per_flow)
            for i in range(n)]


def pipeline_flows(job: str, stages: Sequence[str], activation_bytes: float,
                   backward: bool = True) -> list[Flow]:
    """Pipeline stage-to-stage transfers: activations forward (and gradients back)."""
    out = [Flow(f"{job}/f{i}", job, stages[i], stages[i + 1], float(activation_bytes))
           for i in range(len(stages) - 1)]
    if backward:
        out += [Flow(f"{job}/b{i}", job, stages[i + 1], stages[i], float(activation_bytes))
                for i in range(len(stages) - 1)]
    return out


def all_to_all_flows(job: str, members: Sequence[str], bytes_per_pair: float) -> list[Flow]:
    """All-to-all (e.g. expert parallelism): one flow per ordered pair of members."""
    return [Flow(f"{job}/{i}-{j}", job, a, b, float(bytes_per_pair))
            for i, a in enumerate(members) for j, b in enumerate(members) if i != j]


def job_flows(job: Job) -> list[Flow]:
    """The flows of one job by its pattern."""
    if job.pattern == "ring":
        return ring_allreduce_flows(job.name, job.members, job.buffer_bytes)
    if job.pattern == "pipeline":
        return pipeline_flows(job.name, job.members, job.buffer_bytes)
    if job.pattern == "all_to_all":
        n = len(job.members)
        return all_to_all_flows(job.name, job.members, job.buffer_bytes / max(1, n))
    raise InputError("pattern", f"unknown traffic pattern {job.pattern!r}; valid: "
                     "ring, pipeline, all_to_all")


def flows_of(jobs: Sequence[Job]) -> list[Flow]:
    """All flows of all jobs, in job order."""
    return [f for j in jobs for f in job_flows(j)]


def jobs_on_clos(graph: nx.DiGraph, jobs: int, ring_size: int, *, seed: int,
                 buffer_bytes: float = 1e9, compute_s: float = 0.2, pattern: str = "ring",
                 placement: str = "random") -> list[Job]:
    """`jobs` jobs of `ring_size` hosts each on the fabric's hosts, from a seed.

    placement `random`: hosts drawn at random (jobs interleave over leaves, as a busy
    cluster's scheduler leaves them); `packed`: consecutive hosts (fills leaf by leaf).
    InputError if the fabric has fewer hosts than jobs x ring_size.
    """
    if jobs < 1:
        raise InputError("--jobs", f"must be >= 1, got {jobs}")
    if ring_size < 2:
        raise InputError("--ring-size", f"must be >= 2, got {ring_size}")
    hs = host_nodes(graph)
    if jobs * ring_size > len(hs):
        raise InputError("--jobs", f"{jobs} jobs x {ring_size} hosts need {jobs * ring_size} "
                         f"hosts; the fabric has {len(hs)}")
    if placement == "random":
        rng = random.Random(seed)
        hs = rng.sample(hs, jobs * ring_size)
    elif placement != "packed":
        raise InputError("placement", f"unknown placement {placement!r}; valid: random, packed")
    return [Job(f"j{j}", tuple(hs[j * ring_size:(j + 1) * ring_size]), float(buffer_bytes),
                float(compute_s), pattern) for j in range(jobs)]
