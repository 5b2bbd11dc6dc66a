"""Pure tests of the controller's lightpath book (controllers/lightpaths.py): ids, VLAN ids,
hits in id order, moves, views and gauges."""

from __future__ import annotations

import pytest

from controllers.layout import default_layout
from controllers.lightpaths import (
    VID_MAX,
    VID_MIN,
    LightpathBook,
    fibres_of_row,
    route_of,
    spectrum_view,
    topology_view,
)
from controllers.metrics import ControllerMetrics
from controllers.store import LightpathRow
from testbed.optical import Lightpath, OpticalNetwork
from tests.test_controller_core import small_scenario


def _row(lp_id: int, vid: int, lp: Lightpath) -> LightpathRow:
    return LightpathRow(id=lp_id, vid=vid, src_dc="dc-a", dst_dc="dc-c", src_host=None,
                        dst_host=None, bitrate_gbps=None, slots_req=lp.n_slots,
                        policy="first_fit", nodes=list(lp.nodes), first_slot=lp.first_slot,
                        n_slots=lp.n_slots, modulation=lp.modulation,
                        capacity_gbps=lp.capacity_gbps, job_id=None, created_s=0.0)


def _book(net: OpticalNetwork, vids: list[int]) -> LightpathBook:
    book = LightpathBook()
    for vid in vids:
        lp = net.allocate("A", "C", slots=2)
        assert lp is not None
        book.add(_row(book.next_id(), vid, lp), lp)
    return book


def test_ids_and_vlan_ids_lowest_free() -> None:
    net = OpticalNetwork.from_scenario(small_scenario())
    book = _book(net, [VID_MIN, VID_MIN + 1, VID_MIN + 3])
    assert [r.id for r in book] == [1, 2, 3] and len(book) == 3
    assert book.free_vid() == VID_MIN + 2  # the gap first
    assert book.vid_taken(VID_MIN + 3) and not book.vid_taken(VID_MIN + 2)
    row, lp = book.pop(2)
    assert row.id == 2 and lp.nodes == tuple(row.nodes)
    assert book.free_vid() == VID_MIN + 1 and book.next_id() == 4
    with pytest.raises(KeyError):
        book.pop(2)


def test_no_vlan_id_left() -> None:
    net = OpticalNetwork.from_scenario(small_scenario())
    lp = net.allocate("A", "B", slots=1)
    assert lp is not None
    book = LightpathBook()
    for i, vid in enumerate(range(VID_MIN, VID_MAX + 1), start=1):
        book.rows[i] = _row(i, vid, lp)
    assert book.free_vid() is None


def test_hits_are_in_controller_id_order_and_moves_keep_id_and_vlan() -> None:
    net = OpticalNetwork.from_scenario(small_scenario())
    book = _book(net, [7, 5, 9])
    hit = {lp.id for lp in net.fail_link("A", "B")}  # all three ride A-B-C
    assert book.hit_by(hit) == [1, 2, 3] and book.hit_by(set()) == []
    got = net.allocate("A", "C", slots=2)
    assert got is not None and got.nodes == ("A", "D", "C")
    row = book.move(2, got)
    assert (row.id, row.vid, row.nodes, row.first_slot, row.restored) == \
        (2, 5, ["A", "D", "C"], got.first_slot, 1)
    assert book.optical[2] is got
    assert fibres_of_row(row) == {frozenset(("A", "D")), frozenset(("D", "C"))}


def test_view_gives_fibres_slots_and_optical_figures() -> None:
    net = OpticalNetwork.from_scenario(small_scenario())
    book = _book(net, [2])
    row = book.rows[1]
    v = book.view(row)
    lp = book.optical[1]
    assert v == {**row.to_dict(), "fibres": [["A", "B"], ["B", "C"]],
                 "slots": [lp.first_slot, lp.first_slot + 1], "length_km": lp.length_km,
                 "latency_ms": lp.latency_ms}
    route = route_of(row, ("A", "D", "C"))
    assert (route.id, route.vid, route.nodes, route.backup) == \
        (1, 2, ("A", "B", "C"), ("A", "D", "C"))


def test_gauges_and_state_views() -> None:
    sc = small_scenario()
    net = OpticalNetwork.from_scenario(sc)
    book = _book(net, [2, 3])
    m = ControllerMetrics()
    book.update_gauges(m, net)
    text = m.exposition().decode()
    assert "lightpipe_lightpaths_active 2.0" in text
    assert 'lightpipe_fibre_slots_used{fibre="A-B"} 4.0' in text
    assert 'lightpipe_fibre_slots_used{fibre="A-D"} 0.0' in text
    spec = {(f["u"], f["v"]): f for f in spectrum_view(net)}
    assert spec[("A", "B")]["used"] == [0, 1, 2, 3]
    assert spec[("A", "B")]["occupancy"] == "1111" + "0" * 12
    topo = topology_view(net, sc, default_layout(sc))
    assert topo["slots"] == 16 and [d["name"] for d in topo["dcs"]] == ["dc-a", "dc-c", "dc-b"]
    assert len(topo["hosts"]) == 6 and topology_view(net, sc, None)["hosts"] == []
