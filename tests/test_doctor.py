"""`lightpipe doctor`: every check present, torch's failures and source file, crashes contained."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from testbed import doctor
from testbed.doctor import Found, Probe

from .conftest import ROOT

CHECKS = {"Python", "simulator", "torch", "root", "Open vSwitch (userspace)",
          "OVS kernel datapath", "netem", "Mininet", "os-ken", "iperf3", "Prometheus",
          "Vagrant + libvirt", "free cores", "disk (runs)", "disk (venv)"}
EMULATION_NEEDS = {"root", "Open vSwitch (userspace)", "Mininet", "iperf3"}

# Put first on PYTHONPATH: `import torch` then fails in every Python started with it (the
# doctor's torch check included), as where torch is not installed or does not load.
BLOCK_TORCH = '''\
import importlib.abc
import sys


class _NoTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ModuleNotFoundError(f"No module named {name!r} (blocked by the test)")
        return None


sys.meta_path.insert(0, _NoTorch())
'''


def fake_python(tmp_path: Path, body: str) -> str:
    """An executable standing in for the torch check's interpreter (it ignores `-c CODE`)."""
    path = tmp_path / "fake-python"
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)
    return str(path)


FAKE_OK = "echo '{\"ok\": true, \"version\": \"2.13.0+cpu\", \"cuda\": null}'"


def write_source(prefix: Path, record: dict[str, object]) -> Path:
    path = prefix / doctor.TORCH_SOURCE_FILE
    path.write_text(json.dumps(record))
    return path


def stub(status: str = "ok", detail: str = "stub") -> Found:
    return Found(status, detail, "" if status == "ok" else "the stub's fix")


# ---- the whole command, on this machine --------------------------------------------------

def test_doctor_here_exits_0_with_every_check(cli) -> None:  # type: ignore[no-untyped-def]
    r = cli("doctor", "--json")
    assert r.code == 0, r.err
    report = json.loads(r.out)
    checks = {c["name"]: c for c in report["checks"]}
    assert set(checks) == CHECKS and len(report["checks"]) == len(CHECKS)
    for c in report["checks"]:
        assert set(c) == {"name", "status", "enables", "detail", "fix"}
        assert c["status"] in ("ok", "warn", "missing") and c["enables"] and c["detail"]
        assert bool(c["fix"]) == (c["status"] != "ok"), c
    assert report["simulator_ok"] is True and checks["simulator"]["status"] == "ok"
    assert "500 of its 20,000 requests simulated" in checks["simulator"]["detail"]
    missing = [n for n in checks if n in EMULATION_NEEDS and checks[n]["status"] != "ok"]
    assert report["emulation"] == {"available": not missing, "missing": missing}
    assert report["summary"].startswith("doctor: the simulator works; emulation: ")


def test_doctor_table_is_one_line_per_check_then_the_summary(cli) -> None:  # type: ignore[no-untyped-def]
    r = cli("doctor")
    assert r.code == 0, r.err
    lines = r.out.splitlines()
    assert len(lines) == len(CHECKS) + 1
    assert {re.split(r"\s{2,}", line[8:])[0] for line in lines[:-1]} == CHECKS
    assert all(line.split()[0] in ("ok", "warn", "MISSING") for line in lines[:-1])
    assert all("fix: " in line for line in lines[:-1] if not line.startswith("ok "))
    assert lines[-1].startswith("doctor: the simulator works; emulation: ")


def test_without_torch_it_says_so_with_the_fix_and_exits_0(tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text(BLOCK_TORCH)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    r = subprocess.run([sys.executable, "-c", "from testbed.cli.main import entry; entry()",
                        "doctor", "--json"], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    torch = next(c for c in report["checks"] if c["name"] == "torch")
    assert torch["status"] == "missing"
    assert "ModuleNotFoundError: No module named 'torch' (blocked by the test)" in \
        torch["detail"]
    assert "Traceback" not in torch["detail"]
    assert "make setup" in torch["fix"]
    assert "--index-url https://download.pytorch.org/whl/cpu" in torch["fix"]
    assert report["simulator_ok"] is True and {c["name"] for c in report["checks"]} == CHECKS


# ---- torch: its result, its failures, its source file ------------------------------------

def test_torch_source_file_is_read_and_shown(tmp_path: Path) -> None:
    write_source(tmp_path, {"source": "cpu-index", "detail": "https://mirror.example/whl/cpu",
                            "torch": "2.13.0+cpu"})
    found = doctor.check_torch(python=fake_python(tmp_path, FAKE_OK), prefix=tmp_path)
    assert found.status == "ok", found
    assert found.detail == ("2.13.0+cpu, CPU build, computes; from cpu-index "
                            "(https://mirror.example/whl/cpu)")


def test_torch_source_of_another_version_is_flagged(tmp_path: Path) -> None:
    write_source(tmp_path, {"source": "pypi", "detail": "PyPI", "torch": "2.9.0"})
    found = doctor.check_torch(python=fake_python(tmp_path, FAKE_OK), prefix=tmp_path)
    assert found.detail.endswith("from pypi (PyPI); recorded for torch 2.9.0")


def test_no_torch_source_file_says_source_unknown(tmp_path: Path) -> None:
    found = doctor.check_torch(python=fake_python(tmp_path, FAKE_OK), prefix=tmp_path)
    assert found.detail == "2.13.0+cpu, CPU build, computes; source unknown"


def test_a_symlinked_torch_source_file_is_refused(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    target = write_source(elsewhere, {"source": "local-file", "detail": "planted"})
    (tmp_path / doctor.TORCH_SOURCE_FILE).symlink_to(target)
    record, why = doctor.read_torch_source(tmp_path)
    assert record is None and "symbolic link: refused" in why
    found = doctor.check_torch(python=fake_python(tmp_path, FAKE_OK), prefix=tmp_path)
    assert "source unknown (" in found.detail and "symbolic link: refused" in found.detail
    assert "planted" not in found.detail and "local-file" not in found.detail


def test_an_unreadable_torch_source_file_is_source_unknown(tmp_path: Path) -> None:
    (tmp_path / doctor.TORCH_SOURCE_FILE).write_text("{not json")
    found = doctor.check_torch(python=fake_python(tmp_path, FAKE_OK), prefix=tmp_path)
    assert "source unknown (" in found.detail and "is not JSON" in found.detail


def test_a_cuda_build_is_named(tmp_path: Path) -> None:
    python = fake_python(tmp_path, "echo '{\"ok\": true, \"version\": \"2.13.0\", "
                                   "\"cuda\": \"13.0\"}'")
    found = doctor.check_torch(python=python, prefix=tmp_path)
    assert found.status == "ok" and found.detail.startswith("2.13.0, CUDA 13.0 build")


def test_an_import_error_is_reported_in_one_line(tmp_path: Path) -> None:
    python = fake_python(tmp_path, "echo 'Traceback (most recent call last):' >&2\n"
                                   "echo '  File \"<string>\", line 1' >&2\n"
                                   "echo 'ImportError: libcudnn.so.9: cannot open shared "
                                   "object file: No such file or directory' >&2\nexit 1")
    found = doctor.check_torch(python=python, prefix=tmp_path)
    assert found.status == "missing"
    assert "ImportError: libcudnn.so.9: cannot open shared object file" in found.detail
    assert "Traceback" not in found.detail and "make setup" in found.fix


def test_wrong_numbers_are_a_failure(tmp_path: Path) -> None:
    python = fake_python(tmp_path, "echo '{\"ok\": false, \"version\": \"2.13.0+cpu\", "
                                   "\"cuda\": null}'")
    found = doctor.check_torch(python=python, prefix=tmp_path)
    assert found.status == "missing" and "computes wrong numbers" in found.detail


def test_a_crash_and_a_hang_are_failures(tmp_path: Path) -> None:
    found = doctor.check_torch(python=fake_python(tmp_path, "kill -SEGV $$"), prefix=tmp_path)
    assert found.status == "missing" and "crashed (signal 11)" in found.detail
    found = doctor.check_torch(python=fake_python(tmp_path, "exec sleep 60"), prefix=tmp_path,
                               timeout_s=0.5)
    assert found.status == "missing" and "gave no answer in" in found.detail


def test_the_check_computes_what_it_expects() -> None:
    """The torch check's numbers are right: the check passes with this venv's torch."""
    pytest.importorskip("torch")
    result, why = doctor.run_torch_check(sys.executable, doctor.TORCH_TIMEOUT_S)
    assert why == "" and result is not None and result["ok"] is True


def test_torch_version_is_setup_shs() -> None:
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    assert re.search(rf"^TORCH_VERSION={re.escape(doctor.TORCH_VERSION)}$", setup, re.M)


# ---- the other checks' verdicts ----------------------------------------------------------

def test_python_versions() -> None:
    assert doctor.check_python((3, 12, 4)).status == "ok"
    old = doctor.check_python((3, 10, 12))
    assert old.status == "warn" and "3.10.12 is not supported" in old.detail
    assert "make setup PYTHON=python3.X" in old.fix
    assert doctor.check_python((3, 14, 0)).status == "warn"


def test_not_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(doctor.os, "geteuid", lambda: 1000)
    root = doctor.check_root()
    assert root.status == "missing" and root.detail == "not root (uid 1000)"
    assert "sudo" in root.fix and "vagrant up" in root.fix
    netem = doctor.check_netem()
    assert netem.status == "warn" and netem.detail.startswith("not tried (needs root)")


def test_free_cores() -> None:
    assert doctor.check_free_cores(cores=2, load_1min=0.2).status == "warn"
    busy = doctor.check_free_cores(cores=8, load_1min=7.5)
    assert busy.status == "warn" and "~0.5 free" in busy.detail
    assert doctor.check_free_cores(cores=8, load_1min=1.0).status == "ok"


@pytest.mark.parametrize(("free_gb", "status"), [(0.5, "missing"), (3.0, "warn"),
                                                 (50.0, "ok")])
def test_disk_thresholds(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, free_gb: float,
                         status: str) -> None:
    usage = doctor.shutil.disk_usage(tmp_path)
    monkeypatch.setattr(doctor.shutil, "disk_usage",
                        lambda _p: usage._replace(free=int(free_gb * 1e9)))
    found = doctor.disk_found(tmp_path, "runs")
    assert found.status == status and f"{free_gb:.1f} GB free in {tmp_path}" in found.detail


def test_vagrant_libvirt_plugin_from_the_users_plugins_json(tmp_path: Path) -> None:
    (tmp_path / "plugins.json").write_text('{"installed": {"vagrant-libvirt": {}}}')
    assert doctor.vagrant_libvirt_plugin(tmp_path) == str(tmp_path / "plugins.json")


# ---- crashes are contained; the exit code follows the simulator ---------------------------

def boom() -> Found:
    raise RuntimeError("disk probe exploded")


def test_a_check_that_raises_is_reported_not_raised() -> None:
    check = doctor.run_probe(Probe("boom", "nothing", boom))
    assert check.status == "missing"
    assert check.detail == "the check crashed: RuntimeError: disk probe exploded"
    assert check.fix


def test_a_crashing_check_in_the_command(cli, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(doctor, "check_disk_runs", boom)
    monkeypatch.setattr(doctor, "check_torch", stub)  # (no subprocess: not what is tested)
    r = cli("doctor", "--json")
    assert r.code == 0, r.err
    checks = {c["name"]: c for c in json.loads(r.out)["checks"]}
    assert checks["disk (runs)"]["status"] == "missing"
    assert "crashed: RuntimeError: disk probe exploded" in checks["disk (runs)"]["detail"]
    assert set(checks) == CHECKS and checks["disk (venv)"]["status"] in ("ok", "warn")


def test_a_broken_simulator_exits_1(cli, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(doctor, "check_simulator", boom)
    monkeypatch.setattr(doctor, "check_torch", stub)
    r = cli("doctor")
    assert r.code == 1
    assert r.out.splitlines()[-1].startswith("doctor: the simulator does NOT work")
    r = cli("doctor", "--json")
    assert r.code == 1 and json.loads(r.out)["simulator_ok"] is False


def test_summary_lists_only_what_is_not_ok(cli, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(doctor, "probes", lambda: [
        Probe("simulator", "simulating", stub),
        Probe("root", "emulation", lambda: stub("missing", "not root"), emulation_needs=True),
        Probe("netem", "delay links", lambda: stub("warn", "no netem")),
        Probe("iperf3", "goodput", stub, emulation_needs=True)])
    r = cli("doctor", "--summary")
    assert r.code == 0, r.err
    assert r.out.splitlines() == [
        "doctor: MISSING root, for emulation: not root; fix: the stub's fix",
        "doctor: warn netem, for delay links: no netem; fix: the stub's fix",
        "doctor: the simulator works; emulation: not available here: needs root"]


def test_emulation_available_names_its_links_and_datapath() -> None:
    report = doctor.diagnose([Probe("simulator", "s", stub),
                              Probe("root", "e", stub, emulation_needs=True),
                              Probe("netem", "n", lambda: stub("warn")),
                              Probe(doctor.OVS_KERNEL, "k", stub)])
    assert doctor.summary_line(report) == ("doctor: the simulator works; emulation: available "
                                           "(user-space links, OVS kernel datapath)")


def test_bad_arguments_exit_2(cli) -> None:  # type: ignore[no-untyped-def]
    assert cli("doctor", "--bogus").code == 2
    r = cli("doctor", "--json", "--summary")
    assert r.code == 2 and "not allowed with" in r.err
