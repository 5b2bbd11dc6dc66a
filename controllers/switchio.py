"""One I/O thread for all switch connections, and barrier groups (no os-ken here).

`SwitchIO` owns the switches' sockets after their TCP accept: one thread waits on all
of them with `selectors` (epoll), splits what each sends into OpenFlow messages (the
8-byte header's length) and hands each to its connection's `on_message`, in that
thread. Writes are made by the calling thread itself, straight into the socket
(non-blocking; whatever the kernel does not take at once is queued and flushed by the
I/O thread when the socket is writable, in order, before any later write of that
connection): a set-up writes to all its switches in one pass, with no hand-over to a
sender thread per switch. A closed or failed connection is closed in the I/O thread and
reported once through `on_close`.

`Barriers` ties barrier requests to the one `BarrierGroup` a caller waits on: the
caller registers every (connection, xid) it sends a barrier for, then waits once; the
reply that completes the group wakes it (one wake-up per round, not one per switch). A
connection that closes settles its pending barriers as failed, at once.

The thread hop count of a set-up: REST worker thread -> (writes) -> switches -> I/O
thread (all replies) -> REST worker thread.
"""

from __future__ import annotations

import collections
import logging
import selectors
import socket
import threading
from collections.abc import Callable, Hashable
from typing import Any

log = logging.getLogger("lightpipe.controller.switchio")

HEADER_LEN = 8  # OpenFlow header: version, type, length (2 bytes), xid (4 bytes)
READ_CHUNK = 1 << 16


class BarrierGroup:
    """The barrier replies one caller waits for, from one or more connections."""

    def __init__(self) -> None:
        self.pending: dict[tuple[Hashable, int], Any] = {}  # key -> name (for logs)
        self.failed: list[Any] = []  # names of connections that closed before replying
        self.done = threading.Event()
        self.done.set()  # nothing expected yet
        self.expected = 0

    def __len__(self) -> int:
        return self.expected

    def wait(self, timeout_s: float) -> bool:
        """True when every expected reply came (or its connection closed) in time."""
        return self.done.wait(timeout_s)

    def missing(self) -> list[Any]:
        """Names of the connections whose replies are still awaited."""
        return sorted(set(self.pending.values()), key=str)


class Barriers:
    """Which group waits for which (owner, xid) barrier reply. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_key: dict[tuple[Hashable, int], BarrierGroup] = {}
        self._by_owner: dict[Hashable, set[int]] = collections.defaultdict(set)

    def expect(self, group: BarrierGroup, owner: Hashable, xid: int, name: Any = None) -> None:
        """Register before sending the request (the reply may come before send returns)."""
        key = (owner, xid)
        with self._lock:
            group.pending[key] = owner if name is None else name
            group.expected += 1
            group.done.clear()
            self._by_key[key] = group
            self._by_owner[owner].add(xid)

    def settle(self, owner: Hashable, xid: int) -> bool:
        """A barrier reply came; whether anyone waited for it."""
        key = (owner, xid)
        with self._lock:
            group = self._by_key.pop(key, None)
            if group is None:
                return False
            xids = self._by_owner.get(owner)
            if xids is not None:
                xids.discard(xid)
                if not xids:
                    del self._by_owner[owner]
            group.pending.pop(key, None)
            if not group.pending:
                group.done.set()
        return True

    def drop(self, owner: Hashable) -> int:
        """The owner's connection closed: its awaited replies will not come. Their groups
        count it as failed and stop waiting for it; how many were pending."""
        with self._lock:
            xids = self._by_owner.pop(owner, set())
            for xid in xids:
                group = self._by_key.pop((owner, xid), None)
                if group is None:
                    continue
                name = group.pending.pop((owner, xid), owner)
                if name not in group.failed:
                    group.failed.append(name)
                if not group.pending:
                    group.done.set()
        return len(xids)

    def __len__(self) -> int:
        with self._lock:
            return len(self._by_key)


class Connection:
    """One switch's socket, as the I/O thread holds it."""

    def __init__(self, io: SwitchIO, sock: socket.socket,
                 on_message: Callable[[bytes], None], on_close: Callable[[], None],
                 name: Any = None) -> None:
        self.io, self.sock, self.name = io, sock, name
        self.on_message, self.on_close = on_message, on_close
        self.lock = threading.Lock()  # orders writes: the socket's and the queued rest
        self.out = bytearray()  # what the kernel did not take yet
        self.inbuf = bytearray()
        self.closed = False
        self.close_when_flushed = False
        self.fd = sock.fileno()

    def send(self, data: bytes, close_after: bool = False) -> bool:
        return self.io.send(self, data, close_after)

    def close(self) -> None:
        self.io.close_connection(self)


class SwitchIO:
    """The I/O thread and the connections it serves (`start()`, then `add()` sockets)."""

    def __init__(self, name: str = "switch-io") -> None:
        self.sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._cmds: collections.deque[Callable[[], None]] = collections.deque()
        self._stop = False
        self._shut = False  # close() done: a later add() is closed at once
        self.conns: dict[int, Connection] = {}
        self.sel.register(self._wake_r, selectors.EVENT_READ, None)
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.started = False

    def start(self) -> SwitchIO:
        if not self.started:
            self.started = True
            self.thread.start()
        return self

    # ---- any thread ---------------------------------------------------------------------
    def add(self, sock: socket.socket, on_message: Callable[[bytes], None],
            on_close: Callable[[], None], name: Any = None) -> Connection:
        """Serve `sock` from the I/O thread from now on (it becomes non-blocking)."""
        sock.setblocking(False)
        conn = Connection(self, sock, on_message, on_close, name)
        if self._shut:
            self._close(conn)
            return conn
        self._call(lambda: self._register(conn))
        return conn

    def send(self, conn: Connection, data: bytes, close_after: bool = False) -> bool:
        """Write `data` to the connection now, in this thread; queue what the kernel does
        not take for the I/O thread. False if the connection is closed."""
        with conn.lock:
            if conn.closed or conn.close_when_flushed:
                return False
            if close_after:
                conn.close_when_flushed = True
            if conn.out:  # earlier bytes still queued: keep the order
                conn.out += data
                return True
            try:
                n = conn.sock.send(data)
            except (BlockingIOError, InterruptedError):
                n = 0
            except OSError as exc:
                log.debug("switch %s: write failed: %s", conn.name, exc)
                self._call(lambda: self._close(conn))
                return False
            if n < len(data):
                conn.out += memoryview(data)[n:]
                self._call(lambda: self._want_write(conn))
            elif close_after:
                self._call(lambda: self._close(conn))
        return True

    def close_connection(self, conn: Connection) -> None:
        self._call(lambda: self._close(conn))

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop the thread; close every connection (each reported through on_close) and
        the thread's own sockets."""
        if self.started and self.thread.is_alive():
            self._stop = True
            self._wake()
            self.thread.join(timeout_s)
        if not self.thread.is_alive():
            for conn in list(self.conns.values()):
                self._close(conn)
            while self._cmds:  # connections added but never registered
                with _suppress():
                    self._cmds.popleft()()
            for conn in list(self.conns.values()):
                self._close(conn)
            with _suppress():
                self.sel.close()
            self._wake_r.close()
            self._wake_w.close()
            self._shut = True

    def _call(self, fn: Callable[[], None]) -> None:
        self._cmds.append(fn)
        if threading.current_thread() is not self.thread:
            self._wake()

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"x")
        except (BlockingIOError, OSError):
            pass  # already woken (full), or closed

    # ---- the I/O thread -----------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop:
            try:
                events = self.sel.select()
            except OSError:  # pragma: no cover - closed under us
                break
            for key, mask in events:
                conn = key.data
                if conn is None:
                    with _suppress():
                        while self._wake_r.recv(4096):
                            pass
                    continue
                if mask & selectors.EVENT_WRITE and not conn.closed:
                    self._flush(conn)
                if mask & selectors.EVENT_READ and not conn.closed:
                    self._read(conn)
            while self._cmds:
                try:
                    self._cmds.popleft()()
                except Exception:  # pragma: no cover - a command's own bug
                    log.exception("switch I/O command failed")
        for conn in list(self.conns.values()):
            self._close(conn)

    def _register(self, conn: Connection) -> None:
        if conn.closed:
            return
        if self._stop:
            self._close(conn)
            return
        self.conns[conn.fd] = conn
        with conn.lock:
            events = selectors.EVENT_READ | (selectors.EVENT_WRITE if conn.out else 0)
        self.sel.register(conn.sock, events, conn)

    def _want_write(self, conn: Connection) -> None:
        if conn.closed or conn.fd not in self.conns:
            return  # not registered yet: _register looks at conn.out
        self.sel.modify(conn.sock, selectors.EVENT_READ | selectors.EVENT_WRITE, conn)
        self._flush(conn)

    def _flush(self, conn: Connection) -> None:
        failed = False
        with conn.lock:
            if conn.out:
                try:
                    n = conn.sock.send(conn.out)
                except (BlockingIOError, InterruptedError):
                    return
                except OSError as exc:
                    log.debug("switch %s: write failed: %s", conn.name, exc)
                    failed = True
                else:
                    del conn.out[:n]
            pending = bool(conn.out)
            close = failed or (not pending and conn.close_when_flushed)
        if close:
            self._close(conn)
        elif not pending and conn.fd in self.conns:
            self.sel.modify(conn.sock, selectors.EVENT_READ, conn)

    def _read(self, conn: Connection) -> None:
        buf = conn.inbuf
        while True:
            try:
                data = conn.sock.recv(READ_CHUNK)
            except (BlockingIOError, InterruptedError):
                break
            except OSError as exc:
                log.debug("switch %s: read failed: %s", conn.name, exc)
                data = b""
            if not data:
                self._close(conn)
                return
            buf += data
            if len(data) < READ_CHUNK:
                break
        start = 0
        end = len(buf)
        while end - start >= HEADER_LEN:
            length = max(HEADER_LEN, int.from_bytes(buf[start + 2:start + 4], "big"))
            if end - start < length:
                break
            msg = bytes(buf[start:start + length])
            start += length
            try:
                conn.on_message(msg)
            except Exception:
                log.exception("switch %s: message handler failed", conn.name)
            if conn.closed:
                return
        del buf[:start]

    def _close(self, conn: Connection) -> None:
        with conn.lock:
            if conn.closed:
                return
            conn.closed = True
            conn.out.clear()
        if self.conns.get(conn.fd) is conn:
            del self.conns[conn.fd]
            with _suppress():
                self.sel.unregister(conn.sock)
        with _suppress():
            conn.sock.close()
        try:
            conn.on_close()
        except Exception:
            log.exception("switch %s: close handler failed", conn.name)


class _suppress:
    """contextlib.suppress(Exception), without the import in the hot path."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> bool:
        return exc[0] is not None and issubclass(exc[0], Exception)
