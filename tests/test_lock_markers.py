"""scripts/lock_markers.py: one lock for Python 3.11-3.13, its markers where they belong."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "lock_markers.py"
H = "    --hash=sha256:" + "0" * 64 + "\n"


def _pin(name: str, *via: str) -> str:
    lines = f"{name}==1.0 \\\n{H}"
    if len(via) == 1:
        return lines + f"    # via {via[0]}\n"
    return lines + "    # via\n" + "".join(f"    #   {v}\n" for v in via)


def _run(tmp_path: Path, raw: str, deps: str) -> str:
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "lightpipe"\nversion = "0"\ndependencies = ["dd>=1"]\n'
        f'[project.optional-dependencies]\nx = [{deps}]\n')
    (tmp_path / "raw.lock").write_text(raw)
    r = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "raw.lock"),
                        str(tmp_path / "out.lock"), str(tmp_path / "pyproject.toml")],
                       capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stderr
    return (tmp_path / "out.lock").read_text()


def test_a_marker_goes_onto_its_pin_and_what_only_it_needs(tmp_path: Path) -> None:
    raw = (_pin("aa", "lightpipe (pyproject.toml)") + _pin("bb", "aa") + _pin("cc", "bb")
           + _pin("dd", "aa", "lightpipe (pyproject.toml)") + _pin("ee", "aa", "ff")
           + _pin("ff", "lightpipe (pyproject.toml)"))
    out = _run(tmp_path, raw, "\"aa==1.0; python_version < '3.13'\", \"ff\"")
    marked = {line.split("==")[0] for line in out.splitlines() if " ; " in line}
    assert marked == {"aa", "bb", "cc"}, out
    assert "aa==1.0 ; python_version < '3.13' \\\n" in out
    assert out.count("--hash=sha256:") == 6  # every pin keeps its hashes


def test_torch_and_its_cuda_libraries_are_left_out(tmp_path: Path) -> None:
    raw = (_pin("torch", "lightpipe (pyproject.toml)") + _pin("nvidia-cublas", "torch")
           + _pin("cuda-bindings", "torch") + _pin("cuda-pathfinder", "cuda-bindings")
           + _pin("triton", "torch") + _pin("sympy", "torch") + _pin("dd", "lightpipe"))
    out = _run(tmp_path, raw, '"torch==2.13.0"')
    names = {line.split("==")[0] for line in out.splitlines()
             if "==" in line and not line.startswith("#")}
    assert names == {"sympy", "dd"}, out


def test_the_committed_lock_is_what_the_script_writes(tmp_path: Path) -> None:
    """requirements.lock already has its markers (a hand edit or a stale run shows here)."""
    r = subprocess.run([sys.executable, str(SCRIPT), str(ROOT / "requirements.lock"),
                        str(tmp_path / "again.lock"), str(ROOT / "pyproject.toml")],
                       capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "again.lock").read_text() == (ROOT / "requirements.lock").read_text()
    assert "gnpy ; python_version < '3.13'" in r.stderr
