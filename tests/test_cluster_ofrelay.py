"""The OpenFlow relay over an agent's session (testbed.cluster.ofrelay), its holder request
and the controller's merged port map (testbed.cluster.ctlrun), without SSH: the two ends
joined by a JSON round trip, as the session carries them."""

from __future__ import annotations

import json
import os
import socket
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from testbed.cluster.ctlrun import merged_ports
from testbed.cluster.holdctl import parse_request
from testbed.cluster.ofrelay import Channels, MachineEnd, controller_connector, socket_path
from testbed.errors import InputError, RuntimeFailure
from tests.waiting import wait_until


class Wire:
    """Two relay ends joined as the session joins them: each message through JSON."""

    def __init__(self) -> None:
        self.machine: Channels | None = None
        self.driver: Channels | None = None
        self.log: list[dict[str, Any]] = []

    def to_driver(self, msg: Mapping[str, Any]) -> None:
        doc = json.loads(json.dumps(msg))
        self.log.append(doc)
        assert self.driver is not None
        self.driver.handle(doc)

    def to_machine(self, msg: Mapping[str, Any]) -> None:
        doc = json.loads(json.dumps(msg))
        self.log.append(doc)
        assert self.machine is not None
        self.machine.handle(doc)


def _echo_server() -> tuple[socket.socket, list[bytes]]:
    """A stand-in for the controller's OpenFlow listener: echoes each connection, upper
    case (so an answer is told from the question)."""
    srv = socket.create_server(("127.0.0.1", 0))
    seen: list[bytes] = []

    def serve() -> None:
        while True:
            try:
                c, _ = srv.accept()
            except OSError:
                return

            def one(c: socket.socket = c) -> None:
                with c:
                    while data := c.recv(65536):
                        seen.append(data)
                        c.sendall(data.upper())
            threading.Thread(target=one, daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    return srv, seen


def _recv_exactly(s: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        assert chunk, f"closed after {len(buf)} of {n} bytes"
        buf += chunk
    return buf


def test_switch_connections_reach_the_controller_through_the_session(tmp_path: Path
                                                                      ) -> None:
    srv, seen = _echo_server()
    (tmp_path / "ovs").mkdir()  # the share's Open vSwitch directory
    wire = Wire()
    wire.driver = Channels(wire.to_machine, controller_connector(srv.getsockname()[1]))
    end = MachineEnd(tmp_path, wire.to_driver)
    wire.machine = end
    try:
        path = socket_path(tmp_path)
        assert path == tmp_path / "ovs" / "openflow.sock"
        assert end.target == f"unix:{path}"
        assert (os.stat(path).st_mode & 0o777) == 0o600
        # Two switches at once, each its own channel, in order, more than one chunk.
        big = os.urandom(100_000).hex().encode()[:150_000].lower()
        sw = [socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) for _ in range(2)]
        for s in sw:
            s.settimeout(10)
            s.connect(str(path))
        sw[0].sendall(b"hello from s1")
        sw[1].sendall(big)
        assert _recv_exactly(sw[0], 13) == b"HELLO FROM S1"
        assert _recv_exactly(sw[1], len(big)) == big.upper()
        opens = [m["ch"] for m in wire.log if m["op"] == "of_open"]
        assert len(opens) == 2 and len(set(opens)) == 2
        st = end.stats()
        assert st["channels_opened"] == 2 and st["bytes_from_switches"] == 13 + len(big)
        assert wire.driver.stats()["bytes_to_switches"] == 13 + len(big)
        # A switch that goes away closes its channel on the controller's side too.
        sw[0].close()
        wait_until(lambda: end.stats()["channels_open"] == 1
                   and wire.driver.stats()["channels_open"] == 1,
                   "the closed switch's channel gone on both ends", timeout_s=10)
        assert b"hello from s1" in seen  # what the controller got, as the switch sent it
    finally:
        end.close()
        wire.driver.close()
        srv.close()
    assert not socket_path(tmp_path).exists()


def test_controller_unreachable_closes_the_channel(tmp_path: Path) -> None:
    srv = socket.create_server(("127.0.0.1", 0))
    port = srv.getsockname()[1]
    srv.close()  # nobody listens there any more
    (tmp_path / "ovs").mkdir()
    wire = Wire()
    wire.driver = Channels(wire.to_machine, controller_connector(port))
    end = MachineEnd(tmp_path, wire.to_driver)
    wire.machine = end
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(10)
            s.connect(str(socket_path(tmp_path)))
            assert s.recv(10) == b""  # closed: the switch retries, as with no controller
        assert [m["op"] for m in wire.log][:2] == ["of_open", "of_close"]
    finally:
        end.close()


def test_bad_messages_change_nothing(tmp_path: Path) -> None:
    sent: list[Mapping[str, Any]] = []
    ends = Channels(sent.append, controller_connector(1))
    for msg in ({"op": "of_data", "ch": "x", "b64": "aGk="}, {"op": "of_data", "ch": True},
                {"op": "of_data", "ch": 3, "b64": "not base64!"}, {"op": "of_close", "ch": -1},
                {"op": "of_open"}):
        ends.handle(msg)
    assert ends.stats()["channels_open"] == 0 and sent == []


def test_the_relay_socket_is_never_taken_over(tmp_path: Path) -> None:
    """A file (or link) where the socket goes is refused, not removed."""
    socket_path(tmp_path).parent.mkdir()
    socket_path(tmp_path).write_text("not a socket")
    with pytest.raises(OSError, match="not this run's socket"):
        MachineEnd(tmp_path, lambda m: None)
    assert socket_path(tmp_path).read_text() == "not a socket"


def test_holder_controller_request_is_validated() -> None:
    assert parse_request(b'{"controller": {"probe_ms": 5000}}') == {
        "controller": {"probe_ms": 5000}}
    for bad in (b'{"controller": {"probe_ms": 5}}', b'{"controller": {"probe_ms": true}}',
                b'{"controller": {"probe_ms": 5000, "target": "tcp:1.2.3.4:6653"}}',
                b'{"controller": "unix:/tmp/x"}'):
        with pytest.raises(InputError, match=r"controller\.probe_ms"):
            parse_request(bad)


def test_merged_ports_of_every_machine() -> None:
    replies = {"m-a": {"ok": True, "switches": ["r1", "s1"],
                       "ports": [["r1", "f12", 3], ["s1", "h1", 1]]},
               "m-b": {"ok": True, "switches": ["r2"], "ports": [["r2", "f12", 7]]}}
    assert merged_ports(replies) == {("r1", "f12"): 3, ("s1", "h1"): 1, ("r2", "f12"): 7}
    with pytest.raises(RuntimeFailure, match="machine m-b: OpenFlow relay: no socket"):
        merged_ports({**replies, "m-b": {"ok": False, "why": "no socket"}})
    with pytest.raises(RuntimeFailure, match="switch r1 answered by machines m-a and m-b"):
        merged_ports({**replies, "m-b": {"ok": True, "switches": ["r1"], "ports": []}})


def test_holder_fibre_event_request_is_validated() -> None:
    assert parse_request(b'{"fibre": {"u": "1", "v": "3", "up": false}}') == {
        "fibre": {"u": "1", "v": "3", "up": False}}
    for bad in (b'{"fibre": {"u": "1", "v": "3", "up": 0}}',
                b'{"fibre": {"u": "", "v": "3", "up": true}}',
                b'{"fibre": {"u": "1", "v": "3", "up": true, "cmd": "rm"}}',
                b'{"fibre": ["1", "3"]}'):
        with pytest.raises(InputError, match="fibre"):
            parse_request(bad)


def test_a_closed_driver_end_refuses_new_channels_quietly() -> None:
    sent: list[Mapping[str, Any]] = []

    def never() -> socket.socket:
        raise AssertionError("a closed end must not connect")

    end = Channels(sent.append, never)
    end.close()
    end.handle({"op": "of_open", "ch": 4})
    assert sent == [{"op": "of_close", "ch": 4}] and end.stats()["channels_open"] == 0
