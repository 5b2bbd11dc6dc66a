"""`lightpipe demo` (`make demo`): the headline of the default scenario in seconds, then
the emulated check and the VM (issue 26, defect 3)."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pytest

from testbed.cli.main import main

ROOT = Path(__file__).resolve().parent.parent


def test_demo_shows_policies_and_schedules_side_by_side_then_the_next_steps(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out = tmp_path / "demo"
    assert main(["demo", str(ROOT / "scenarios/quickstart.yaml"), "--out", str(out),
                 "-q"]) == 0
    text = capsys.readouterr().out
    # 1. every spectrum policy of the default scenario, best first, with its interval
    rows = re.findall(r"^   (\w+_fit) +(\d+\.\d\d)% ± (\d+\.\d\d)% +(\d+\.\d\d)% +"
                      r"(\d+\.\d)%$", text, re.M)
    assert {r[0] for r in rows} == {"first_fit", "best_fit", "last_fit", "random_fit"}
    blocking = [float(r[1]) for r in rows]
    assert blocking == sorted(blocking) and 1 < blocking[0] < blocking[-1] < 20
    assert "20,000 lightpath requests at 10 Erlang" in text
    # the simulated blocking is the simulator's (0.048 on seed 1, not an emulated replay's)
    with (out / "policies.csv").open() as f:
        pol = {r["policy"]: r for r in csv.DictReader(f)}
    shown = {r[0]: r[1] for r in rows}
    assert all(f"{float(p['blocking_ratio']):.2%}" == f"{shown[k]}%" for k, p in pol.items())
    assert int(pol["first_fit"]["seeds"]) == 3
    # 2. the pipeline schedules on one cross-DC pipeline
    sched = dict(re.findall(r"^   ([\w-]+) +(\d+\.\d) ms +\d+\.\d% +\d+ micro-batches$",
                            text, re.M))
    assert set(sched) == {"gpipe", "1f1b", "zb-h1", "crosspipe-greedy"}
    # 3./4. what to run next: the emulated check (saying whether this machine can) and the VM
    assert "lightpipe run scenarios/quickstart.yaml --backend both --out runs/quickstart" \
        in text.replace(str(ROOT) + "/", "")
    assert re.search(r"this machine (can run it|cannot \(.+\): use the VM below)", text)
    assert "cd vagrant && vagrant up" in text
    assert "None" not in text and "e+0" not in text
    man = json.loads((out / "manifest.json").read_text())
    assert man["backend"] == "sim" and man["scenario"] == "quickstart"
    assert (out / "demo.md").read_text().count("best_fit") >= 1


def test_demo_input_errors(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["demo", str(ROOT / "scenarios/pp-jobs.yaml"), "--out",
                 str(tmp_path / "d")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "lightpath_requests" in err
    assert main(["demo", "--seeds", "0", "--out", str(tmp_path / "d")]) == 2
    assert "--seeds" in capsys.readouterr().err
    assert not (tmp_path / "d").exists()
