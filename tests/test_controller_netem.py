"""netem-mode fibres: the controller sets per-lightpath caps as HTB classes (tc/flower).

The pure test checks the path from the controller's capacity channel to the tc batch
(no tc run); the root test needs a kernel with the netem qdisc and skips without it.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from controllers.core import ForwarderChannel
from testbed.emu.links import NetemLink
from testbed.emu.plan import FibrePlan


def _fibre() -> FibrePlan:
    return FibrePlan("A", "B", "lp0001s1", "lp0001s2", "lp0001f1", 100.0, 0.5, 200.0, 200.0,
                     "16QAM", 0.0)


def test_netem_descriptor_round_trip_and_caps_from_the_controller(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    link = NetemLink(_fibre(), 4242, "lp0001f1-eth0", "lp0001f1-eth1", {101: 10.0}, tmp_path)
    control = link.write_descriptor()
    assert control.startswith("netem:") and Path(control[6:]).is_file()
    back = NetemLink.from_descriptor(json.loads(Path(control[6:]).read_text()))
    assert back.script() == link.script()
    calls: list[tuple[list[str], str | None]] = []

    def fake_run(argv: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        calls.append((list(argv), kw.get("input")))
        return subprocess.CompletedProcess(argv, 0, "", "")

    monkeypatch.setattr("testbed.emu.links.subprocess.run", fake_run)
    ch = ForwarderChannel()
    ch.set_cap(control, 101, 10.0)  # unchanged start-up cap: nothing to do
    assert calls == []
    ch.set_cap(control, 7, 25.0)
    batches = [inp for argv, inp in calls if argv[-2:] == ["-batch", "-"]]
    assert len(batches) == 1 and all(a[:3] == ["mnexec", "-a", "4242"] for a, _ in calls)
    script = batches[0]
    for dev in ("lp0001f1-eth0", "lp0001f1-eth1"):  # both directions
        assert f"filter add dev {dev} parent 1: protocol 802.1Q prio 10 flower vlan_id 7 " \
               "classid 1:10" in script
        assert f"class add dev {dev} parent 1:1 classid 1:10 htb rate 25.000000mbit" in script
    calls.clear()
    ch.set_cap(control, 7, None)
    assert "vlan_id 7" not in next(inp for argv, inp in calls if inp)


def _why_skip() -> str | None:
    if os.geteuid() != 0:
        return "needs root"
    from testbed.envprobe import netem_available

    if not netem_available():
        return "this kernel has no netem qdisc (sch_netem): netem-mode caps cannot be tested"
    return None


@pytest.mark.root
@pytest.mark.slow
def test_netem_caps_follow_controller_lightpaths(tmp_path: Path) -> None:
    why = _why_skip()
    if why:
        pytest.skip(why)
    from controllers.emu_glue import attach_controller, controller_address
    from testbed.emu.network import EmuNetwork
    from testbed.emu.plan import build_plan
    from testbed.spec import load_scenario
    from tests.test_controller_ovs import SCENARIO

    spec = tmp_path / "ring.yaml"
    spec.write_text(SCENARIO.replace("link_mode: userspace", "link_mode: netem"))
    sc = load_scenario(spec)
    net = EmuNetwork(build_plan(sc), link_mode="netem", datapath="user",
                     controller=controller_address())
    ctl = None
    try:
        net.start()
        ctl = attach_controller(net, spec, tmp_path / "run")
        status, lp = ctl.request("POST", "/lightpaths", {"src_dc": "dc-a", "dst_dc": "dc-c",
                                                         "slots": 2})
        assert status == 201, lp
        f = net.plan.fibre(lp["nodes"][0], lp["nodes"][1])
        emu = net.emulators[f.middle]
        out = subprocess.run(["mnexec", "-a", str(emu.ns_pid), "tc", "filter", "show", "dev",
                              emu.intf_v], capture_output=True, text=True, check=True).stdout
        assert f"vlan_id {lp['vid']}" in out
        ctl.request("DELETE", f"/lightpaths/{lp['id']}")
        out = subprocess.run(["mnexec", "-a", str(emu.ns_pid), "tc", "filter", "show", "dev",
                              emu.intf_v], capture_output=True, text=True, check=True).stdout
        assert f"vlan_id {lp['vid']}" not in out
    finally:
        if ctl is not None:
            ctl.stop()
        net.stop()
