"""Per-lightpath capacity across machines (testbed.cluster.caprelay, holdctl's `cap`): the
controller's own capacity channel, through the driver's relay sockets, to each machine's
holder and its emulators; refusals named; nothing followed through a link. No root."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any

import pytest

from controllers.channels import ForwarderChannel
from controllers.controls import ControlRefused, RunControls
from testbed.cluster.caprelay import (
    CapRelay,
    caps_mismatch,
    parse_forwarder_request,
    relay_dir,
    remove_relay_dir,
)
from testbed.cluster.holdctl import ControlServer, parse_cap, parse_request, request
from testbed.cluster.sharedoc import plan_cluster
from testbed.cluster.spec import parse_cluster
from testbed.emu.links import LinkEmulator
from testbed.errors import InputError
from testbed.spec import parse_scenario
from tests.conftest import load_yaml


class CapLink(LinkEmulator):
    """A fibre emulator's cap bookkeeping (what it paces each lightpath at), no data
    plane; a rate over 1e6 Mbit/s is refused as a forwarder refuses a bad request."""

    def set_cap(self, vlan: int, rate_mbps: float | None) -> None:
        if rate_mbps is not None and rate_mbps > 1e6:
            raise RuntimeError(f"forwarder refused rate {rate_mbps:g}")
        if rate_mbps is None:
            self.caps_mbps.pop(vlan, None)
        else:
            self.caps_mbps[vlan] = rate_mbps


class HolderSession:
    """What a machine's agent does with a `cap` message (testbed.cluster.agent): the
    validated body to its share holder's control socket, the reply mapped back."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self.asked = 0

    def set_cap(self, fibre: str, vlan: int, rate_mbps: float | None,
                timeout_s: float = 30.0) -> dict[str, Any]:
        self.asked += 1
        body = parse_cap({"fibre": fibre, "vlan": vlan, "rate_mbps": rate_mbps})
        reply = request(self.state_dir, {"cap": body}, timeout_s)
        return {"op": "cap", "ok": bool(reply.get("ok")), "fibre": fibre, "vlan": vlan,
                "caps_mbps": reply.get("caps_mbps"), "why": reply.get("error")}


@pytest.fixture
def cluster(tmp_path: Path) -> Any:
    """The quickstart on two machines: a holder per machine (its control socket, its
    fibres' emulators), a session to each, the relay in a stage directory."""
    sc = parse_scenario(load_yaml("quickstart.yaml"))
    c = parse_cluster({"machines": [{"name": "m1", "address": "192.0.2.1"},
                                    {"name": "m2", "address": "192.0.2.2"}]})
    plan, _, shares = plan_cluster(sc, c, "lp0a0b")
    servers, sessions, emulators = [], {}, {}
    for m, sh in shares.items():
        state = tmp_path / m
        state.mkdir(mode=0o700)
        emulators[m] = {f.middle: CapLink(f, 1, "u", "v", {}, state) for f in sh.fibres}
        servers.append(ControlServer(state, emulators[m]).start())
        sessions[m] = HolderSession(state)
    owners = {f.middle: sessions[m] for m, sh in shares.items() for f in sh.fibres}
    stage = tmp_path / "stage"
    stage.mkdir()
    directory, temp = relay_dir(stage, plan.prefix, "x.sock")
    relay = CapRelay(directory, owners).start()
    try:
        yield plan, relay, emulators, sessions
    finally:
        relay.close()
        remove_relay_dir(directory, temp)
        for s in servers:
            s.close()
    assert not (stage / ".caps").exists()


def test_every_lightpath_capped_on_the_machine_of_each_fibre(cluster: Any) -> None:
    plan, relay, emulators, sessions = cluster
    assert relay.dir.name == plan.prefix and (os.stat(relay.dir).st_mode & 0o777) == 0o700
    controls = relay.controls()
    assert set(controls) == {f.middle for f in plan.fibres}
    # The controller's own channel, checking controls against its run state as it does.
    channel = ForwarderChannel(RunControls(relay.dir))
    for lp in plan.lightpaths:
        for u, v in zip(lp.path, lp.path[1:], strict=False):
            channel.set_cap(controls[plan.fibre(u, v).middle], lp.vlan, lp.rate_mbps * 2)
    # Each cap is on the emulator of the machine that emulates the fibre, nowhere else.
    mism = caps_mismatch(plan, relay.caps())
    assert len(mism) == sum(len(lp.path) - 1 for lp in plan.lightpaths) > 0
    assert all("its emulator reports" in m and "no cap" not in m for m in mism)
    for m, per in emulators.items():
        for middle, emu in per.items():
            want = {lp.vlan: lp.rate_mbps * 2 for lp in plan.lightpaths
                    if any(plan.fibre(u, v).middle == middle
                           for u, v in zip(lp.path, lp.path[1:], strict=False))}
            assert emu.caps_mbps == want, (m, middle)
    for lp in plan.lightpaths:  # the plan's own rates again: nothing left to report
        for u, v in zip(lp.path, lp.path[1:], strict=False):
            channel.set_cap(controls[plan.fibre(u, v).middle], lp.vlan, lp.rate_mbps)
    assert caps_mismatch(plan, relay.caps()) == []
    rec = relay.record()
    assert rec["failed"] == 0 and rec["requests"] == sum(s.asked for s in sessions.values())
    # A removal reaches the emulator too.
    lp = plan.lightpaths[0]
    middle = plan.fibre(lp.path[0], lp.path[1]).middle
    channel.set_cap(controls[middle], lp.vlan, None)
    assert lp.vlan not in next(e for per in emulators.values() for k, e in per.items()
                               if k == middle).caps_mbps
    assert caps_mismatch(plan, relay.caps())[0].endswith("reports no cap")


def test_refusals_are_named_and_change_nothing(cluster: Any) -> None:
    plan, relay, emulators, _ = cluster
    channel = ForwarderChannel(RunControls(relay.dir))
    middle = sorted(relay.controls())[0]
    control = relay.controls()[middle]
    before = {m: {k: dict(e.caps_mbps) for k, e in per.items()}
              for m, per in emulators.items()}
    with pytest.raises(RuntimeError, match="forwarder refused rate"):  # the emulator's
        channel.set_cap(control, 7, 5e6)
    for raw, field in ((b'{"vlan": 0, "rate_mbps": 5}', "cap.vlan"),
                       (b'{"vlan": 7, "rate_mbps": -1}', "cap.rate_mbps"),
                       (b'{"vlan": 7, "remove": false}', "cap"),
                       (b'not json', "cap")):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.connect(control)
            s.sendall(raw + b"\n")
            reply = json.loads(s.makefile().readline())
        assert not reply["ok"] and reply["error"].startswith(field), (raw, reply)
    assert {m: {k: dict(e.caps_mbps) for k, e in per.items()}
            for m, per in emulators.items()} == before
    assert relay.record()["failed"] == 5
    # The controller names only the relay's own sockets: a link to one is refused.
    link = relay.dir / f"{plan.prefix}f99.sock"
    link.symlink_to(control)
    with pytest.raises(ControlRefused, match="not a socket"):
        channel.set_cap(str(link), 7, 1.0)
    link.unlink()


def test_holder_cap_request_is_validated() -> None:
    ok = parse_request(b'{"cap": {"fibre": "lp0a0bf3", "vlan": 12, "rate_mbps": 50}}')
    assert ok == {"cap": {"fibre": "lp0a0bf3", "vlan": 12, "rate_mbps": 50.0}}
    assert parse_cap({"fibre": "lp0a0bf3", "vlan": 12, "rate_mbps": None})["rate_mbps"] is None
    for body, field in (({"fibre": "../x", "vlan": 1, "rate_mbps": 1}, "cap.fibre"),
                        ({"fibre": "a", "vlan": True, "rate_mbps": 1}, "cap.vlan"),
                        ({"fibre": "a", "vlan": 1, "rate_mbps": float("inf")}, "cap.rate_mbps"),
                        ({"fibre": "a", "vlan": 1}, "cap")):
        with pytest.raises(InputError) as e:
            parse_cap(body)
        assert e.value.path == field
    with pytest.raises(InputError):
        parse_forwarder_request(b'{"vlan": 3, "rate_mbps": 1, "extra": 1}')
    assert parse_forwarder_request(b'{"vlan": 3, "remove": true}') == (3, None)


def test_relay_directory_falls_back_when_the_stage_path_is_too_long(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 90)
    deep.mkdir()
    directory, temp = relay_dir(deep, "lp0a0b", "lp0a0bf12.sock")
    try:
        assert temp is not None and directory == temp / "lp0a0b"
        assert len(os.fsencode(directory / "lp0a0bf12.sock")) <= 107
        assert (os.stat(directory).st_mode & 0o777) == 0o700
        assert not (deep / ".caps").exists()
    finally:
        remove_relay_dir(directory, temp)
    assert not temp.exists()


def test_an_answer_to_another_request_is_not_taken(tmp_path: Path) -> None:
    """A machine's late answer (to a request whose asker stopped waiting) names another
    fibre: the relay refuses it rather than record the wrong fibre's caps."""

    class LateAnswers:
        def set_cap(self, fibre: str, vlan: int, rate_mbps: float | None,
                    timeout_s: float = 30.0) -> dict[str, Any]:
            return {"ok": True, "fibre": "lp0a0bf9", "vlan": vlan, "caps_mbps": {"3": 5.0}}

    directory, temp = relay_dir(tmp_path, "lp0a0b", "lp0a0bf1.sock")
    relay = CapRelay(directory, {"lp0a0bf1": LateAnswers()}).start()
    try:
        with pytest.raises(RuntimeError, match="named lp0a0bf9/3"):
            ForwarderChannel(RunControls(relay.dir)).set_cap(relay.controls()["lp0a0bf1"],
                                                             3, 1.0)
        assert relay.settle(5.0) and relay.caps() == {} and relay.record()["failed"] == 1
    finally:
        relay.close()
        remove_relay_dir(directory, temp)
