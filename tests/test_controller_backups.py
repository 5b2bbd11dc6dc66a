"""Pure tests of the protection state (controllers/backups.py): backup routes and their cache,
pending protections, the deferred install's timer."""

from __future__ import annotations

import threading
from collections.abc import Callable
from itertools import pairwise
from typing import Any

from controllers.backups import MAX_POSTPONE_S, Backups
from controllers.layout import default_layout
from controllers.rules import LayoutIndex
from controllers.store import LightpathRow
from testbed.optical import OpticalNetwork
from tests.test_controller_core import small_scenario


def _row(lp_id: int, nodes: list[str]) -> LightpathRow:
    return LightpathRow(id=lp_id, vid=lp_id + 1, src_dc="dc-a", dst_dc="dc-c", src_host=None,
                        dst_host=None, bitrate_gbps=None, slots_req=1, policy="first_fit",
                        nodes=nodes, first_slot=0, n_slots=1, modulation="BPSK",
                        capacity_gbps=12.5, job_id=None, created_s=0.0)


def _setup() -> tuple[OpticalNetwork, LayoutIndex]:
    sc = small_scenario()
    return OpticalNetwork.from_scenario(sc), LayoutIndex.build(default_layout(sc))


def test_backup_is_disjoint_cached_and_recomputed_after_a_change() -> None:
    net, ix = _setup()
    b = Backups(net, on=True)
    assert b.backup(ix, ["A", "B", "C"]) == ("A", "D", "C")
    assert b.backup(ix, ("A", "D", "C")) == ("A", "B", "C")
    assert b.backup(None, ["A", "B", "C"]) is None  # no layout, no backup
    net.fail_link("A", "D")
    assert b.backup(ix, ["A", "B", "C"]) == ("A", "D", "C")  # cached until told
    b.routes_changed()
    assert b.backup(ix, ["A", "B", "C"]) is None  # the only disjoint route is cut
    row = _row(1, ["A", "B", "C"])
    assert b.view(ix, row) == {"backup": None, "protected": False}


def test_pending_lightpaths_hold_no_backup_until_taken() -> None:
    net, ix = _setup()
    b = Backups(net, on=True, delay_s=3600.0)
    row = _row(1, ["A", "B", "C"])
    assert b.defer(1) and b.pending == {1}
    assert b.held(ix, row) is None
    assert b.view(ix, row) == {"backup": ["A", "D", "C"], "protected": False}
    assert b.take_pending() and not b.take_pending()
    assert b.held(ix, row) == ("A", "D", "C")
    assert b.view(ix, row) == {"backup": ["A", "D", "C"], "protected": True}
    b.defer(2)
    b.forget(2)
    assert not b.pending


def test_off_or_not_deferred() -> None:
    net, ix = _setup()
    off = Backups(net, on=False, delay_s=0.05)
    row = _row(1, ["A", "B", "C"])
    assert not off.defer(1) and off.backup(ix, row.nodes) is None and off.view(ix, row) == {}
    within = Backups(net, on=True, delay_s=None)  # protection installed with the set-up
    assert not within.defer(1) and within.held(ix, row) == ("A", "D", "C")


def test_timer_installs_once_for_a_burst() -> None:
    net, _ = _setup()
    b = Backups(net, on=True, delay_s=0.01)
    calls: list[int] = []
    done = threading.Event()

    def install() -> None:
        calls.append(1)
        done.set()

    for i in range(5):  # a burst of set-ups: each restarts the timer
        b.defer(i)
        b.schedule(install)
    assert done.wait(30)
    timer = b._timer
    assert timer is not None
    timer.join(30)
    assert calls == [1]


def test_a_steady_stream_postpones_at_most_max_postpone() -> None:
    net, _ = _setup()
    now = [100.0]
    b = Backups(net, on=True, delay_s=3600.0, clock=lambda: now[0])
    try:
        b.schedule(lambda: None)
        first = b._timer
        now[0] += MAX_POSTPONE_S / 2
        b.schedule(lambda: None)  # restarted: a new timer, the first one cancelled
        second = b._timer
        assert second is not first and first is not None and first.finished.is_set()
        now[0] += MAX_POSTPONE_S
        b.schedule(lambda: None)  # the oldest pending one waited long enough: kept
        assert b._timer is second
    finally:
        if b._timer is not None:
            b._timer.cancel()


def _backup_over_a_view(graph: Any, nodes: tuple[str, ...],
                        usable: Callable[[str, str], bool]) -> tuple[str, ...] | None:
    """The search as it was (controllers/protection.py before it hid edges by weight): a
    dijkstra over a subgraph view without the route's and the unusable fibres."""
    import networkx as nx

    used = {frozenset(e) for e in pairwise(nodes)}
    view = nx.subgraph_view(graph, filter_edge=lambda u, v: frozenset((u, v)) not in used
                            and usable(u, v))
    try:
        return tuple(nx.dijkstra_path(view, nodes[0], nodes[-1], weight="length_km"))
    except (nx.NetworkXNoPath, nx.NodeNotFound):
        return None


def test_backup_route_is_the_subgraph_views_route_ties_included() -> None:
    """Every working route (k shortest between all node pairs) on NSFNET and on a grid of
    equal lengths (many ties), with every single fibre and random pairs of fibres out."""
    import random

    import networkx as nx

    from controllers.protection import backup_route
    from testbed.optical.paths import k_shortest_paths
    from testbed.spec import load_scenario
    from tests.test_controller_core import ROOT

    nsfnet = OpticalNetwork.from_scenario(load_scenario(ROOT / "scenarios" /
                                                        "quickstart.yaml")).graph
    grid = nx.convert_node_labels_to_integers(nx.grid_2d_graph(4, 4))
    grid = nx.relabel_nodes(grid, {n: str(n) for n in grid})
    nx.set_edge_attributes(grid, 100.0, "length_km")
    rng = random.Random(5)
    checked = 0
    for g in (nsfnet, grid):
        fibres = [frozenset(e) for e in g.edges]
        outs = [set()] + [{f} for f in fibres] + [set(rng.sample(fibres, 2)) for _ in range(6)]
        nodes = sorted(g.nodes)
        for a in nodes:
            for b in nodes:
                if a >= b:
                    continue
                for route in k_shortest_paths(g, a, b, 2):
                    for out in outs:
                        def usable(u: str, v: str, out: set[frozenset[str]] = out) -> bool:
                            return frozenset((u, v)) not in out
                        got = backup_route(g, tuple(route), usable)
                        assert got == _backup_over_a_view(g, tuple(route), usable)
                        checked += 1
    assert checked > 5000
