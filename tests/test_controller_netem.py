"""netem-mode fibres: the controller sets per-lightpath caps as HTB classes (netlink, pyroute2).

The pure test checks the path from the controller's capacity channel to the tc requests
(no tc run); the root test needs a kernel with the netem qdisc and skips without it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from controllers.channels import ForwarderChannel
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
    sent: list[tuple[list[Any], bool]] = []

    def fake_apply(self: NetemLink, ops: list[Any], clear: bool = False) -> None:
        sent.append((list(ops), clear))

    monkeypatch.setattr(NetemLink, "_apply", fake_apply)
    ch = ForwarderChannel()
    ch.set_cap(control, 101, 10.0)  # unchanged start-up cap: nothing to do
    assert sent == []
    ch.set_cap(control, 7, 25.0)
    assert len(sent) == 1 and sent[0][1]  # one rebuild, old trees cleared first
    ops = sent[0][0]
    for dev in ("lp0001f1-eth0", "lp0001f1-eth1"):  # both directions
        vlan_filters = [op for op in ops if op.dev == dev and op.kind == "basic"]
        assert sorted(op.args["match"][0]["value"] for op in vlan_filters) == [7, 101]
        f7 = next(op for op in vlan_filters if op.args["match"][0]["value"] == 7)
        cls7 = next(op for op in ops if op.dev == dev and op.command == "add-class"
                    and op.args["handle"] == f7.args["classid"])
        assert cls7.args["rate"] == 25_000_000 // 8  # bytes/s
        redirect = next(op for op in ops if op.kind == "u32" and
                        op.args["action"]["ifindex"].name == dev)
        assert redirect.dev != dev and redirect.args["action"]["action"] == "redirect"
    netems = [op for op in ops if op.kind == "netem"]
    assert len(netems) == 2 * 3 and all(op.args["delay"] == 500 for op in netems)
    sent.clear()
    ch.set_cap(control, 7, None)
    assert all(op.args["match"][0]["value"] != 7 for op in sent[0][0] if op.kind == "basic")


def test_controller_rebuild_keeps_the_calibrated_delay(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The delay calibration writes its correction into the descriptor after the
    controller has read it: the controller's next rebuild (a cap change) uses it."""
    link = NetemLink(_fibre(), 4242, "lp0001f1-eth0", "lp0001f1-eth1", {101: 10.0}, tmp_path)
    control = link.write_descriptor()
    sent: list[list[Any]] = []
    monkeypatch.setattr(NetemLink, "_apply",
                        lambda self, ops, clear=False: sent.append(list(ops)))
    ch = ForwarderChannel()
    ch.set_cap(control, 7, 25.0)  # the controller now holds the link (delay 0.5 ms)
    assert {op.args["delay"] for op in sent[-1] if op.kind == "netem"} == {500}
    link.correction_ms = 0.2  # what set_delay_correction records, less its tc change
    link._update_descriptor()
    desc = json.loads(Path(control[6:]).read_text())
    assert desc["correction_ms"] == 0.2 and desc["caps_mbps"] == {"101": 10.0}
    ch.set_cap(control, 8, 5.0)
    assert {op.args["delay"] for op in sent[-1] if op.kind == "netem"} == {300}
    assert NetemLink.from_descriptor(desc).emulated_delay_ms() == pytest.approx(0.3)


def test_lightpath_correction_has_its_own_netem_leaf_and_survives_a_rebuild(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The calibration's per-lightpath step in netem mode: the lightpath's leaf (under
    its cap class, found by its VLAN id) runs shorter; the fibre's other leaves do not;
    the controller's next rebuild (another process, from the descriptor) keeps it."""
    from testbed.emu.links import vlan_class_minor, vlan_leaf_handle

    link = NetemLink(_fibre(), 4242, "lp0001f1-eth0", "lp0001f1-eth1", {101: 10.0}, tmp_path)
    control = link.write_descriptor()
    changed: list[tuple[int, int]] = []

    def change(self: NetemLink, pick: Any, args_of: Any) -> int:
        leaves = [0x20000, vlan_leaf_handle(101)]  # the default class's and VLAN 101's
        hit = [h for h in leaves if pick(h)]
        changed.extend((h, args_of(h)["delay"]) for h in hit)
        return 2 * len(hit)  # both directions

    monkeypatch.setattr(NetemLink, "_change_leaves", change)
    assert link.set_vlan_correction(101, 0.15)
    assert changed == [(vlan_leaf_handle(101), 350)]  # 0.5 ms less 0.15
    assert not link.set_vlan_correction(7, 0.1)  # no class for VLAN 7 on this fibre
    assert link.vlan_corrections_ms == {101: 0.15}
    assert link.emulated_delay_ms(101) == pytest.approx(0.35)
    assert link.emulated_delay_ms() == pytest.approx(0.5)
    changed.clear()
    link.set_delay_correction(0.1)  # the fibre's step keeps the lightpath's on top
    assert dict(changed) == {0x20000: 400, vlan_leaf_handle(101): 250}
    sent: list[list[Any]] = []
    monkeypatch.setattr(NetemLink, "_apply",
                        lambda self, ops, clear=False: sent.append(list(ops)))
    ForwarderChannel().set_cap(control, 9, 5.0)  # the controller rebuilds both directions
    leaves = {op.args["parent"]: op.args["delay"] for op in sent[-1] if op.kind == "netem"}
    assert leaves == {0x10002: 400, 0x10000 | vlan_class_minor(101): 250,
                      0x10000 | vlan_class_minor(9): 400}
    classes = {op.args["classid"] for op in sent[-1] if op.kind == "basic"}
    assert classes == {0x10000 | vlan_class_minor(101), 0x10000 | vlan_class_minor(9)}


def test_netem_requests_reject_unsafe_names(tmp_path: Path) -> None:
    link = NetemLink(_fibre(), 4242, "lp0001f1-eth0", "bad;name", {}, tmp_path)
    with pytest.raises(ValueError, match="unsafe interface name"):
        link.tc_ops()


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
    from testbed.emu.network import EmuNetwork
    from testbed.emu.plan import build_plan
    from testbed.orchestrate.glue import attach_controller, controller_address
    from testbed.spec import load_scenario
    from tests.ctl_ring import ring_spec

    spec = tmp_path / "ring.yaml"
    spec.write_text(ring_spec(link_mode="netem"))
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
        assert re.search(rf"\bvlan(?:_tag)? eq {lp['vid']}\b", out), out  # tc 6.1: meta(vlan eq V)
        ctl.request("DELETE", f"/lightpaths/{lp['id']}")
        out = subprocess.run(["mnexec", "-a", str(emu.ns_pid), "tc", "filter", "show", "dev",
                              emu.intf_v], capture_output=True, text=True, check=True).stdout
        assert not re.search(rf"\bvlan(?:_tag)? eq {lp['vid']}\b", out), out
    finally:
        if ctl is not None:
            ctl.stop()
        net.stop()
