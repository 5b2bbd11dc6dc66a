"""`lightpipe reproduce cba|bace` end to end on a tiny sweep (CSV, Markdown, PNG)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from testbed.cli.main import main


@pytest.mark.slow
@pytest.mark.parametrize("name,policies", [
    ("cba", {"sp-ff", "sp-ff-best", "cba", "joint", "cba-ilp", "cba-no-cb", "cba-k1",
             "cba-no-search", "sp-ff 1f1b", "sp-ff-best 1f1b", "cba 1f1b"}),
    ("bace", {"delay-first", "cost-first", "delay-first-best", "bace-pipe", "joint",
              "bace-pipe-fifo", "bace-pipe-no-path", "bace-pipe-no-cost"})])
def test_reproduce_quick(reproduced, name: str, policies: set[str]) -> None:  # type: ignore[no-untyped-def]
    """The quick reproduction's tables (its report: tests/test_report.py, same run)."""
    r = reproduced(name, "seeds=2", "jobs=12")
    out = r.out
    assert r.code == 0, r.stderr
    rows = list(csv.DictReader((out / "summary.csv").open()))
    assert {r["policy"] for r in rows} == policies
    for col in ("jobs", "blocking_ratio", "mean_iteration_time_s", "mean_jct_s",
                "total_cost_usd", "gpu_utilization", "spectrum_utilization"):
        assert col in rows[0]
    assert (out / f"{name}.png").stat().st_size > 1000
    md = (out / "summary.md").read_text()
    assert "±" in md
    # the ablation table with the baseline at its best, the attribution and the notes
    assert "baseline at its best" in md and "# Attribution" in md
    assert "Against the paper" in md
    ablation = [r for r in rows if r.get("case") == "ablation"]
    assert {r["role"] for r in ablation} >= {"paper's policy"}
    assert all(r["seeds"] == "2" for r in ablation)
    assert json.loads((out / "summary.json").read_text())["experiment"] == name


def test_reproduce_rejects_unknown_option(tmp_path: Path) -> None:
    rc = main(["reproduce", "cba", "--out", str(tmp_path / "x"), "--set", "bogus=1"])
    assert rc == 2
    assert not (tmp_path / "x").exists()
