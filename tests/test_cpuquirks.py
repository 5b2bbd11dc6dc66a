"""testbed.cpuquirks: NumPy kept to its baseline kernels only on a software-emulated CPU."""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed import cpuquirks


def test_only_a_qemu_guest_is_asked(tmp_path: Path) -> None:
    vendor = tmp_path / "sys_vendor"
    assert cpuquirks.software_cpu(tmp_path / "none") is False
    vendor.write_text("Dell Inc.\n")
    assert cpuquirks.software_cpu(vendor) is False


def test_apply_sets_the_variable_once_and_never_over_the_users(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpuquirks, "software_cpu", lambda: True)
    env: dict[str, str] = {}
    assert cpuquirks.apply(env, modules=set()) is True
    assert env == {"NPY_DISABLE_CPU_FEATURES": "X86_V3 X86_V4"}
    mine = {"NPY_DISABLE_CPU_FEATURES": "AVX512F"}
    assert cpuquirks.apply(mine, modules=set()) is False
    assert mine["NPY_DISABLE_CPU_FEATURES"] == "AVX512F"
    late: dict[str, str] = {}  # NumPy already loaded: too late, nothing set
    assert cpuquirks.apply(late, modules={"numpy"}) is False and late == {}
    monkeypatch.setattr(cpuquirks, "software_cpu", lambda: False)
    assert cpuquirks.apply({}, modules=set()) is False
