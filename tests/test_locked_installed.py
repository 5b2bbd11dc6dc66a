"""scripts/locked_installed.py: make setup leaves pip out only when the venv holds the lock."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "locked_installed.py"
LOCK = ROOT / "requirements.lock"


def _check(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True,
                          text=True, timeout=120, check=False)


def _pin(name: str) -> str:
    return f"{name}=={metadata.version(name)} \\\n    --hash=sha256:{'0' * 64}\n    # via x\n"


def test_the_suites_own_venv_holds_the_lock() -> None:
    """`make setup` built this venv from requirements.lock: it holds every pin."""
    r = _check(str(LOCK))
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize(("extra", "why"), [
    ("pyyaml==0.0.1", "pyyaml is"),
    ("no-such-package-lightpipe==1.0", "no-such-package-lightpipe is not installed"),
])
def test_a_version_off_or_a_missing_package_says_which(tmp_path: Path, extra: str,
                                                       why: str) -> None:
    lock = tmp_path / "lock.txt"
    lock.write_text("# a lock\n" + _pin("pyyaml") + _pin("pydantic"))
    assert _check(str(lock)).returncode == 0  # the installed versions: satisfied
    lock.write_text(lock.read_text() + extra + f" \\\n    --hash=sha256:{'1' * 64}\n")
    r = _check(str(lock))
    assert r.returncode == 1 and why in r.stderr and len(r.stderr.splitlines()) == 1


def test_an_extra_pin_on_the_command_line_counts() -> None:
    assert _check(str(LOCK), "pyyaml==0.0.1").returncode == 1


@pytest.mark.parametrize("line", ["pyyaml>=6", "pyyaml==6.0 ; python_version <<< '3'",
                                  "-e .", "git+https://example.org/x.git"])
def test_a_line_it_cannot_read_sends_setup_to_pip(tmp_path: Path, line: str) -> None:
    lock = tmp_path / "lock.txt"
    lock.write_text(_pin("pyyaml") + line + "\n")
    r = _check(str(lock))
    assert r.returncode == 1 and "cannot read" in r.stderr


def test_a_marker_decides_per_python(tmp_path: Path) -> None:
    """One lock for 3.11-3.13: a pin whose marker does not hold here (gnpy's on 3.13) is not
    asked for; one whose marker holds is checked like any other."""
    lock = tmp_path / "lock.txt"
    hashes = " \\\n    --hash=sha256:" + "1" * 64
    off = "no-such-package-lightpipe==1.0 ; python_version < '3'" + hashes
    lock.write_text(_pin("pyyaml") + off + "\n")
    assert _check(str(lock)).returncode == 0
    held = "no-such-package-lightpipe==1.0 ; python_version >= '3'" + hashes
    lock.write_text(_pin("pyyaml") + held + "\n")
    r = _check(str(lock))
    assert r.returncode == 1 and "no-such-package-lightpipe is not installed" in r.stderr


def test_an_empty_or_missing_lock_is_not_satisfied(tmp_path: Path) -> None:
    (tmp_path / "empty.txt").write_text("# nothing\n")
    assert _check(str(tmp_path / "empty.txt")).returncode == 1
    assert _check(str(tmp_path / "missing.txt")).returncode == 1
    assert _check().returncode == 2
