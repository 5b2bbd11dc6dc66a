"""Pure tests of restoration (controllers/restoration.py, through the core and alone): cuts and
slot-block losses re-placed by the simulator's rule, stored, the caps moved."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from controllers.backups import Backups
from controllers.core import ControllerCore, RequestError
from controllers.layout import default_layout
from controllers.lightpaths import LightpathBook
from controllers.restoration import Restorer, lost_runs
from controllers.rules import OFPVID_PRESENT, LayoutIndex
from controllers.store import LightpathRow, Store
from testbed.optical import OpticalNetwork
from tests.test_controller_core import make_core, small_scenario


@pytest.fixture
def core(tmp_path: Path) -> ControllerCore:
    return make_core(tmp_path)


def test_fibre_cut_reroutes_with_new_spectrum(core: ControllerCore) -> None:
    lp = core.request("dc-a", "dc-c", slots=4)
    assert lp["nodes"] == ["A", "B", "C"]
    res = core.fail_fibre("A", "B")
    assert res.restored == [lp["id"]] and not res.lost
    after = core.lightpath(lp["id"])
    assert after["nodes"] == ["A", "D", "C"] and after["vid"] == lp["vid"]
    assert after["restored"] == 1
    # the emulators' caps: removed where it left (A-B; B-C has no emulator here)
    caps = core.capacity.calls  # type: ignore[union-attr]
    assert ("/tmp/ab.sock", lp["vid"], None) in caps
    # the new route's rules are installed, the old fibre carries nothing
    ix = core.layout
    assert ix is not None
    b = ix.dpid[ix.roadm["B"]]
    tag = OFPVID_PRESENT | lp["vid"]
    assert not any(("vlan_vid", tag) in r.match for r in core.desired()[b].values())


def test_cut_without_alternative_loses(core: ControllerCore) -> None:
    lp = core.request("dc-a", "dc-b", slots=2)
    core.fail_fibre("A", "B")
    # A-D-C-B is the only other route; k=2 finds it (A-B direct is cut)
    assert [v["nodes"] for v in core.lightpaths()] == [["A", "D", "C", "B"]]
    res = core.fail_fibre("A", "D")
    assert res.lost == [lp["id"]] and core.lightpaths() == []


# ---- wavelength loss / repair (slot blocks) ------------------------------------------------
def test_slot_loss_moves_the_hit_lightpath_to_other_slots(core: ControllerCore) -> None:
    a = core.request("dc-a", "dc-c", slots=4)  # A-B-C, slots 0..3
    b = core.request("dc-a", "dc-b", slots=2)  # A-B, slots 4..5
    caps = core.capacity.calls  # type: ignore[union-attr]
    n_caps = len(caps)
    res = core.fail_slots("A", "B", 2, 1)  # hits a only
    # the emulators' caps: same route, so set again in place, never removed (a removal
    # would drop the lightpath's class and its delay correction in the emulator)
    rate = a["capacity_gbps"]
    assert caps[n_caps:] == [("/tmp/ab.sock", a["vid"], rate), ("/tmp/bc.sock", a["vid"], rate)]
    assert res.restored == [a["id"]] and res.lost == [] and res.block == (2, 1)
    moved, kept = core.lightpath(a["id"]), core.lightpath(b["id"])
    assert moved["nodes"] == ["A", "B", "C"] and moved["vid"] == a["vid"]
    assert moved["slots"] == [6, 7, 8, 9] and moved["restored"] == 1  # first fit past b
    assert kept == {k: v for k, v in b.items() if k != "setup_s"}  # untouched
    ab = next(f for f in core.spectrum() if {f["u"], f["v"]} == {"A", "B"})
    assert ab["lost_slots"] == [2] and ab["used"] == [4, 5, 6, 7, 8, 9]
    # slot 2 is out of service: a new 3-slot request cannot use 0..2 any more
    c = core.request("dc-a", "dc-b", slots=2)
    assert c["slots"] == [0, 1]
    assert core.request("dc-a", "dc-b", slots=3)["slots"] == [10, 11, 12]
    text = core.metrics.exposition().decode()
    assert "lightpipe_lightpaths_restored_total 1.0" in text
    assert "lightpipe_restoration_seconds_count 1.0" in text


def test_slot_loss_over_the_whole_grid_reroutes_then_loses(core: ControllerCore) -> None:
    lp = core.request("dc-a", "dc-b", slots=2)
    assert lp["nodes"] == ["A", "B"]
    res = core.fail_slots("B", "A", 0, 16)  # every slot of A-B: the other route
    assert res.restored == [lp["id"]]
    assert core.lightpath(lp["id"])["nodes"] == ["A", "D", "C", "B"]
    core.fail_fibre("A", "D")  # the lightpath is cut off its detour: nowhere to go
    assert core.lightpaths() == []
    lp2_err = None
    try:
        core.request("dc-a", "dc-b", slots=1)
    except RequestError as exc:
        lp2_err = exc
    assert lp2_err is not None and lp2_err.reason == "no_spectrum"  # A-B up, no slot free
    core.repair_fibre("A", "D")
    lp3 = core.request("dc-a", "dc-b", slots=16)
    assert lp3["nodes"] == ["A", "D", "C", "B"]
    res = core.fail_slots("A", "D", 8, 1)  # the only route with spectrum left: lost
    assert res.lost == [lp3["id"]] and res.restored == [] and core.lightpaths() == []
    assert core.store.lightpaths() == []


def test_slot_repair_returns_slots_to_service(core: ControllerCore) -> None:
    core.fail_slots("A", "B", 0, 4)
    assert core.request("dc-a", "dc-b", slots=2)["slots"] == [4, 5]
    assert core.repair_slots("A", "B", 1, 2) == [0, 3]  # part of the block back
    assert core.request("dc-a", "dc-b", slots=2)["slots"] == [1, 2]
    assert core.repair_slots("A", "B", 0, 16) == []
    assert core.request("dc-a", "dc-b", slots=1)["slots"] == [0]
    assert core.store.lost_slots() == []


def test_restart_keeps_lost_slots(tmp_path: Path) -> None:
    sc = small_scenario(spectrum_sharing="per_direction")
    layout = default_layout(sc)
    c1 = ControllerCore(sc, Store(tmp_path / "s.db"), layout=layout)
    a = c1.request("dc-a", "dc-c", slots=3)
    c1.fail_slots("B", "A", 1, 2)
    c1.fail_slots("B", "C", 5, 3)
    c1.repair_slots("B", "C", 6, 1)
    assert c1.lightpath(a["id"])["slots"] == [8, 9, 10]  # 0..2 hit, then 3..5 hit
    c2 = ControllerCore(sc, Store(tmp_path / "s.db"), layout=layout)
    assert c2.spectrum() == c1.spectrum() and c2.lightpaths() == c1.lightpaths()
    assert c2.net.lost_slots("A", "B") == [1, 2] and c2.net.lost_slots("C", "B") == [5, 7]
    assert c2.net.unavailable("A", "B") == [1, 2, 8, 9, 10]
    assert c2.net.unavailable("B", "A") == [1, 2]  # lost in both directions, held in one
    assert c2.request("dc-a", "dc-b", slots=2)["slots"] == [3, 4]
    c2.repair_slots("A", "B", 0, 16)
    c3 = ControllerCore(sc, Store(tmp_path / "s.db"), layout=layout)
    assert c3.net.lost_slots("A", "B") == [] and c3.net.lost_slots("B", "C") == [5, 7]


@pytest.mark.parametrize("fibre,first,n,status", [
    (("A", "Q"), 0, 1, 404), (("A", "C"), 0, 1, 404), (("A", "B"), 15, 2, 400),
    (("A", "B"), 16, 1, 400), (("A", "B"), -1, 2, 400), (("A", "B"), 0, 0, 400)])
def test_bad_slot_blocks(core: ControllerCore, fibre: tuple[str, str], first: int, n: int,
                         status: int) -> None:
    for call in (core.fail_slots, core.repair_slots):
        with pytest.raises(RequestError) as err:
            call(*fibre, first, n)
        assert err.value.status == status
    assert core.store.lost_slots() == [] and not core.net.lost_slots("A", "B")


# ---- the Restorer alone -------------------------------------------------------------------
def _restorer(tmp_path: Path, policy: str) -> tuple[Restorer, LightpathBook, OpticalNetwork,
                                                     LayoutIndex]:
    sc = small_scenario()
    net = OpticalNetwork.from_scenario(sc)
    book = LightpathBook()
    rng = random.Random("7:spectrum")
    dc_node = {d.name: d.node for d in sc.dcs}
    store = Store(tmp_path / "r.db")
    for i, (src, dst, n) in enumerate([("dc-a", "dc-c", 3), ("dc-a", "dc-b", 2),
                                       ("dc-b", "dc-c", 4), ("dc-a", "dc-c", 2)], start=1):
        lp = net.allocate(dc_node[src], dc_node[dst], slots=n, policy=policy, rng=rng)
        assert lp is not None
        row = LightpathRow(id=i, vid=10 + i, src_dc=src, dst_dc=dst, src_host=None,
                           dst_host=None, bitrate_gbps=None, slots_req=n, policy=policy,
                           nodes=list(lp.nodes), first_slot=lp.first_slot,
                           n_slots=lp.n_slots, modulation=lp.modulation,
                           capacity_gbps=lp.capacity_gbps, job_id=None, created_s=0.0)
        book.add(row, lp)
        store.save([row])
    ix = LayoutIndex.build(default_layout(sc))
    return Restorer(net, book, store, Backups(net), dc_node, rng), book, net, ix


@pytest.mark.parametrize("policy", ["first_fit", "random_fit"])
def test_restorer_follows_the_simulators_rule(tmp_path: Path, policy: str) -> None:
    """All hit lightpaths released first, then re-placed in id order with their request:
    the same routes and slots as doing exactly that on a plain OpticalNetwork."""
    r, book, net, ix = _restorer(tmp_path, policy)
    ref = net.copy()
    ref_rng = random.Random()
    ref_rng.setstate(r.rng.getstate())
    before = {i: (list(row.nodes), row.first_slot) for i, row in book.rows.items()}
    res, moves = r.cut(ix, "A", "B")
    assert moves is not None
    hit = sorted(i for i, (nodes, _) in before.items()
                 if {"A", "B"} <= set(nodes) and abs(nodes.index("A") - nodes.index("B")) == 1)
    assert hit and sorted(moves.before) == hit
    ref.fail_link("A", "B")
    expect_restored, expect_lost = [], []
    for i in hit:
        row = moves.before[i]
        got = ref.allocate_or_reason(row.nodes[0], row.nodes[-1], slots=row.slots_req,
                                     policy=policy, rng=ref_rng)
        if isinstance(got, str):
            expect_lost.append(i)
        else:
            expect_restored.append((i, list(got.nodes), got.first_slot, got.n_slots))
    assert [(row.id, row.nodes, row.first_slot, row.n_slots) for row in moves.changed] == \
        expect_restored
    assert res.restored == [i for i, *_ in expect_restored] and res.lost == expect_lost
    assert all(book.rows[i].restored == 1 for i in res.restored)
    assert all(moves.before[i].nodes == before[i][0] for i in hit)  # copies, as they were
    assert sorted(r.store.lightpaths(), key=lambda x: x.id) == list(book.rows.values())
    assert r.store.failed_fibres() == [("A", "B")]


def test_restorer_cut_twice_and_repairs(tmp_path: Path) -> None:
    r, book, net, ix = _restorer(tmp_path, "first_fit")
    res, moves = r.cut(ix, "B", "C")
    assert moves is not None and res.fibre == ("B", "C") and res.on_backup is None
    rows = {i: LightpathRow(**row.to_dict()) for i, row in book.rows.items()}
    again, none = r.cut(ix, "C", "B")  # already cut: nothing changes
    assert none is None and again.restored == [] and book.rows == rows
    assert r.fibre_state("B", "C") == {"failed": True, "lost_slots": []}
    assert r.repair("C", "B") and not r.repair("B", "C")
    assert r.store.failed_fibres() == [] and not net.is_failed("B", "C")
    with pytest.raises(RequestError) as err:
        r.cut(ix, "A", "C")  # no such fibre
    assert err.value.status == 404


def test_restorer_slot_blocks_are_stored_as_runs(tmp_path: Path) -> None:
    r, book, net, ix = _restorer(tmp_path, "first_fit")
    res, _ = r.lose_slots(ix, "A", "B", 0, 2)
    assert res.block == (0, 2) and res.restored == [1]  # lightpath 1 held slots 0..2 there
    assert book.rows[1].first_slot not in (0, 1)
    r.lose_slots(ix, "A", "B", 5, 1)
    assert lost_runs(net, "A", "B") == [(0, 2), (5, 1)]
    assert sorted(r.store.lost_slots()) == [("A", "B", 0, 2), ("A", "B", 5, 1)]
    assert r.repair_slots("A", "B", 1, 5) == [0]
    assert r.store.lost_slots() == [("A", "B", 0, 1)]
