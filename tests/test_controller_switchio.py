"""The one I/O thread for all switch connections (controllers/switchio.py) and its barrier
groups: message framing and order, writes the kernel does not take at once, one wait for
many switches' replies, a switch that disconnects, shutdown. No OVS, no os-ken (but for
the last test, which runs os-ken's Datapath over it)."""

from __future__ import annotations

import os
import socket
import struct
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from controllers.switchio import HEADER_LEN, BarrierGroup, Barriers, SwitchIO

WAIT_S = 10.0  # generous: these never time out unless something is broken


def ofmsg(msg_type: int, xid: int, body: bytes = b"") -> bytes:
    return struct.pack("!BBHI", 4, msg_type, HEADER_LEN + len(body), xid) + body


def split(data: bytes) -> list[tuple[int, int, bytes]]:
    out, i = [], 0
    while i < len(data):
        _, kind, length, xid = struct.unpack_from("!BBHI", data, i)
        out.append((kind, xid, data[i + HEADER_LEN:i + length]))
        i += length
    return out


def recv_exactly(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            break
        buf += chunk
    return bytes(buf)


class Switch:
    """The far end of one connection, and what the I/O thread handed up from it."""

    def __init__(self, io: SwitchIO, name: str) -> None:
        self.peer, ours = socket.socketpair()
        self.peer.settimeout(WAIT_S)
        self.got: list[bytes] = []
        self.got_some = threading.Condition()
        self.closed = threading.Event()
        self.threads: list[str] = []
        self.conn = io.add(ours, self._message, self._closed, name=name)

    def _message(self, data: bytes) -> None:
        with self.got_some:
            self.got.append(data)
            self.threads.append(threading.current_thread().name)
            self.got_some.notify_all()

    def _closed(self) -> None:
        self.closed.set()

    def wait_for(self, n: int) -> list[bytes]:
        with self.got_some:
            assert self.got_some.wait_for(lambda: len(self.got) >= n, WAIT_S), self.got
            return list(self.got)


@pytest.fixture
def io() -> Iterator[SwitchIO]:
    io = SwitchIO(name="test-switch-io").start()
    try:
        yield io
    finally:
        io.close()


def test_messages_are_split_by_their_header_and_handed_up_in_order(io: SwitchIO) -> None:
    sw = Switch(io, "s1")
    msgs = [ofmsg(21, xid, bytes(xid % 7)) for xid in range(1, 200)]
    wire = b"".join(msgs)
    for i in range(0, len(wire), 5):  # in pieces that cut headers and bodies
        sw.peer.sendall(wire[i:i + 5])
    assert sw.wait_for(len(msgs)) == msgs
    assert set(sw.threads) == {"test-switch-io"}  # all read in the one I/O thread


def test_many_connections_share_one_thread(io: SwitchIO) -> None:
    before = threading.active_count()
    switches = [Switch(io, f"s{i}") for i in range(20)]
    assert threading.active_count() == before  # no thread per connection
    for i, sw in enumerate(switches):
        sw.peer.sendall(ofmsg(21, i))
    for i, sw in enumerate(switches):
        assert sw.wait_for(1) == [ofmsg(21, i)]


def test_writes_keep_their_order_when_the_kernel_takes_only_part(io: SwitchIO) -> None:
    """The switch reads nothing for a while: the first write fills the socket buffers,
    the rest queues in order behind it and goes out as the switch reads."""
    sw = Switch(io, "s1")
    sw.peer.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    chunks = [ofmsg(14, i, os.urandom(3000)) for i in range(400)]  # ~1.2 MB
    senders = [threading.Thread(target=lambda: [sw.conn.send(c) for c in chunks[:200]])]
    senders[0].start()
    senders[0].join(WAIT_S)
    for c in chunks[200:]:
        assert sw.conn.send(c)
    assert sw.conn.out  # the kernel did not take it all: some is queued
    got = recv_exactly(sw.peer, sum(map(len, chunks)))
    assert got == b"".join(chunks)


def test_one_group_waits_for_the_barriers_of_all_its_switches(io: SwitchIO) -> None:
    barriers = Barriers()
    switches = [Switch(io, f"s{i}") for i in range(5)]
    group = BarrierGroup()
    for i, sw in enumerate(switches):
        barriers.expect(group, sw.conn, 100 + i, name=f"s{i}")
    assert len(group) == 5 and not group.done.is_set()
    # replies in another order than the requests; an unknown xid settles nothing
    for i in (3, 0, 4, 1):
        assert barriers.settle(switches[i].conn, 100 + i)
        assert not group.wait(0)
    assert not barriers.settle(switches[2].conn, 999)
    assert group.missing() == ["s2"]
    assert barriers.settle(switches[2].conn, 102)
    assert group.wait(0) and group.missing() == [] and group.failed == []
    assert len(barriers) == 0
    assert not barriers.settle(switches[2].conn, 102)  # settled once only


def test_an_empty_group_is_done() -> None:
    assert BarrierGroup().wait(0)


def test_barrier_replies_read_by_the_io_thread_settle_the_group(io: SwitchIO) -> None:
    """The round trip as the app wires it: write flow-mods + barrier to every switch,
    the switches answer, the I/O thread settles the replies, one wait returns."""
    barriers = Barriers()
    switches: list[Switch] = []

    def on_message(conn_of: list[Any]) -> Any:
        def handle(data: bytes) -> None:
            _, kind, _, xid = struct.unpack_from("!BBHI", data)
            if kind == 21:
                barriers.settle(conn_of[0], xid)
        return handle

    for i in range(4):
        peer, ours = socket.socketpair()
        holder: list[Any] = []
        conn = io.add(ours, on_message(holder), lambda: None, name=f"s{i}")
        holder.append(conn)
        peer.settimeout(WAIT_S)
        sw = Switch.__new__(Switch)
        sw.peer, sw.conn = peer, conn
        switches.append(sw)
    group = BarrierGroup()
    for i, sw in enumerate(switches):
        barriers.expect(group, sw.conn, 7 + i)
        sw.conn.send(ofmsg(14, 5 + i, b"flow") + ofmsg(20, 7 + i))
    for i, sw in enumerate(switches):  # every write went out before any reply came
        got = split(recv_exactly(sw.peer, 2 * HEADER_LEN + 4))
        assert [(k, x) for k, x, _ in got] == [(14, 5 + i), (20, 7 + i)]
    assert not group.wait(0)
    for i, sw in enumerate(switches):
        sw.peer.sendall(ofmsg(21, 7 + i))
    assert group.wait(WAIT_S) and group.failed == []


def test_a_switch_that_disconnects_releases_its_waiters_at_once(io: SwitchIO) -> None:
    barriers = Barriers()
    a, b = Switch(io, "a"), Switch(io, "b")
    a.conn.on_close = lambda: (barriers.drop(a.conn), a.closed.set())
    group = BarrierGroup()
    barriers.expect(group, a.conn, 1, name="a")
    barriers.expect(group, b.conn, 1, name="b")
    assert barriers.settle(b.conn, 1)
    a.peer.close()  # the switch goes away without replying
    assert a.closed.wait(WAIT_S)
    assert group.wait(WAIT_S)  # not after a time-out: at once
    assert group.failed == ["a"] and group.missing() == []
    assert not a.conn.send(ofmsg(14, 2))  # writes to a closed connection are refused
    assert a.conn.sock.fileno() == -1  # its socket is closed
    b.peer.sendall(ofmsg(10, 3))  # the other connection goes on
    assert b.wait_for(1) == [ofmsg(10, 3)]
    assert len(barriers) == 0


def test_closing_a_connection_from_our_side_after_what_is_queued(io: SwitchIO) -> None:
    sw = Switch(io, "s1")
    assert sw.conn.send(ofmsg(2, 1, b"bye"), close_after=True)
    assert not sw.conn.send(ofmsg(2, 2))  # nothing after the close
    assert split(recv_exactly(sw.peer, HEADER_LEN + 3)) == [(2, 1, b"bye")]
    assert sw.peer.recv(10) == b""  # then EOF
    assert sw.closed.wait(WAIT_S)


def test_shutdown_ends_the_thread_and_closes_every_socket() -> None:
    io = SwitchIO(name="test-switch-io-close").start()
    switches = [Switch(io, f"s{i}") for i in range(3)]
    for sw in switches:
        sw.peer.sendall(ofmsg(0, 1))
        sw.wait_for(1)
    wake = (io._wake_r, io._wake_w)
    io.close()
    assert not io.thread.is_alive()
    assert "test-switch-io-close" not in {t.name for t in threading.enumerate()}
    for sw in switches:
        assert sw.closed.is_set()  # each reported closed once
        assert sw.conn.sock.fileno() == -1
        assert sw.peer.recv(10) == b""  # the switch sees EOF
    assert all(s.fileno() == -1 for s in wake)
    io.close()  # twice is harmless


def test_a_connection_added_after_shutdown_is_closed() -> None:
    io = SwitchIO(name="test-switch-io-late").start()
    io.close()
    peer, ours = socket.socketpair()
    closed = threading.Event()
    conn = io.add(ours, lambda _d: None, closed.set)
    assert closed.is_set() and conn.closed and ours.fileno() == -1
    assert not conn.send(ofmsg(2, 1))
    peer.close()


def test_the_app_dispatches_through_the_io_thread_as_os_ken_does() -> None:
    """os-ken's Datapath served by the I/O thread (controllers.lightpath_app.IODatapath):
    Hello goes out at once; a barrier reply someone waits for settles its group in the
    I/O thread without an event; every other message is dispatched as os-ken's receive
    loop would; the connection's end releases its barriers and ends serve()."""
    pytest.importorskip("os_ken")
    os.environ.setdefault("OSKEN_HUB_TYPE", "native")
    from os_ken.ofproto import ofproto_v1_3

    from controllers.lightpath_app import IODatapath

    seen: list[Any] = []

    class Brick:  # the ofp_event service brick, as far as the receive loop uses it
        def send_event_to_observers(self, ev: Any, state: Any) -> None:
            seen.append((type(ev).__name__, state))

        def get_handlers(self, ev: Any) -> list[Any]:
            return []

    io = SwitchIO(name="test-switch-io-dp").start()
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        switch = socket.create_connection(srv.getsockname())
        ours, addr = srv.accept()
    switch.settimeout(WAIT_S)
    try:
        dp = IODatapath(ours, addr)
        dp.ofp_brick = Brick()
        dp.io, dp.pending = io, Barriers()
        dp.set_version(ofproto_v1_3.OFP_VERSION)
        server = threading.Thread(target=dp.serve, daemon=True)
        server.start()
        hello = split(recv_exactly(switch, HEADER_LEN))
        assert hello[0][0] == ofproto_v1_3.OFPT_HELLO
        group = BarrierGroup()
        dp.pending.expect(group, dp, 42, name=1)
        switch.sendall(ofmsg(ofproto_v1_3.OFPT_BARRIER_REPLY, 42)
                       + ofmsg(ofproto_v1_3.OFPT_ECHO_REQUEST, 43))
        assert group.wait(WAIT_S)
        deadline = threading.Event()
        for _ in range(100):
            if seen:
                break
            deadline.wait(0.05)
        assert [name for name, _ in seen] == ["EventOFPEchoRequest"]  # the barrier: none
        waiting = BarrierGroup()
        dp.pending.expect(waiting, dp, 44, name=1)
        switch.close()
        assert waiting.wait(WAIT_S) and waiting.failed == [1]
        server.join(WAIT_S)
        assert not server.is_alive() and not dp.is_active
        assert not dp.send(b"x" * 8)
    finally:
        io.close()
