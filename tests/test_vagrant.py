"""The Vagrant testbed's files: `vagrant validate`, shellcheck on every shell script, and
vagrant/provision.sh idempotent (run twice) where it can run (root, apt)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def shell_scripts() -> list[Path]:
    """Every tracked file that is a shell script (*.sh or a sh/bash shebang)."""
    out = subprocess.run(["git", "ls-files", "--cached", "--others",
                          "--exclude-standard"], cwd=REPO, capture_output=True, text=True,
                         check=False).stdout.split()
    files = [REPO / f for f in out] if out else [p for p in REPO.rglob("*") if ".venv"
                                                 not in p.parts and ".git" not in p.parts]
    found = []
    for p in files:
        if not p.is_file():
            continue
        if p.suffix == ".sh":
            found.append(p)
            continue
        try:
            first = p.open("rb").readline(200)
        except OSError:
            continue
        if first.startswith(b"#!") and (b"bash" in first or first.rstrip().endswith(b"/sh")):
            found.append(p)
    return sorted(set(found))


def test_every_shell_script_is_shellcheck_clean() -> None:
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck not installed (scripts/setup.sh installs it as root)")
    scripts = shell_scripts()
    names = {str(p.relative_to(REPO)) for p in scripts}
    assert {"vagrant/provision.sh", "tests/vm/run.sh", "scripts/setup.sh"} <= names, names
    r = subprocess.run(["shellcheck", "-x", *map(str, scripts)], cwd=REPO,
                       capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stdout[-3000:]


def test_vagrant_validate() -> None:
    if shutil.which("vagrant") is None:
        pytest.skip("vagrant not installed (.ci/run installs vagrant and vagrant-libvirt)")
    env = {**os.environ, "VAGRANT_CHECKPOINT_DISABLE": "1", "LP_CPUS": "2",
           "LP_MEMORY_MB": "4096"}
    r = subprocess.run(["vagrant", "validate"], cwd=REPO / "vagrant", capture_output=True,
                       text=True, check=False, env=env, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "validated successfully" in r.stdout
    bad = subprocess.run(["vagrant", "validate"], cwd=REPO / "vagrant", capture_output=True,
                         text=True, check=False, env={**env, "LP_CPUS": "many"}, timeout=300)
    assert bad.returncode != 0  # CPUs from the environment are parsed, not passed blindly


@pytest.mark.root
@pytest.mark.slow
def test_provision_twice_is_idempotent() -> None:
    """Where it can run (root, apt): twice in a row, both succeed; the second installs
    nothing. Grafana's repository and `make setup` are left out (no network to Grafana
    here; CI runs make setup itself)."""
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        pytest.skip("needs root and apt-get")
    argv = ["bash", str(REPO / "vagrant" / "provision.sh"), "--no-grafana", "--no-setup",
            "--repo", str(REPO)]
    first = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=900)
    assert first.returncode == 0, first.stderr[-2000:]
    second = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=900)
    assert second.returncode == 0, second.stderr[-2000:]
    assert "installing" not in second.stderr, second.stderr
    assert "provision: done" in second.stderr


def test_provision_rejects_unknown_flags() -> None:
    r = subprocess.run(["bash", str(REPO / "vagrant" / "provision.sh"), "--no-such-flag"],
                       capture_output=True, text=True, check=False)
    assert r.returncode == 2 and "unknown option --no-such-flag" in r.stderr
