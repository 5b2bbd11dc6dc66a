"""Job simulator invariants under random workloads, for every policy and admission."""

from __future__ import annotations

import random

import pytest

from testbed.jobs.cluster import Cluster
from testbed.jobs.engine import JobSimulator
from testbed.jobs.policies import Planner
from testbed.jobs.sim import resolve_jobs
from testbed.jobs.timing import Timer
from testbed.spec import parse_scenario
from testbed.traces import generate_jobs

POLICIES = ("sp-ff", "delay-first", "cost-first", "cba", "bace-pipe", "joint", "cba-ilp")


def _scenario(policy: str, admission: str, seed: int, jobs: int) -> object:
    rng = random.Random(seed)
    nodes = rng.sample([str(n) for n in range(1, 15)], 5)
    events = []
    if seed % 2 == 0:
        events = [{"at_s": 3000.0, "kind": "fiber_cut", "link": ["9", "12"]},
                  {"at_s": 9000.0, "kind": "fiber_repair", "link": ["9", "12"]},
                  {"at_s": 4000.0, "kind": "wavelength_loss", "link": ["13", "14"],
                   "first_slot": 0, "slots": 8},
                  {"at_s": 8000.0, "kind": "wavelength_repair", "link": ["13", "14"],
                   "first_slot": 0, "slots": 8}]
    return parse_scenario({
        "name": "inv", "topology": {"library": "nsfnet"},
        "dcs": [{"name": f"d{n}", "node": n, "gpus": rng.choice([32, 48, 64]),
                 "gpu": rng.choice(["h100", "a100"]),
                 "price_usd_per_kwh": rng.uniform(0.05, 0.2)} for n in nodes],
        "optical": {"slots": 24, "k_paths": 2, "guard_slots": seed % 2},
        "workload": {"kind": "pp_jobs", "jobs": jobs, "mean_interarrival_s": 200.0,
                     "seed": seed, "max_stages_per_dc": rng.choice([None, 1, 2]),
                     "mix": [{"model": "gpt3-6.7b", "stages": 4, "gpus_per_stage": 8,
                              "microbatches": 8, "iterations": 3000},
                             {"model": "llama2-13b", "stages": 3, "gpus_per_stage": 16,
                              "microbatches": 8, "iterations": 2000}]},
        "policy": {"placement": policy, "admission": admission, "schedule": "1f1b",
                   "fixed_slots": 3, "max_slots": 6, "ilp_time_limit_s": 2.0},
        "events": events,
    })


def _check(sim: JobSimulator) -> None:
    cl = sim.cluster
    net = cl.network
    # GPU capacity: free never negative, and held GPUs match running jobs
    held = [0] * len(cl.dcs)
    for st in sim.running.values():
        assert st.alloc is not None
        for d in st.alloc.stage_dcs:
            held[d] += st.job.req.gpus_per_stage
    for d, dc in enumerate(cl.dcs):
        assert 0 <= cl.free[d] <= dc.gpus
        assert cl.free[d] + held[d] == dc.gpus
    # spectrum: every live lightpath belongs to exactly one running job, no slot twice
    owned: set[int] = set()
    for st in sim.running.values():
        assert st.alloc is not None
        for lp in st.alloc.lightpaths:
            if lp is not None and lp.id in net.lightpaths:
                assert lp.id not in owned
                owned.add(lp.id)
    assert owned == set(net.lightpaths)
    cells: set[tuple[int, int]] = set()
    occ = [0] * net.n_spectra
    for lp in net.lightpaths.values():
        for s in lp.path.spectra:
            for t in lp.slots:
                assert (s, t) not in cells, "slot double-booked"
                cells.add((s, t))
                occ[s] |= 1 << t
    for s in range(net.n_spectra):
        assert net._occ[s] == occ[s]  # the network's bitmap is exactly the live lightpaths


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("admission", ["block", "queue"])
@pytest.mark.parametrize("seed", [1, 2])
def test_invariants(policy: str, admission: str, seed: int) -> None:
    jobs = 12 if policy == "cba-ilp" else 40
    scen = _scenario(policy, admission, seed, jobs)
    wl = scen.workload
    reqs = generate_jobs(wl)
    cluster = Cluster.from_scenario(scen)
    planner = Planner(cluster, scen.policy, Timer(), random.Random(seed), wl.max_stages_per_dc)
    sim = JobSimulator(cluster, planner, admission, scen.events, on_change=_check)
    done = sim.run(resolve_jobs(wl, reqs), [r.arrival_s for r in reqs])
    # every job accounted for exactly once
    ids = sorted(s.job.req.job_id for s in done)
    assert ids == [r.job_id for r in reqs]
    # everything released at the end
    assert cluster.free == [dc.gpus for dc in cluster.dcs]
    assert not cluster.network.lightpaths
    assert all(m == 0 for m in cluster.network._occ)
    for s in done:
        if s.blocked:
            assert s.reason and s.start_s is None and s.energy_kwh == 0
        else:
            assert s.start_s is not None and s.end_s is not None and s.end_s >= s.start_s
            if s.reason == "":
                assert s.iterations_done == pytest.approx(s.job.req.iterations, rel=1e-6)
        if admission == "queue":
            assert s.reason in ("", "never_fits", "interrupted")


def test_cba_ilp_out_of_time_is_refused_as_such() -> None:
    """A job whose MILP runs out of time is refused as `ilp_time_limit`, never counted as
    blocked for want of spectrum (a loaded machine changed the blocking figures)."""
    scen = _scenario("cba-ilp", "block", 1, 6)
    scen = scen.model_copy(update={"policy": scen.policy.model_copy(
        update={"ilp_time_limit_s": 1e-9})})
    wl = scen.workload
    reqs = generate_jobs(wl)
    cluster = Cluster.from_scenario(scen)
    planner = Planner(cluster, scen.policy, Timer(), random.Random(1), wl.max_stages_per_dc)
    done = JobSimulator(cluster, planner, "block", scen.events, on_change=_check).run(
        resolve_jobs(wl, reqs), [r.arrival_s for r in reqs])
    reasons = [s.reason for s in done]
    assert all(s.blocked for s in done) and "ilp_time_limit" in reasons, reasons
    assert "no_spectrum" not in reasons, reasons
