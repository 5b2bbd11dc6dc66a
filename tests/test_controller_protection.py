"""Fast-failover protection (pure): backup routes, FF groups, a frame walked through the
rules with ports down, restoration adopting the backup, decisions unchanged."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from controllers.core import ControllerCore
from controllers.layout import default_layout
from controllers.protection import (
    OFPP_IN_PORT,
    PCP_CRANKBACK,
    FailoverGroup,
    failover_group_id,
)
from controllers.rules import OFPVID_PRESENT, LayoutIndex
from controllers.store import Store
from testbed.spec import load_scenario, parse_scenario

ROOT = Path(__file__).resolve().parents[1]


def ring_scenario() -> Any:
    """A-B-C-D-E-A ring (5 nodes): routes of 2 and 3 hops, crankback over 2 ROADMs."""
    return parse_scenario({
        "name": "ctl-ff",
        "topology": {"links": [
            {"u": "A", "v": "B", "length_km": 100}, {"u": "B", "v": "C", "length_km": 100},
            {"u": "C", "v": "D", "length_km": 100}, {"u": "D", "v": "E", "length_km": 200},
            {"u": "E", "v": "A", "length_km": 200}]},
        "dcs": [{"name": "dc-a", "node": "A", "gpus": 8},
                {"name": "dc-d", "node": "D", "gpus": 8},
                {"name": "dc-c", "node": "C", "gpus": 8}],
        "optical": {"slots": 16, "k_paths": 2},
        "workload": {"kind": "lightpath_requests"},
        "emulation": {"hosts_per_dc": 1, "bandwidth_divisor": 1000},
    })


class Recorder:
    def __init__(self) -> None:
        self.syncs: list[dict[int, dict[tuple, Any]]] = []

    def sync(self, desired: dict[int, dict[tuple, Any]]) -> None:
        self.syncs.append(desired)


def make_core(tmp: Path, sc: Any, protection: bool = True) -> ControllerCore:
    return ControllerCore(sc, Store(tmp / f"s{int(protection)}.db"),
                          layout=default_layout(sc), southbound=Recorder(),
                          protection=protection)


def walk(ix: LayoutIndex, desired: dict[int, dict[tuple, Any]], vid: int, src_dc: str,
         dst_dc: str, down: set[tuple[str, int]], cut: set[frozenset[str]]
         ) -> tuple[bool, list[str]]:
    """Follow a frame tagged `vid` from src_dc's uplink through the ROADMs' rules and
    groups as a switch would: a group takes its first bucket whose watched port is not
    in `down` ((node, port) the switch sees down); a frame sent into a cut fibre is lost.
    Returns (delivered to dst_dc's uplink, the nodes visited)."""
    peer: dict[tuple[str, int], tuple[str, int]] = {}
    for (u, v), port in ix.fibre_port.items():
        peer[(u, port)] = (v, ix.fibre_port[(v, u)])
    uplink = {(ix.dc_node[dc], ix.edge[dc][3]): dc for dc in ix.edge}
    node, in_port = ix.dc_node[src_dc], ix.edge[src_dc][3]
    tag, pcp = OFPVID_PRESENT | vid, 0
    seen = [node]
    for _ in range(64):
        rules = desired[ix.dpid[ix.roadm[node]]]
        fields = {"in_port": in_port, "vlan_vid": tag, "vlan_pcp": pcp}
        hits = [r for r in rules.values() if not isinstance(r, FailoverGroup)
                and r.table == 0 and all(fields.get(k) == v for k, v in r.match)]
        if not hits:
            return False, seen  # table miss: dropped
        actions = list(max(hits, key=lambda r: r.priority).actions)
        out = None
        while actions:
            name, arg = actions.pop(0)
            if name == "group":
                group = rules[(ix.dpid[ix.roadm[node]], "group", arg)]
                live = [acts for watch, acts in group.buckets if (node, watch) not in down]
                if not live:
                    return False, seen
                actions = list(live[0]) + actions
            elif name == "set_vlan_pcp":
                pcp = arg
            elif name == "output":
                out = in_port if arg == OFPP_IN_PORT else arg
        assert out is not None
        if (node, out) not in peer:
            return uplink.get((node, out)) == dst_dc, seen
        nxt, nxt_port = peer[(node, out)]
        if frozenset((node, nxt)) in cut:
            return False, seen  # into the cut fibre
        node, in_port = nxt, nxt_port
        seen.append(node)
    raise AssertionError(f"frame loops: {seen}")


def test_backup_is_fibre_disjoint_and_installed_as_ff_groups(tmp_path: Path) -> None:
    core = make_core(tmp_path, ring_scenario())
    lp = core.request("dc-a", "dc-d", slots=2)
    assert lp["nodes"] == ["A", "B", "C", "D"] and lp["backup"] == ["A", "E", "D"]
    ix = core.layout
    assert ix is not None
    desired = core.desired()
    port = ix.fibre_port
    tag = OFPVID_PRESENT | lp["vid"]

    def group(node: str, direction: int) -> FailoverGroup:
        return desired[ix.dpid[ix.roadm[node]]][(ix.dpid[ix.roadm[node]], "group",
                                                 failover_group_id(lp["id"], direction))]

    # head end A (A -> D): working out port first, then the backup's first fibre
    assert group("A", 0).buckets == ((port[("A", "B")], (("output", port[("A", "B")]),)),
                                     (port[("A", "E")], (("output", port[("A", "E")]),)))
    # further on (B, C): working out port, else back where the frame came from, marked
    for node, prev, nxt in (("B", "A", "C"), ("C", "B", "D")):
        assert group(node, 0).buckets == (
            (port[(node, nxt)], (("output", port[(node, nxt)]),)),
            (port[(node, prev)], (("set_vlan_pcp", PCP_CRANKBACK), ("output", OFPP_IN_PORT))))
    # the other direction's head end is D, whose backup leaves toward E
    assert group("D", 1).buckets[1] == (port[("D", "E")], (("output", port[("D", "E")]),))
    # the tail has no group for that direction; E (backup only) holds plain hop rules
    e = ix.dpid[ix.roadm["E"]]
    assert not any(isinstance(x, FailoverGroup) for x in desired[e].values())
    assert sorted(r.actions for r in desired[e].values() if ("vlan_vid", tag) in r.match) == \
        sorted([(("output", port[("E", "D")]),), (("output", port[("E", "A")]),)])


@pytest.mark.parametrize("fibre", [("A", "B"), ("B", "C"), ("C", "D")])
@pytest.mark.parametrize("seen_by", ["both", "u", "v"])
def test_a_cut_fails_over_in_the_switches_alone(tmp_path: Path, fibre: tuple[str, str],
                                                seen_by: str) -> None:
    """No controller action: with the rules as installed before the cut, frames of the
    direction whose upstream end sees the port down reach the far DC over the backup."""
    core = make_core(tmp_path, ring_scenario())
    lp = core.request("dc-a", "dc-d", slots=2)
    ix = core.layout
    assert ix is not None
    desired = core.desired()
    u, v = fibre
    down = {(u, ix.fibre_port[(u, v)])} if seen_by in ("both", "u") else set()
    down |= {(v, ix.fibre_port[(v, u)])} if seen_by in ("both", "v") else set()
    cut = {frozenset(fibre)}
    for src, dst, upstream in (("dc-a", "dc-d", u), ("dc-d", "dc-a", v)):
        ok, path = walk(ix, desired, lp["vid"], src, dst, down, cut)
        sees = seen_by in ("both", "u" if upstream == u else "v")
        assert ok == sees, (src, path)
        if ok:
            assert "E" in path  # over the backup
    # before any cut, both directions take the working route only
    for src, dst, nodes in (("dc-a", "dc-d", lp["nodes"]),
                            ("dc-d", "dc-a", lp["nodes"][::-1])):
        assert walk(ix, desired, lp["vid"], src, dst, set(), set()) == (True, nodes)


def test_restoration_adopts_the_backup_and_finds_a_new_one(tmp_path: Path) -> None:
    core = make_core(tmp_path, ring_scenario())
    lp = core.request("dc-a", "dc-d", slots=2)
    ix = core.layout
    assert ix is not None
    before = core.desired()
    e = ix.dpid[ix.roadm["E"]]
    res = core.fail_fibre("B", "C")
    assert res.restored == [lp["id"]] and res.on_backup == [lp["id"]]
    assert res.to_dict()["on_backup"] == [lp["id"]]
    now = core.lightpath(lp["id"])
    assert now["nodes"] == ["A", "E", "D"]
    assert now["backup"] is None  # the ring's other side is cut: nothing disjoint left
    after = core.desired()
    # the backup's hops keep the very rules the switch forwards on: nothing to send to E
    assert after[e] == before[e]
    assert core.metrics.restored_on_backup._value.get() == 1
    core.repair_fibre("B", "C")
    assert core.lightpath(lp["id"])["backup"] == ["A", "B", "C", "D"]
    desired = core.desired()
    assert walk(ix, desired, lp["vid"], "dc-a", "dc-d", {("A", ix.fibre_port[("A", "E")])},
                {frozenset(("A", "E"))})[0]


def test_without_protection_no_groups_and_no_backup_key(tmp_path: Path) -> None:
    core = make_core(tmp_path, ring_scenario(), protection=False)
    lp = core.request("dc-a", "dc-d", slots=2)
    assert "backup" not in lp
    assert not any(isinstance(x, FailoverGroup) for d in core.desired().values()
                   for x in d.values())
    assert "on_backup" not in core.fail_fibre("B", "C").to_dict()


def test_protection_leaves_every_decision_unchanged(tmp_path: Path) -> None:
    """Same requests, cuts, repairs and deletes on NSFNET with and without protection:
    the same routes, slots, VLAN ids, restorations and losses."""
    sc = load_scenario(ROOT / "scenarios" / "quickstart.yaml")
    cores = [make_core(tmp_path, sc, protection=p) for p in (False, True)]
    rng = random.Random(23)
    dcs = [d.name for d in sc.dcs]
    fibres = [(f.u, f.v) for f in cores[0].net.topology.fibres]
    outs: list[list[Any]] = [[], []]
    for _ in range(150):
        op = rng.random()
        a, b = rng.sample(dcs, 2)
        failed = [x for x in fibres if cores[0].net.is_failed(*x)]
        f = rng.choice(failed) if op >= 0.7 and failed else rng.choice(fibres)
        live = sorted(r["id"] for r in cores[0].lightpaths())
        victim = rng.choice(live) if live else None
        slots = rng.randint(1, 8)
        for core, out in zip(cores, outs, strict=True):
            if op < 0.6:
                try:
                    out.append(core.request(a, b, slots=slots)["id"])
                except Exception as exc:
                    out.append(str(exc))
            elif op < 0.7:
                r = core.fail_fibre(*f)
                out.append((r.restored, r.lost))
            elif op < 0.85:
                core.repair_fibre(*f)
            elif victim is not None:
                core.delete(victim)
    assert outs[0] == outs[1]
    assert any(isinstance(x, tuple) and x[0] for x in outs[0])  # restorations happened
    extra = ("backup", "protected", "setup_s", "created_s")
    strip = [[{k: x for k, x in v.items() if k not in extra} for v in c.lightpaths()]
             for c in cores]
    assert strip[0] == strip[1] and strip[0]
    # and with protection every protected lightpath survives any one cut of its route
    core = cores[1]
    ix = core.layout
    assert ix is not None
    desired = core.desired()
    checked = 0
    for v in core.lightpaths():
        if v["backup"] is None:
            continue
        for u, w in zip(v["nodes"], v["nodes"][1:], strict=False):
            down = {(u, ix.fibre_port[(u, w)]), (w, ix.fibre_port[(w, u)])}
            for src, dst in ((v["src_dc"], v["dst_dc"]), (v["dst_dc"], v["src_dc"])):
                assert walk(ix, desired, v["vid"], src, dst, down, {frozenset((u, w))})[0]
                checked += 1
    assert checked > 0


def test_sync_is_make_before_break_in_one_write_per_switch(tmp_path: Path) -> None:
    """The app's sync after a cut that moves a lightpath (no protection here) from
    A-B-C-D to A-E-D, in three rounds of one write per switch (the messages, then a
    barrier), each after the last round's barriers: entries new to a switch (E's), then
    changed ones (A's head-end rule now pointing at E), then deleted ones (B's, C's)."""
    pytest.importorskip("os_ken")
    import threading
    import types

    from os_ken.ofproto import ofproto_v1_3
    from os_ken.ofproto import ofproto_v1_3_parser as parser

    from controllers.lightpath_app import LightpathApp

    core = make_core(tmp_path, ring_scenario(), protection=False)
    lp = core.request("dc-a", "dc-d", slots=2)
    before = core.desired()
    core.fail_fibre("B", "C")
    after = core.desired()
    assert core.lightpath(lp["id"])["nodes"] == ["A", "E", "D"]
    log: list[tuple[str, int, list[tuple[int, int]]]] = []

    class Dp:
        ofproto, ofproto_parser = ofproto_v1_3, parser

        def __init__(self, dpid: int) -> None:
            self.id, self.xid = dpid, 0

        def set_xid(self, msg: Any) -> int:
            self.xid += 1
            msg.set_xid(self.xid)
            return self.xid

        def send(self, buf: bytes) -> None:  # (type, command) of each message in the write
            msgs, i = [], 0
            while i < len(buf):
                kind, length = buf[i + 1], int.from_bytes(buf[i + 2:i + 4], "big")
                command = int.from_bytes(buf[i + 8 + 17:i + 8 + 18], "big") if kind == 14 \
                    else int.from_bytes(buf[i + 8:i + 10], "big") if kind == 15 else -1
                msgs.append((kind, command))
                i += length
            log.append(("write", self.id, msgs))

    app = types.SimpleNamespace(
        sync_lock=threading.RLock(), awaiting_layout=set(), barriers={},
        datapaths={d: Dp(d) for d in after}, installed={d: dict(before[d]) for d in after},
        core=core)
    app._barrier = types.MethodType(LightpathApp._barrier, app)
    app._wait = lambda waits: log.append(("wait", len(waits), []))
    LightpathApp.sync(app, after)  # type: ignore[arg-type]
    waits = [i for i, x in enumerate(log) if x[0] == "wait"]
    assert len(waits) == 3
    first, second, third = (log[:waits[0]], log[waits[0] + 1:waits[1]],
                            log[waits[1] + 1:waits[2]])
    flow_mod, group_mod, barrier = 14, 15, 20
    add, modify, delete_strict, group_delete = 0, 1, 4, 2
    for _, _, msgs in first + second + third:
        assert msgs[-1] == (barrier, -1) and (barrier, -1) not in msgs[:-1]
    kinds = [{m for _, _, msgs in r for m in msgs[:-1]} for r in (first, second, third)]
    assert kinds[0] and kinds[0] <= {(flow_mod, add), (group_mod, add)}
    assert kinds[1] and kinds[1] <= {(flow_mod, add), (group_mod, modify)}
    assert kinds[2] and kinds[2] <= {(flow_mod, delete_strict), (group_mod, group_delete)}
    ix = core.layout
    assert ix is not None
    dpid = {n: ix.dpid[ix.roadm[n]] for n in "ABCDE"}
    assert dpid["E"] in {d for _, d, _ in first}
    assert dpid["E"] not in {d for _, d, _ in second + third}
    assert dpid["A"] in {d for _, d, _ in second}  # A's (uplink, VLAN) rule redirected
    # the old route's hops only lose entries, last (A and D lose their old in-ports' too)
    assert {dpid["B"], dpid["C"]} <= {d for _, d, _ in third}
    assert not {dpid["B"], dpid["C"]} & {d for _, d, _ in first + second}
    assert app.installed == {d: dict(after[d]) for d in after}


def test_deferred_protection_follows_the_set_up(tmp_path: Path) -> None:
    """With protect_delay_s the set-up installs the working route only (the rules it
    would have without protection); the protection of all pending lightpaths follows in
    one go, and a restoration before that is the controller's alone."""
    sc = ring_scenario()
    plain = make_core(tmp_path, sc, protection=False)
    core = ControllerCore(sc, Store(tmp_path / "d.db"), layout=default_layout(sc),
                          southbound=Recorder(), protection=True, protect_delay_s=3600.0)
    a = core.request("dc-a", "dc-d", slots=2)
    b = core.request("dc-a", "dc-c", slots=2)
    plain.request("dc-a", "dc-d", slots=2)
    plain.request("dc-a", "dc-c", slots=2)
    assert a["protected"] is False and a["backup"] == ["A", "E", "D"]
    assert core.desired() == plain.desired()  # the working routes' rules only
    core.protect_pending()
    assert all(v["protected"] for v in core.lightpaths())
    groups = {x.group_id for d in core.desired().values() for x in d.values()
              if isinstance(x, FailoverGroup)}
    assert groups == {failover_group_id(i, d) for i in (a["id"], b["id"]) for d in (0, 1)}
    c = core.request("dc-a", "dc-d", slots=2)
    res = core.fail_fibre("B", "C")  # c's backup was never installed: not "on backup"
    assert set(res.restored) == {a["id"], b["id"], c["id"]}
    assert res.on_backup == [a["id"], b["id"]]
    core.delete(c["id"])
    assert not core.backups.pending


def test_deferred_protection_is_installed_by_its_timer(tmp_path: Path) -> None:
    from tests.waiting import wait_until

    sc = ring_scenario()
    core = ControllerCore(sc, Store(tmp_path / "t.db"), layout=default_layout(sc),
                          southbound=Recorder(), protection=True, protect_delay_s=0.01)
    lp = core.request("dc-a", "dc-d", slots=2)
    wait_until(lambda: core.lightpath(lp["id"])["protected"], "the protection timer")
