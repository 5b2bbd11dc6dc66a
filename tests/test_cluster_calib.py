"""Delay calibration across machines (testbed.cluster.calib, testbed.cluster.holdctl): the
driver's solve with every fibre's emulator on its own machine, the holder's control
socket, and the `hold correct` input checks. No root: the emulators here keep the
bookkeeping of a real one without a data plane, and the machines are modelled."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from testbed.cluster.calib import RemoteFibre, calibrate_cluster, fibre_labels, flush
from testbed.cluster.holdctl import ControlServer, apply, parse_request, request
from testbed.cluster.sharedoc import pair_probes, plan_cluster, probes_doc, read_probes
from testbed.cluster.spec import parse_cluster
from testbed.emu.calibrate import CalibrationConfig
from testbed.emu.links import LinkEmulator
from testbed.errors import InputError, RuntimeFailure
from testbed.spec import parse_scenario
from tests.conftest import load_yaml


class ModelLink(LinkEmulator):
    """A fibre emulator's bookkeeping (what it runs each frame at), no data plane."""

    def __init__(self, *a: Any, mode: str = "userspace", **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.mode = mode

    def set_delay_correction(self, correction_ms: float) -> None:
        self.correction_ms = max(0.0, correction_ms)

    def set_vlan_correction(self, vlan: int, correction_ms: float) -> bool:
        if self.mode != "userspace":
            return False
        self.vlan_corrections_ms[vlan] = correction_ms
        return True


def _two_machines(tmp_path: Path, mode: str = "userspace") -> tuple[Any, ...]:
    sc = parse_scenario(load_yaml("quickstart.yaml"))
    c = parse_cluster({"machines": [{"name": "m1", "address": "192.0.2.1"},
                                    {"name": "m2", "address": "192.0.2.2"}]})
    plan, placement, shares = plan_cluster(sc, c, "lp0a0b")
    emulators = {m: {f.middle: ModelLink(f, 1, "u", "v", {}, tmp_path, mode=mode)
                     for f in sh.fibres} for m, sh in shares.items()}
    return plan, placement, shares, emulators


def _machines(emulators: dict[str, dict[str, ModelLink]]) -> Any:
    """apply(): what `hold correct` does on a machine, JSON both ways."""
    asked: list[str] = []

    def on(machine: str, req: dict[str, Any]) -> dict[str, Any]:
        asked.append(machine)
        reply = apply(emulators[machine], parse_request(json.dumps(req).encode()))
        reply = json.loads(json.dumps(reply))
        if not reply["ok"]:
            raise RuntimeFailure(reply["error"])
        return dict(reply["fibres"])
    return on, asked


def _network(plan: Any, placement: Any, emulators: dict[str, dict[str, ModelLink]],
             tunnel_ms: float) -> Any:
    """ping(): RTTs the network would give. Each fibre pass costs its emulated delay
    (the lightpath's) and some processing; each DC end 0.4 ms; a fibre whose ends are on
    two machines adds the tunnel's latency each way."""
    links = {k: e for per in emulators.values() for k, e in per.items()}
    labels = fibre_labels(plan)
    proc = {k: 0.15 + 0.05 * (i % 4) for i, k in enumerate(sorted(links))}
    crossing = {c.middle for c in placement.crossing}
    assert crossing, "the placement cuts no fibre"

    def ping(probes: Any) -> list[dict[str, Any]]:
        rows = []
        for p in probes:
            one_way = sum(links[labels[f]].emulated_delay_ms(p.vlan) + proc[labels[f]]
                          + (tunnel_ms if labels[f] in crossing else 0.0)
                          for f in p.fibres)
            rtt = 2 * one_way + 0.4
            rows.append({"pair": p.pair, "rtts_ms": [rtt] * p.pings,
                         "dense_rtts_ms": [rtt - 0.1] * p.dense_pings})
        return rows
    return ping, crossing


def _fibre_machine(shares: dict[str, Any]) -> dict[str, str]:
    return {f.middle: m for m, sh in shares.items() for f in sh.fibres}


def test_every_pair_lands_on_its_plan_with_fibres_on_two_machines(tmp_path: Path) -> None:
    plan, placement, shares, emulators = _two_machines(tmp_path)
    on, asked = _machines(emulators)
    ping, crossing = _network(plan, placement, emulators, tunnel_ms=0.6)
    probes = pair_probes(plan, placement)
    before = {r["pair"]: r["rtts_ms"][0] - 2 * p.configured_ms
              for p, r in zip(probes, ping(probes), strict=True)}
    crosses = [p.pair for p in probes if any(fibre_labels(plan)[f] in crossing
                                             for f in p.fibres)]
    assert max(before[pair] for pair in crosses) > 2.0  # the tunnels: far out of the band
    rec = calibrate_cluster(plan, _fibre_machine(shares), probes, on, ping,
                            CalibrationConfig(rounds=3))
    assert rec["settled"] and rec["mode"] == "per_lightpath"
    assert {r["pair"] for r in rec["after"]} == {p.pair for p in probes}
    assert all(abs(r["error_ms"]) <= 0.25 for r in rec["after"]), rec["after"]
    # Each machine was asked for its state first and its fibres' values after.
    assert set(asked) == {"m1", "m2"}
    # What the record says each fibre runs at is what its machine's emulator runs at.
    links = {k: e for per in emulators.values() for k, e in per.items()}
    for f in rec["fibres"]:
        assert f["machine"] in ("m1", "m2") and f["middle"] in emulators[f["machine"]]
        assert f["emulated_delay_ms"] == pytest.approx(links[f["middle"]].emulated_delay_ms())
    # A crossing pair's lightpath carries the tunnel's latency in its own correction.
    for pair in crosses:
        assert sum(rec["path_corrections_ms"][pair].values()) > 0.6


def test_netem_machines_get_one_value_per_fibre(tmp_path: Path) -> None:
    plan, placement, shares, emulators = _two_machines(tmp_path, mode="netem")
    on, _ = _machines(emulators)
    ping, _ = _network(plan, placement, emulators, tunnel_ms=0.3)
    rec = calibrate_cluster(plan, _fibre_machine(shares), pair_probes(plan, placement),
                            on, ping, CalibrationConfig.for_link_mode("netem"))
    assert rec["mode"] == "per_fibre" and rec["path_corrections_ms"] == {}
    assert rec["corrections_applied"] >= 1
    worst_before = max(abs(r["error_ms"]) for r in rec["before"])
    worst_after = max(abs(r["error_ms"]) for r in rec["after"])
    assert worst_after < worst_before / 2
    assert all(not e.vlan_corrections_ms for per in emulators.values() for e in per.values())


def test_a_machine_that_misreports_is_named(tmp_path: Path) -> None:
    plan, placement, shares, emulators = _two_machines(tmp_path)
    on, _ = _machines(emulators)
    ping, _ = _network(plan, placement, emulators, tunnel_ms=0.3)
    emulators["m2"].popitem()  # a fibre the driver expects there is not emulated there
    with pytest.raises(RuntimeFailure, match="not reported by their machine"):
        calibrate_cluster(plan, _fibre_machine(shares), pair_probes(plan, placement), on,
                          ping, CalibrationConfig())


def test_flush_sends_only_what_changed(tmp_path: Path) -> None:
    plan, _, shares, emulators = _two_machines(tmp_path)
    on, asked = _machines(emulators)
    fm = _fibre_machine(shares)
    by = {f.middle: f for f in plan.fibres}
    states = on("m1", {"fibres": {}, "vlans": {}}) | on("m2", {"fibres": {}, "vlans": {}})
    remote = {k: RemoteFibre(by[k], fm[k], states[k]) for k in fm}
    asked.clear()
    assert flush(remote, on) == 0 and asked == []
    k = next(k for k in remote if fm[k] == "m2")
    remote[k].set_delay_correction(0.3)
    assert remote[k].set_vlan_correction(7, -0.1)
    assert flush(remote, on) == 1 and asked == ["m2"]
    assert emulators["m2"][k].correction_ms == 0.3
    assert emulators["m2"][k].vlan_corrections_ms == {7: -0.1}
    assert remote[k].emulated_delay_ms(7) == pytest.approx(by[k].delay_ms - 0.3 + 0.1)
    assert not remote[k].pending


@pytest.mark.parametrize("raw, field", [
    (b"[1]", "correct"),
    (b'{"fibres": {"x;id": 1}}', "correct.fibres"),
    (b'{"fibres": {"m1": "1"}}', "correct.fibres.m1"),
    (b'{"fibres": {"m1": 1e9}}', "correct.fibres.m1"),
    (b'{"fibres": {"m1": NaN}}', "correct.fibres.m1"),
    (b'{"vlans": {"m1": {"0": 1}}}', "correct.vlans.m1"),
    (b'{"vlans": {"m1": {"7": true}}}', "correct.vlans.m1.7"),
    (b'{"other": 1}', "correct"),
])
def test_bad_correction_request_names_the_field(raw: bytes, field: str) -> None:
    with pytest.raises(InputError) as exc:
        parse_request(raw)
    assert exc.value.path == field


def test_unknown_fibre_is_refused_and_nothing_changes(tmp_path: Path) -> None:
    _, _, _, emulators = _two_machines(tmp_path)
    here = emulators["m1"]
    reply = apply(here, parse_request(b'{"fibres": {"nowhere": 0.5}}'))
    assert not reply["ok"] and "nowhere" in reply["error"]
    assert all(e.correction_ms is None for e in here.values())


def test_control_socket_round_trip_and_refusals(tmp_path: Path) -> None:
    _, _, _, emulators = _two_machines(tmp_path)
    here = emulators["m1"]
    k = sorted(here)[0]
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    server = ControlServer(run, here).start()
    try:
        assert (os.stat(run / "hold.sock").st_mode & 0o777) == 0o600
        reply = request(run, {"fibres": {k: 0.25}, "vlans": {k: {5: 0.1}}})
        assert reply["ok"] and reply["fibres"][k]["correction_ms"] == 0.25
        assert reply["fibres"][k]["vlans"] == {"5": 0.1}
        assert here[k].emulated_delay_ms(5) == pytest.approx(here[k].fibre.delay_ms - 0.35)
        bad = request(run, {"fibres": {"nowhere": 1.0}, "vlans": {}})
        assert not bad["ok"] and "nowhere" in bad["error"]
        # A link where the socket should be is not followed.
        other = tmp_path / "other"
        other.mkdir()
        (other / "hold.sock").symlink_to(run / "hold.sock")
        refused = request(other, {"fibres": {k: 0.0}, "vlans": {}})
        assert not refused["ok"] and "not the holder's socket" in refused["error"]
        assert here[k].correction_ms == 0.25
    finally:
        server.close()
    assert not (run / "hold.sock").exists()
    gone = request(run, {"fibres": {}, "vlans": {}})
    assert not gone["ok"] and "no control socket" in gone["error"]


def test_hold_correct_refuses_bad_input_without_root() -> None:
    for argv, stdin, words in ((["correct", "lp;id"], b"{}", "@lightpipe-share bad RUN: "),
                               (["correct", "lp0a0b"], b"{not json",
                                "@lightpipe-share bad correct: not JSON"),
                               (["correct", "lp0a0b"], b'{"fibres": {"a": -1e6}}',
                                "@lightpipe-share bad correct.fibres.a")):
        res = subprocess.run([sys.executable, "-m", "testbed.cluster.hold", *argv],
                             input=stdin, capture_output=True, timeout=60, check=False)
        assert res.returncode == 2 and res.stdout.decode().startswith(words), res


def test_probes_carry_the_lightpath_and_the_echo_counts(tmp_path: Path) -> None:
    plan, placement, _, _ = _two_machines(tmp_path)
    probes = pair_probes(plan, placement)
    assert {p.vlan for p in probes} == {lp.vlan for lp in plan.lightpaths}
    assert read_probes(probes_doc(probes)) == probes
    doc = json.loads(probes_doc(probes[:1]))
    for key, value in (("vlan", 0), ("vlan", 4095), ("pings", 0), ("pings", True),
                       ("dense_pings", 1001), ("interval_s", 0.0), ("dense_interval_s", 5)):
        bad = [dict(doc[0], **{key: value})]
        with pytest.raises(InputError, match=r"probes\[0\]"):
            read_probes(json.dumps(bad).encode())


def _rtt_doc(within: int, planned: int = 3) -> dict[str, Any]:
    pairs = [{"pair": f"p{i}", "pings": 10, "within_band": i < within} for i in range(planned)]
    return {"pairs_planned": planned, "pairs_within_band": within, "pairs": pairs}


@pytest.mark.parametrize(("bands", "calibrations", "rechecked"), [
    ([3], 0, []),                      # in band at once: no second calibration
    ([2, 3], 1, [["p2"]]),             # one pair out, in band after one more
    ([1, 2, 2], 2, [["p1", "p2"], ["p2"]]),  # still out after RTT_RECHECKS: recorded
])
def test_cluster_up_calibrates_again_while_pairs_are_out_of_band(
        monkeypatch: pytest.MonkeyPatch, bands: list[int], calibrations: int,
        rechecked: list[list[str]]) -> None:
    """`cluster up`'s pair check: pairs outside the RTT band after the calibration get
    another calibration and another ping, up to RTT_RECHECKS times (as one machine's
    verify_network), each recorded in cluster_rtt.json's rtt_rechecks."""
    from testbed.cluster import bringup

    docs = iter(bands)
    seen: list[list[dict[str, Any]] | None] = []
    calls: list[int] = []

    def check(*args: Any, **kw: Any) -> tuple[str, dict[str, Any]]:
        seen.append(list(args[5]) if len(args) > 5 else None)
        return "", _rtt_doc(next(docs))

    def calibrate(*args: Any) -> dict[str, Any]:
        calls.append(1)
        return {"enabled": True, "settled": False, "corrections_applied": 2}

    monkeypatch.setattr(bringup, "check_pairs", check)
    monkeypatch.setattr(bringup, "calibrate", calibrate)
    from testbed.emu.scale import Scale

    up = bringup.UpRun(None, None, type("P", (), {"prefix": "lp0001", "scale": Scale()})(),
                       None, {}, [], {}, {"enabled": True})
    assert bringup.check_and_recheck(up, [], None) == ""
    assert len(calls) == calibrations
    assert [[*r["out_of_band"]] for r in (seen[-1] or [])] == rechecked


def test_a_moved_lightpath_is_checked_and_corrected_on_its_new_fibres(tmp_path: Path
                                                                      ) -> None:
    """testbed.cluster.reroute: a lightpath the controller moved is pinged on its new
    route from its first DC's machine, corrected on its own new fibres (each on its
    machine), and lands in the band; a gone one and an unanswered GET are rows that say
    so, and no route is asked for after the checks began."""
    import networkx as nx

    from testbed.cluster.reroute import check_lightpaths, lightpath_probe

    plan, placement, shares, emulators = _two_machines(tmp_path)
    on, _ = _machines(emulators)
    ping, _ = _network(plan, placement, emulators, tunnel_ms=0.6)
    lp = next(x for x in plan.lightpaths if len(x.path) >= 3)
    g = nx.Graph([(f.u, f.v) for f in plan.fibres])
    g.remove_edge(lp.path[0], lp.path[1])  # the cut: its first fibre
    new = nx.shortest_path(g, lp.path[0], lp.path[-1])
    record = {"nodes": new, "src_dc": lp.dc_a, "dst_dc": lp.dc_b, "vid": lp.vlan}
    calls: list[str] = []

    def client(method: str, path: str, body: Any) -> tuple[Any, Any]:
        calls.append(path)
        if path == "/lightpaths/7":
            return 200, record
        if path == "/lightpaths/9":
            raise OSError("connection refused")
        return 404, None

    probe = lightpath_probe(plan, placement.dc_machine, record)
    assert probe.src_machine == placement.dc_machine[lp.dc_a] and probe.vlan == lp.vlan
    assert len(probe.fibres) == len(new) - 1
    assert probe.configured_ms == pytest.approx(
        sum(plan.fibre(u, v).delay_ms for u, v in itertools.pairwise(new)))
    rows = check_lightpaths(plan, placement.dc_machine, _fibre_machine(shares), client,
                            [7, 8, 9], on, ping)
    assert calls == ["/lightpaths/7", "/lightpaths/8", "/lightpaths/9"]
    moved, gone, refused = rows
    assert moved["ok"] and moved["route"] == new and moved["pair"] == probe.pair, moved
    assert abs(moved["after_error_ms"]) <= 0.25 < abs(moved["before_error_ms"])
    assert set(moved["corrections_ms"]) == {plan.fibre(u, v).middle
                                            for u, v in itertools.pairwise(new)}
    assert moved["machines"] and set(moved["machines"]) <= {"m1", "m2"}
    assert gone == {"id": 8, "ok": False, "error": "GET /lightpaths/8: 404"}
    assert refused["id"] == 9 and not refused["ok"] and "refused" in refused["error"]
