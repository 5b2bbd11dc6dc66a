"""Pure tests of the controller core, rules and store (no root, no OVS)."""

from __future__ import annotations

from pathlib import Path

import pytest

from controllers.core import ControllerCore, RequestError
from controllers.layout import Layout, default_layout
from controllers.rules import (
    COOKIE_LP,
    OFPVID_PRESENT,
    P_DC_PAIR,
    P_VLAN,
    LayoutIndex,
    ShortestPathRouting,
    desired_rules,
    diff_rules,
)
from controllers.store import Store
from testbed.optical import OpticalNetwork
from testbed.spec import load_scenario, parse_scenario

ROOT = Path(__file__).resolve().parents[1]


def small_scenario(**optical: object) -> object:
    return parse_scenario({
        "name": "ctl-small",
        "topology": {"links": [
            {"u": "A", "v": "B", "length_km": 100}, {"u": "B", "v": "C", "length_km": 100},
            {"u": "A", "v": "D", "length_km": 150}, {"u": "D", "v": "C", "length_km": 150}]},
        "dcs": [{"name": "dc-a", "node": "A", "gpus": 8},
                {"name": "dc-c", "node": "C", "gpus": 8},
                {"name": "dc-b", "node": "B", "gpus": 8}],
        "optical": {"slots": 16, "k_paths": 2, **optical},
        "workload": {"kind": "lightpath_requests"},
        "emulation": {"hosts_per_dc": 2, "bandwidth_divisor": 1000},
    })


class Recorder:
    """Southbound that records every sync (what the app would install)."""

    def __init__(self) -> None:
        self.syncs: list[dict[int, dict[tuple, object]]] = []

    def sync(self, desired: dict[int, dict[tuple, object]]) -> None:
        self.syncs.append(desired)


class Caps:
    def __init__(self) -> None:
        self.calls: list[tuple[str, int, float | None]] = []

    def set_cap(self, control: str, vid: int, rate_mbps: float | None) -> None:
        self.calls.append((control, vid, rate_mbps))


def make_core(tmp_path: Path) -> ControllerCore:
    """The small scenario's core with a layout (emulator controls on A-B and B-C), a
    recording southbound and recording caps."""
    sc = small_scenario()
    controls = {("A", "B"): "/tmp/ab.sock", ("B", "C"): "/tmp/bc.sock"}
    return ControllerCore(sc, Store(tmp_path / "state.db"),
                          layout=default_layout(sc, controls=controls),
                          southbound=Recorder(), capacity=Caps())


@pytest.fixture
def core(tmp_path: Path) -> ControllerCore:
    return make_core(tmp_path)


def test_same_decision_as_optical_layer(core: ControllerCore) -> None:
    sim = OpticalNetwork.from_scenario(core.scenario)
    for bitrate in (100, 200, 400, 100):
        ref = sim.allocate("A", "C", bitrate_gbps=bitrate)
        got = core.request("dc-a", "dc-c", bitrate_gbps=bitrate)
        assert ref is not None
        assert tuple(got["nodes"]) == ref.nodes
        assert (got["first_slot"], got["n_slots"]) == (ref.first_slot, ref.n_slots)
        assert got["modulation"] == ref.modulation
        assert got["capacity_gbps"] == ref.capacity_gbps


def test_two_lightpaths_disjoint_slots_and_vids(core: ControllerCore) -> None:
    a = core.request("dc-a", "dc-c", slots=3)
    b = core.request("dc-a", "dc-c", slots=3)
    assert a["nodes"] == b["nodes"]
    assert not set(a["slots"]) & set(b["slots"])
    assert a["vid"] != b["vid"]


def test_rules_push_hop_pop(core: ControllerCore) -> None:
    lp = core.request("dc-a", "dc-c", slots=2)
    ix = core.layout
    assert ix is not None
    rules = core.desired()
    tag = OFPVID_PRESENT | lp["vid"]
    lp_rules = [r for d in rules.values() for r in d.values() if r.cookie == COOKIE_LP | lp["id"]]
    # per direction: push per remote host (2) + pop at far edge + one per ROADM on the route
    assert len(lp_rules) == 2 * (2 + 1 + len(lp["nodes"]))
    edge_a = ix.dpid[ix.edge["dc-a"][0]]
    pushes = [r for r in rules[edge_a].values() if r.priority == P_DC_PAIR]
    assert pushes and all(("set_vlan_vid", tag) in r.actions for r in pushes)
    for node in lp["nodes"]:
        roadm = ix.dpid[ix.roadm[node]]
        assert sum(1 for r in rules[roadm].values()
                   if r.priority == P_VLAN and ("vlan_vid", tag) in r.match) == 2
    # a ROADM off the route has no rule for it
    off = ix.dpid[ix.roadm["D"]]
    assert not any(("vlan_vid", tag) in r.match for r in rules[off].values())


def test_restart_rereads_state(tmp_path: Path) -> None:
    sc = small_scenario()
    layout = default_layout(sc)
    c1 = ControllerCore(sc, Store(tmp_path / "s.db"), layout=layout)
    a = c1.request("dc-a", "dc-c", slots=3)
    c1.request("dc-a", "dc-b", bitrate_gbps=100)
    c1.fail_fibre("B", "C")
    before = c1.desired()
    c2 = ControllerCore(sc, Store(tmp_path / "s.db"), layout=layout)
    assert c2.lightpaths() == c1.lightpaths()
    assert c2.desired() == before
    assert c2.net.is_failed("B", "C")
    assert c2.spectrum() == c1.spectrum()
    # a new lightpath after restart does not reuse the slots or the VLAN id
    b = c2.request("dc-a", "dc-c", slots=3)
    assert b["vid"] != a["vid"] and b["id"] not in (a["id"],)


@pytest.mark.parametrize("kwargs,status", [
    ({"src_dc": "nope", "dst_dc": "dc-c", "slots": 1}, 404),
    ({"src_dc": "dc-a", "dst_dc": "dc-a", "slots": 1}, 400),
    ({"src_dc": "dc-a", "dst_dc": "dc-c"}, 400),
    ({"src_dc": "dc-a", "dst_dc": "dc-c", "slots": 1, "bitrate_gbps": 100}, 400),
    ({"src_dc": "dc-a", "dst_dc": "dc-c", "slots": 99}, 400),
    ({"src_dc": "dc-a", "dst_dc": "dc-c", "slots": 1, "policy": "worst_fit"}, 400),
    ({"src_dc": "dc-a", "dst_dc": "dc-c", "slots": 1, "src_host": "dc-a-h0"}, 400),
    ({"src_dc": "dc-a", "dst_dc": "dc-c", "slots": 1, "src_host": "x", "dst_host": "y"}, 404),
])
def test_bad_requests(core: ControllerCore, kwargs: dict, status: int) -> None:
    with pytest.raises(RequestError) as err:
        core.request(**kwargs)
    assert err.value.status == status


def test_blocked_is_409(core: ControllerCore) -> None:
    core.request("dc-a", "dc-c", slots=16)
    core.request("dc-a", "dc-c", slots=16)  # second route
    with pytest.raises(RequestError) as err:
        core.request("dc-a", "dc-c", slots=1)
    assert err.value.status == 409 and err.value.reason == "no_spectrum"


def test_host_pair_lightpath_and_dc_pair_owner(core: ControllerCore) -> None:
    a = core.request("dc-a", "dc-c", slots=1)
    b = core.request("dc-a", "dc-c", slots=1)
    c = core.request("dc-a", "dc-c", slots=1, src_host="dc-a-h1", dst_host="dc-c-h0")
    rules = [r for d in core.desired().values() for r in d.values()]
    pushes = {r.cookie & 0xFFFF for r in rules if ("push_vlan", 0x8100) in r.actions}
    assert pushes == {a["id"], c["id"]}  # b carries no default traffic while a lives
    core.delete(a["id"])
    rules = [r for d in core.desired().values() for r in d.values()]
    assert {r.cookie & 0xFFFF for r in rules if ("push_vlan", 0x8100) in r.actions} \
        == {b["id"], c["id"]}


def test_diff_rules() -> None:
    sc = small_scenario()
    ix = LayoutIndex.build(default_layout(sc))
    base = desired_rules(ix, ShortestPathRouting(), [])
    dpid = next(iter(base))
    d = diff_rules({}, base[dpid], dpid)
    assert len(d.add) == len(base[dpid]) and not d.delete
    d2 = diff_rules(base[dpid], base[dpid], dpid)
    assert not d2.add and not d2.delete


def test_layout_validation() -> None:
    sc = small_scenario()
    lay = default_layout(sc).model_dump()
    lay["links"][0]["b_port"] = lay["links"][1]["b_port"]
    lay["links"][0]["b"] = lay["links"][1]["b"]
    with pytest.raises(ValueError):
        Layout.model_validate(lay)


def test_quickstart_layout_builds() -> None:
    sc = load_scenario(ROOT / "scenarios" / "quickstart.yaml")
    ix = LayoutIndex.build(default_layout(sc))
    assert len(ix.roadm) == 14 and len(ix.edge) == 4


def test_cached_lightpath_rules_equal_fresh(core: ControllerCore) -> None:
    """desired() with the per-lightpath rule cache warm equals a fresh computation, through
    set-ups, a restoration that moves a lightpath, a DC-pair owner deleted and a new one."""
    from controllers.rules import LayoutIndex

    def fresh() -> dict:
        saved = core.layout
        assert saved is not None
        core.layout = LayoutIndex.build(saved.layout)  # an index with an empty cache
        try:
            return core.desired()
        finally:
            core.layout = saved

    a = core.request("dc-a", "dc-c", slots=2)
    core.request("dc-a", "dc-c", slots=1)  # a second one: not the pair's owner
    core.request("dc-a", "dc-b", slots=1)
    assert core.desired() == fresh() and core.layout.lp_rules  # type: ignore[union-attr]
    core.fail_fibre("A", "B")  # moves a: new route, same id and vid
    assert core.desired() == fresh()
    core.delete(a["id"])  # the second dc-a~dc-c lightpath now carries the pair
    assert core.desired() == fresh()


def test_heap_settle_freezes_the_survivors_and_collects_the_garbage() -> None:
    """controllers.heap.settle (the controller process, after start-up and each layout):
    cyclic garbage is collected first, what survives is frozen (a later full collection
    does not walk it), and what is made afterwards is not frozen."""
    import gc
    import weakref

    from controllers import heap

    class Node:
        pass

    keep, junk = Node(), Node()
    junk.self = junk  # type: ignore[attr-defined]  # a cycle: only the GC frees it
    gone = weakref.ref(junk)
    del junk
    try:
        heap.settle("a test")
        assert gone() is None
        frozen = gc.get_freeze_count()
        assert frozen > 0
        later = [Node() for _ in range(100)]
        assert gc.get_freeze_count() == frozen and gc.is_tracked(later[0])
        assert keep is not None
    finally:
        gc.unfreeze()


def test_controller_app_settles_the_heap_after_start_up_and_each_layout() -> None:
    """The wiring: the app passes its own layout hook to the REST API, and both it and
    the start-up call heap.settle (read from the source: the app needs os-ken and OVS)."""
    import ast
    import inspect

    from controllers import lightpath_app

    tree = ast.parse(inspect.getsource(lightpath_app.LightpathApp))
    calls = {ast.unparse(n) for n in ast.walk(tree) if isinstance(n, ast.Call)
             and ast.unparse(n.func) == "heap.settle"}
    assert calls == {"heap.settle('start-up')", "heap.settle('a new layout')"}, calls
    kw = {k.arg: ast.unparse(k.value) for n in ast.walk(tree) if isinstance(n, ast.Call)
          and ast.unparse(n.func) == "RestApi" for k in n.keywords}
    assert kw.get("on_layout") == "self._adopt_layout"
