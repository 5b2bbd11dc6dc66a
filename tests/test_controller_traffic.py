"""Pure tests of the core's job traffic (controllers/traffic.py) alone: the WAN re-assignment
only on change, its rules only for live lightpaths, routing calls' refusals, fabric ports."""

from __future__ import annotations

import pytest

from controllers.errors import RequestError
from controllers.layout import default_layout
from controllers.metrics import ControllerMetrics
from controllers.rules import LayoutIndex
from controllers.store import LightpathRow
from controllers.traffic import TrafficControl, wan_lightpaths
from controllers.wanroute import P_WAN_FLOW, WanFlow
from tests.test_routing_testbed import leafspine_layout
from tests.test_wan_routing import scenario


def _row(lp_id: int, vid: int, src: str = "dc-a", dst: str = "dc-b",
         capacity_gbps: float = 100.0) -> LightpathRow:
    return LightpathRow(id=lp_id, vid=vid, src_dc=src, dst_dc=dst, src_host=None,
                        dst_host=None, bitrate_gbps=None, slots_req=4, policy="first_fit",
                        nodes=["A", "B"], first_slot=0, n_slots=4, modulation="QPSK",
                        capacity_gbps=capacity_gbps, job_id=None, created_s=0.0)


def test_reassign_on_change_only_and_rules_for_live_lightpaths() -> None:
    sc = scenario()
    ix = LayoutIndex.build(default_layout(sc))
    t = TrafficControl(ControllerMetrics(), "greedy", 1)
    hosts = {dc: sorted(h.name for h in ix.hosts_by_dc[dc]) for dc in ("dc-a", "dc-b")}
    flows = [WanFlow(1, hosts["dc-a"][0], hosts["dc-b"][0]),
             WanFlow(2, hosts["dc-a"][1], hosts["dc-b"][1])]
    t.wan_sources.append(lambda: list(flows))
    rows = [_row(2, 12), _row(1, 11)]
    assert not t.reassign(None, rows)  # no layout
    assert t.reassign(ix, rows)
    assert sorted(t.wan.assignment.values()) == [1, 2]  # greedy: one lightpath each
    assert not t.reassign(ix, rows)  # nothing changed
    assert [lp.id for lp in wan_lightpaths(ix, rows)] == [1, 2]
    fabric = t.fabric(ix)
    assert fabric is ix  # no fabric link failed
    wan = [r for r in t.rules(fabric, {1: 11, 2: 12}) if r.priority == P_WAN_FLOW]
    assert len(wan) == 4  # two flows, both directions
    only_one = [r for r in t.rules(fabric, {1: 11}) if r.priority == P_WAN_FLOW]
    assert len(only_one) == 2 and all(("set_vlan_vid", 0x1000 | 11) in r.actions
                                      for r in only_one)
    assert t.reassign(ix, rows[:1])  # lightpath 1 gone: its flow moves
    assert set(t.wan.assignment.values()) == {2}
    assert t.view()["wan"]["last"]["reason"] == "lightpath_down"


def test_routing_calls_and_their_refusals() -> None:
    sc, layout = leafspine_layout()
    ix = LayoutIndex.build(layout)
    t = TrafficControl(ControllerMetrics(), "ecmp", 1)
    hosts = sorted(ix.hosts)[:4]
    job = t.call(ix, "register", hosts, 1 << 20)
    assert job["members"] == hosts and t.view()["jobs"][0]["id"] == job["id"]
    for what, args, status in (("set_policy", ("nope",), 400),
                               ("register", (["nobody", hosts[0]], 1), 422),
                               ("unregister", (99,), 404)):
        with pytest.raises(RequestError) as err:
            t.call(ix, what, *args)
        assert err.value.status == status
    with pytest.raises(ValueError):
        t.call(ix, "reroute", "x")
    assert "wan" not in t.call(ix, "set_policy", "greedy")  # the core adds it
    with pytest.raises(ValueError, match="host"):
        t.check_layout(LayoutIndex.build(default_layout(sc, hosts_per_dc=1)))


def test_fabric_ports_down_while_either_end_is() -> None:
    _, layout = leafspine_layout()
    ix = LayoutIndex.build(layout)
    t = TrafficControl(ControllerMetrics(), "ecmp", 1)
    link = next(lk for lk in layout.links if lk.kind == "fabric")
    a, b = (ix.dpid[link.a], link.a_port), (ix.dpid[link.b], link.b_port)
    pair = tuple(sorted((link.a, link.b)))
    assert t.port_status(ix, *a, up=False) == (*pair, False)
    assert t.port_status(ix, *b, up=False) == (*pair, False)
    assert t.port_status(ix, *a, up=True) == (*pair, False)  # b still down
    assert t.port_status(ix, *b, up=True) == (*pair, True)
    assert t.port_status(ix, ix.dpid[link.a], 999, up=False) is None  # not a fabric port
