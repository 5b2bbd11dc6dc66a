"""OpenFlow carried over a worker agent's SSH session: every machine's switches reach the
one controller beside the driver, with no port opened on the lab network.

A share's Open vSwitch runs in the run's namespace on its machine, which reaches nothing
outside. Its switches are pointed (by the share holder, testbed.cluster.holdctl) at a
Unix socket in the run's Open vSwitch directory, `STATE_DIR/ovs/openflow.sock` (root's,
mode 0600; a path is the same in every namespace; ovs-vswitchd connects to a `unix:`
controller only inside its run directory, OVS_RUNDIR). The agent (testbed.cluster.agent)
listens there; each connection a switch opens becomes a channel of the session:

    agent -> driver   of_open  ch                 a switch connected
    both ways         of_data  ch, b64            bytes of that connection
    both ways         of_close ch                 that side closed it

and the driver connects each channel to the controller's OpenFlow listener on its own
loopback. So the controller's traffic is as private as the agent's session (SSH: the
cluster file's key, the host key checked), and the agent accepts only connections from
its own user (SO_PEERCRED). `Channels` is both ends: which one it is depends on whether
it accepts connections (the machine) or opens them (the driver).
"""

from __future__ import annotations

import base64
import binascii
import logging
import os
import socket
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from testbed.io.trusted import bind_private_socket, own_socket

log = logging.getLogger(__name__)

SOCK_NAME = "openflow.sock"
OPS = ("of_open", "of_data", "of_close")
CHUNK_BYTES = 32 * 1024        # one of_data message carries at most this much
MAX_CHANNELS = 256             # switches per machine, with reconnections
CONNECT_TIMEOUT_S = 5.0

Send = Callable[[Mapping[str, Any]], None]


def socket_path(state_dir: Path) -> Path:
    """Where a share's switches find the relay: in its Open vSwitch's run directory
    (testbed.emu.ovs: STATE_DIR/ovs), the only place ovs-vswitchd takes a `unix:`
    controller from."""
    return Path(state_dir) / "ovs" / SOCK_NAME


def _channel(msg: Mapping[str, Any]) -> int | None:
    ch = msg.get("ch")
    return ch if isinstance(ch, int) and not isinstance(ch, bool) and 0 <= ch < 1 << 31 \
        else None


class Channels:
    """One end of the relay: channel id -> local socket, bytes pumped into `send`."""

    def __init__(self, send: Send, connect: Callable[[], socket.socket] | None = None,
                 name: str = "openflow") -> None:
        """connect: how the driver's end reaches the controller for a new channel (None:
        this is a machine's end, which only accepts)."""
        self.send = send
        self.connect = connect
        self.name = name
        self.socks: dict[int, socket.socket] = {}
        self.lock = threading.Lock()
        self.opened = 0
        self.closed = False
        self.bytes_in = 0      # read from the local sockets
        self.bytes_out = 0     # written to them

    # -- from the session --------------------------------------------------------------
    def handle(self, msg: Mapping[str, Any]) -> None:
        """One of_* message from the other end."""
        op, ch = msg.get("op"), _channel(msg)
        if ch is None:
            return
        if op == "of_open" and self.connect is not None:
            self._open(ch)
        elif op == "of_data":
            b64 = msg.get("b64")
            try:
                data = base64.b64decode(str(b64), validate=True)
            except (binascii.Error, ValueError):
                self._drop(ch, tell=True)
                return
            with self.lock:
                s = self.socks.get(ch)
            if s is None:
                return
            try:
                s.sendall(data)
                self.bytes_out += len(data)
            except OSError:
                self._drop(ch, tell=True)
        elif op == "of_close":
            self._drop(ch, tell=False)

    def _open(self, ch: int) -> None:
        assert self.connect is not None
        if self.closed:  # the run is ending: the switch retries until it is taken down
            self.send({"op": "of_close", "ch": ch})
            return
        try:
            s = self.connect()
        except OSError as exc:
            log.warning("%s: channel %d: cannot reach the controller: %s", self.name, ch, exc)
            self.send({"op": "of_close", "ch": ch})
            return
        if not self._add(ch, s):
            s.close()
            self.send({"op": "of_close", "ch": ch})

    def _add(self, ch: int, s: socket.socket, first: Mapping[str, Any] | None = None
             ) -> bool:
        """Take the socket as channel `ch` and pump it (after sending `first`, so that
        the other end hears of the channel before its bytes)."""
        with self.lock:
            if self.closed or ch in self.socks or len(self.socks) >= MAX_CHANNELS:
                return False
            self.socks[ch] = s
            self.opened += 1
        if first is not None:
            self.send(first)
        threading.Thread(target=self._pump, args=(ch, s), daemon=True,
                         name=f"{self.name}-{ch}").start()
        return True

    def _pump(self, ch: int, s: socket.socket) -> None:
        """Bytes of the local socket to the other end, until either side closes."""
        while True:
            try:
                data = s.recv(CHUNK_BYTES)
            except OSError:
                data = b""
            if not data:
                break
            self.bytes_in += len(data)
            self.send({"op": "of_data", "ch": ch, "b64": base64.b64encode(data).decode()})
        self._drop(ch, tell=True)

    def _drop(self, ch: int, tell: bool) -> None:
        with self.lock:
            s = self.socks.pop(ch, None)
        if s is None:
            return
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        s.close()
        if tell:
            self.send({"op": "of_close", "ch": ch})

    def close(self) -> None:
        with self.lock:
            self.closed = True
            chans = list(self.socks)
        for ch in chans:
            self._drop(ch, tell=False)

    def stats(self) -> dict[str, int]:
        """Channels and bytes; the local sockets are the switches' on a machine's end and
        the controller's on the driver's."""
        up, down = ((self.bytes_in, self.bytes_out) if self.connect is None
                    else (self.bytes_out, self.bytes_in))
        with self.lock:
            return {"channels_opened": self.opened, "channels_open": len(self.socks),
                    "bytes_from_switches": up, "bytes_to_switches": down}


class MachineEnd(Channels):
    """The agent's end: listens on STATE_DIR/ovs/openflow.sock for this machine's
    switches."""

    def __init__(self, state_dir: Path, send: Send) -> None:
        super().__init__(send, None, "openflow-machine")
        self.path = socket_path(state_dir)
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._next = 0
        mine = own_socket(self.path)
        if mine is False:  # a file, a link or another user's: never taken over
            self.listener.close()
            raise OSError(f"{self.path} exists and is not this run's socket")
        if mine:  # a socket left by an earlier agent of this run
            self.path.unlink()
        bind_private_socket(self.listener, self.path)
        self.listener.listen(16)
        threading.Thread(target=self._accept, daemon=True, name="openflow-accept").start()

    @property
    def target(self) -> str:
        """What the switches are pointed at (Open vSwitch's controller syntax)."""
        return f"unix:{self.path}"

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return  # closed
            creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
            if int.from_bytes(creds[4:8], "little") != os.geteuid():
                conn.close()  # only our own switches (ovs-vswitchd runs as us)
                continue
            ch = self._next
            self._next += 1
            if not self._add(ch, conn, first={"op": "of_open", "ch": ch}):
                conn.close()

    def close(self) -> None:
        try:
            self.listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.listener.close()
        try:
            self.path.unlink()
        except OSError:
            pass
        super().close()


def controller_connector(port: int, host: str = "127.0.0.1") -> Callable[[], socket.socket]:
    """The driver's side: a new TCP connection to the controller's OpenFlow listener."""
    def connect() -> socket.socket:
        s = socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S)
        s.settimeout(None)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return s
    return connect
