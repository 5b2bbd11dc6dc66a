"""Ablation variants, the latency-aware CB test, rigid cost-first, same-jobs comparisons."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from testbed.experiments import placement as exp
from testbed.experiments.placement import (
    Run,
    Variant,
    bace_scenario,
    cba_scenario,
    compare,
    matched_change,
    share,
)
from testbed.jobs.placement import PLACEMENTS, exposed_ms
from testbed.jobs.sim import simulate
from testbed.jobs.timing import Timer
from testbed.spec.models import PLACEMENT_POLICIES

ROOT = Path(__file__).resolve().parents[1]


def _run(block: float, it: dict[int, float]) -> Run:
    return Run({"blocking_ratio": block}, it, {}, {})


def test_matched_change_by_hand() -> None:
    # job 3 only ran under the baseline, job 4 only under the new policy: both drop out
    mine = {1: 9.0, 2: 18.0, 4: 1.0}
    ref = {1: 10.0, 2: 20.0, 3: 100.0}
    change, n = matched_change(mine, ref)
    assert n == 2
    assert change == pytest.approx((9 + 18) / (10 + 20) - 1)  # -10 %, not skewed by job 3
    assert matched_change({1: 1.0}, {2: 1.0}) == (None, 0)


def test_compare_uses_common_jobs_per_seed_and_reports_blocked_shares() -> None:
    runs = {"new": [_run(0.0, {1: 9.0, 2: 9.0, 3: 50.0}), _run(0.0, {1: 8.0, 2: 8.0})],
            "base": [_run(1 / 3, {1: 10.0, 2: 10.0}), _run(0.5, {1: 10.0})]}
    c = compare(runs, "new", "base", "iteration")
    # seed 1: jobs 1, 2 -> -10 %; seed 2: job 1 -> -20 %; mean -15 %, t(1) CI
    assert c["change"] == pytest.approx(-0.15)
    assert c["ci95"] == pytest.approx(12.706 * (0.1 / math.sqrt(2)) / math.sqrt(2), rel=1e-3)
    assert c["common_jobs"] == pytest.approx(1.5)
    assert c["blocked"] == 0.0
    assert c["blocked_base"] == pytest.approx((1 / 3 + 0.5) / 2)


def test_share_of_a_gain() -> None:
    assert share(-0.2, -0.05) == pytest.approx(0.75)  # removing it loses 75 % of the gain
    assert share(-0.2, -0.2) == pytest.approx(0.0)
    assert share(0.0, -0.1) is None


def test_every_variant_is_registered_and_in_the_spec() -> None:
    names = [v.placement for v in exp.CBA_ABLATION + exp.BACE_ABLATION]
    assert set(names) <= set(PLACEMENTS) == set(PLACEMENT_POLICIES)
    assert PLACEMENTS["bace-pipe"].queue == "priority"
    assert PLACEMENTS["bace-pipe-fifo"].queue == "fifo"
    assert PLACEMENTS["delay-first-best"].queue == "priority"


@pytest.mark.parametrize("variants,base,best", [
    (exp.CBA_ABLATION, "sp-ff", "sp-ff-best"),
    (exp.BACE_ABLATION, "delay-first", "delay-first-best")])
def test_every_table_has_the_baseline_at_its_best(variants: tuple[Variant, ...], base: str,
                                                  best: str) -> None:
    roles = {v.label: v.role for v in variants}
    assert "baseline at its best" in roles[best]
    assert roles[base].startswith("baseline as the paper")
    for ingredient in (["comm-bound", "multi-path", "search"] if base == "sp-ff" else
                       ["prioritisation", "pathfinder", "cost allocator"]):
        assert any(r.startswith("without") and ingredient in r for r in roles.values())


def test_baseline_at_its_best_gets_cbas_paths_and_search() -> None:
    """sp-ff-best holds lightpaths on more than the shortest path and more than one
    layout; sp-ff never leaves the shortest path."""
    timer = Timer()
    states, _ = simulate(cba_scenario(150.0, "sp-ff-best", 1, 80), timer=timer)
    sp_states, _ = simulate(cba_scenario(150.0, "sp-ff", 1, 80), timer=timer)
    from testbed.jobs.cluster import Cluster

    cl = Cluster.from_scenario(cba_scenario(150.0, "sp-ff", 1, 80))
    shortest = {tuple(p.nodes) for i in range(len(cl.dcs)) for j in range(len(cl.dcs))
                if i != j for p in cl.paths(i, j)[:1]}

    def routes(sts: list) -> set[tuple[str, ...]]:  # type: ignore[type-arg]
        return {tuple(lp.nodes) for s in sts for _, lp, _, _ in s.lightpath_log}

    assert routes(sp_states) <= shortest
    assert routes(states) - shortest  # some boundary took the 2nd or 3rd path
    assert all(lp.n_slots - cl.network.guard_slots == 4
               for s in states for _, lp, _, _ in s.lightpath_log)  # still fixed slots


def test_ablation_rows_are_computed_on_the_same_jobs() -> None:
    variants = (Variant("cba", "cba"), Variant("sp-ff", "sp-ff"),
                Variant("sp-ff-best", "sp-ff-best"), Variant("cba 1f1b", "cba", "1f1b"),
                Variant("sp-ff 1f1b", "sp-ff", "1f1b"))
    rows, runs = exp.ablation(cba_scenario, variants, 150.0, 2, 40, True,
                              exp._refs(variants, "sp-ff", "cba"), "iteration")
    assert [r["policy"] for r in rows] == [v.label for v in variants]
    for seed in range(2):  # one arrival sequence per seed, whatever the policy
        ids = {lab: set(runs[lab][seed].iteration_s) for lab in runs}
        for lab in runs:
            assert runs[lab][seed].summary["jobs"] == 40
        want = matched_change(runs["cba"][seed].iteration_s, runs["sp-ff"][seed].iteration_s)
        assert want[1] == len(ids["cba"] & ids["sp-ff"])
    by = {r["policy"]: r for r in rows}
    assert by["cba 1f1b"]["baseline"] == "sp-ff 1f1b"
    assert by["cba"]["iteration_vs_base"] == pytest.approx(compare(
        runs, "cba", "sp-ff", "iteration")["change"])
    # the common-set mean is over one job set per schedule: sp-ff's and cba's rows agree
    # on which jobs they average
    assert by["cba"]["common_iteration_jobs"] == by["sp-ff"]["common_iteration_jobs"]


def test_cb_test_counts_latency_where_the_schedule_pays_it() -> None:
    """1F1B waits for every micro-batch's round trip; GPipe pays latency only at fill
    and drain. The engine agrees with exposed_ms on which boundary is CB."""
    timer = Timer()
    f, b = [20.0] * 4, [40.0] * 4
    fast = 1e6  # Gb/s: transfer ~0

    def it(sched: str, lat: float) -> float:
        return timer.time(f, b, [(lat, fast)] * 3, 50.0, 32, sched).iteration_ms

    for sched in ("1f1b", "gpipe"):
        per_mb = (it(sched, 10.0) - it(sched, 0.0)) / 32
        cb = exposed_ms(sched, 10.0, 0.0, f[1]) > 0
        assert cb == (sched == "1f1b")
        assert (per_mb > 5.0) == cb  # per micro-batch cost only where it is CB
    # GPipe: bandwidth still makes a boundary CB when tx > next forward
    assert exposed_ms("gpipe", 10.0, 25.0, 20.0) > 0
    assert exposed_ms("gpipe", 50.0, 15.0, 20.0) < 0
    # 1F1B: the slowest stage's slack hides a short round trip
    assert exposed_ms("1f1b", 5.0, 1.0, 20.0, slack_ms=30.0) < 0


def test_cb_labels_change_with_schedule() -> None:
    """On NSFNET every cross-DC boundary of a non-bandwidth-bound job is CB under 1F1B
    (latency), none is under GPipe."""
    import random

    from testbed.jobs.cluster import Cluster
    from testbed.jobs.model import MODELS
    from testbed.jobs.outcome import Job
    from testbed.jobs.placement import cb_labels
    from testbed.jobs.policies import Planner
    from testbed.traces import JobRequest

    labels = {}
    for sched in ("gpipe", "1f1b"):
        sc = cba_scenario(300.0, "cba", 1, 10)
        sc = sc.model_copy(update={"policy": sc.policy.model_copy(update={"schedule": sched})})
        cl = Cluster.from_scenario(sc)
        pl = Planner(cl, sc.policy, Timer(), random.Random(0), 1)
        job = Job(JobRequest(1, 0.0, "llama2-13b", 4, 16, 32, 100), MODELS["llama2-13b"])
        labels[sched] = cb_labels(pl, job, (0, 1, 2, 3))
    assert labels["1f1b"] == [True, True, True]
    assert labels["gpipe"] == [False, False, False]


def test_cost_first_is_rigid_and_cheaper_than_delay_first() -> None:
    """The bundled bace scenario: cost-first pays less for electricity than delay-first
    (it waits for its cheap home regions) and its jobs wait far longer."""
    from testbed.spec import load_scenario

    base = load_scenario(ROOT / "scenarios" / "bace-regions.yaml")
    out = {}
    timer = Timer()
    for pol in ("delay-first", "cost-first"):
        sc = base.model_copy(update={"policy": base.policy.model_copy(
            update={"placement": pol})})
        _, out[pol] = simulate(sc, timer=timer)
    assert out["cost-first"]["total_cost_usd"] < 0.8 * out["delay-first"]["total_cost_usd"]
    assert out["cost-first"]["mean_wait_s"] > out["delay-first"]["mean_wait_s"]


def test_bace_fifo_variant_only_changes_the_queue() -> None:
    timer = Timer()
    _, a = simulate(bace_scenario(1800.0, "bace-pipe-fifo", 1, 40), timer=timer)
    sc = bace_scenario(1800.0, "bace-pipe", 1, 40)
    sc = sc.model_copy(update={"policy": sc.policy.model_copy(update={"queue": "fifo"})})
    _, b = simulate(sc, timer=timer)
    for key in ("mean_jct_s", "total_cost_usd", "mean_wait_s"):
        assert a[key] == pytest.approx(b[key])
