"""scripts/lock_markers.py: one lock for Python 3.11-3.13 from each Python's resolution."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "lock_markers.py"
H = "    --hash=sha256:" + "0" * 64 + "\n"


def _pins(*pins: str) -> str:
    return "".join(f"{p} \\\n{H}    # via x\n" for p in pins)


def _merge(tmp_path: Path, **raws: str) -> tuple[str, str]:
    args = []
    for py, text in raws.items():
        path = tmp_path / f"raw-{py}.lock"
        path.write_text(text)
        args.append(f"{py.replace('_', '.')}={path}")
    r = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "out.lock"), *args],
                       capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stderr
    return (tmp_path / "out.lock").read_text(), r.stderr


def _first_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if "==" in line and not line.startswith("#")]


def test_each_pin_gets_the_marker_of_the_pythons_that_need_it(tmp_path: Path) -> None:
    out, _ = _merge(tmp_path,
                    **{"3_11": _pins("aa==1.0", "gnpy==3.0.1", "libyang==0.1", "sb==2.0"),
                       "3_12": _pins("aa==1.0", "gnpy==3.0.1", "libyang==0.1", "sb==2.0"),
                       "3_13": _pins("aa==1.0", "legacy-cgi==2.6", "sb==2.1")})
    assert _first_lines(out) == [
        "aa==1.0 \\",
        "gnpy==3.0.1 ; python_version < '3.13' \\",
        "legacy-cgi==2.6 ; python_version >= '3.13' \\",
        "libyang==0.1 ; python_version < '3.13' \\",
        "sb==2.0 ; python_version < '3.13' \\",
        "sb==2.1 ; python_version >= '3.13' \\",
    ]
    assert out.count("--hash=sha256:") == 6  # every pin keeps its hashes


def test_one_python_alone_and_two_apart(tmp_path: Path) -> None:
    out, _ = _merge(tmp_path, **{"3_11": _pins("x==1", "y==1"), "3_12": _pins("x==2", "y==2"),
                                 "3_13": _pins("x==1", "y==1")})
    lines = _first_lines(out)
    assert "x==2 ; python_version == '3.12' \\" in lines
    assert "x==1 ; python_version == '3.11' or python_version == '3.13' \\" in lines


def test_torch_and_its_cuda_libraries_are_left_out(tmp_path: Path) -> None:
    raw = _pins("torch==2.13.0", "nvidia-cublas==13.1", "cuda-bindings==13.5",
                "cuda-pathfinder==1.9", "triton==3.7.1", "sympy==1.14.0", "dd==1.0")
    out, _ = _merge(tmp_path, **{"3_11": raw, "3_12": raw})
    assert [line.split("==")[0] for line in _first_lines(out)] == ["dd", "sympy"]


def test_the_committed_lock_serves_three_pythons_with_its_markers() -> None:
    """The lock as committed: merged from 3.11, 3.12 and 3.13 (gnpy's marker and webob's
    legacy-cgi for 3.13 are the two known differences)."""
    text = (ROOT / "requirements.lock").read_text()
    assert "gnpy==3.0.1 ; python_version < '3.13' \\\n" in text
    assert "legacy-cgi==" in text and "; python_version >= '3.13'" in text
    pins = [line for line in text.splitlines() if line[:1].isalnum()]
    assert not [p for p in pins if p.startswith(("torch==", "nvidia-", "cuda-", "triton=="))]


def test_a_bad_argument_exits_2(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "o"), "py3=x"],
                       capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 2 and "'py3'" in r.stderr
