"""A sweep point that fails (any error type) is named; the finished points are kept."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from testbed.experiments import sweep

QUICKSTART = Path(__file__).resolve().parent.parent / "scenarios" / "quickstart.yaml"


@pytest.mark.parametrize("jobs", [1, 2])
def test_worker_input_error_is_named_and_finished_points_kept(jobs: int) -> None:
    good = yaml.safe_load(QUICKSTART.read_text())
    bad = yaml.safe_load(QUICKSTART.read_text())
    bad["name"] = ""  # fails spec validation inside the worker: an InputError
    bad["no_such_field"] = 1
    points = [({"case": "good"}, good), ({"case": "bad"}, bad)]
    with pytest.raises(sweep.SweepFailure) as info:
        sweep.run_sweep(points, jobs)
    err = info.value
    assert "point 1" in str(err) and "'bad'" in str(err)
    assert err.exit_code == 2
    assert [r["point"] for r in err.rows] == [0]


def test_cli_sweep_with_failing_point_keeps_rows_and_exits_nonzero(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    from testbed.cli.main import main

    real = sweep.run_point

    def flaky(args):  # type: ignore[no-untyped-def]
        if args[0] == 1:
            raise ZeroDivisionError("boom")
        return real(args)

    monkeypatch.setattr(sweep, "run_point", flaky)
    out = tmp_path / "sw"
    code = main(["sweep", str(QUICKSTART), "--seeds", "2", "--out", str(out),
                 "--quiet", "--jobs", "1"])
    err = capsys.readouterr().err
    assert code == 1, err
    assert "point 1" in err and "ZeroDivisionError: boom" in err
    assert (out / "sweep.csv").read_text().strip().count("\n") == 1  # header + finished point
    assert "point 1" in (out / "failed_points.txt").read_text()


def test_cli_sweep_unknown_metric_exits_2(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    from testbed.cli.main import main

    out = tmp_path / "sw"
    assert main(["sweep", str(QUICKSTART), "--metric", "nonsense", "--out", str(out),
                 "--quiet", "--jobs", "1"]) == 2
    err = capsys.readouterr().err
    assert "--metric" in err and "nonsense" in err
    assert not out.exists()
