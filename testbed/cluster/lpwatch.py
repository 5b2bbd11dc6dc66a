"""A share's half of the lightpath probes across machines: watch its fibres, send, collect.

A one-machine run follows each lightpath probe through every fibre it crosses
(testbed.emu.probes.lightpath_probe: kernel receive stamps on both sides of each fibre's
middle node, the VLAN tag it carries there, its arrival at the far host). Across machines
the fibres of one lightpath sit on several machines, so the driver
(testbed.cluster.lpprobe) does it in three requests to every share holder, each answered
when done (readiness by reply, no waiting on a clock):

    {"probe_watch": {"probes": [{"token", "vlan", "fibres": [{"middle", "from"}],
                                 "dst_host"}], "timeout_s"}}
        sniff sockets on the interfaces the probes enter and leave this machine's fibre
        emulators by, and on the probes' far hosts here; answered once they are bound.
    {"probe_send": {"probes": [{"token", "vlan", "src_host", "dst_host"}], "gap_ms"}}
        each probe's frame from its source host here, gap_ms apart; answered with each
        one's send time.
    {"probe_collect": {"wait_s"}}
        waits (up to wait_s) until every watched probe was seen everywhere it was
        expected, closes the sockets, answers what was seen.
    {"probe_run": {"probes", "gap_ms", "wait_s"}}
        probe_send (of none or more probes), then probe_collect, in one request: what the
        driver sends each machine once every machine watches (one SSH step per machine
        and round less).

A fibre's own delay is the difference of two kernel stamps taken in its middle node, one
machine, one clock: it needs no clock shared between machines. The hold control server
validates every request (testbed.cluster.holdctl) before it reaches this module.
"""

from __future__ import annotations

import logging
import select
import socket
import threading
import time
from collections.abc import Mapping
from typing import Any

from testbed.emu.probes import PROBE_MARK, PROBE_TOKEN_BYTES, probe_frame, recv_with_vlan

log = logging.getLogger(__name__)

MAX_PROBES = 4096
TIMEOUT_S_RANGE = (1.0, 600.0)   # how long a watch stays open at most
WAIT_S_MAX = 20.0   # within the control socket's 30 s answer time
GAP_MS_MAX = 1000.0
_MARK_AT = 42  # Ethernet 14 + IPv4 20 + UDP 8: where an untagged probe's payload starts


def token_of(data: bytes) -> bytes | None:
    """The probe token in a frame, or None (tagged or not: the mark is searched)."""
    i = data.find(PROBE_MARK, _MARK_AT if len(data) > _MARK_AT else 0)
    if i < 0:
        return None
    tok = data[i + len(PROBE_MARK):i + len(PROBE_MARK) + PROBE_TOKEN_BYTES]
    return tok if len(tok) == PROBE_TOKEN_BYTES else None


class ProbeWatch:
    """The share's one open watch (a new one replaces it)."""

    def __init__(self, net: Any) -> None:
        self.net = net
        self.lock = threading.Lock()
        # fd -> (socket, fibre middle or host name, interface, "fibre" | "host")
        self.socks: dict[int, tuple[socket.socket, str, str, str]] = {}
        # per token: the interface it enters / leaves each watched fibre by, its far host
        self.into: dict[str, dict[str, str]] = {}
        self.out: dict[str, dict[str, str]] = {}
        self.dst: dict[str, str | None] = {}
        self.vlan: dict[str, int] = {}
        self.seen: dict[str, dict[str, list[Any]]] = {}     # token -> name -> [stamp, tag]
        self.left: dict[str, dict[str, float]] = {}
        self.arrived: dict[str, float] = {}
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None
        self.deadline = 0.0

    # -- the three requests ------------------------------------------------------------
    def watch(self, body: Mapping[str, Any]) -> dict[str, Any]:
        self.reset()
        net = self.net
        # One socket per interface, whichever probes and directions cross it.
        wanted: dict[tuple[str, str], tuple[str, str]] = {}  # (ns, ifname) -> (name, kind)
        try:
            for p in body["probes"]:
                tok = p["token"]
                self.vlan[tok] = p["vlan"]
                self.into[tok], self.out[tok] = {}, {}
                for f in p["fibres"]:
                    emu = net.emulators.get(f["middle"])
                    if emu is None:
                        self.reset()
                        return {"ok": False, "error": f"fibre {f['middle']} is not emulated "
                                                      "on this machine"}
                    fib = emu.fibre
                    if f["from"] not in (fib.u, fib.v):
                        self.reset()
                        return {"ok": False, "error": f"fibre {f['middle']} does not end at "
                                                      f"{f['from']}"}
                    into, out = ((emu.intf_u, emu.intf_v) if f["from"] == fib.u
                                 else (emu.intf_v, emu.intf_u))
                    self.into[tok][f["middle"]], self.out[tok][f["middle"]] = into, out
                    ns = f"/proc/{emu.ns_pid}/ns/net"
                    wanted[(ns, into)] = wanted[(ns, out)] = (f["middle"], "fibre")
                self.dst[tok] = p["dst_host"]
                if p["dst_host"] is not None:
                    _node, ns, ifname = self._host(p["dst_host"])
                    wanted[(ns, ifname)] = (p["dst_host"], "host")
            from testbed.emu.probes import sniff_socket

            for (ns, ifname), (name, kind) in wanted.items():
                s = sniff_socket(ns, ifname)
                self.socks[s.fileno()] = (s, name, ifname, kind)
        except (KeyError, OSError, ValueError) as exc:
            self.reset()
            return {"ok": False, "error": f"probe watch: {str(exc)[:300]}"}
        self.deadline = time.monotonic() + float(body["timeout_s"])
        self.stop.clear()
        self.thread = threading.Thread(target=self._loop, name="probe-watch", daemon=True)
        self.thread.start()
        return {"ok": True, "sockets": len(self.socks), "probes": len(self.vlan)}

    def send(self, body: Mapping[str, Any]) -> dict[str, Any]:
        from testbed.emu.netns import in_netns
        from testbed.emu.probes import ETH_P_ALL

        plan = self.net.plan
        sent: dict[str, float] = {}
        try:
            for i, p in enumerate(body["probes"]):
                src, dst = plan.host(p["src_host"]), plan.host(p["dst_host"])
                _node, ns, ifname = self._host(p["src_host"])
                frame = probe_frame(src.mac, src.ip.split("/")[0], dst.mac,
                                    dst.ip.split("/")[0], p["vlan"], bytes.fromhex(p["token"]))
                with in_netns(ns):
                    tx = socket.socket(socket.AF_PACKET, socket.SOCK_RAW,
                                       socket.htons(ETH_P_ALL))
                    tx.bind((ifname, ETH_P_ALL))
                try:
                    if i and body["gap_ms"]:
                        time.sleep(body["gap_ms"] / 1000.0)
                    sent[p["token"]] = time.time()
                    tx.send(frame)
                finally:
                    tx.close()
        except (KeyError, OSError, ValueError) as exc:
            return {"ok": False, "error": f"probe send: {str(exc)[:300]}", "sent": sent}
        return {"ok": True, "sent": sent}

    def collect(self, body: Mapping[str, Any]) -> dict[str, Any]:
        end = time.monotonic() + float(body["wait_s"])
        while time.monotonic() < end and not self._complete():
            time.sleep(0.01)
        self.close()
        emulated = {tok: {m: round(self.net.emulators[m].emulated_delay_ms(self.vlan[tok]), 6)
                          for m in fibres} for tok, fibres in self.into.items()}
        with self.lock:
            return {"ok": True, "seen": self.seen, "left": self.left, "arrived": self.arrived,
                    "emulated_ms": emulated}

    def run(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """Send this machine's probes (none: only collect), then collect: one request
        per machine and round once every machine watches."""
        sent: dict[str, Any] = {"ok": True, "sent": {}}
        if body["probes"]:
            sent = self.send(body)
            if not sent.get("ok"):
                self.close()
                return sent
        return {**self.collect(body), "sent": sent["sent"]}

    # -- helpers -----------------------------------------------------------------------
    def _host(self, name: str) -> tuple[str, str, str]:
        """(node, namespace path, interface) of a host of this share (KeyError if not)."""
        h = self.net.plan.host(name)
        node = self.net.nodes[h.node]
        return h.node, f"/proc/{int(node.pid)}/ns/net", str(node.defaultIntf())

    def _complete(self) -> bool:
        with self.lock:
            for tok, fibres in self.into.items():
                if self.dst.get(tok) is not None and tok not in self.arrived:
                    return False
                if set(fibres) - set(self.seen.get(tok, {})) \
                        or set(fibres) - set(self.left.get(tok, {})):
                    return False
        return True

    def _loop(self) -> None:
        roles = {fd: (name, ifname, kind) for fd, (_s, name, ifname, kind)
                 in self.socks.items()}
        socks = [entry[0] for entry in self.socks.values()]
        while not self.stop.is_set() and time.monotonic() < self.deadline:
            try:
                ready, _, _ = select.select(socks, [], [], 0.05)
            except (OSError, ValueError):
                return  # closed under us
            for s in ready:
                name, ifname, kind = roles[s.fileno()]
                while True:
                    try:
                        data, tag, stamp = recv_with_vlan(s)
                    except (BlockingIOError, OSError):
                        break
                    tok = token_of(data)
                    if tok is not None:
                        self._record(tok.hex(), name, ifname, kind, tag, stamp)

    def _record(self, tok: str, name: str, ifname: str, kind: str, tag: int | None,
                stamp: float) -> None:
        """The first time a probe's frame shows where this token is expected: entering or
        leaving one of its fibres by the interface of its direction, or at its own far
        host (a host also sees the probes it sends, and an ICMP error may carry one back:
        neither counts)."""
        with self.lock:
            if kind == "host":
                if self.dst.get(tok) == name:
                    self.arrived.setdefault(tok, stamp)
            elif self.into.get(tok, {}).get(name) == ifname:
                self.seen.setdefault(tok, {}).setdefault(name, [stamp, tag])
            elif self.out.get(tok, {}).get(name) == ifname:
                self.left.setdefault(tok, {}).setdefault(name, stamp)

    def close(self) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join(timeout=5)
            self.thread = None
        for entry in self.socks.values():
            entry[0].close()
        self.socks = {}

    def reset(self) -> None:
        """Close the watch and forget what it saw (a new watch starts clean)."""
        self.close()
        with self.lock:
            self.into, self.out, self.dst, self.vlan = {}, {}, {}, {}
            self.seen, self.left, self.arrived = {}, {}, {}
