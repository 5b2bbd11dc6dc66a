"""Tests of `lightpipe sweep` (grid, --set parsing, outputs) and `lightpipe plan`."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from testbed.cli.main import main
from testbed.errors import InputError
from testbed.experiments.sweep import parse_set, set_path
from testbed.optical import OpticalNetwork
from testbed.sim.plan import plan
from testbed.spec import parse_scenario

SPEC = {
    "name": "sw", "topology": {"library": "nsfnet"}, "optical": {"slots": 40, "k_paths": 2},
    "workload": {"kind": "lightpath_requests", "load_erlang": 20, "requests": 1500,
                 "bitrate_gbps": [50, 100], "seed": 3},
}


def test_parse_set() -> None:
    assert parse_set("workload.load_erlang=100, 200,300") == ("workload.load_erlang",
                                                              [100, 200, 300])
    assert parse_set("policy.spectrum=first_fit,best_fit")[1] == ["first_fit", "best_fit"]
    for bad in ("workload.load_erlang", "=1", "a..b=1", "x="):
        with pytest.raises(InputError):
            parse_set(bad)
    data: dict = {"dcs": [{"gpus": 1}], "optical": None}
    set_path(data, "dcs.0.gpus", 8)
    set_path(data, "optical.slots", 16)
    assert data == {"dcs": [{"gpus": 8}], "optical": {"slots": 16}}


@pytest.mark.slow
def test_sweep_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "s.json"
    spec.write_text(json.dumps(SPEC))
    out = tmp_path / "sw"
    assert main(["sweep", str(spec), "--set", "workload.load_erlang=10,40", "--set",
                 "policy.spectrum=first_fit,best_fit", "--seeds", "2", "--out", str(out),
                 "-q"]) == 0
    with open(out / "sweep.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 8
    assert {r["seed"] for r in rows} == {"3", "4"}
    assert {r["policy.spectrum"] for r in rows} == {"first_fit", "best_fit"}
    assert (out / "blocking_ratio_vs_load_erlang.png").stat().st_size > 1000
    by_load: dict[str, list[float]] = {}
    for r in rows:
        by_load.setdefault(r["workload.load_erlang"], []).append(float(r["blocking_ratio"]))
    assert sum(by_load["40"]) > sum(by_load["10"])  # more load, more blocking
    # a sweep point equals the same spec run directly
    direct = dict(SPEC, workload=dict(SPEC["workload"], load_erlang=40, seed=4),
                  policy={"spectrum": "best_fit"})
    spec2 = tmp_path / "d.json"
    spec2.write_text(json.dumps(direct))
    assert main(["sim", str(spec2), "--out", str(tmp_path / "d"), "-q"]) == 0
    want = json.loads((tmp_path / "d/summary.json").read_text())["blocking_ratio"]
    (row,) = [r for r in rows if r["workload.load_erlang"] == "40" and r["seed"] == "4"
              and r["policy.spectrum"] == "best_fit"]
    assert float(row["blocking_ratio"]) == pytest.approx(want)


def test_sweep_bad_value_names_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "s.json"
    spec.write_text(json.dumps(SPEC))
    out = tmp_path / "sw"
    assert main(["sweep", str(spec), "--set", "policy.spectrum=first_fit,worst_fit",
                 "--out", str(out), "-q"]) == 2
    err = capsys.readouterr().err
    assert "policy.spectrum" in err and err.count("\n") == 1
    assert not out.exists()


def test_plan_lightpaths_valid(tmp_path: Path) -> None:
    scenario = parse_scenario(dict(SPEC, workload=dict(SPEC["workload"], requests=300)))
    result = plan(scenario)
    assert result["requests"] == 300 == result["accepted"] + result["blocked"]
    assert result["blocked"] > 0  # nothing departs, so the spectrum fills up
    net = OpticalNetwork.from_scenario(scenario)
    for lp in result["lightpaths"]:  # re-assigning every lightpath at once must succeed
        path = net.path_info(lp["route"])
        assert [list(f) for f in path.fibres] == lp["fibres"]
        assert path.modulation == lp["modulation"]
        net.assign(path, lp["first_slot"], lp["slots"])
        assert lp["capacity_gbps"] >= lp["bitrate_gbps"]
    assert net.utilization() == pytest.approx(result["spectrum_utilization"])


def test_plan_cli(tmp_path: Path) -> None:
    spec = tmp_path / "s.json"
    spec.write_text(json.dumps(SPEC))
    assert main(["plan", str(spec), "--out", str(tmp_path / "plan.json")]) == 0
    data = json.loads((tmp_path / "plan.json").read_text())
    assert data["lightpaths"] and data["manifest"]["spec_sha256"]
