"""The paper ablation of `reproduce routing` (testbed/experiments/routing_paper.py)."""

from __future__ import annotations

import statistics
from dataclasses import replace
from pathlib import Path

import pytest

from testbed.experiments import routing as rr
from testbed.experiments import routing_paper as rp
from testbed.routing.flows import Job, flows_of
from testbed.routing.maxmin import LinkIndex
from testbed.routing.metric import evaluate
from testbed.routing.policies import ecmp_port, route
from testbed.routing.topology import clos, leaf_of

SMALL = rp.Setting(spines=4, leaves=8, hosts_per_leaf=4, ring_size=8, busy_share=0.5)


def test_ours_row_is_reproduce_routings_large_case() -> None:
    """The ablation's baseline is the headline case itself: same jobs, same routings,
    same mean all-reduce times as `reproduce routing`'s clos-32x64 for that seed."""
    case = next(c for c in rr.cases(False) if c.name == "clos-32x64")
    for seed in (1, 2):
        g, jobs, _down = rr._fabric(case, seed)
        flows = flows_of(jobs)
        want = {p: evaluate(g, flows, route(p, g, flows, seed=seed).paths, jobs)
                .mean_allreduce_time_s for p in ("ecmp", "greedy")}
        got = rp.measure(rp.OURS, seed)
        assert got["jobs"] == case.jobs
        assert got["ecmp_mean_s"] == pytest.approx(want["ecmp"], rel=1e-9)
        assert got["greedy_mean_s"] == pytest.approx(want["greedy"], rel=1e-9)


def test_static_times_equal_the_metric_module() -> None:
    g = clos(SMALL.spines, SMALL.leaves, SMALL.hosts_per_leaf)
    jobs = rp.place(g, SMALL, 3)
    e, _gr = rp.route_both(g, jobs, SMALL, 3)
    cap = LinkIndex(g).capacity_gbps
    ev = evaluate(g, flows_of(jobs), route("ecmp", g, flows_of(jobs), seed=3).paths, jobs)
    assert rp.static_times(cap, e, jobs) == pytest.approx(
        [j.allreduce_time_s for j in ev.jobs], rel=1e-9)


def test_connections_split_the_bytes_and_hash_on_their_own() -> None:
    g = clos(SMALL.spines, SMALL.leaves, SMALL.hosts_per_leaf)
    s = replace(SMALL, qps=4)
    jobs = rp.place(g, s, 1)
    base = flows_of(jobs)
    conns = rp.split(base, 4)
    assert len(conns) == 4 * len(base)
    assert sum(c.demand_bytes for c in conns) == pytest.approx(sum(f.demand_bytes
                                                                   for f in base))
    assert len({ecmp_port(c) for c in conns}) > len(conns) * 0.9  # own source ports
    e, gr = rp.route_both(g, jobs, s, 1)
    spine_of = {}
    for r in (e, gr):
        spine_of[r.policy] = {}
        for c, links in zip(r.flows, r.links, strict=True):
            spine_of[r.policy].setdefault(c.id.rsplit(".q", 1)[0], set()).add(
                tuple(links.tolist()))
    # greedy pins a neighbour's connections to one path; ECMP spreads some of them
    assert all(len(v) == 1 for v in spine_of["greedy"].values())
    assert any(len(v) > 1 for v in spine_of["ecmp"].values())


def test_rack_local_placement() -> None:
    g = clos(8, 16, 8)
    s = replace(SMALL, spines=8, leaves=16, hosts_per_leaf=8, ring_size=16, block=4)
    jobs = rp.place(g, s, 5)
    used = [h for j in jobs for h in j.members]
    assert len(used) == len(set(used)) == s.jobs * 16
    for j in jobs:
        leaves = [leaf_of(g, h) for h in j.members]
        runs = [leaves[i:i + 4] for i in range(0, 16, 4)]
        assert all(len(set(r)) == 1 for r in runs)  # 4 consecutive ring members per ToR
        assert len({r[0] for r in runs}) == 4
    with pytest.raises(Exception, match="block"):
        rp.place(g, replace(s, block=3), 1)


def _two_jobs_one_spine() -> tuple[object, list[Job], rp.Routed]:
    # one spine: both jobs' flows share the leaf-spine links, so they collide when both
    # communicate; alone each gets the host link's 100 Gb/s
    g = clos(1, 2, 2)
    jobs = [Job("a", ("h0", "h2"), 1e9, 0.3), Job("b", ("h1", "h3"), 1e9, 0.3)]
    e, _g = rp.route_both(g, jobs, rp.Setting(spines=1, leaves=2, hosts_per_leaf=2,
                                              ring_size=2), 1)
    return g, jobs, e


def test_staggered_times_lie_between_alone_and_all_at_once() -> None:
    g, jobs, e = _two_jobs_one_spine()
    cap = LinkIndex(g).capacity_gbps
    together = rp.static_times(cap, e, jobs)
    alone = [rp.static_times(cap, rp.Routed("ecmp", [f for f in e.flows if f.job == j.name],
                                            [lk for f, lk in zip(e.flows, e.links,
                                                                 strict=True)
                                             if f.job == j.name],
                                            [2, 2], 0.0), [j])[0] for j in jobs]
    assert together[0] == pytest.approx(2 * alone[0], rel=1e-3)
    seen = []
    for seed in range(1, 11):
        times = rp.staggered_times(cap, e, jobs, 5, seed)
        assert [len(t) for t in times] == [5, 5]
        for k, ts in enumerate(times):
            for t in ts:
                assert alone[k] * (1 - 1e-9) <= t <= together[k] * (1 + 1e-9)
            seen += ts
        assert times == rp.staggered_times(cap, e, jobs, 5, seed)  # seeded
    # some phases overlap, some do not: staggering is neither extreme
    assert min(seen) < statistics.fmean(together) * 0.9
    assert max(seen) > alone[0] * 1.1


def test_static_greedy_never_slower_than_ecmp_and_same_seeds_every_row() -> None:
    rows = [("a", SMALL), ("b", replace(SMALL, qps=2)), ("c", replace(SMALL, block=2))]
    summary, runs = rp.ablation(4, rows)
    assert [r["seeds"] for r in summary] == [4, 4, 4]
    for r in runs:
        assert r["greedy_mean_s"] <= r["ecmp_mean_s"] * (1 + 1e-9)
    seeds = {row: sorted(r["seed"] for r in runs if r["row"] == row) for row in "abc"}
    assert seeds["a"] == seeds["b"] == seeds["c"] == [1, 2, 3, 4]
    for r in summary:
        assert r["greedy_vs_ecmp_min_pct"] <= r["greedy_vs_ecmp_pct"] <= \
            r["greedy_vs_ecmp_max_pct"]


def test_iteration_metric_adds_compute_to_both() -> None:
    a = rp.measure(SMALL, 2)
    b = rp.measure(replace(SMALL, metric="iteration"), 2)
    assert b["ecmp_mean_s"] == pytest.approx(a["ecmp_mean_s"] + rp.COMPUTE_S)
    assert b["greedy_mean_s"] == pytest.approx(a["greedy_mean_s"] + rp.COMPUTE_S)
    assert abs(b["change_pct"]) <= abs(a["change_pct"]) + 1e-9


def test_rows_switch_each_difference_on_and_off() -> None:
    rows = dict(rp.ablation_rows())
    ours, on = rows["ours (clos-32x64)"], rows["all on"]
    for name, field, value, _src, _d in rp.DIFFERENCES:
        alone = next(s for n, s in rows.items() if n.startswith(f"ours + {name}"))
        assert getattr(alone, field) == value and getattr(ours, field) != value
        assert replace(alone, **{field: getattr(ours, field)}) == ours
        assert replace(rows[f"all on - {name}"], **{field: value}) == on
    assert len(rp.ablation_rows(quick=True)) < len(rows)


def test_headline_shows_the_paper_text_setting_and_the_settings_in_range() -> None:
    from testbed.report.headline import headline_rows

    ab = [{"row": "ours (clos-32x64)", "greedy_vs_ecmp_pct": -51.8},
          {"row": "ours + fabric 1:1 = paper text", "greedy_vs_ecmp_pct": -69.2,
           "greedy_vs_ecmp_ci95_pct": 0.6},
          {"row": "paper text + x + y", "greedy_vs_ecmp_pct": -25.6},
          {"row": "all on", "greedy_vs_ecmp_pct": -1.5}]
    got = headline_rows({"experiment": "routing", "rows": [], "paper_ablation": ab})
    names = [fig for fig, _ours, _paper in got]
    assert names == ["greedy vs ecmp, setting 'ours + fabric 1:1 = paper text'",
                     "greedy vs ecmp, setting 'paper text + x + y'"]
    assert got[0][1] == "-69.2 +- 0.6 %"


def test_ecmp_hash_spreads_connections_evenly_over_spines() -> None:
    """ECMP's 5-tuple hash behaves as a uniform draw: no spine gets far more or fewer
    connections than the mean (so its collisions are the birthday-paradox ones, not a
    biased hash's)."""
    g = clos(32, 64, 8)
    s = replace(rp.OURS, qps=8)
    jobs = rp.place(g, s, 1)
    e, _gr = rp.route_both(g, jobs, s, 1)
    idx = LinkIndex(g)
    per_spine: dict[str, int] = {}
    for links in e.links:
        if len(links) == 4:
            spine = idx.edges[int(links[1])][1]
            per_spine[spine] = per_spine.get(spine, 0) + 1
    mean = statistics.fmean(per_spine.values())
    assert len(per_spine) == 32
    chi2 = sum((v - mean) ** 2 / mean for v in per_spine.values())
    assert chi2 < 61.1, per_spine  # chi-square, 31 degrees of freedom, 99.9 % quantile


def test_reproduce_routing_writes_the_ablation_beside_its_usual_records(tmp_path: Path) -> None:
    import csv

    res = rr.routing(tmp_path / "rr", quiet=True, quick=True, seeds=1, sa_budget_s=0.05)
    out = tmp_path / "rr"
    rows = list(csv.DictReader((out / "paper_ablation.csv").open()))
    assert [r["row"] for r in rows] == [n for n, _s in rp.ablation_rows(quick=True)]
    assert {"greedy_vs_ecmp_pct", "greedy_vs_ecmp_ci95_pct", "ecmp_mean_s",
            "greedy_mean_s", "hosts_per_leaf", "qps", "block", "staggered"} <= set(rows[0])
    assert len(list(csv.DictReader((out / "paper_runs.csv").open()))) == len(rows)
    md = (out / "summary.md").read_text()
    assert "Compared with the paper" in md and "## Against the paper" in md
    assert res["paper_ablation"] and res["paper_effects"]
    summary_cols = set(next(csv.DictReader((out / "summary.csv").open())))
    assert {"policy", "case", "mean_allreduce_time_s", "time_vs_ecmp_pct"} <= summary_cols
    rr.routing(tmp_path / "off", quiet=True, quick=True, seeds=1, sa_budget_s=0.05,
               paper_ablation=False)
    assert not (tmp_path / "off" / "paper_ablation.csv").exists()
    assert "Against the paper" not in (tmp_path / "off" / "summary.md").read_text()  # nor a pointer


def test_ring_paced_rates_leave_a_slowed_rings_share_to_others() -> None:
    """Links L (0) and M (1): job A has a connection on each, B two on L, C one on M.
    Per connection, L holds a1, b1, b2 at 33.3 and M splits 50/50 between a2 and c1.
    Paced, A's ring moves at 33.3 everywhere, so C gets the 66.7 that a2 cannot use."""
    import numpy as np

    cap = np.array([100.0, 100.0])
    links = [np.array([0]), np.array([1]), np.array([0]), np.array([0]), np.array([1])]
    group = [0, 0, 1, 1, 2]
    per_conn = rp.conn_rates(cap, links, group, paced=False)
    paced = rp.conn_rates(cap, links, group, paced=True)
    assert per_conn == pytest.approx([100 / 3, 50, 100 / 3, 100 / 3, 50])
    assert paced == pytest.approx([100 / 3, 100 / 3, 100 / 3, 100 / 3, 200 / 3])
    # on a real instance, pacing never slows a job's slowest connection below per-connection
    g = clos(SMALL.spines, SMALL.leaves, SMALL.hosts_per_leaf)
    jobs = rp.place(g, SMALL, 4)
    e, _gr = rp.route_both(g, jobs, SMALL, 4)
    cap = LinkIndex(g).capacity_gbps
    for a, b in zip(rp.static_times(cap, e, jobs, paced=True), rp.static_times(cap, e, jobs),
                    strict=True):
        assert a <= b * (1 + 1e-9)
