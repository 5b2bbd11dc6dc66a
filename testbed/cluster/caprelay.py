"""Per-lightpath capacity across machines: the controller's cap requests relayed to the
machine that emulates each fibre.

On one machine the SDN controller tells a fibre emulator a lightpath's rate over the
emulator's control socket (controllers.channels.ForwarderChannel, the forwarder's JSON-line
protocol: {"vlan": N, "rate_mbps": R} or {"vlan": N, "remove": true}). In a cluster run
the emulators live on other machines, so the driver serves one Unix socket per fibre of
the plan, with the name a one-machine run's control socket has (`PREFIXf<N>.sock`), in a
private directory named after the plan's prefix; the controller is started with that
directory as its run state (controllers.controls.RunControls accepts exactly those
sockets, owned by its user). Each request is validated, carried over the owning
machine's agent session (`cap`) to its share holder, which sets the cap on its emulator
(user-space forwarder or netem/HTB alike: testbed.cluster.holdctl), and the holder's
answer goes back to the controller: {"ok": true} or {"ok": false, "error": ...}. The
relay keeps what each fibre's emulator last reported (`caps()`), for the run's record.
"""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import tempfile
import threading
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

from testbed.cluster.holdctl import read_line
from testbed.errors import InputError
from testbed.io.trusted import bind_private_socket, make_private_dir

log = logging.getLogger(__name__)

REQUEST_MAX_BYTES = 4096
ANSWER_TIMEOUT_S = 30.0
"""How long a request waits for the owning machine's answer. The controller itself waits
2 s (controllers.channels.ForwarderChannel) and logs a slower cap as an error; the relay
still carries it through, so the emulator gets it and the record says so."""
SUN_PATH_MAX = 107  # bytes of a Unix socket path (sun_path less its NUL)


class CapSession(Protocol):
    """What the relay needs of a machine's agent session (testbed.cluster.agentlink)."""

    def set_cap(self, fibre: str, vlan: int, rate_mbps: float | None,
                timeout_s: float = 30.0) -> dict[str, Any]: ...


def parse_forwarder_request(raw: bytes) -> tuple[int, float | None]:
    """(vlan, rate_mbps or None to remove) from a forwarder-protocol cap request
    (InputError naming the field)."""
    if len(raw) > REQUEST_MAX_BYTES:
        raise InputError("cap", f"a request over {REQUEST_MAX_BYTES} bytes")
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise InputError("cap", "not JSON") from None
    if not isinstance(doc, dict) or not ({"vlan", "rate_mbps"} == set(doc)
                                         or ({"vlan", "remove"} == set(doc)
                                             and doc["remove"] is True)):
        raise InputError("cap", "expected {vlan, rate_mbps} or {vlan, remove: true}")
    vlan = doc["vlan"]
    if isinstance(vlan, bool) or not isinstance(vlan, int) or not 1 <= vlan <= 4094:
        raise InputError("cap.vlan", f"not a VLAN id: {str(vlan)[:8]!r}")
    if "remove" in doc:
        return vlan, None
    rate = doc["rate_mbps"]
    if isinstance(rate, bool) or not isinstance(rate, int | float) \
            or not math.isfinite(rate) or rate <= 0:
        raise InputError("cap.rate_mbps", f"not a positive rate: {str(rate)[:20]!r}")
    return vlan, float(rate)


def relay_dir(stage: Path, prefix: str, longest_name: str) -> tuple[Path, Path | None]:
    """Where the relay's sockets go: STAGE/.caps/PREFIX when its longest socket path fits
    in a Unix socket address, else a fresh private directory in the system's temporary
    one; (the directory, the temporary parent to remove at the end or None)."""
    inside = stage.resolve() / ".caps" / prefix
    if len(os.fsencode(inside / longest_name)) <= SUN_PATH_MAX:
        make_private_dir(inside, "cluster caps relay")
        return inside, None
    parent = Path(tempfile.mkdtemp(prefix="lightpipe-caps-"))
    return make_private_dir(parent / prefix, "cluster caps relay"), parent


class CapRelay:
    """One socket per fibre in `directory`, each request carried to the fibre's machine."""

    def __init__(self, directory: Path, owners: Mapping[str, CapSession],
                 timeout_s: float = ANSWER_TIMEOUT_S) -> None:
        """owners: fibre middle node -> the agent session of the machine emulating it."""
        self.dir = directory
        self.owners = dict(owners)
        self.timeout_s = timeout_s
        self._caps: dict[str, dict[str, float]] = {}
        self._lock = threading.Lock()
        self.requests = 0
        self.failed = 0
        self._in_flight = 0
        self._idle = threading.Condition(self._lock)
        self._socks: dict[str, socket.socket] = {}
        self._pool = ThreadPoolExecutor(8, thread_name_prefix="cap-relay")
        self._threads: list[threading.Thread] = []
        self._closed = False
        self.temp_parent: Path | None = None  # a temporary parent to remove at the end
        try:
            for middle in sorted(self.owners):
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                self._socks[middle] = s
                bind_private_socket(s, self.path(middle))
                s.listen(16)
        except BaseException:
            self.close()
            raise

    def path(self, middle: str) -> Path:
        return self.dir / f"{middle}.sock"

    def controls(self) -> dict[str, str]:
        """Each fibre's control for the controller's layout (middle -> socket path)."""
        return {m: str(self.path(m)) for m in sorted(self._socks)}

    def start(self) -> CapRelay:
        for middle, s in self._socks.items():
            t = threading.Thread(target=self._accept, args=(middle, s), daemon=True,
                                 name=f"cap-relay-{middle}")
            t.start()
            self._threads.append(t)
        return self

    def settle(self, timeout_s: float) -> bool:
        """Wait until no request is in flight (True), or timeout_s (False)."""
        with self._idle:
            return self._idle.wait_for(lambda: self._in_flight == 0, timeout_s)

    def caps(self) -> dict[str, dict[str, float]]:
        """What each fibre's emulator reported after the last cap set on it."""
        with self._lock:
            return {m: dict(c) for m, c in sorted(self._caps.items())}

    def record(self) -> dict[str, Any]:
        with self._lock:
            requests, failed = self.requests, self.failed
        return {"fibres": len(self._socks), "requests": requests, "failed": failed,
                "caps_mbps": self.caps()}

    def close(self) -> None:
        self._closed = True
        for s in self._socks.values():
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
        for t in self._threads:
            t.join(timeout=2)
        self._pool.shutdown(wait=True, cancel_futures=True)
        for middle in self._socks:
            self.path(middle).unlink(missing_ok=True)

    # -- serving ------------------------------------------------------------------------
    def _accept(self, middle: str, s: socket.socket) -> None:
        while not self._closed:
            try:
                conn, _ = s.accept()
            except OSError:
                return  # closed
            try:
                self._pool.submit(self._one, middle, conn)
            except RuntimeError:  # the pool is shut down: the relay is closing
                conn.close()
                return

    def _one(self, middle: str, conn: socket.socket) -> None:
        with conn:
            try:
                creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
                if int.from_bytes(creds[4:8], "little") != os.geteuid():
                    conn.sendall(b'{"ok": false, "error": "not the relay\'s user"}\n')
                    return
                conn.settimeout(self.timeout_s + 5)
                reply = self._answer(middle, read_line(conn, REQUEST_MAX_BYTES))
                conn.sendall(json.dumps(reply).encode() + b"\n")
            except OSError as exc:
                log.warning("cap relay %s: %s", middle, exc)

    def _answer(self, middle: str, raw: bytes) -> dict[str, Any]:
        with self._lock:
            self.requests += 1
            self._in_flight += 1
        try:
            return self._carry(middle, raw)
        finally:
            with self._idle:
                self._in_flight -= 1
                self._idle.notify_all()

    def _carry(self, middle: str, raw: bytes) -> dict[str, Any]:
        try:
            vlan, rate = parse_forwarder_request(raw)
        except InputError as exc:
            reply: dict[str, Any] = {"ok": False, "error": str(exc)}
        else:
            got = self.owners[middle].set_cap(middle, vlan, rate, timeout_s=self.timeout_s)
            if got.get("ok") and (got.get("fibre"), got.get("vlan")) != (middle, vlan):
                # an answer to another request (one whose asker stopped waiting)
                got = {"ok": False, "why": f"the answer of {middle} named "
                                           f"{got.get('fibre')}/{got.get('vlan')}"}
            if got.get("ok"):
                reply = {"ok": True}
                caps = got.get("caps_mbps")
                if isinstance(caps, dict):
                    with self._lock:
                        self._caps[middle] = {str(k): float(v) for k, v in caps.items()
                                              if isinstance(v, int | float)}
            else:
                reply = {"ok": False, "error": str(got.get("why") or "refused")[:300]}
        if not reply["ok"]:
            with self._lock:
                self.failed += 1
            log.warning("cap relay %s: %s", middle, reply["error"])
        return reply


def caps_mismatch(plan: Any, caps: Mapping[str, Mapping[str, float]]) -> list[str]:
    """Each (lightpath, fibre of its route) whose emulator does not report the lightpath's
    rate as its cap, one line each (empty: every cap is where the plan's lightpaths say)."""
    out: list[str] = []
    for lp in plan.lightpaths:
        for u, v in zip(lp.path, lp.path[1:], strict=False):
            middle = plan.fibre(u, v).middle
            got = caps.get(middle, {}).get(str(lp.vlan))
            if got is None or abs(got - lp.rate_mbps) > 1e-6 * max(1.0, lp.rate_mbps):
                out.append(f"VLAN {lp.vlan} on fibre {u}-{v}: rate {lp.rate_mbps:g} Mbit/s, "
                           f"its emulator reports {'no cap' if got is None else f'{got:g}'}")
    return out


def remove_relay_dir(directory: Path, temp_parent: Path | None) -> None:
    """Remove the relay's directory once its sockets are gone, and the one above it (the
    stage's `.caps` or the temporary parent it made); anything left in them is kept."""
    for d in (directory, temp_parent or directory.parent):
        try:
            d.rmdir()
        except OSError:
            pass
