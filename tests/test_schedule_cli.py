"""`lightpipe schedule` and `lightpipe reproduce` (crosspipe, geopipe) end to end."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from testbed.cli.main import main

BASE = ["schedule", "--stages", "4", "--microbatches", "8", "--forward-ms", "1",
        "--backward-ms", "2"]


def test_schedule_json_no_delay(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*BASE, "--schedule", "1f1b", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["schedule"] == "1f1b"
    assert out["iteration_time_ms"] == pytest.approx(33.0)
    assert out["bubble_ratio"] == pytest.approx(3 / 11)
    assert out["peak_inflight"] == [4, 3, 2, 1]
    assert out["lower_bound_ms"] == pytest.approx(33.0)


def test_schedule_per_hop_lists_trace_and_gantt(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    trace, gantt = tmp_path / "t.json", tmp_path / "g.png"
    rc = main([*BASE, "--latency-ms", "0,5,0", "--bandwidth-gbps", "400,100,inf",
               "--activation-mb", "50", "--schedule", "crosspipe-opt", "--memory-cap", "4",
               "--time-limit-s", "10", "--json", "--trace", str(trace), "--gantt", str(gantt)])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["solver_status"] == "OPTIMAL" and out["gap"] == 0.0
    assert out["lower_bound_ms"] <= out["iteration_time_ms"]
    assert max(out["peak_inflight"]) <= 4
    events = json.loads(trace.read_text())["traceEvents"]
    assert any(e.get("name") == "F0" and e.get("ph") == "X" for e in events)
    assert gantt.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("extra", [
    ["--forward-ms", "1,2"],
    ["--latency-ms", "-1"],
    ["--bandwidth-gbps", "0"],
    ["--microbatches", "x"],
    ["--schedule", "nope"],
    ["--schedule", "gpipe", "--memory-cap", "2"],
    ["--schedule", "gpipe", "--virtual-stages", "2"],
])
def test_schedule_bad_input_exit_2(extra: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*BASE, *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("lightpipe: error:") and err.count("\n") == 1


def test_reproduce_unknown_and_bad_option(tmp_path: Path) -> None:
    assert main(["reproduce", "nope", "--out", str(tmp_path / "x")]) == 2
    assert main(["reproduce", "geopipe", "--out", str(tmp_path / "x"), "--set", "foo=1"]) == 2
    assert not (tmp_path / "x").exists()


def test_reproduce_geopipe_quick(reproduced) -> None:  # type: ignore[no-untyped-def]
    r = reproduced("geopipe")  # (its report: tests/test_report.py, the same run)
    out = r.out
    assert r.code == 0, r.stderr
    for name in ("geopipe.csv", "geopipe.md", "summary.json", "summary.md",
                 "geopipe_latency.png", "geopipe_bandwidth.png"):
        assert (out / name).is_file()
    s = json.loads((out / "summary.json").read_text())
    assert s["max_bubble_reduction_pct"] > 20
    assert s["latency_comparison"]  # the all() below are not vacuous
    assert all(c["iteration_reduction_pct"] >= -1e-9 for c in s["latency_comparison"])
    # equal bytes: GeoPipe within 1F1B's most loaded GPU cannot warm up past 1F1B on
    # stage 0, so it is 1F1B; the relaxed row is labelled and holds more bytes
    assert s["equal_bytes_max_iteration_reduction_pct"] == 0.0
    assert all(c["geopipe_peak_gb"] > c["budget_gb"] for c in s["latency_comparison"])
    rows = list(csv.DictReader((out / "geopipe.csv").open()))
    assert rows
    for r in rows:
        assert (r["fits_budget"] == "True") == (float(r["peak_gb"]) <= float(r["budget_gb"]))
        assert r["memory"] == "equal bytes" or r["fits_budget"] == "False"
    md = (out / "geopipe.md").read_text()
    assert "equal budget 98.48 GB" in md and "(over)" in md
    assert "ours, equal bytes" in (out / "summary.md").read_text()
    knees = s["bandwidth_optimisation_point_gbps"]
    assert any(v is not None and v < 1600 for k, v in knees.items() if k != "1f1b")


@pytest.mark.slow
def test_reproduce_crosspipe_quick(reproduced) -> None:  # type: ignore[no-untyped-def]
    r = reproduced("crosspipe")  # (its report: tests/test_report.py, the same run)
    out = r.out
    assert r.code == 0, r.stderr
    s = json.loads((out / "summary.json").read_text())
    # Whether CP-SAT proves optimality within the quick run's wall-clock limit depends on
    # the machine's load (a busy core left a 0.10 gap once): the summary must say which,
    # consistently; the schedules it found must still beat or equal every baseline (below:
    # the solver starts from the best heuristic and never returns anything worse).
    assert s["all_optimal"] == (s["max_gap"] == 0.0), s
    assert 0.0 <= s["max_gap"] <= 1.0
    assert s["opt_never_beaten_at_equal_bytes"]
    assert s["max_reduction_vs_1f1b_same_memory_pct"] > 10
    for g in s["reductions"]:
        assert g["opt_vs_1f1b_equal_bytes_pct"] >= -1e-6
        assert g["opt_vs_best_fitting_pct"] >= -1e-6  # zb-h1 included
        # more memory freedom never hurts: equal bytes >= strict per-stage bytes
        assert g["opt_vs_1f1b_equal_bytes_pct"] >= g["strict_vs_1f1b_pct"] - 1e-6
    rows = list(csv.DictReader((out / "crosspipe.csv").open()))
    assert {r["schedule"] for r in rows if r["fits_budget"] == "False"} >= {"gpipe"}
    assert "Equal budget" in (out / "crosspipe.md").read_text()
    assert (out / "summary.md").is_file()
    assert (out / "crosspipe_latency.png").is_file()
