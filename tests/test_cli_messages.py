"""What the CLI says (issue 26, defect 7): unknown options named as such, documented exit
codes only, no Python-isms on the console, --out help that tells how DIR is written."""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed.cli.main import main

SPEC = str(Path(__file__).resolve().parent.parent / "scenarios" / "quickstart.yaml")


def _err(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    return code, capsys.readouterr().err


def test_an_unknown_option_is_named_not_a_missing_required_one(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, err = _err(capsys, "sim", SPEC, "--output", str(tmp_path / "x"))
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "unknown option --output (did you mean --out?)" in err
    assert "required" not in err
    assert not (tmp_path / "x").exists()


def test_the_spec_after_an_unknown_option_is_not_called_unrecognised(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _err(capsys, "sim", "--backend", "emu", SPEC)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "unknown option --backend (an option of `lightpipe run`)" in err
    assert SPEC not in err and "quickstart.yaml" not in err
    # several at once, and one that looks like nothing: each named once
    code, err = _err(capsys, "sim", SPEC, "--outt", "x", "--bogus")
    assert code == 2 and "--outt (did you mean --out?), --bogus;" in err
    # plain argparse errors are kept where no option is unknown
    code, err = _err(capsys, "sim")
    assert code == 2 and "required" in err


def test_monitor_status_uses_the_documented_exit_codes(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code = main(["monitor", "status", "--dir", str(tmp_path / "m")])
    out = capsys.readouterr().out
    assert code == 1  # documented: 0 success, 1 runtime failure, 2 bad input
    assert "prometheus down" in out and "`lightpipe monitor up` starts it" in out


def test_no_python_isms_in_a_run_summary(capsys: pytest.CaptureFixture[str],
                                         tmp_path: Path) -> None:
    from testbed.cli.summary import print_run

    print_run("emu", tmp_path, str(tmp_path), {"mean_goodput_ratio": None, "verified": True,
                                                "blocking_ratio": 0.048}, None, None)
    out = capsys.readouterr().out
    assert "None" not in out and "True" not in out
    assert "mean_goodput_ratio: not measured" in out and "verified: yes" in out


def test_progress_counts_are_written_as_numbers(capsys: pytest.CaptureFixture[str]) -> None:
    from testbed.progress import progress

    with progress(1e6, "simulating requests"):
        pass
    err = capsys.readouterr().err
    assert "simulating requests (1,000,000 steps)" in err and "e+06" not in err


@pytest.mark.parametrize(("command", "says"), [
    ("run", "written as the run goes"), ("sim", "written as the run goes"),
    ("emu", "written as the run goes"), ("sweep", "put in place whole at the end"),
    ("reproduce", "put in place whole at the end")])
def test_out_help_says_how_dir_is_written(capsys: pytest.CaptureFixture[str], command: str,
                                          says: str) -> None:
    assert main([command, "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert says in text
    assert "atomically" not in text


def test_a_fault_that_failed_says_why_on_the_console() -> None:
    """A fault row tried but failed (its `error`, e.g. the controller's REST call timed
    out) says so instead of "not applied (?)" (the user path's guest, 6d8ef00)."""
    from testbed.cli.summary import fault_lines

    rows = [{"kind": "fiber_cut", "target": "A-B", "at_s": 0.2, "applied": False,
             "error": "POST /faults/fiber_cut: timed out after 60 s"},
            {"kind": "fiber_repair", "target": "A-B", "at_s": 0.6, "applied": False,
             "note": "not reached: the workload ended before it was due"},
            {"kind": "fiber_cut", "target": "A-B", "at_s": 0.9, "applied": False}]
    lines = fault_lines(rows)
    assert lines[0].endswith("not applied (POST /faults/fiber_cut: timed out after 60 s)")
    assert lines[1].endswith("(not reached: the workload ended before it was due)")
    assert lines[2].endswith("not applied (?)")
