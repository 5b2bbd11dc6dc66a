"""The controller's own OpenFlow 1.3 encoding (controllers/ofwire.py) gives os-ken's bytes
exactly, for every entry the controller installs: lightpaths with fast-failover protection
and crankback, host-pair and optical-node ends, WAN flow rules, ECMP select groups and
per-flow paths in leaf-spine fabrics; each in every command (add, modify, delete)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from controllers import ofwire
from controllers.core import ControllerCore
from controllers.flowroute import GroupRule
from controllers.layout import default_layout
from controllers.protection import FailoverGroup
from controllers.rules import FlowRule
from controllers.store import Store
from controllers.wanroute import WanFlow
from tests.test_controller_core import Recorder
from tests.test_controller_protection import ring_scenario
from tests.test_routing_testbed import leafspine_layout
from tests.test_wan_routing import scenario as wan_scenario

os_ken = pytest.importorskip("os_ken")
from os_ken.ofproto import ofproto_protocol, ofproto_v1_3  # noqa: E402


# ---- the reference: the same messages built with os-ken's classes ---------------------------
def _action_list(dp: Any, spec: tuple[tuple[str, int], ...]) -> tuple[list[Any], list[Any]]:
    """OpenFlow actions and instructions (goto_table) of a rule's or bucket's actions."""
    parser, ofp = dp.ofproto_parser, dp.ofproto
    actions: list[Any] = []
    inst: list[Any] = []
    for name, arg in spec:
        if name == "output":
            actions.append(parser.OFPActionOutput(arg))
        elif name == "controller":
            actions.append(parser.OFPActionOutput(ofp.OFPP_CONTROLLER, ofp.OFPCML_NO_BUFFER))
        elif name == "push_vlan":
            actions.append(parser.OFPActionPushVlan(arg))
        elif name == "set_vlan_vid":
            actions.append(parser.OFPActionSetField(vlan_vid=arg))
        elif name == "set_vlan_pcp":
            actions.append(parser.OFPActionSetField(vlan_pcp=arg))
        elif name == "pop_vlan":
            actions.append(parser.OFPActionPopVlan())
        elif name == "group":
            actions.append(parser.OFPActionGroup(arg))
        elif name == "goto_table":
            inst.append(parser.OFPInstructionGotoTable(arg))
        else:
            raise ValueError(f"unknown action {name!r}")
    return actions, inst


def _actions(dp: Any, rule: FlowRule) -> list[Any]:
    parser, ofp = dp.ofproto_parser, dp.ofproto
    actions, inst = _action_list(dp, rule.actions)
    if actions:
        inst.insert(0, parser.OFPInstructionActions(ofp.OFPIT_APPLY_ACTIONS, actions))
    return inst


def flow_mod(dp: Any, rule: FlowRule, delete: bool = False) -> Any:
    """The OFPFlowMod that adds (or strictly deletes) a FlowRule."""
    parser, ofp = dp.ofproto_parser, dp.ofproto
    match = parser.OFPMatch(**dict(rule.match))
    if delete:
        return parser.OFPFlowMod(dp, cookie=rule.cookie, cookie_mask=0xFFFFFFFFFFFFFFFF,
                                 table_id=rule.table, command=ofp.OFPFC_DELETE_STRICT,
                                 priority=rule.priority, out_port=ofp.OFPP_ANY,
                                 out_group=ofp.OFPG_ANY, match=match)
    return parser.OFPFlowMod(dp, cookie=rule.cookie, table_id=rule.table,
                             command=ofp.OFPFC_ADD, priority=rule.priority, match=match,
                             instructions=_actions(dp, rule))


def group_mod(dp: Any, group: GroupRule | FailoverGroup, command: str) -> Any:
    """The OFPGroupMod that adds, modifies or deletes a select or fast-failover group."""
    parser, ofp = dp.ofproto_parser, dp.ofproto
    cmd = {"add": ofp.OFPGC_ADD, "modify": ofp.OFPGC_MODIFY, "delete": ofp.OFPGC_DELETE}[command]
    if isinstance(group, FailoverGroup):
        buckets = [] if command == "delete" else [
            parser.OFPBucket(weight=0, watch_port=watch, watch_group=ofp.OFPG_ANY,
                             actions=_action_list(dp, acts)[0])
            for watch, acts in group.buckets]
        return parser.OFPGroupMod(dp, cmd, ofp.OFPGT_FF, group.group_id, buckets)
    buckets = [] if command == "delete" else [
        parser.OFPBucket(weight=1, watch_port=ofp.OFPP_ANY, watch_group=ofp.OFPG_ANY,
                         actions=[parser.OFPActionOutput(port)]) for port in group.ports]
    return parser.OFPGroupMod(dp, cmd, ofp.OFPGT_SELECT, group.group_id, buckets)


def osken_bytes(x: FlowRule | GroupRule | FailoverGroup, command: Any, xid: int) -> bytes:
    dp = ofproto_protocol.ProtocolDesc(ofproto_v1_3.OFP_VERSION)
    msg = group_mod(dp, x, command) if isinstance(x, GroupRule | FailoverGroup) \
        else flow_mod(dp, x, delete=command)
    msg.xid = xid
    msg.serialize()
    return bytes(msg.buf)


def ours(x: FlowRule | GroupRule | FailoverGroup, command: Any, xid: int) -> bytes:
    m = ofwire.group_mod(x, command) if isinstance(x, GroupRule | FailoverGroup) \
        else ofwire.flow_mod(x, delete=command)
    return ofwire.frame([m], xid)


def entries(desired: dict[int, dict[tuple, Any]]) -> list[Any]:
    return [x for rules in desired.values() for x in rules.values()]


def _protected_ring(tmp: Path) -> list[Any]:
    sc = ring_scenario()
    core = ControllerCore(sc, Store(tmp / "ring.db"), layout=default_layout(sc),
                          southbound=Recorder(), protection=True)
    core.request("dc-a", "dc-d", slots=2)  # 3 hops: crankback at the middle ROADMs
    core.request("dc-a", "dc-c", slots=1, src_host="dc-a-h0", dst_host="dc-c-h0")
    core.request("dc-a", "node:B", slots=1)  # an optical-node end: ROADM rules only
    return entries(core.desired())


def _wan(tmp: Path) -> list[Any]:
    sc = wan_scenario()
    core = ControllerCore(sc, Store(tmp / "wan.db"), layout=default_layout(sc),
                          southbound=Recorder())
    ix = core.layout
    assert ix is not None
    a, b = (sorted(h.name for h in ix.hosts_by_dc[dc]) for dc in ("dc-a", "dc-b"))
    core.traffic.wan_sources.append(lambda: [WanFlow(1, a[0], b[0]), WanFlow(2, a[1], b[1])])
    core.request("dc-a", "dc-b", slots=4)
    core.request("dc-a", "dc-b", slots=4)
    return entries(core.desired())


def _fabric(tmp: Path, policy: str) -> list[Any]:
    sc, layout = leafspine_layout()
    core = ControllerCore(sc, Store(tmp / f"{policy}.db"), layout=layout)
    core.routing_call("set_policy", policy)
    core.routing_call("register", ["dc-a-h0", "dc-a-h2", "dc-a-h4", "dc-a-h6"], 1 << 20)
    core.set_fabric_link("lpab12s5", "lpab12s3", up=False)
    return entries(core.desired())


def test_every_entry_encodes_as_os_ken_does(tmp_path: Path) -> None:
    seen: set[str] = set()
    n = 0
    for got in (_protected_ring(tmp_path), _wan(tmp_path), _fabric(tmp_path, "ecmp"),
                _fabric(tmp_path, "greedy")):
        for x in got:
            if isinstance(x, GroupRule | FailoverGroup):
                commands: tuple[Any, ...] = ("add", "modify", "delete")
                seen.add(type(x).__name__)
                if isinstance(x, FailoverGroup):
                    seen.update(name for _, acts in x.buckets for name, _ in acts)
            else:
                commands = (False, True)
                seen.update(name for name, _ in x.actions)
                seen.update(name for name, _ in x.match)
            for command in commands:
                assert ours(x, command, 0xFFFFFFF0 + n % 16) == \
                    osken_bytes(x, command, 0xFFFFFFF0 + n % 16), (x, command)
                n += 1
    # the whole vocabulary of the controller's entries was met
    assert seen >= {"GroupRule", "FailoverGroup", "output", "controller", "push_vlan",
                    "pop_vlan", "set_vlan_vid", "set_vlan_pcp", "group", "goto_table",
                    "in_port", "eth_type", "vlan_vid", "vlan_pcp", "ipv4_src", "ipv4_dst"}
    assert n > 500


def test_changes_order_and_one_write_with_consecutive_xids(tmp_path: Path) -> None:
    got = _protected_ring(tmp_path)
    groups = [x for x in got if isinstance(x, FailoverGroup)]
    flows = [x for x in got if isinstance(x, FlowRule)]
    installed = {groups[0].key: groups[0]}
    msgs = ofwire.changes(installed, (flows[0], groups[0], groups[1]), (flows[1], groups[2]))
    assert msgs == [ofwire.group_mod(groups[0], "modify"), ofwire.group_mod(groups[1], "add"),
                    ofwire.flow_mod(flows[0]), ofwire.flow_mod(flows[1], delete=True),
                    ofwire.group_mod(groups[2], "delete")]
    buf = ofwire.frame([*msgs, ofwire.barrier()], 0xFFFFFFFE)
    want = b"".join(osken_bytes(x, c, xid) for (x, c), xid in zip(
        ((groups[0], "modify"), (groups[1], "add"), (flows[0], False), (flows[1], True),
         (groups[2], "delete")), (0xFFFFFFFE, 0xFFFFFFFF, 0, 1, 2), strict=True))
    from os_ken.ofproto import ofproto_v1_3_parser

    dp = ofproto_protocol.ProtocolDesc(ofproto_v1_3.OFP_VERSION)
    barrier = ofproto_v1_3_parser.OFPBarrierRequest(dp)
    barrier.xid = 3
    barrier.serialize()
    assert buf == want + bytes(barrier.buf)


def test_xids_are_reserved_as_os_ken_hands_them_out() -> None:
    from controllers.lightpath_app import reserve_xids

    class Dp:
        ofproto = ofproto_v1_3

        def __init__(self) -> None:
            self.xid = ofproto_v1_3.MAX_XID - 1

    a, b = Dp(), ofproto_protocol.ProtocolDesc(ofproto_v1_3.OFP_VERSION)
    b.xid = a.xid
    first = reserve_xids(a, 3)
    one_by_one = []
    for _ in range(3):
        b.xid = (b.xid + 1) & ofproto_v1_3.MAX_XID  # os-ken's Datapath.set_xid
        one_by_one.append(b.xid)
    assert [(first + i) & ofproto_v1_3.MAX_XID for i in range(3)] == one_by_one
    assert a.xid == b.xid


def test_unknown_fields_and_actions_are_refused() -> None:
    with pytest.raises(ofwire.Unsupported, match="eth_src"):
        ofwire.flow_mod(FlowRule(1, 0, 10, (("eth_src", "02:00:00:00:00:01"),), (), 0))
    with pytest.raises(ofwire.Unsupported, match="meter"):
        ofwire.flow_mod(FlowRule(1, 0, 10, (("in_port", 1),), (("meter", 3),), 0))


def test_a_foreign_stale_entry_is_deleted_as_os_ken_deleted_it() -> None:
    """A switch may list entries matching on anything (a flow planted by hand, another
    controller's, masked fields): their strict deletes go through os-ken, as before."""
    from controllers.lightpath_app import delete_by_os_ken

    dp = ofproto_protocol.ProtocolDesc(ofproto_v1_3.OFP_VERSION)
    udp = FlowRule(5, 0, 7, (("eth_type", 0x800), ("ip_proto", 17), ("udp_dst", 9999)), (),
                   0x5E1F)
    masked = FlowRule(5, 0, 9, (("vlan_vid", (0x1000, 0x1000)),), (), 0)
    ours_too = FlowRule(5, 0, 400, (("in_port", 3), ("vlan_vid", 0x1000 | 7)), (), 9)
    for stale in (udp, masked):
        with pytest.raises(ofwire.Unsupported):
            ofwire.changes({}, (), (stale,))
    msgs = ofwire.changes({}, (), (udp, ours_too, masked),
                          delete_other=lambda r: delete_by_os_ken(dp, r))
    assert ofwire.frame(msgs, 40) == b"".join(
        osken_bytes(r, True, 40 + i) for i, r in enumerate((udp, ours_too, masked)))
