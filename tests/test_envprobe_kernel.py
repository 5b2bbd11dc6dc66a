"""testbed.envprobe: what a modprobe would make available, and scaled start-up time-outs."""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed import envprobe


def test_module_state_reads_sysfs_modules_dep_and_builtin(tmp_path: Path) -> None:
    sysmod, moddir = tmp_path / "sys", tmp_path / "lib"
    (sysmod / "sch_htb").mkdir(parents=True)
    moddir.mkdir()
    (moddir / "modules.dep").write_text(
        "kernel/net/sched/sch_netem.ko.xz:\n"
        "kernel/net/openvswitch/openvswitch.ko.xz: kernel/net/nsh/nsh.ko.xz\n")
    (moddir / "modules.builtin").write_text("kernel/net/sched/cls_u32.ko\n")

    def state(name: str) -> str:
        return envprobe.module_state(name, sys_module=str(sysmod), moddir=str(moddir))

    assert state("sch_htb") == "loaded"
    assert state("sch_netem") == "loadable"
    assert state("openvswitch") == "loadable"
    assert state("cls_u32") == "loaded"  # built in
    assert state("sch_fq") == "absent"
    assert envprobe.module_state("sch_fq", sys_module=str(sysmod),
                                 moddir=str(tmp_path / "none")) == "absent"


def test_startup_timeout_scenario_wins_else_scaled(monkeypatch: pytest.MonkeyPatch) -> None:
    assert envprobe.startup_timeout_s(12.5) == 12.5
    envprobe.machine_slowness.cache_clear()
    monkeypatch.setenv("LIGHTPIPE_TIMEOUT_SCALE", "3")
    try:
        assert envprobe.startup_timeout_s() == pytest.approx(90.0)
        assert envprobe.startup_timeout_s(base_s=10.0) == pytest.approx(30.0)
    finally:
        envprobe.machine_slowness.cache_clear()
    monkeypatch.delenv("LIGHTPIPE_TIMEOUT_SCALE")
    assert 1.0 <= envprobe.machine_slowness() <= 50.0  # measured, never below the reference


def test_scenario_field_validates() -> None:
    from testbed.spec.models import EmulationSpec

    assert EmulationSpec(startup_timeout_s=120).startup_timeout_s == 120
    assert EmulationSpec().startup_timeout_s is None
    with pytest.raises(ValueError, match="startup_timeout_s"):
        EmulationSpec(startup_timeout_s=0)
