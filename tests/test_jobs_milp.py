"""cba-ilp MILP equals the brute-force optimum on small random instances."""

from __future__ import annotations

import random

import pytest

from testbed.jobs import milp


def _instance(rng: random.Random, p: int, nd: int) -> milp.JointInstance:
    fibres = list(range(5))
    options = []
    for _ in range(p - 1):
        per: dict[tuple[int, int], list[milp.LinkOption]] = {}
        for d1 in range(nd):
            for d2 in range(nd):
                if d1 == d2 or rng.random() < 0.2:
                    continue
                opts = []
                for _ in range(rng.randint(1, 3)):
                    fs = tuple(sorted(rng.sample(fibres, rng.randint(1, 3))))
                    slots = rng.choice([1, 2, 4])
                    opts.append(milp.LinkOption(route=("a", "b"), fibres=fs,
                                                first_slot=rng.randint(0, 5), slots=slots,
                                                latency_ms=rng.uniform(0.5, 10),
                                                capacity_gbps=slots * rng.choice([12.5, 25, 50])))
                per[(d1, d2)] = opts
        options.append(per)
    return milp.JointInstance(
        dcs=[f"d{i}" for i in range(nd)],
        free_gpus=[rng.choice([8, 16, 24]) for _ in range(nd)],
        gpus_per_stage=8,
        compute_ms=[[rng.uniform(2, 20) for _ in range(nd)] for _ in range(p)],
        activation_mb=rng.uniform(5, 60),
        microbatches=rng.randint(1, 16),
        fabric_latency_ms=0.01, fabric_gbps=400.0, options=options, slot_weight_ms=0.01)


@pytest.mark.parametrize("seed", range(40))
def test_milp_equals_brute_force(seed: int) -> None:
    rng = random.Random(seed)
    inst = _instance(rng, p=rng.randint(2, 4), nd=rng.randint(2, 3))
    exact = milp.brute_force(inst)
    got = milp.solve(inst)
    if exact is None:
        assert got is None
        return
    assert got is not None and got.status == "optimal"
    assert got.objective_ms == pytest.approx(exact.objective_ms, rel=1e-6, abs=1e-6)
    # the MILP's own choice is feasible: capacity and no shared (fibre, slot)
    for d in range(len(inst.dcs)):
        assert got.stage_dcs.count(d) * inst.gpus_per_stage <= inst.free_gpus[d]
    used: set[tuple[int, int]] = set()
    for lk in got.links:
        if lk is not None:
            cells = {(e, t) for e in lk.fibres for t in range(lk.first_slot,
                                                              lk.first_slot + lk.slots)}
            assert not cells & used
            used |= cells


def test_milp_infeasible_when_no_gpus() -> None:
    inst = milp.JointInstance(dcs=["a"], free_gpus=[8], gpus_per_stage=8,
                              compute_ms=[[1.0], [1.0]], activation_mb=1, microbatches=2,
                              fabric_latency_ms=0, fabric_gbps=100, options=[{}])
    assert milp.solve(inst) is None and milp.brute_force(inst) is None


def test_milp_out_of_time_is_not_infeasible() -> None:
    """A spent time budget is OutOfTime, never None (None says the job cannot be placed:
    a loaded machine made blocked jobs out of slow solves); with time the same instance
    is placed."""
    rng = random.Random(3)
    inst = _instance(rng, p=4, nd=3)
    assert milp.brute_force(inst) is not None
    with pytest.raises(milp.OutOfTime):
        milp.solve(inst, time_limit_s=1e-9)
    assert milp.solve(inst) is not None
