"""Lightpath probes side by side (testbed.emu.batches): pure, no root."""

from __future__ import annotations

import itertools

from testbed.emu.batches import disjoint_batches
from testbed.emu.plan import build_plan
from testbed.emu.verify import probe_jobs
from testbed.spec import parse_scenario


def nsfnet_all_dcs() -> object:
    nodes = [str(n) for n in range(1, 15)]
    return parse_scenario({
        "name": "big", "topology": {"library": "nsfnet"},
        "dcs": [{"name": f"dc-{n}", "node": n, "gpus": 8} for n in nodes],
        "workload": {"kind": "lightpath_requests"},
        "emulation": {"bandwidth_divisor": 10000, "hosts_per_dc": 2}})


def test_batches_cover_every_probe_once_and_share_no_fibre() -> None:
    plan = build_plan(nsfnet_all_dcs())  # type: ignore[arg-type]
    jobs = probe_jobs(plan)
    assert len(plan.lightpaths) == 91 and len(jobs) == 182
    batches = disjoint_batches([j.fibres() for j in jobs])
    assert sorted(i for b in batches for i in b) == list(range(len(jobs)))
    for b in batches:
        assert b == sorted(b)
        for i, j in itertools.combinations(b, 2):
            assert not jobs[i].fibres() & jobs[j].fibres(), (jobs[i], jobs[j])
    # Both directions of a lightpath share its fibres: never in one batch; and the
    # batches are far fewer than the probes (what makes the big verification fast).
    assert len(batches) < len(jobs) / 3
    for k in range(0, len(jobs), 2):
        assert not any(k in b and k + 1 in b for b in batches)


def test_a_single_lightpath_is_probed_one_direction_at_a_time() -> None:
    sc = parse_scenario({
        "name": "one", "topology": {"links": [{"u": "A", "v": "B", "length_km": 100}]},
        "dcs": [{"name": "dc-a", "node": "A", "gpus": 8}, {"name": "dc-b", "node": "B", "gpus": 8}],
        "workload": {"kind": "lightpath_requests"},
        "emulation": {"bandwidth_divisor": 10000, "hosts_per_dc": 1}})
    jobs = probe_jobs(build_plan(sc))
    assert [(j.src_dc, j.path) for j in jobs] == [("dc-a", ("A", "B")), ("dc-b", ("B", "A"))]
    assert disjoint_batches([j.fibres() for j in jobs]) == [[0], [1]]
