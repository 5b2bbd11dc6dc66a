"""scripts/install_torch.py and setup.sh's Python check: torch as a user's machine gets it.

Each install runs in a fresh venv whose pip is isolated from this machine's configuration
(no find-links, no config files, no constraints): PyPI only, as on a user's machine. PyTorch's
CPU index is played by a PEP 503 index on 127.0.0.1 that serves a real CPU wheel of torch
(the one this machine's pip finds; skipped where there is none).
"""

from __future__ import annotations

import http.server
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "install_torch.py"
SETUP = ROOT / "scripts" / "setup.sh"
TORCH = "2.13.0"


def isolated_env(**extra: str) -> dict[str, str]:
    """This process's environment with pip seeing PyPI only (a user's machine)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PIP_", "LIGHTPIPE_TORCH_"))}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1", **extra)
    return env


@pytest.fixture(scope="module")
def fresh_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A new venv (pip only, no torch) with the current Python."""
    venv = tmp_path_factory.mktemp("venv") / "v"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    return venv


def run_script(venv: Path, *args: str, timeout_s: float = 120,
               **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(venv / "bin" / "python"), str(SCRIPT), *args],
                          capture_output=True, text=True, timeout=timeout_s,
                          env=isolated_env(**env), check=False)


@pytest.mark.parametrize(("args", "env", "names"), [
    (["--source", "conda"], {}, "LIGHTPIPE_TORCH_SOURCE"),
    ([], {"LIGHTPIPE_TORCH_SOURCE": "nightly"}, "'nightly'"),
    (["--index", "ftp://mirror/whl"], {}, "LIGHTPIPE_TORCH_INDEX"),
    (["--probe-timeout-s", "0"], {}, "LIGHTPIPE_TORCH_PROBE_TIMEOUT_S"),
])
def test_bad_settings_are_refused_in_one_line(fresh_venv: Path, args: list[str],
                                              env: dict[str, str], names: str) -> None:
    r = run_script(fresh_venv, *args, **env)
    assert r.returncode == 2, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and names in r.stderr, r.stderr
    assert not (fresh_venv / "lightpipe-torch-source.json").exists()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_refused_index_fails_over_at_once(fresh_venv: Path) -> None:
    """Connection refused: the probe says so; no pip retries behind it."""
    index = f"http://127.0.0.1:{_closed_port()}/simple"
    r = run_script(fresh_venv, "--reinstall", "--source", "cpu-index", "--index", index,
                   timeout_s=60)
    assert r.returncode == 1, r.stderr
    assert f"CPU index {index} is unreachable" in r.stderr, r.stderr
    assert "no working torch==2.13.0 from cpu-index" in r.stderr


def test_a_silent_index_fails_over_after_the_probe_timeout(fresh_venv: Path) -> None:
    """A server that accepts and never answers (a firewall's black hole): the probe's own
    timeout ends it, not pip's default of 15 s times 5 retries."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        index = f"http://127.0.0.1:{server.getsockname()[1]}/simple"
        r = run_script(fresh_venv, "--reinstall", "--source", "cpu-index", "--index", index,
                       "--probe-timeout-s", "1", timeout_s=60)
    assert r.returncode == 1, r.stderr
    assert "is unreachable (timed out after 1." in r.stderr, r.stderr


def _local_cpu_wheel() -> Path | None:
    """The CPU torch wheel this machine's pip configuration points at, if any."""
    dirs = [d for d in os.environ.get("PIP_FIND_LINKS", "").split() if d]
    for d in [*dirs, "/opt/wheels"]:
        path = Path(d)
        if path.is_dir():
            tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
            for whl in sorted(path.glob(f"torch-{TORCH}+cpu-{tag}-*.whl")):
                return whl
    return None


@pytest.fixture
def cpu_index(tmp_path: Path) -> Iterator[str]:
    """A PEP 503 index on 127.0.0.1 holding one CPU torch wheel: PyTorch's CPU index's shape."""
    wheel = _local_cpu_wheel()
    if wheel is None:
        pytest.skip("no local CPU torch wheel for this Python to serve as the CPU index")
    root = tmp_path / "index"
    (root / "torch").mkdir(parents=True)
    os.link(wheel, root / "torch" / wheel.name) if wheel.stat().st_dev == root.stat().st_dev \
        else shutil.copy(wheel, root / "torch" / wheel.name)
    href = wheel.name.replace("+", "%2B")
    (root / "torch" / "index.html").write_text(
        f'<!DOCTYPE html><html><body><a href="{href}">{wheel.name}</a></body></html>\n')

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *a, **k):  # type: ignore[no-untyped-def]
            super().__init__(*a, directory=str(root), **k)

        def log_message(self, *a) -> None:  # type: ignore[no-untyped-def]
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.mark.slow
def test_a_user_machine_takes_the_cpu_index_and_torch_computes(tmp_path: Path,
                                                               cpu_index: str) -> None:
    """pip sees PyPI only: PyPI's torch for Linux x86_64 is a CUDA build, so the CPU index
    is taken; torch then imports and computes, and the source is recorded."""
    venv = tmp_path / "v"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    # torch's own requirements, as the lock gives them (the lock is installed first).
    deps = subprocess.run(
        [str(venv / "bin" / "pip"), "install", "-q", "typing-extensions", "sympy", "filelock",
         "fsspec", "jinja2", "networkx", "numpy"],
        capture_output=True, text=True, timeout=600, env=isolated_env(), check=False)
    assert deps.returncode == 0, deps.stderr
    r = run_script(venv, "--index", cpu_index, timeout_s=900)
    assert r.returncode == 0, r.stderr
    lines = r.stderr
    if sys.platform == "linux" and os.uname().machine == "x86_64":
        assert "is a CUDA build: looking for a CPU build" in lines, lines
    record = json.loads((venv / "lightpipe-torch-source.json").read_text())
    assert record["source"] == "cpu-index" and record["detail"] == cpu_index, record
    assert record["torch"] == f"{TORCH}+cpu" and record["cuda"] is None, record
    assert f"torch {TORCH}+cpu (CPU build) from cpu-index" in lines
    # A rerun finds it and keeps the recorded source.
    again = run_script(venv, "--index", cpu_index, timeout_s=300)
    assert again.returncode == 0 and "installed already, from cpu-index" in again.stderr


def test_the_suites_venv_records_where_its_torch_came_from() -> None:
    """`make setup` built this venv: its torch source is recorded, and where this machine's
    pip has a local CPU wheel, that file was used (not a download)."""
    path = Path(sys.prefix) / "lightpipe-torch-source.json"
    if not path.is_file():
        pytest.skip("this venv was not made by this make setup")
    record = json.loads(path.read_text())
    assert record["source"] in {"local-file", "pypi-cpu", "cpu-index", "pypi",
                                "already-installed"}, record
    import torch

    assert record["torch"] == torch.__version__
    if _local_cpu_wheel() is not None and record["source"] != "already-installed":
        assert record["source"] == "local-file" and record["detail"].startswith("file://")


def _setup(venv: Path, python: str) -> subprocess.CompletedProcess[str]:
    env = isolated_env(PYTHON=python)
    return subprocess.run(["bash", str(SETUP), str(venv)], capture_output=True, text=True,
                          timeout=120, env=env, cwd=ROOT, check=False)


def _find_python(version: str) -> str | None:
    r = subprocess.run(["bash", str(ROOT / "scripts" / "find_python.sh"), version],
                       capture_output=True, text=True, timeout=60, check=False)
    return r.stdout.strip() or None


@pytest.mark.parametrize("version", ["3.10", "3.9", "3.14"])
def test_an_unsupported_python_is_refused_in_one_line(tmp_path: Path, version: str) -> None:
    python = _find_python(version)
    if python is None:
        pytest.skip(f"no Python {version} on this machine")
    r = _setup(tmp_path / "venv", python)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines() == [r.stderr.strip()], r.stderr
    assert f"Python {version} ({python}) is not supported" in r.stderr
    assert "3.11, 3.12 or 3.13" in r.stderr and "PYTHON=" in r.stderr
    assert not (tmp_path / "venv").exists()  # nothing made for it


def test_a_missing_python_is_named(tmp_path: Path) -> None:
    r = _setup(tmp_path / "venv", "python3.99-lightpipe-none")
    assert r.returncode == 2 and "PYTHON=python3.99-lightpipe-none: not found" in r.stderr


def test_a_venv_of_another_python_is_refused(tmp_path: Path) -> None:
    """`make setup PYTHON=python3.12` on a venv made with 3.11: one line, nothing touched."""
    other = next((p for v in ("3.12", "3.13", "3.11")
                  if (p := _find_python(v)) and not v.endswith(f".{sys.version_info.minor}")),
                 None)
    if other is None:
        pytest.skip("one supported Python only on this machine")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)
    r = _setup(venv, other)
    assert r.returncode == 2, r.stderr
    assert f"{venv} has Python {sys.version_info.major}.{sys.version_info.minor}" in r.stderr
    assert "VENV=" in r.stderr
