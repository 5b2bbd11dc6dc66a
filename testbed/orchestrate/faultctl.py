"""The fault control channel of a held emulation: `lightpipe fault` over a Unix socket.

A held run (`lightpipe emu SPEC --hold`) owns its network, SDN controller and Prometheus;
it serves `faults.sock` in its state directory (mode 0600; a peer must be root or the
run's own user) while it holds. One connection carries one request and one response,
each a single JSON line of at most MAX_REQUEST_BYTES / MAX_RESPONSE_BYTES:

    request   {"kind": "fiber_cut", "link": ["1", "3"]}       the fields of a scenario
              event (testbed.spec.models.EventSpec) without at_s: it applies now
    response  {"ok": true, "row": {...}}                      its summary.json `faults` row
              {"ok": false, "error": {"type": "input", "field": "link",
                                      "message": "no fibre 1-5 in topology quickstart"}}
              ("type": "runtime" when it could not be applied, "busy" with too many
              requests at once)

A request is validated like a scenario's `events` entry (the same model, the same
cross-field checks against the run's scenario, so the same fields and messages: down_s
and period_s at most a day on the scenario clock, count at most 1000), and its span on
the wall clock (x the run's time_factor) is at most MAX_FAULT_WALL_S; it is then applied
by the run's FaultInjector (FaultInjector.apply_now), the same code that plays a
scenario's events; the rows go into the run's summary.json when it ends. worker_kill is
refused: a held network runs no workers.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import socket
import stat
import struct
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from testbed.emu.scale import Scale
from testbed.errors import InputError, RuntimeFailure
from testbed.spec.check import check_scenario
from testbed.spec.load import format_validation_error
from testbed.spec.models import EventSpec, Scenario

log = logging.getLogger(__name__)

SOCKET_NAME = "faults.sock"
MAX_REQUEST_BYTES = 4096
MAX_RESPONSE_BYTES = 1 << 20
READ_TIMEOUT_S = 5.0      # a client has this long to send its request line
MAX_CLIENTS = 4           # requests served at once; more are answered "busy"
APPLY_MARGIN_S = 120.0    # beyond the fault's own duration: restoration, restart, scrape
SUN_PATH_MAX = 107        # bytes of a Unix socket path (Linux sun_path, NUL excluded)
MAX_FAULT_WALL_S = 86_400.0  # a request's own span on the wall clock (scaled): one day
MAX_MESSAGE_CHARS = 500   # of a refusal's field or message shown from the reply


class _HeldEvents(BaseModel):
    """The request validated in the place it has in a scenario (messages, 'did you mean')."""

    events: list[EventSpec]


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number here")


def parse_request(line: bytes, scenario: Scenario) -> EventSpec:
    """The event a request line asks for (at_s 0); InputError naming the field."""
    if len(line) > MAX_REQUEST_BYTES:
        raise InputError("request", f"over {MAX_REQUEST_BYTES} bytes")
    try:
        data = json.loads(line.decode("utf-8"), parse_constant=_no_constant)
    except UnicodeDecodeError:
        raise InputError("request", "not UTF-8") from None
    except (ValueError, RecursionError) as exc:
        raise InputError("request", f"not JSON ({str(exc)[:80]})") from None
    if not isinstance(data, dict):
        raise InputError("request", "must be a JSON object of event fields, e.g. "
                         '{"kind": "fiber_cut", "link": ["1", "3"]}')
    if "at_s" in data:
        raise InputError("at_s", "a fault on a held network applies now; at_s is for a "
                         "scenario's events")
    if data.get("kind") == "worker_kill":
        raise InputError("kind", "worker_kill needs running pp_jobs workers and a held "
                         "network runs none; put it in the scenario's events and run "
                         "without --hold")
    try:
        ev = _HeldEvents.model_validate({"events": [{**data, "at_s": 0.0}]}).events[0]
    except ValidationError as exc:
        path, message = format_validation_error(exc)
        raise InputError(_field(path), message) from None
    try:
        check_scenario(scenario.model_copy(update={"events": [ev]}))
    except InputError as exc:
        raise InputError(_field(exc.path), exc.message) from None
    check_wall_span(ev, Scale.of(scenario.emulation))
    return ev


def fault_span_s(ev: EventSpec) -> float:
    """The fault's own duration on the scenario clock (a restart's wait, a flap's cycles)."""
    return (ev.down_s or 0.0) + (ev.period_s or 0.0) * (ev.count or 0)


def check_wall_span(ev: EventSpec, scale: Scale) -> None:
    """InputError naming the field when the fault would last over MAX_FAULT_WALL_S on the
    wall clock (its timers, and the answer's wait, must stay finite and sane)."""
    wall_s = scale.emulated_s(fault_span_s(ev))
    if not (math.isfinite(wall_s) and wall_s <= MAX_FAULT_WALL_S):
        field = "down_s" if ev.down_s is not None else "period_s"
        raise InputError(field, f"the fault would last {wall_s:g} s of wall-clock time "
                         f"(x time_factor {scale.time_factor:g}); the limit is "
                         f"{MAX_FAULT_WALL_S:g} s")


def _field(path: str) -> str:
    """'events[0].link' -> 'link'; the event itself ('events[0]') -> 'kind'."""
    rest = path.removeprefix("events[0]").lstrip(".")
    return rest or "kind"


def apply_timeout_s(ev: EventSpec, scale: float) -> float:
    """How long a request may take: the fault's own span (scaled, at most
    MAX_FAULT_WALL_S) and a margin."""
    span_s = min(fault_span_s(ev) * scale, MAX_FAULT_WALL_S)
    return (span_s if math.isfinite(span_s) else MAX_FAULT_WALL_S) + APPLY_MARGIN_S


class FaultServer:
    """Serves the channel in a thread; `apply(ev) -> row` applies a validated event."""

    def __init__(self, path: Path, scenario: Scenario,
                 apply: Callable[[EventSpec], dict[str, Any]],
                 after: Callable[[dict[str, Any]], None] | None = None,
                 read_timeout_s: float = READ_TIMEOUT_S) -> None:
        self.path = Path(path)
        self.scenario = scenario
        self.apply = apply
        self.after = after  # called with each applied row (e.g. rewrite network.json)
        self.served = 0
        self.read_timeout_s = read_timeout_s
        self._slots = threading.BoundedSemaphore(MAX_CLIENTS)
        self._stop = threading.Event()
        self._after_lock = threading.Lock()  # no `after` once close() has returned
        self._sock = _bind_private(self.path)
        self._sock.listen(16)
        self._sock.settimeout(0.2)
        self._thread = threading.Thread(target=self._serve, name="fault-channel",
                                        daemon=True)

    def start(self) -> FaultServer:
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop accepting and remove the socket file (requests being applied finish)."""
        with self._after_lock:
            self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self._sock.close()
        with contextlib.suppress(FileNotFoundError):
            if stat.S_ISSOCK(os.lstat(self.path).st_mode):
                os.unlink(self.path)

    def __enter__(self) -> FaultServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError as exc:  # e.g. out of file descriptors: keep serving
                if self._stop.is_set():
                    return
                log.warning("fault channel: accept: %s", exc)
                self._stop.wait(0.1)
                continue
            conn.settimeout(self.read_timeout_s)
            if not self._slots.acquire(blocking=False):
                with conn, contextlib.suppress(OSError):
                    _send(conn, _error("busy", "", f"{MAX_CLIENTS} fault requests already "
                                       "running; try again when one has finished"))
                continue
            threading.Thread(target=self._handle, args=(conn,), name="fault-request",
                             daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        try:
            with conn:
                if not _peer_allowed(conn):
                    _send(conn, _error("input", "", "only root or the run's own user may "
                                       "inject faults"))
                    return
                _send(conn, self._answer(conn))
        except OSError as exc:  # the client went away; the fault (if any) is recorded
            log.info("fault channel: %s", exc)
        except Exception as exc:  # answer, log, and go on serving the next request
            log.exception("fault channel: request failed")
            with contextlib.suppress(OSError):
                _send(conn, _error("runtime", "", f"internal error: {type(exc).__name__}"))
        finally:
            self._slots.release()

    def _answer(self, conn: socket.socket) -> dict[str, Any]:
        try:
            ev = parse_request(_read_line(conn, MAX_REQUEST_BYTES), self.scenario)
        except TimeoutError:
            return _error("input", "request",
                          f"no complete line within {self.read_timeout_s:g} s")
        except InputError as exc:
            return _error("input", exc.path, exc.message)
        try:
            row = self.apply(ev)
        except (TimeoutError, RuntimeFailure) as exc:
            return _error("runtime", "", str(exc))
        except Exception as exc:  # a bug must not leave the client without an answer
            log.exception("fault channel: %s", ev.kind)
            return _error("runtime", "", f"internal error applying {ev.kind}: "
                          f"{type(exc).__name__}: {exc}")
        self.served += 1
        with self._after_lock:
            if self.after is not None and not self._stop.is_set():
                try:
                    self.after(row)
                except Exception as exc:  # the fault is applied and recorded either way
                    log.warning("fault channel: after %s: %s", ev.kind, exc)
        return {"ok": True, "row": row}


def _error(kind: str, field: str, message: str) -> dict[str, Any]:
    return {"ok": False, "error": {"type": kind, "field": field, "message": message}}


def _send(conn: socket.socket, reply: dict[str, Any]) -> None:
    conn.sendall(json.dumps(reply, default=str).encode() + b"\n")


def _read_line(conn: socket.socket, limit: int) -> bytes:
    """One line (without its newline), at most `limit` bytes; InputError beyond that
    (TimeoutError when it does not come within the socket's timeout)."""
    buf = bytearray()
    while b"\n" not in buf:
        chunk = conn.recv(min(65536, limit + 1 - len(buf)))
        if not chunk:
            break
        buf += chunk
        if b"\n" not in buf and len(buf) > limit:
            raise InputError("request", f"over {limit} bytes")
    line = bytes(buf).split(b"\n", 1)[0]
    if len(line) > limit:
        raise InputError("request", f"over {limit} bytes")
    return line


def trusted_uids() -> tuple[int, int]:
    """Who may be on the other end of the channel: root and this process's user."""
    return (0, os.geteuid())


def peer_uid(conn: socket.socket) -> int:
    """The user the process at the other end of a connected Unix socket runs as (the
    kernel's SO_PEERCRED, taken when it called connect or listen)."""
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return int(uid)


def _peer_allowed(conn: socket.socket) -> bool:
    """The connecting process runs as root or as this process's user (SO_PEERCRED)."""
    return peer_uid(conn) in trusted_uids()


def check_socket_file(path: str | Path) -> None:
    """RuntimeFailure unless `path` is a Unix socket itself (not a link to one) owned by
    root or this user: a network.json must not send us to another user's server."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise RuntimeFailure("the held run is gone (no fault channel at "
                             f"{path}); is `lightpipe emu --hold` still running?") from None
    except OSError as exc:
        raise RuntimeFailure(f"cannot use the fault channel {path}: {exc.strerror}") from None
    if not stat.S_ISSOCK(st.st_mode):
        raise RuntimeFailure(f"{path} is not a socket (a link or a file): refused")
    if st.st_uid not in trusted_uids():
        raise RuntimeFailure(f"{path} is owned by uid {st.st_uid}, not by root or you: "
                             "refused")


def _bind_private(path: Path) -> socket.socket:
    """A listening Unix socket at `path`, mode 0600 from the moment it appears: bound
    in a private directory beside it, then renamed into place."""
    if len(os.fsencode(path)) > SUN_PATH_MAX:
        raise RuntimeFailure(f"fault channel path too long for a Unix socket: {path}")
    with contextlib.suppress(FileNotFoundError):
        if not stat.S_ISSOCK(os.lstat(path).st_mode):
            raise RuntimeFailure(f"{path} exists and is not a socket")
        os.unlink(path)  # a dead run's socket of the same state directory
    private = Path(tempfile.mkdtemp(prefix=".fsock-", dir=path.parent))  # mode 0700
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        tmp = private / "s"
        sock.bind(str(tmp))
        os.chmod(tmp, 0o600)
        os.rename(tmp, path)
    except BaseException:
        sock.close()
        raise
    finally:
        with contextlib.suppress(OSError):
            for p in private.iterdir():
                p.unlink()
            private.rmdir()
    return sock


def request_fault(path: str | Path, request: dict[str, Any], timeout_s: float
                  ) -> dict[str, Any]:
    """Send one request to a held run's channel; its `faults` row. InputError (the field)
    for a request the run refuses, RuntimeFailure when the run is gone or could not
    apply it."""
    line = json.dumps(request).encode() + b"\n"
    if len(line) > MAX_REQUEST_BYTES:
        raise InputError("request", f"over {MAX_REQUEST_BYTES} bytes")
    if not (math.isfinite(timeout_s) and 0 < timeout_s <= threading.TIMEOUT_MAX):
        raise ValueError(f"timeout_s must be in (0, {threading.TIMEOUT_MAX:g}], got "
                         f"{timeout_s!r}")
    check_socket_file(path)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout_s)
        try:
            sock.connect(str(path))
        except (FileNotFoundError, ConnectionRefusedError):
            raise RuntimeFailure("the held run is gone (no fault channel at "
                                 f"{path}); is `lightpipe emu --hold` still running?"
                                 ) from None
        except PermissionError:
            raise RuntimeFailure(f"no permission to use {path} (the held run's fault "
                                 "channel is root only)") from None
        uid = peer_uid(sock)  # who serves it (a socket file can be swapped after lstat)
        if uid not in trusted_uids():
            raise RuntimeFailure(f"the fault channel {path} is served by uid {uid}, not by "
                                 "root or you: refused (nothing was sent)")
        try:
            sock.sendall(line)
        except (BrokenPipeError, ConnectionResetError):
            pass  # a busy run answers and closes before it reads: its answer is still there
        try:
            raw = _read_line(sock, MAX_RESPONSE_BYTES)
        except TimeoutError:
            raise RuntimeFailure(f"no answer from the held run within {timeout_s:g} s (the "
                                 "fault may still be running; its row goes into the "
                                 "run's summary.json)") from None
        except InputError as exc:
            raise RuntimeFailure(f"bad answer from the held run: {exc.message}") from None
    if not raw:
        raise RuntimeFailure("the held run closed the fault channel without answering "
                             "(did it end?)")
    try:
        reply = json.loads(raw, parse_constant=_no_constant)
    except (ValueError, RecursionError):
        raise RuntimeFailure("the held run answered something that is not JSON") from None
    if not isinstance(reply, dict):
        raise RuntimeFailure("the held run answered something that is not a JSON object")
    if reply.get("ok"):
        row = reply.get("row")
        if not isinstance(row, dict):
            raise RuntimeFailure("the held run answered without a faults row")
        return row
    err = reply.get("error")
    err = err if isinstance(err, dict) else {}
    message = _shown(err.get("message", "refused"))
    if err.get("type") == "input":
        raise InputError(_shown(err.get("field", "")), message)
    raise RuntimeFailure(_shown(err.get("message", "the held run could not apply the "
                                        "fault")))


def _shown(value: object) -> str:
    """A string from the reply, made safe for one terminal line and cut short."""
    from testbed.io.terminal import safe_line

    return safe_line(str(value)[:MAX_MESSAGE_CHARS])
