"""`make setup` puts `lightpipe` on PATH (scripts/link_cli.sh, run by scripts/setup.sh):
as root it links LINK to this checkout's venv script when LINK is free, leads nowhere or is
already that link, and leaves anything else (the VM's wrapper, another checkout's link)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
VENV_CLI = (ROOT / ".venv" / "bin" / "lightpipe").resolve()
pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not VENV_CLI.exists(),
                                reason="needs root and make setup's .venv")


def _link(link: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(ROOT / "scripts/link_cli.sh"), str(ROOT / ".venv"),
                           str(link)], capture_output=True, text=True, timeout=60, check=True)


def test_setup_runs_the_link_step() -> None:
    assert 'link_cli.sh" "$VENV"' in (ROOT / "scripts/setup.sh").read_text()


def test_links_a_free_path_and_keeps_its_own_link(tmp_path: Path) -> None:
    link = tmp_path / "bin" / "lightpipe"
    res = _link(link)
    assert os.readlink(link) == str(VENV_CLI)
    assert f"lightpipe on PATH: linked {link} -> {VENV_CLI}" in res.stderr
    res = _link(link)
    assert os.readlink(link) == str(VENV_CLI) and "linked" not in res.stderr
    out = subprocess.run([str(link), "--version"], capture_output=True, text=True, timeout=60)
    assert out.stdout.startswith("lightpipe ")


def test_replaces_a_link_that_leads_nowhere(tmp_path: Path) -> None:
    link = tmp_path / "lightpipe"
    link.symlink_to(tmp_path / "removed-checkout" / ".venv" / "bin" / "lightpipe")
    _link(link)
    assert os.readlink(link) == str(VENV_CLI)


def test_leaves_what_is_not_its_own(tmp_path: Path) -> None:
    wrapper = tmp_path / "lightpipe"
    wrapper.write_text("#!/bin/sh\necho the VM's wrapper\n")
    res = _link(wrapper)
    assert wrapper.read_text() == "#!/bin/sh\necho the VM's wrapper\n"
    assert "left as it is" in res.stderr and str(VENV_CLI) in res.stderr
    other = tmp_path / "other"
    other.write_text("x")
    link = tmp_path / "bin-lightpipe"
    link.symlink_to(other)
    _link(link)
    assert os.readlink(link) == str(other) and other.read_text() == "x"
