"""Planning on a cluster snapshot and committing the plan on the live cluster (the SDN
controller's POST /jobs outside its lock): same decisions, conflicts refused whole."""

from __future__ import annotations

import random

import pytest

from testbed.jobs.cluster import Cluster
from testbed.jobs.model import model_catalog
from testbed.jobs.outcome import Job, Placed
from testbed.jobs.policies import Planner
from testbed.spec import load_scenario
from testbed.traces import JobRequest
from tests.ctl_sequence import SCENARIO

POLICIES = ("sp-ff", "cba", "delay-first", "bace-pipe", "joint", "cba-ilp")


def _job(job_id: int, stages: int = 4, gpus: int = 8) -> Job:
    return Job(JobRequest(job_id, 0.0, "gpt3-6.7b", stages, gpus, 16, 100),
               model_catalog()["gpt3-6.7b"])


def _planner(cluster: Cluster, policy: str, spectrum: str = "random_fit",
             seed: int = 7) -> Planner:
    sc = load_scenario(SCENARIO)
    return Planner(cluster, sc.policy.model_copy(update={"placement": policy,
                                                         "spectrum": spectrum}),
                   rng=random.Random(seed), max_stages_per_dc=1)


def _held(cluster: Cluster) -> list[tuple[tuple[str, ...], int, int]]:
    return sorted((lp.nodes, lp.first_slot, lp.n_slots)
                  for lp in cluster.network.lightpaths.values())


@pytest.mark.parametrize("policy", POLICIES)
def test_plan_on_snapshot_then_commit_equals_planning_live(policy: str) -> None:
    """Three jobs one after another: planned on a snapshot and committed, or planned on
    the live cluster as before, give the same DCs, routes, slots and end state."""
    live = Cluster.from_scenario(load_scenario(SCENARIO))
    ref = Cluster.from_scenario(load_scenario(SCENARIO))
    rng_live, ref_planner = random.Random(7), _planner(ref, policy)
    for i in range(1, 4):
        snap = live.snapshot()
        before = live.state_key()
        got = Planner(snap, ref_planner.policy, rng=rng_live, max_stages_per_dc=1) \
            .place(_job(i), 0.0)
        want = ref_planner.place(_job(i), 0.0)
        assert live.state_key() == before  # planning took nothing live
        assert isinstance(got, Placed) and isinstance(want, Placed)
        alloc = live.commit_planned(got.alloc, 8)
        assert alloc.stage_dcs == want.alloc.stage_dcs
        assert [None if lp is None else (lp.nodes, lp.first_slot, lp.n_slots)
                for lp in alloc.lightpaths] == \
            [None if lp is None else (lp.nodes, lp.first_slot, lp.n_slots)
             for lp in want.alloc.lightpaths]
        assert alloc.short_gbps == want.alloc.short_gbps
        live.keep_paths(snap)
        assert live.state_key() == snap.state_key() == ref.state_key()
        assert _held(live) == _held(ref)


def test_commit_planned_refuses_taken_slots_cut_fibres_and_gpus_whole() -> None:
    live = Cluster.from_scenario(load_scenario(SCENARIO))
    snap = live.snapshot()
    got = _planner(snap, "cba", spectrum="first_fit").place(_job(1), 0.0)
    assert isinstance(got, Placed)
    lps = [lp for lp in got.alloc.lightpaths if lp is not None]
    assert len(lps) == 3  # max_stages_per_dc=1: four DCs, three lightpaths
    # another placement took one of the plan's blocks meanwhile
    other = live.network.assign(lps[-1].path, lps[-1].first_slot, 1)
    before = (live.state_key(), _held(live))
    with pytest.raises(ValueError, match="not free"):
        live.commit_planned(got.alloc, 8)
    assert (live.state_key(), _held(live)) == before  # nothing taken, not even GPUs
    live.network.release(other)
    # a fibre of a route was cut meanwhile
    u, v = lps[0].fibres[0]
    live.network.fail_link(u, v)
    before = (live.state_key(), _held(live))
    with pytest.raises(ValueError):
        live.commit_planned(got.alloc, 8)
    assert (live.state_key(), _held(live)) == before
    live.network.repair_link(u, v)
    # the GPUs of a stage's DC went to another job meanwhile
    d = got.alloc.stage_dcs[0]
    live.free[d] = 7
    before = (live.state_key(), _held(live))
    with pytest.raises(ValueError, match="GPUs"):
        live.commit_planned(got.alloc, 8)
    assert (live.state_key(), _held(live)) == before
    live.free[d] = 128
    alloc = live.commit_planned(got.alloc, 8)
    assert live.state_key() == snap.state_key() and len(_held(live)) == 3
    live.free_allocation(alloc, 8)
    assert live.state_key() == Cluster.from_scenario(load_scenario(SCENARIO)).state_key()
