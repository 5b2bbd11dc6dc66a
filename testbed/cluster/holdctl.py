"""A held share's control socket: the driver's delay corrections applied by the holder.

The share holder (`python -m testbed.cluster.hold serve`) owns its fibre emulators, so it
is the one that re-shapes them, whatever their mode (a user-space forwarder's control
socket, or netem's `tc change`). It listens on `hold.sock` in the run's state directory
(root's, mode 0600) and answers one JSON request per connection:

    {"fibres": {MIDDLE: correction_ms}, "vlans": {MIDDLE: {VLAN: correction_ms}}}

with {"ok": true, "fibres": {MIDDLE: state}} for every fibre emulated on this machine
(state: configured and emulated delay, the fibre's correction, its lightpaths' own
corrections, and whether it can delay a lightpath apart), or {"ok": false, "error": ...};
or {"links": IP}: serve this machine's link metrics (the user-space fibre emulators'
counters, testbed.metrics.links) on IP (any port, once per holder) for the driver's
Prometheus, answered with {"ok": true, "target": "IP:PORT", "fibres": [...]}; or
{"controller": {"probe_ms": N}}: point this machine's switches at the run's OpenFlow relay
socket (STATE_DIR/ovs/openflow.sock, which the worker agent serves: testbed.cluster.ofrelay),
answered with {"ok": true, "target": ..., "switches": [...], "ports": [[SWITCH, NEIGHBOUR,
PORT], ...]} (their OpenFlow port numbers, for the controller's layout); or
{"fibre": {"u": U, "v": V, "up": BOOL}}: a fibre event in the data plane (its emulator's
links set down or up: the ROADM ports here lose or regain carrier and the controller hears
it from the switch), answered with {"ok": true}; or
{"cap": {"fibre": MIDDLE, "vlan": VLAN, "rate_mbps": RATE | null}}: a lightpath's capacity
on a fibre emulated here, set (or removed: null) by the run's controller through the
driver's relay (testbed.cluster.caprelay), answered with {"ok": true, "caps_mbps": {VLAN:
RATE}} (the fibre's caps now); or
{"probe_watch": ...}, {"probe_send": ...}, {"probe_collect": ...}, {"probe_run": ...}: the
share's half of the
lightpath probes across machines (testbed.cluster.lpwatch), each answered when done; or
{"fidelity": {}}: what the run's fidelity verdict reads from this machine's share besides
RTTs and CPU (its forwarders' counters and timer slack, its hosts' TCP counters, the shaped
fabric's and the user-space switch's drops, the switch sockets' sizing:
testbed.emu.fidelity_probe.network_measurements), answered with {"ok": true, ...those}.
Only a peer of the holder's own user is served. `python -m testbed.cluster.hold correct
RUN` (over SSH, from the driver) validates the request and relays it here.
"""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from testbed.emu.links import LinkEmulator
from testbed.errors import InputError
from testbed.io.trusted import bind_private_socket, own_socket
from testbed.names import NODE_NAME_RE

log = logging.getLogger(__name__)

SOCK_NAME = "hold.sock"
REQUEST_MAX_BYTES = 1 << 20
TIMEOUT_S = 30.0
MAX_CORRECTION_MS = 10_000.0   # |correction| bound (a fibre's delay is far below)
PROBE_MS_RANGE = (1000, 600_000)  # OVS's inactivity probe towards the controller
MAX_CAP_MBPS = 1e7                # a lightpath's emulated rate (Mbit/s) is far below


def _ms(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) \
            or not math.isfinite(value) or abs(value) > MAX_CORRECTION_MS:
        raise InputError(where, f"expected a number of ms within +-{MAX_CORRECTION_MS:g}")
    return float(value)


def parse_request(raw: bytes) -> dict[str, Any]:
    """A validated correction request (InputError naming the field)."""
    if len(raw) > REQUEST_MAX_BYTES:
        raise InputError("correct", f"over {REQUEST_MAX_BYTES} bytes")
    try:
        doc = json.loads(raw or b"{}")
    except (ValueError, UnicodeDecodeError) as exc:
        raise InputError("correct", f"not JSON ({exc})") from None
    if isinstance(doc, dict) and set(doc) == {"links"}:
        import ipaddress

        try:
            return {"links": str(ipaddress.ip_address(str(doc["links"])))}
        except ValueError:
            raise InputError("links", f"not an IP address: {str(doc['links'])[:60]!r}"
                             ) from None
    if isinstance(doc, dict) and set(doc) == {"controller"}:
        c = doc["controller"]
        probe = c.get("probe_ms") if isinstance(c, dict) and set(c) == {"probe_ms"} else None
        lo, hi = PROBE_MS_RANGE
        if isinstance(probe, bool) or not isinstance(probe, int) or not lo <= probe <= hi:
            raise InputError("controller.probe_ms", f"expected an integer in {lo}..{hi}")
        return {"controller": {"probe_ms": probe}}
    if isinstance(doc, dict) and set(doc) == {"fibre"}:
        f = doc["fibre"]
        if not (isinstance(f, dict) and set(f) == {"u", "v", "up"}
                and isinstance(f["up"], bool)
                and all(isinstance(f[k], str) and 0 < len(f[k]) <= 64 for k in ("u", "v"))):
            raise InputError("fibre", "expected {u: NODE, v: NODE, up: true|false}")
        return {"fibre": {"u": f["u"], "v": f["v"], "up": f["up"]}}
    if isinstance(doc, dict) and set(doc) == {"cap"}:
        return {"cap": parse_cap(doc["cap"])}
    if isinstance(doc, dict) and set(doc) == {"fidelity"}:
        if doc["fidelity"] != {}:
            raise InputError("fidelity", "expected {} (no fields)")
        return {"fidelity": {}}
    if isinstance(doc, dict) and len(doc) == 1 and next(iter(doc)) in PROBE_REQUESTS:
        (what, body), = doc.items()
        return {what: PROBE_REQUESTS[what](body)}
    if not isinstance(doc, dict) or set(doc) - {"fibres", "vlans"}:
        raise InputError("correct", "expected an object with fibres and vlans")
    fibres, vlans = doc.get("fibres", {}), doc.get("vlans", {})
    if not isinstance(fibres, dict) or not isinstance(vlans, dict):
        raise InputError("correct.fibres", "expected objects {MIDDLE: ...}")
    out_f: dict[str, float] = {}
    out_v: dict[str, dict[int, float]] = {}
    for node, c in fibres.items():
        if not NODE_NAME_RE.fullmatch(node):
            raise InputError("correct.fibres", f"not a node name: {node[:40]!r}")
        out_f[node] = _ms(c, f"correct.fibres.{node}")
    for node, per in vlans.items():
        if not NODE_NAME_RE.fullmatch(node) or not isinstance(per, dict):
            raise InputError("correct.vlans", f"not a node name: {str(node)[:40]!r}")
        out_v[node] = {}
        for vlan, c in per.items():
            if not (isinstance(vlan, str) and vlan.isdigit() and 1 <= int(vlan) <= 4094):
                raise InputError(f"correct.vlans.{node}", f"not a VLAN id: {str(vlan)[:8]!r}")
            out_v[node][int(vlan)] = _ms(c, f"correct.vlans.{node}.{vlan}")
    return {"fibres": out_f, "vlans": out_v}


def _token(v: Any, where: str) -> str:
    if not (isinstance(v, str) and len(v) == 16 and all(c in "0123456789abcdef" for c in v)):
        raise InputError(where, "expected a probe token (16 lower-case hex digits)")
    return v


def _vlan(v: Any, where: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 4094:
        raise InputError(where, f"not a VLAN id: {str(v)[:8]!r}")
    return v


def _name(v: Any, where: str) -> str:
    if not (isinstance(v, str) and NODE_NAME_RE.fullmatch(v)):
        raise InputError(where, f"not a node name: {str(v)[:40]!r}")
    return v


def _number(v: Any, where: str, lo: float, hi: float) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) \
            or not lo <= v <= hi:
        raise InputError(where, f"expected a number in {lo:g}..{hi:g}")
    return float(v)


def _probes(body: Any, where: str, fields: set[str], least: int = 1
            ) -> list[dict[str, Any]]:
    from testbed.cluster.lpwatch import MAX_PROBES

    probes = body.get("probes") if isinstance(body, dict) else None
    if not isinstance(probes, list) or not least <= len(probes) <= MAX_PROBES \
            or not all(isinstance(p, dict) and set(p) == fields for p in probes):
        raise InputError(f"{where}.probes", f"expected {least}..{MAX_PROBES} objects with "
                                           f"{', '.join(sorted(fields))}")
    return probes


def parse_probe_watch(body: Any) -> dict[str, Any]:
    """{probes: [{token, vlan, fibres: [{middle, from}], dst_host|null}], timeout_s}."""
    from testbed.cluster.lpwatch import TIMEOUT_S_RANGE

    if not isinstance(body, dict) or set(body) != {"probes", "timeout_s"}:
        raise InputError("probe_watch", "expected {probes, timeout_s}")
    out = []
    for i, p in enumerate(_probes(body, "probe_watch", {"token", "vlan", "fibres",
                                                        "dst_host"})):
        w = f"probe_watch.probes[{i}]"
        fibres = p["fibres"]
        if not isinstance(fibres, list) or len(fibres) > 64 or not all(
                isinstance(f, dict) and set(f) == {"middle", "from"} for f in fibres):
            raise InputError(f"{w}.fibres", "expected up to 64 objects {middle, from}")
        out.append({"token": _token(p["token"], f"{w}.token"),
                    "vlan": _vlan(p["vlan"], f"{w}.vlan"),
                    "fibres": [{"middle": _name(f["middle"], f"{w}.fibres.middle"),
                                "from": _name(f["from"], f"{w}.fibres.from")} for f in fibres],
                    "dst_host": None if p["dst_host"] is None
                    else _name(p["dst_host"], f"{w}.dst_host")})
    return {"probes": out,
            "timeout_s": _number(body["timeout_s"], "probe_watch.timeout_s", *TIMEOUT_S_RANGE)}


def parse_probe_send(body: Any, what: str = "probe_send") -> dict[str, Any]:
    """{probes: [{token, vlan, src_host, dst_host}], gap_ms}."""
    from testbed.cluster.lpwatch import GAP_MS_MAX

    if not isinstance(body, dict) or set(body) != {"probes", "gap_ms"}:
        raise InputError(what, "expected {probes, gap_ms}")
    out = []
    for i, p in enumerate(_probes(body, what, {"token", "vlan", "src_host", "dst_host"},
                                  least=1 if what == "probe_send" else 0)):
        w = f"{what}.probes[{i}]"
        out.append({"token": _token(p["token"], f"{w}.token"),
                    "vlan": _vlan(p["vlan"], f"{w}.vlan"),
                    "src_host": _name(p["src_host"], f"{w}.src_host"),
                    "dst_host": _name(p["dst_host"], f"{w}.dst_host")})
    return {"probes": out, "gap_ms": _number(body["gap_ms"], f"{what}.gap_ms", 0.0,
                                             GAP_MS_MAX)}


def parse_probe_run(body: Any) -> dict[str, Any]:
    """{probes: [{token, vlan, src_host, dst_host}] (maybe none), gap_ms, wait_s}."""
    if not isinstance(body, dict) or set(body) != {"probes", "gap_ms", "wait_s"}:
        raise InputError("probe_run", "expected {probes, gap_ms, wait_s}")
    send = parse_probe_send({k: body[k] for k in ("probes", "gap_ms")}, "probe_run")
    wait = parse_probe_collect({"wait_s": body["wait_s"]}, "probe_run")
    return {**send, **wait}


def parse_probe_collect(body: Any, what: str = "probe_collect") -> dict[str, Any]:
    """{wait_s}."""
    from testbed.cluster.lpwatch import WAIT_S_MAX

    if not isinstance(body, dict) or set(body) != {"wait_s"}:
        raise InputError(what, "expected {wait_s}")
    return {"wait_s": _number(body["wait_s"], f"{what}.wait_s", 0.0, WAIT_S_MAX)}


PROBE_REQUESTS: dict[str, Callable[[Any], dict[str, Any]]] = {
    "probe_watch": parse_probe_watch, "probe_send": parse_probe_send,
    "probe_collect": parse_probe_collect, "probe_run": parse_probe_run}


def parse_cap(c: Any) -> dict[str, Any]:
    """A validated cap body {fibre, vlan, rate_mbps} (InputError naming the field)."""
    if not (isinstance(c, dict) and set(c) == {"fibre", "vlan", "rate_mbps"}):
        raise InputError("cap", "expected {fibre: MIDDLE, vlan: N, rate_mbps: RATE|null}")
    fibre, vlan, rate = c["fibre"], c["vlan"], c["rate_mbps"]
    if not (isinstance(fibre, str) and NODE_NAME_RE.fullmatch(fibre)):
        raise InputError("cap.fibre", f"not a node name: {str(fibre)[:40]!r}")
    if isinstance(vlan, bool) or not isinstance(vlan, int) or not 1 <= vlan <= 4094:
        raise InputError("cap.vlan", f"not a VLAN id: {str(vlan)[:8]!r}")
    if rate is not None and (isinstance(rate, bool) or not isinstance(rate, int | float)
                             or not math.isfinite(rate) or not 0 < rate <= MAX_CAP_MBPS):
        raise InputError("cap.rate_mbps", f"expected a rate in (0, {MAX_CAP_MBPS:g}] Mbit/s "
                                          "or null")
    return {"fibre": fibre, "vlan": vlan,
            "rate_mbps": None if rate is None else float(rate)}


def set_cap(emulators: Mapping[str, LinkEmulator], body: Mapping[str, Any]
            ) -> dict[str, Any]:
    """Apply a validated cap body to the fibre emulated here; the reply."""
    emu = emulators.get(body["fibre"])
    if emu is None:
        return {"ok": False, "error": f"fibre {body['fibre']} is not emulated on this "
                                      "machine"}
    try:
        emu.set_cap(body["vlan"], body["rate_mbps"])
    except Exception as exc:  # the forwarder's refusal, or tc's
        return {"ok": False, "error": f"fibre {body['fibre']}: {str(exc)[:300]}"}
    return {"ok": True, "caps_mbps": {str(v): r for v, r in sorted(emu.caps_mbps.items())}}


def fibre_state(emu: LinkEmulator) -> dict[str, Any]:
    """What the driver mirrors of one emulator."""
    return {"delay_ms": emu.fibre.delay_ms,
            "emulated_ms": round(emu.emulated_delay_ms(), 6),
            "correction_ms": emu.correction_ms,
            "vlans": {str(v): c for v, c in sorted(emu.vlan_corrections_ms.items())},
            "per_vlan": emu.mode == "userspace"}


def apply(emulators: Mapping[str, LinkEmulator], req: Mapping[str, Any]) -> dict[str, Any]:
    """Apply a validated request to this machine's emulators; the reply."""
    unknown = sorted((set(req["fibres"]) | set(req["vlans"])) - set(emulators))
    if unknown:
        return {"ok": False, "error": f"fibre(s) not emulated on this machine: "
                                      f"{', '.join(unknown[:5])}"}
    refused: list[str] = []
    for node, c in req["fibres"].items():
        emulators[node].set_delay_correction(max(0.0, c))
    for node, per in req["vlans"].items():
        for vlan, c in per.items():
            if not emulators[node].set_vlan_correction(vlan, c):
                refused.append(f"{node}/{vlan}")
    reply: dict[str, Any] = {"ok": not refused,
                             "fibres": {k: fibre_state(e) for k, e in emulators.items()}}
    if refused:
        reply["error"] = f"cannot delay lightpath(s) apart: {', '.join(refused[:5])}"
    return reply


class ControlServer:
    """The holder's side: serve requests on state_dir/hold.sock in a thread."""

    def __init__(self, state_dir: Path, emulators: Mapping[str, LinkEmulator],
                 home_fd: int | None = None,
                 hooks: Mapping[str, Callable[[Any], dict[str, Any]]] | None = None) -> None:
        """home_fd: the machine's namespace the share was built from (link metrics are
        served there, where the driver reaches them), when the holder entered another.
        hooks: what the holder does for a `controller` request (point the switches at the
        OpenFlow relay) and a `fibre` one (a fibre event), each its validated body to the
        reply."""
        self.path = state_dir / SOCK_NAME
        self.emulators = emulators
        self.home_fd = home_fd
        self.hooks = dict(hooks or {})
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.path.unlink(missing_ok=True)
        bind_private_socket(self.sock, self.path)
        self.sock.listen(4)
        self.lock = threading.Lock()
        self.links: Any = None  # testbed.metrics.links.LinkExporter, once asked for
        self.thread = threading.Thread(target=self._serve, name="hold-control", daemon=True)

    def start(self) -> ControlServer:
        self.thread.start()
        return self

    def close(self) -> None:
        if self.links is not None:
            self.links.stop()
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        self.path.unlink(missing_ok=True)

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return  # closed
            with conn:
                try:
                    self._one(conn)
                except Exception as exc:  # one bad client must not end the server
                    log.warning("hold control: %s", exc)

    def _one(self, conn: socket.socket) -> None:
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
        uid = int.from_bytes(creds[4:8], "little")
        if uid != os.geteuid():
            conn.sendall(b'{"ok": false, "error": "not the holder\'s user"}\n')
            return
        conn.settimeout(TIMEOUT_S)
        raw = read_line(conn)
        try:
            req = parse_request(raw)
        except InputError as exc:
            reply: dict[str, Any] = {"ok": False, "error": str(exc)}
        else:
            with self.lock:
                if "links" in req:
                    reply = self.serve_links(req["links"])
                elif "cap" in req:
                    reply = set_cap(self.emulators, req["cap"])
                elif set(req) & {"controller", "fibre", "fidelity", *PROBE_REQUESTS}:
                    (what, body), = req.items()
                    hook = self.hooks.get(what)
                    reply = (hook(body) if hook is not None else
                             {"ok": False, "error": f"this holder does not do {what}"})
                else:
                    reply = apply(self.emulators, req)
        conn.sendall(json.dumps(reply, sort_keys=True).encode() + b"\n")

    def serve_links(self, address: str) -> dict[str, Any]:
        """This machine's link metrics on address:any (started on the first request)."""
        from testbed.metrics.links import LinkExporter
        from testbed.monitor.run import in_netns

        if self.links is None:
            links = LinkExporter(e for e in self.emulators.values() if e.counters)
            try:
                in_netns(self.home_fd, lambda: links.start(addr=address))
            except OSError as exc:
                return {"ok": False, "error": f"cannot serve link metrics on {address} "
                                              f"({exc.strerror or exc})"}
            self.links = links
        return {"ok": True, "target": self.links.target, "fibres": list(self.links.fibres)}


def read_line(conn: socket.socket, max_bytes: int = REQUEST_MAX_BYTES) -> bytes:
    """One request line from conn (without its newline), reading at most about
    max_bytes: a longer one comes back longer than max_bytes, for the caller to refuse."""
    buf = b""
    while b"\n" not in buf and len(buf) <= max_bytes:
        chunk = conn.recv(65536)
        if not chunk:
            break
        buf += chunk
    return buf.split(b"\n", 1)[0]


def request(state_dir: Path, req: Mapping[str, Any], timeout_s: float = TIMEOUT_S
            ) -> dict[str, Any]:
    """The client's side: send a validated request to the run's holder; its reply.
    The socket must be a socket owned by this user (never a link)."""
    path = state_dir / SOCK_NAME
    mine = own_socket(path)
    if mine is None:
        return {"ok": False, "error": "the share's holder has no control socket"}
    if not mine:
        return {"ok": False, "error": f"{path} is not the holder's socket"}
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout_s)
        try:
            s.connect(str(path))
            body = {k: req[k] for k in ("links", "controller", "fibre", "cap", "fidelity",
                                        *PROBE_REQUESTS) if k in req} or {
                "fibres": req["fibres"],
                "vlans": {k: {str(v): c for v, c in per.items()}
                          for k, per in req["vlans"].items()}}
            s.sendall(json.dumps(body).encode() + b"\n")
            raw = read_line(s)
        except OSError as exc:
            return {"ok": False, "error": f"the share's holder did not answer ({exc})"}
    try:
        reply = json.loads(raw)
    except ValueError:
        return {"ok": False, "error": "unreadable reply from the share's holder"}
    return reply if isinstance(reply, dict) else {"ok": False, "error": "bad reply"}
