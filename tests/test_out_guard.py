"""--out never destroys what LightPipe did not write (issue 17)."""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed.cli.main import main

QUICKSTART = Path(__file__).resolve().parent.parent / "scenarios" / "quickstart.yaml"


def test_out_onto_existing_file_is_refused(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "README.md"
    target.write_text("precious\n")
    assert main(["sim", str(QUICKSTART), "--out", str(target), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--out" in err and len(err.splitlines()) == 1
    assert target.read_text() == "precious\n"
    assert [p.name for p in tmp_path.iterdir()] == ["README.md"]


def test_out_onto_foreign_directory_is_refused(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "results"
    target.mkdir()
    (target / "mine.csv").write_text("a,b\n")
    assert main(["sim", str(QUICKSTART), "--out", str(target), "--quiet"]) == 2
    assert "not a LightPipe run" in capsys.readouterr().err
    assert [p.name for p in target.iterdir()] == ["mine.csv"]


def test_out_onto_previous_run_needs_force(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    """Replacing a run needs --force, which names what it replaces."""
    import json

    target = tmp_path / "run"
    assert main(["sim", str(QUICKSTART), "--out", str(target), "--quiet"]) == 0
    first = json.loads((target / "manifest.json").read_text())["started_unix_s"]
    capsys.readouterr()
    assert main(["sim", str(QUICKSTART), "--out", str(target), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--force" in err and "quickstart" in err, err
    assert json.loads((target / "manifest.json").read_text())["started_unix_s"] == first
    assert main(["sim", str(QUICKSTART), "--out", str(target), "--quiet", "--force"]) == 0
    assert "replacing the run" in capsys.readouterr().out
    assert json.loads((target / "manifest.json").read_text())["started_unix_s"] > first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # no .old-/.partial left


def test_both_backends_run_needs_force_too(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    """A `--backend both` directory (runs under sim/ and emu/) is a run as well."""
    target = tmp_path / "both"
    (target / "sim").mkdir(parents=True)
    assert main(["sim", str(QUICKSTART), "--out", str(target / "sim"), "--quiet",
                 "--force"]) == 0
    capsys.readouterr()
    assert main(["sim", str(QUICKSTART), "--out", str(target), "--quiet"]) == 2
    assert "already holds a LightPipe run" in capsys.readouterr().err
