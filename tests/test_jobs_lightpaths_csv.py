"""lightpaths.csv of pp_jobs runs: every lightpath a job held, with its slots and its life."""

from __future__ import annotations

import csv
import itertools
import json
from collections import defaultdict
from pathlib import Path

import yaml

from testbed.jobs.sim import LIGHTPATHS_COLUMNS

REPO = Path(__file__).resolve().parent.parent
SCENARIOS = REPO / "scenarios"


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open() as fh:
        return list(csv.DictReader(fh))


def _cba_with_a_cut(tmp_path: Path) -> Path:
    spec = yaml.safe_load((SCENARIOS / "cba-nsfnet.yaml").read_text())
    spec["workload"]["jobs"] = 120
    spec["events"] = [{"at_s": 20000, "kind": "fiber_cut", "link": ["1", "2"]}]
    path = tmp_path / "cba.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_lightpaths_csv_matches_jobs_and_never_overlaps_slots(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "run"
    r = cli("sim", str(_cba_with_a_cut(tmp_path)), "--out", str(out), "-q")
    assert r.code == 0, r.err
    lps = _rows(out / "lightpaths.csv")
    jobs = {j["job_id"]: j for j in _rows(out / "jobs.csv")}
    assert lps and tuple(lps[0]) == LIGHTPATHS_COLUMNS
    man = json.loads((out / "manifest.json").read_text())
    assert "lightpaths.csv" in json.dumps(man)
    assert "`lightpaths.csv`" in (out / "README.md").read_text()
    by_job: dict[str, list[dict[str, str]]] = defaultdict(list)
    for lp in lps:
        by_job[lp["job_id"]].append(lp)
    for job_id, job in jobs.items():
        inter_dc = [x for x in job["lightpaths"].split("|") if x and x != "fabric"]
        if job["blocked"] == "1":
            assert job_id not in by_job
            continue
        mine = by_job[job_id]
        assert len(mine) >= len(inter_dc)
        for lp in mine:
            assert float(job["start_s"]) <= float(lp["setup_s"]) < float(lp["teardown_s"])
            assert float(lp["teardown_s"]) <= float(job["end_s"]) + 1e-6
        # the lightpaths the job ended with are the ones jobs.csv names
        last = {f"{x['path']}:{x['first_slot']}+{x['slots']}" for x in mine
                if abs(float(x["teardown_s"]) - float(job["end_s"])) < 1e-6}
        assert last == {x.split(":")[0] + ":" + x.split(":")[1] for x in inter_dc}
    # no two lightpaths ever hold the same slot of the same fibre at the same time
    held: dict[tuple[frozenset, int], list[tuple[float, float]]] = defaultdict(list)
    for lp in lps:
        nodes = lp["path"].split("-")
        for a, b in itertools.pairwise(nodes):
            for s in range(int(lp["first_slot"]), int(lp["first_slot"]) + int(lp["slots"])):
                held[(frozenset((a, b)), s)].append((float(lp["setup_s"]),
                                                     float(lp["teardown_s"])))
    for spans in held.values():
        spans.sort()
        for (_a0, b0), (a1, _b1) in itertools.pairwise(spans):
            assert a1 >= b0 - 1e-9
    # the fibre cut tore lightpaths down at the cut: none over 1-2 lives past it
    for lp in lps:
        nodes = lp["path"].split("-")
        if {"1", "2"} in [{a, b} for a, b in itertools.pairwise(nodes)]:
            assert float(lp["setup_s"]) >= 20000 or float(lp["teardown_s"]) <= 20000 + 1e-6
