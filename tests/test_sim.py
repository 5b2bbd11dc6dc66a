"""Simulator tests: requests.csv replays without conflicts, traces, events, CLI outputs."""

from __future__ import annotations

import csv
import heapq
import json
from itertools import pairwise
from pathlib import Path

import pytest

from testbed.cli.main import main
from testbed.errors import InputError
from testbed.optical import OpticalNetwork
from testbed.sim import simulate_lightpaths
from testbed.sim.engine import REQUESTS_COLUMNS
from testbed.spec import parse_scenario

ROOT = Path(__file__).resolve().parents[1]


def nsfnet(**over: object) -> dict:
    spec = {
        "name": "t", "topology": {"library": "nsfnet"},
        "optical": {"slots": 40, "k_paths": 3, "guard_slots": 1},
        "workload": {"kind": "lightpath_requests", "load_erlang": 60, "requests": 4000,
                     "bitrate_gbps": [10, 100, 200], "seed": 4},
    }
    spec.update(over)
    return spec


def rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


@pytest.mark.parametrize("policy", ["first_fit", "last_fit", "random_fit", "best_fit"])
def test_requests_csv_replays_without_conflict(tmp_path: Path, policy: str) -> None:
    scenario = parse_scenario(nsfnet(policy={"spectrum": policy}))
    out = tmp_path / "requests.csv"
    summary = simulate_lightpaths(scenario, out)
    data = rows(out)
    assert list(data[0]) == list(REQUESTS_COLUMNS)
    assert len(data) == summary["requests"] == 4000
    assert sum(r["accepted"] == "0" for r in data) == summary["blocked"] > 0
    assert summary["blocked"] < 4000
    # Replay the accepted rows on a fresh network: every block must be free when taken.
    net = OpticalNetwork.from_scenario(scenario)
    live: list[tuple[float, int, object]] = []
    for r in data:
        t = float(r["arrival_s"])
        while live and live[0][0] <= t:
            net.release(heapq.heappop(live)[2])  # type: ignore[arg-type]
        if r["accepted"] == "1":
            path = net.path_info(r["path"].split("-"))
            assert path.modulation == r["modulation"]
            n = int(r["slots"])
            assert n == net.slots_needed(float(r["bitrate"]), path)
            lp = net.assign(path, int(r["first_slot"]), n)
            heapq.heappush(live, (t + float(r["holding_s"]), lp.id, lp))
        else:
            assert r["reason"] in ("no_spectrum", "no_reach", "no_path")
            assert net.allocate(r["src"], r["dst"], bitrate_gbps=float(r["bitrate"])) is None


def test_deterministic_and_summary_fields(tmp_path: Path) -> None:
    a = simulate_lightpaths(parse_scenario(nsfnet()))
    b = simulate_lightpaths(parse_scenario(nsfnet()))
    for key in ("requests", "blocked", "blocking_ratio", "blocking_ci95",
                "bitrate_blocking_ratio", "mean_spectrum_utilization"):
        assert a[key] == b[key]
    lo, hi = a["blocking_ci95"]
    assert lo <= a["blocking_ratio"] <= hi
    assert 0 < a["mean_spectrum_utilization"] < 1
    assert a["bitrate_blocking_ratio"] >= a["blocking_ratio"]  # big requests block more
    assert a["wall_s"] > 0 and a["requests_per_s"] > 0


def test_fiber_cut_loses_or_restores(tmp_path: Path) -> None:
    events = [{"at_s": 20.0, "kind": "fiber_cut", "link": ["9", "10"]},
              {"at_s": 40.0, "kind": "fiber_repair", "link": ["9", "10"]},
              {"at_s": 45.0, "kind": "wavelength_loss", "link": ["1", "2"], "first_slot": 0,
               "slots": 20},
              {"at_s": 50.0, "kind": "wavelength_repair", "link": ["1", "2"], "first_slot": 0,
               "slots": 20}]
    out = tmp_path / "r.csv"
    s = simulate_lightpaths(parse_scenario(nsfnet(events=events)), out)
    assert s["events_applied"] == 4
    assert s["lightpaths_lost"] + s["lightpaths_restored"] > 0
    assert s["lightpaths_restored"] > 0
    for r in rows(out):
        t = float(r["arrival_s"])
        nodes = r["path"].split("-")
        hops = {frozenset(h) for h in pairwise(nodes)}
        if r["accepted"] == "1" and 20.0 <= t < 40.0:
            assert frozenset(("9", "10")) not in hops
        if r["accepted"] == "1" and 45.0 <= t < 50.0 and frozenset(("1", "2")) in hops:
            assert int(r["first_slot"]) >= 20


def test_trace_file(tmp_path: Path) -> None:
    trace = tmp_path / "trace.csv"
    trace.write_text("id,arrival_s,holding_s,src,dst,bitrate_gbps\n"
                     "7,0.0,10,a,b,50\n8,1.0,10,b,a,50\n9,2.0,10,a,b,50\n10,20,1,a,b,100\n")
    spec = {"name": "tr", "topology": {"links": [{"u": "a", "v": "b", "length_km": 100}]},
            "optical": {"slots": 2, "k_paths": 1},
            "workload": {"kind": "lightpath_requests", "trace": str(trace)}}
    out = tmp_path / "r.csv"
    s = simulate_lightpaths(parse_scenario(spec), out)
    assert (s["requests"], s["blocked"]) == (4, 1)
    got = [(r["id"], r["accepted"], r["first_slot"]) for r in rows(out)]
    assert got == [("7", "1", "0"), ("8", "1", "1"), ("9", "0", ""), ("10", "1", "0")]
    assert s["bitrate_blocking_ratio"] == pytest.approx(50 / 250)


@pytest.mark.parametrize(("text", "msg"), [
    ("arrival_s,src,dst,bitrate_gbps\n", "missing column"),
    ("arrival_s,holding_s,src,dst,bitrate_gbps\n1,1,a,zz,10\n", "not a node"),
    ("arrival_s,holding_s,src,dst,bitrate_gbps\n1,1,a,b,x\n", "must be numbers"),
    ("arrival_s,holding_s,src,dst,bitrate_gbps\n2,1,a,b,1\n1,1,a,b,1\n", "sort by arrival"),
    ("arrival_s,holding_s,src,dst,bitrate_gbps\n1,0,a,b,1\n", "holding_s must be > 0"),
])
def test_bad_trace(tmp_path: Path, text: str, msg: str) -> None:
    trace = tmp_path / "trace.csv"
    trace.write_text(text)
    spec = {"name": "tr", "topology": {"links": [{"u": "a", "v": "b", "length_km": 100}]},
            "workload": {"kind": "lightpath_requests", "trace": str(trace)}}
    with pytest.raises(InputError, match=msg) as info:
        simulate_lightpaths(parse_scenario(spec))
    assert info.value.path == "workload.trace"


def test_cli_sim_writes_records(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "s.json"
    spec.write_text(json.dumps(nsfnet()))
    out = tmp_path / "run"
    assert main(["sim", str(spec), "--out", str(out), "--quiet"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["backend"] == "sim" and manifest["seed"] == 4 and manifest["spec_sha256"]
    for key in ("requests", "blocked", "blocking_ratio", "blocking_ci95",
                "bitrate_blocking_ratio", "mean_spectrum_utilization", "wall_s",
                "requests_per_s", "lightpaths_lost", "lightpaths_restored"):
        assert key in summary
    assert len(rows(out / "requests.csv")) == 4000
    assert "blocking_ratio" in capsys.readouterr().out


def test_cli_sim_bad_trace_leaves_nothing(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "trace.csv"
    trace.write_text("arrival_s,holding_s,src,dst,bitrate_gbps\n1,1,a,b,10\n0,1,a,b,10\n")
    spec = tmp_path / "s.yaml"
    spec.write_text("name: x\ntopology: {links: [{u: a, v: b, length_km: 10}]}\n"
                    f"workload: {{kind: lightpath_requests, trace: {trace}}}\n")
    out = tmp_path / "run"
    assert main(["sim", str(spec), "--out", str(out), "-q"]) == 2
    assert not out.exists()
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "workload.trace" in err


def test_quickstart_runs(tmp_path: Path) -> None:
    assert main(["sim", str(ROOT / "scenarios/quickstart.yaml"), "--out",
                 str(tmp_path / "q"), "-q"]) == 0
    assert json.loads((tmp_path / "q/summary.json").read_text())["requests"] == 20000
