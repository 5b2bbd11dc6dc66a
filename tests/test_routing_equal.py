"""Greedy's routings and metrics on the reproduction's instances equal digests recorded from
the code before the speed work of issue 23 (commit 8bb7a4a): same routes, same metric, for
the policy (guard included), the unguarded greedy, a shuffled order, an incremental start
and random tie-breaking. Run as a script to print the digests of the code in the tree."""

from __future__ import annotations

import hashlib
import json
import random
import sys

import networkx as nx
import pytest

from testbed.errors import InputError
from testbed.experiments.routing import Case
from testbed.routing.flows import Flow, Job, flows_of, jobs_on_clos
from testbed.routing.greedy import greedy
from testbed.routing.instance import Instance
from testbed.routing.metric import evaluate
from testbed.routing.policies import route
from testbed.routing.topology import clos

SEEDS = range(1, 21)  # the reproduction's 20 seeds

# `lightpipe reproduce routing`'s cases (full and --quick), their numbers copied here so
# that changes to the experiment do not move the record.
CASES = {c.name: c for c in (
    Case("small", 4, 8, 4, 4, 6),
    Case("small-fail", 4, 8, 4, 4, 6, link_failures=3),
    Case("small-full", 4, 8, 4, 4, 8),
    Case("clos-8x16", 8, 16, 4, 8, 8),
    Case("clos-8x16-fail", 8, 16, 4, 8, 8, spine_failures=1, link_failures=8),
    Case("clos-32x64", 32, 64, 8, 16, 16),
    Case("clos-32x64-fail", 32, 64, 8, 16, 16, spine_failures=1, link_failures=64),
)}


def fabric(case: Case, seed: int) -> tuple[nx.DiGraph, list[Job]]:
    """The case's fabric with the seed's failures and its jobs, drawn as the reproduction
    draws them."""
    g = clos(case.spines, case.leaves, case.hosts_per_leaf)
    jobs = jobs_on_clos(g, case.jobs, case.ring_size, seed=seed, buffer_bytes=1e9,
                        compute_s=0.3)
    rng = random.Random(seed * 7919 + 17)
    for _attempt in range(100):
        h = g.copy()
        for s in rng.sample(range(case.spines), case.spine_failures):
            for leaf in range(case.leaves):
                h.remove_edge(f"spine{s}", f"leaf{leaf}")
                h.remove_edge(f"leaf{leaf}", f"spine{s}")
        pairs = [(s, leaf) for s in range(case.spines) for leaf in range(case.leaves)
                 if h.has_edge(f"spine{s}", f"leaf{leaf}")]
        for s, leaf in rng.sample(pairs, case.link_failures):
            h.remove_edge(f"spine{s}", f"leaf{leaf}")
            h.remove_edge(f"leaf{leaf}", f"spine{s}")
        try:
            Instance(h, flows_of(jobs))
        except InputError:
            continue
        return h, jobs
    raise AssertionError(f"{case.name}: no connected failure draw")


def _record(g: nx.DiGraph, flows: list[Flow], jobs: list[Job],
            paths: dict[str, tuple[str, ...]]) -> list:
    ev = evaluate(g, flows, paths, jobs)
    return [sorted((k, list(v)) for k, v in paths.items()), list(ev.key[0]), list(ev.key[1]),
            ev.mean_allreduce_time_s]


def routings(case: Case, seed: int) -> dict[str, list]:
    """Per variant, the routing and its metric on one instance."""
    g, jobs = fabric(case, seed)
    flows = flows_of(jobs)
    out: dict[str, list] = {}
    r = route("greedy", g, flows, seed=seed)
    out["policy"] = [*_record(g, flows, jobs, r.paths), sorted(r.info.items())]
    inst = Instance(g, flows)
    out["unguarded"] = _record(g, flows, jobs, inst.paths_of(greedy(inst)))
    order = list(range(len(flows)))
    random.Random(seed).shuffle(order)
    out["shuffled"] = _record(g, flows, jobs, inst.paths_of(greedy(inst, order=order)))
    half = flows_of(jobs[:len(jobs) // 2])
    first = route("greedy", g, half, seed=seed)
    r2 = route("greedy", g, flows, first.paths, seed=seed)
    out["incremental"] = [*_record(g, flows, jobs, r2.paths), sorted(r2.info.items())]
    # as a ruin-and-recreate kick does: a third of the flows off, placed again in a random
    # order with random ties
    rng = random.Random(seed)
    base = greedy(inst)
    ruined = rng.sample(range(len(flows)), len(flows) // 3)
    start: list[int | None] = list(base)
    for i in ruined:
        start[i] = None
    rng.shuffle(ruined)
    out["kick"] = _record(g, flows, jobs, inst.paths_of(greedy(inst, start, order=ruined,
                                                               rng=rng)))
    return out


VARIANTS = ("policy", "unguarded", "shuffled", "incremental", "kick")


def digests(case: Case) -> dict[str, str]:
    """Per variant, a SHA-256 over the 20 seeds' routings and metrics (first 16 hex)."""
    hs = {v: hashlib.sha256() for v in VARIANTS}
    for seed in SEEDS:
        for v, rec in routings(case, seed).items():
            hs[v].update(json.dumps([seed, rec]).encode())
    return {v: h.hexdigest()[:16] for v, h in hs.items()}


# Recorded from commit 8bb7a4a (before the speed work), `python tests/test_routing_equal.py`.
RECORDED: dict[str, dict[str, str]] = {
    'small': {
        "policy": "56585629ef434ffb",
        "unguarded": "1de4bec34a661f2f",
        "shuffled": "bd2fcb4c9aa760b7",
        "incremental": "56585629ef434ffb",
        "kick": "ca17ad3203ea8da6",
    },
    'small-fail': {
        "policy": "d117573ec996e0da",
        "unguarded": "2259f5397a50bd34",
        "shuffled": "0272b56e3964c635",
        "incremental": "d117573ec996e0da",
        "kick": "c6045a5b0e067ed7",
    },
    'small-full': {
        "policy": "3b6df9c89bd5a8c3",
        "unguarded": "a9af7db81ea12fbf",
        "shuffled": "3649269f5bbbf4e4",
        "incremental": "3b6df9c89bd5a8c3",
        "kick": "2d1655b8cef53fb3",
    },
    'clos-8x16': {
        "policy": "9a606983abd7e7c0",
        "unguarded": "698e83fdc9e7e5fb",
        "shuffled": "fcf9e6b03502b759",
        "incremental": "9a606983abd7e7c0",
        "kick": "35c66b3c7d14312a",
    },
    'clos-8x16-fail': {
        "policy": "89c20510584defb1",
        "unguarded": "b7d78d4051088581",
        "shuffled": "9fd4711b5cf8f913",
        "incremental": "89c20510584defb1",
        "kick": "f673526d56b67b18",
    },
    'clos-32x64': {
        "policy": "cf522198762b33b4",
        "unguarded": "691621b3f39f0b80",
        "shuffled": "ffb8c19b800684dd",
        "incremental": "cf522198762b33b4",
        "kick": "e33c409e24103dfa",
    },
    'clos-32x64-fail': {
        "policy": "8231071c0aa42f41",
        "unguarded": "0295b08d17fcfbcb",
        "shuffled": "39507e5ddc5c3630",
        "incremental": "8231071c0aa42f41",
        "kick": "4bf1830af4ff00e1",
    },
}


@pytest.mark.parametrize("name", list(CASES))
def test_greedy_routes_and_metric_equal_the_record(name: str) -> None:
    assert digests(CASES[name]) == RECORDED[name]


if __name__ == "__main__":
    for n, c in CASES.items():
        sys.stdout.write(f"    {n!r}: {{\n")
        for v, h in digests(c).items():
            sys.stdout.write(f"        {v!r}: {h!r},\n")
        sys.stdout.write("    },\n")
