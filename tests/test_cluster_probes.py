"""Lightpath probes across machines (testbed.cluster.lpprobe, .lpwatch): the holders'
requests validated, the rows composed from several machines' clocks, and the real
watch/send/collect of a holder's control socket on an emulated network, row for row
against the one-machine verification's probes."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from testbed.cluster.holdctl import parse_request
from testbed.cluster.lpprobe import compose, place_probes, requests, run_probes
from testbed.cluster.place import place
from testbed.emu.plan import build_plan
from testbed.errors import InputError
from tests.test_cluster import ring

TOKEN = "0123456789abcdef"


def test_probe_requests_are_validated_field_by_field() -> None:
    watch = {"probe_watch": {"probes": [{"token": TOKEN, "vlan": 12, "dst_host": None,
                                         "fibres": [{"middle": "lp0001f1", "from": "n1"}]}],
                             "timeout_s": 60}}
    import json

    assert parse_request(json.dumps(watch).encode())["probe_watch"]["timeout_s"] == 60.0
    send = {"probe_send": {"probes": [{"token": TOKEN, "vlan": 12, "src_host": "dc-a-h0",
                                       "dst_host": "dc-b-h0"}], "gap_ms": 5}}
    assert parse_request(json.dumps(send).encode())["probe_send"]["gap_ms"] == 5.0
    run = {"probe_run": {**send["probe_send"], "wait_s": 4}}
    assert parse_request(json.dumps(run).encode())["probe_run"]["wait_s"] == 4.0
    none = {"probe_run": {"probes": [], "gap_ms": 5, "wait_s": 4}}  # only collect
    assert parse_request(json.dumps(none).encode())["probe_run"]["probes"] == []
    assert parse_request(b'{"probe_collect": {"wait_s": 3}}') == {
        "probe_collect": {"wait_s": 3.0}}
    bad = [
        ({"probe_watch": {"probes": [], "timeout_s": 60}}, "probe_watch.probes"),
        ({"probe_watch": {**watch["probe_watch"], "timeout_s": 0}}, "probe_watch.timeout_s"),
        ({"probe_watch": {"probes": [{**watch["probe_watch"]["probes"][0],
                                      "token": "XYZ"}], "timeout_s": 9}}, ".token"),
        ({"probe_watch": {"probes": [{**watch["probe_watch"]["probes"][0],
                                      "fibres": [{"middle": "a;b", "from": "n1"}]}],
                          "timeout_s": 9}}, "fibres.middle"),
        ({"probe_send": {"probes": [{**send["probe_send"]["probes"][0], "vlan": 5000}],
                         "gap_ms": 5}}, ".vlan"),
        ({"probe_send": {**send["probe_send"], "gap_ms": 1e9}}, "probe_send.gap_ms"),
        ({"probe_send": {"probes": [{"token": TOKEN}], "gap_ms": 1}}, "probe_send.probes"),
        ({"probe_collect": {"wait_s": 99}}, "probe_collect.wait_s"),
        ({"probe_collect": {}}, "probe_collect"),
        ({"probe_run": {"probes": [], "gap_ms": 5, "wait_s": -1}}, "probe_run.wait_s"),
        ({"probe_send": {"probes": [], "gap_ms": 5}}, "probe_send.probes"),
    ]
    for doc, field in bad:
        with pytest.raises(InputError, match=field.replace(".", r"\.")):
            parse_request(json.dumps(doc).encode())


def _two_machine_ring() -> tuple[Any, Any]:
    """A ring of 4 nodes, DCs d1, d2 on m-a and d3, d4 on m-b."""
    sc = ring(4, [("d1", "n1", 1), ("d2", "n2", 1), ("d3", "n3", 1), ("d4", "n4", 1)])
    plan = build_plan(sc)
    return plan, place(sc, plan, ["m-a", "m-b"],
                       {"d1": "m-a", "d2": "m-a", "d3": "m-b", "d4": "m-b"})


CLOCK = {"m-a": 1000.0, "m-b": 5000.0}   # the machines' clocks: far apart on purpose


def _replies(plan: Any, probes: list[Any], *, held_ms: float | None = None,
             tag: int | None = None, skip: str | None = None, reverse: str | None = None,
             ) -> tuple[dict[str, float], dict[str, dict[str, Any]]]:
    """What the holders would answer for probes that went right (unless told otherwise),
    each machine on its own clock: each fibre entered 0.2 ms after the last one's exit."""
    sent: dict[str, float] = {}
    got: dict[str, dict[str, Any]] = {m: {"seen": {}, "left": {}, "arrived": {},
                                          "emulated_ms": {}} for m in CLOCK}
    for p in probes:
        t = 0.0
        sent[p.token] = CLOCK[p.src_machine] + t
        stamps = []
        for mid, mach in zip(p.middles, p.middle_machine, strict=True):
            f = next(f for f in plan.fibres if f.middle == mid)
            t += 0.0002
            hold = (held_ms if held_ms is not None else f.delay_ms) / 1000.0
            stamps.append((mid, mach, t, t + hold))
            t += hold
        if reverse is not None:  # two fibres of one machine swapped in time
            (a, b) = [i for i, s in enumerate(stamps) if s[1] == reverse][:2]
            stamps[a], stamps[b] = ((stamps[a][0], stamps[a][1], stamps[b][2], stamps[b][3]),
                                    (stamps[b][0], stamps[b][1], stamps[a][2], stamps[a][3]))
        for mid, mach, t_in, t_out in stamps:
            if mid == skip:
                continue
            r = got[mach]
            r["seen"].setdefault(p.token, {})[mid] = [CLOCK[mach] + t_in,
                                                      tag if tag is not None else p.job.lp.vlan]
            r["left"].setdefault(p.token, {})[mid] = CLOCK[mach] + t_out
            r["emulated_ms"].setdefault(p.token, {})[mid] = next(
                f.delay_ms for f in plan.fibres if f.middle == mid)
        got[p.dst_machine]["arrived"][p.token] = CLOCK[p.dst_machine] + t + 0.0003
    return sent, got


def test_rows_from_several_clocks_check_what_each_clock_allows() -> None:
    plan, placement = _two_machine_ring()
    probes = place_probes(plan, placement)
    assert len(probes) == 2 * len(plan.lightpaths) == 12
    crossing = [p for p in probes if p.src_machine != p.dst_machine]
    local = [p for p in probes if p.src_machine == p.dst_machine]
    assert crossing and local
    sent, got = _replies(plan, probes)
    rows = [compose(plan, p, sent, got) for p in probes]
    assert all(r["ok"] and r["route_ok"] and r["delay_ok"] for r in rows), rows
    for p, r in zip(probes, rows, strict=True):
        assert r["hops_seen"] == r["hops_expected"] == list(p.middles)
        for mid in p.middles:  # entry -> exit on one machine: the fibre's own delay
            f = next(f for f in plan.fibres if f.middle == mid)
            assert r["fibre_delay_ms"][mid] == pytest.approx(f.delay_ms, abs=1e-3)
        if p.src_machine == p.dst_machine:
            assert r["one_way_checked"] and r["one_way_ms"] == pytest.approx(
                sum(f.delay_ms for f in plan.fibres if f.middle in p.middles)
                + 0.2 * len(p.middles) + 0.3, abs=1e-3)
        else:  # 4,000 s apart: never compared
            assert not r["one_way_checked"] and r["one_way_ms"] is None
    # The watch and send bodies: each machine watches its own fibres; sources send.
    watch, send = requests(probes)
    assert set(watch) == {"m-a", "m-b"} and set(send) == {"m-a", "m-b"}
    for mach, body in watch.items():
        for w in body["probes"]:
            p = next(p for p in probes if p.token == w["token"])
            assert [f["middle"] for f in w["fibres"]] == [
                m for m, mm in zip(p.middles, p.middle_machine, strict=True) if mm == mach]
            assert (w["dst_host"] is not None) == (p.dst_machine == mach)


@pytest.mark.parametrize("bad, route, delay", [
    ({"tag": 4000}, False, True),          # seen with another lightpath's tag
    ({"held_ms": 50.0}, True, False),      # every fibre held 50 ms: on route, late
])
def test_a_wrong_tag_or_a_late_fibre_is_caught(bad: dict[str, Any], route: bool,
                                               delay: bool) -> None:
    plan, placement = _two_machine_ring()
    probes = place_probes(plan, placement)
    sent, got = _replies(plan, probes, **bad)
    for p in probes:
        r = compose(plan, p, sent, got)
        assert (r["route_ok"], r["delay_ok"], r["ok"]) == (route, delay, False), r


def test_a_missed_fibre_or_an_order_against_the_route_is_off_route() -> None:
    plan, placement = _two_machine_ring()
    probes = place_probes(plan, placement)
    long = next(p for p in probes if len(p.middles) >= 2
                and len({m for m in p.middle_machine}) == 1)
    sent, got = _replies(plan, [long], skip=long.middles[0])
    assert not compose(plan, long, sent, got)["route_ok"]
    sent, got = _replies(plan, [long], reverse=long.middle_machine[0])
    r = compose(plan, long, sent, got)
    assert not r["route_ok"] and r["hops_seen"] == [long.middles[1], long.middles[0],
                                                     *long.middles[2:]]
    sent, got = _replies(plan, [long])
    got[long.dst_machine]["arrived"].clear()  # never delivered
    assert not compose(plan, long, sent, got)["delivered"]


def test_failed_probes_go_round_again_with_fresh_tokens() -> None:
    """run_probes' rounds: a probe that failed is sent again under a new token, the ones
    that passed are not; the record says how many rounds it took."""
    plan, placement = _two_machine_ring()
    delay = {f.middle: f.delay_ms for f in plan.fibres}
    watched: dict[str, list[dict[str, Any]]] = {}
    sends: list[list[str]] = []
    lost: set[str] = set()

    def step(machine: str, req: dict[str, Any]) -> dict[str, Any]:
        (what, body), = req.items()
        if what == "probe_watch":
            watched[machine] = body["probes"]
            return {"ok": True}
        assert what == "probe_run"  # send this machine's probes, then collect
        tokens = [p["token"] for p in body["probes"]]
        if not sends:
            lost.add(tokens[0])  # the very first probe sent never arrives
        sends.append(tokens)
        out: dict[str, Any] = {"ok": True, "seen": {}, "left": {}, "arrived": {},
                               "emulated_ms": {}, "sent": {t: CLOCK[machine] for t in tokens}}
        for w in watched[machine]:  # as a holder whose probes all went right
            t = CLOCK[machine]
            for f in w["fibres"]:
                out["seen"].setdefault(w["token"], {})[f["middle"]] = [t, w["vlan"]]
                t += delay[f["middle"]] / 1000.0
                out["left"].setdefault(w["token"], {})[f["middle"]] = t
                out["emulated_ms"].setdefault(w["token"], {})[f["middle"]] = \
                    delay[f["middle"]]
            if w["dst_host"] is not None and w["token"] not in lost:
                out["arrived"][w["token"]] = t + 0.001
        return out

    rec = run_probes(plan, placement, step, lambda ms, fn: [fn(m) for m in ms])
    assert rec["rounds"] == 2 and rec["routes_ok"] and rec["delays_ok"], rec
    first = {t for tokens in sends[:2] for t in tokens}
    again = [t for tokens in sends[2:] for t in tokens]
    assert len(first) == 12 and len(again) == 1 and again[0] not in first
    assert sorted(r["rounds"] for r in rec["probes"]) == [1] * 11 + [2]


@pytest.mark.root
@pytest.mark.slow
@pytest.mark.skipif(not (os.geteuid() == 0 and shutil.which("mnexec")
                         and shutil.which("ovs-vsctl")),
                    reason="needs root, mnexec and Open vSwitch")
def test_holder_watch_send_collect_matches_the_one_machine_probes(tmp_path: Path) -> None:
    """On a real emulated network (user-space links and datapath), the holder's control
    socket with the share's ProbeWatch: every lightpath direction on its route, each
    fibre's delay within its tolerance and within 1 ms of what the one-machine probe
    measures on the same fibre."""
    from testbed.cluster.holdctl import ControlServer, request
    from testbed.cluster.lpwatch import ProbeWatch
    from testbed.emu.network import EmuNetwork
    from testbed.emu.verify import probe_jobs, run_probe

    sc = ring(3, [("d1", "n1", 1), ("d2", "n2", 1), ("d3", "n3", 1)])
    sc = sc.model_copy(update={"emulation": sc.emulation.model_copy(
        update={"forwarding": "static", "hosts_per_dc": 1})})
    plan = build_plan(sc)
    one = place(sc, plan, ["m"])
    d = tmp_path / "run"
    d.mkdir(mode=0o700)
    with EmuNetwork(plan, link_mode="userspace", datapath="user") as net:
        watch = ProbeWatch(net)
        server = ControlServer(d, net.emulators, hooks={
            "probe_watch": watch.watch, "probe_send": watch.send,
            "probe_collect": watch.collect, "probe_run": watch.run}).start()
        try:
            def step(_m: str, req: dict[str, Any]) -> dict[str, Any]:
                return request(d, parse_request(__import__("json").dumps(req).encode()))

            rec = run_probes(plan, one, step, lambda ms, fn: [fn(m) for m in ms])
            ref = [run_probe(net, j) for j in probe_jobs(plan)]
        finally:
            server.close()
            watch.close()
    assert rec["routes_ok"] and rec["delays_ok"], [
        {k: r[k] for k in ("vlan", "hops_seen", "fibre_delay_ms", "one_way_ms", "expected_ms",
                           "delay_ok", "route_ok")} for r in rec["probes"]]
    assert rec["one_way_checked"] == len(rec["probes"]) == len(ref) == 6
    for row, want in zip(rec["probes"], ref, strict=True):
        assert row["vlan"] == want["vlan"] and row["hops_seen"] == want["hops_seen"]
        for mid, ms in row["fibre_delay_ms"].items():
            assert abs(ms - want["fibre_delay_ms"][mid]) < 1.0, (row, want)
        assert row["one_way_ms"] is not None and row["delay_ok"]
