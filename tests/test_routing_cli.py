"""`lightpipe route` and `lightpipe reproduce routing`: JSON shape, errors, outputs."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import yaml

from testbed.routing.maxmin import max_min_rates
from testbed.routing.topology import clos, from_scenario, remove_links
from testbed.spec import parse_scenario

from .conftest import load_yaml

ISSUE_CMD = ["route", "--clos", "32x64", "--hosts-per-leaf", "8", "--jobs", "16",
             "--ring-size", "16", "--seed", "1", "--policy", "greedy", "--json"]


def test_route_json_exact_shape(cli) -> None:  # type: ignore[no-untyped-def]
    res = cli(*ISSUE_CMD)
    assert res.code == 0, res.err
    out = json.loads(res.out)
    assert list(out) == ["links", "flows", "jobs", "metric", "policy", "wall_s"]
    assert out["policy"] == "greedy" and out["wall_s"] > 0
    assert len(out["links"]) == 2 * (32 * 64 + 64 * 8)  # one entry per direction
    assert set(out["links"][0]) == {"u", "v", "capacity_gbps"}
    assert len(out["flows"]) == 256 and len(out["jobs"]) == 16
    for f in out["flows"]:
        assert list(f) == ["id", "job", "src", "dst", "path", "rate_gbps"]
        assert f["path"][0] == f["src"] and f["path"][-1] == f["dst"]
    assert all(list(j) == ["job", "bottleneck_gbps", "allreduce_time_s"] for j in out["jobs"])
    assert out["metric"] == sorted(j["bottleneck_gbps"] for j in out["jobs"])
    # rates are the max-min allocation of the printed paths on the printed links
    g = clos(32, 64, 8)
    rates = max_min_rates(g, {f["id"]: f["path"] for f in out["flows"]})
    assert all(rates[f["id"]] == pytest.approx(f["rate_gbps"]) for f in out["flows"])


def test_route_greedy_beats_ecmp_and_fail_removes_links(cli) -> None:  # type: ignore[no-untyped-def]
    base = ["route", "--clos", "4x8", "--hosts-per-leaf", "4", "--jobs", "4",
            "--ring-size", "6", "--seed", "2", "--json"]
    ecmp = json.loads(cli(*base, "--policy", "ecmp").out)
    greedy = json.loads(cli(*base, "--policy", "greedy").out)
    assert greedy["metric"] >= ecmp["metric"]
    failed = json.loads(cli(*base, "--policy", "greedy", "--fail", "spine0-leaf1",
                            "--fail", "leaf2-spine3").out)
    links = {(x["u"], x["v"]) for x in failed["links"]}
    assert len(links) == len(greedy["links"]) - 4
    for u, v in (("spine0", "leaf1"), ("leaf1", "spine0"), ("leaf2", "spine3")):
        assert (u, v) not in links
        assert all((u, v) not in zip(f["path"], f["path"][1:], strict=False)
                   for f in failed["flows"])


@pytest.mark.parametrize("extra,needle", [
    (["--clos", "4x4", "--policy", "nope"], "valid: ecmp, shortest, edge-coloring, greedy"),
    (["--clos", "2x2", "--hosts-per-leaf", "2", "--jobs", "3", "--ring-size", "4"],
     "need 12 hosts"),
    (["--clos", "4x4", "--fail", "spine9-leaf0"], "no link spine9-leaf0"),
    (["--clos", "4x4", "--fail", "spine1"], "expected NODE-NODE"),
    (["--clos", "4by4"], "expected SPINESxLEAVES"),
    ([], "give exactly one of"),
    (["--clos", "4x4", "--ring-size", "1"], "--ring-size"),
])
def test_route_bad_input_exit_2(cli, extra: list[str], needle: str) -> None:  # type: ignore[no-untyped-def]
    res = cli("route", *extra)
    assert res.code == 2
    assert needle in res.err and len(res.err.strip().splitlines()) == 1
    assert res.out == ""


def _leaf_spine_spec(tmp_path: Path, routing: str = "edge-coloring") -> Path:
    d = load_yaml("quickstart.yaml")
    d.setdefault("policy", {})["routing"] = routing
    emu = d.setdefault("emulation", {})
    emu["dc_fabric"] = "leaf_spine"
    emu["leaf_spine"] = {"spines": 4, "leaves": 4, "hosts_per_leaf": 4}
    path = tmp_path / "ls.yaml"
    path.write_text(yaml.safe_dump(d))
    return path


def test_route_from_scenario_uses_its_fabric_and_policy(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    spec = _leaf_spine_spec(tmp_path)
    res = cli("route", str(spec), "--jobs", "2", "--ring-size", "8", "--json")
    assert res.code == 0, res.err
    out = json.loads(res.out)
    assert out["policy"] == "edge-coloring"
    assert len(out["links"]) == 2 * (4 * 4 + 4 * 4)
    sc = parse_scenario(yaml.safe_load(spec.read_text()))
    g = from_scenario(sc)
    assert g.number_of_nodes() == 4 + 4 + 16


def test_spec_rejects_unknown_routing(tmp_path: Path) -> None:
    from testbed.errors import InputError
    d = load_yaml("quickstart.yaml")
    d.setdefault("policy", {})["routing"] = "magic"
    with pytest.raises(InputError, match="routing"):
        parse_scenario(d)
    assert parse_scenario(load_yaml("quickstart.yaml")).policy.routing == "ecmp"


def test_from_scenario_needs_leaf_spine() -> None:
    from testbed.errors import InputError
    with pytest.raises(InputError, match="dc_fabric"):
        from_scenario(parse_scenario(load_yaml("quickstart.yaml")))


def test_reproduce_routing_quick(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "rr"
    res = cli("reproduce", "routing", "--out", str(out), "--quick", "-q", "--set", "seeds=2",
              "--set", "sa_budget_s=0.05")
    assert res.code == 0, res.err
    for name in ("summary.csv", "summary.md", "routing.png", "manifest.json", "runs.csv"):
        assert (out / name).stat().st_size > 0
    rows = list(csv.DictReader((out / "summary.csv").open()))
    need = {"policy", "case", "mean_allreduce_time_s", "max_allreduce_time_s", "bottleneck",
            "effective_gpu_utilization", "wall_s"}
    assert need <= set(rows[0])
    pols = {r["policy"] for r in rows}
    assert {"ecmp", "shortest", "edge-coloring", "greedy", "greedy-ls", "sa", "ilp"} <= pols
    by = {(r["case"], r["policy"]): r for r in rows}
    for case in ("small", "small-fail"):
        assert float(by[(case, "ilp")]["ilp_gap_max"]) == 0.0
        assert float(by[(case, "greedy")]["bottleneck_vs_best_worst"]) >= 0.5 - 1e-9
    assert float(by[("clos-8x16", "greedy")]["mean_allreduce_time_s"]) < \
        float(by[("clos-8x16", "ecmp")]["mean_allreduce_time_s"])
    assert "Compared with the paper" in (out / "summary.md").read_text()


def test_remove_links_unknown() -> None:
    from testbed.errors import InputError
    with pytest.raises(InputError, match="no link"):
        remove_links(clos(2, 2, 1), [("spine0", "h0")])
