"""ASGI guard in front of the REST API: Host/Origin, bearer token, bounded JSON-only bodies.

Runs before any routing or parsing, so a hostile request is refused cheaply and with a
documented 4xx, never a 500:
    Host not the bound address or localhost      400 (missing) / 421
    mutating request (POST/PUT/DELETE/PATCH) with a foreign Origin or
    Sec-Fetch-Site: cross-site                    403 (a browser's cross-site request)
    no/wrong `Authorization: Bearer` (every path but OPEN_PATHS)            401
    a body that is not Content-Type application/json                         415
    a body over MAX_BODY_BYTES                                               413
    a body that does not arrive within BODY_TIMEOUT_S                        408
    invalid UTF-8/JSON, nesting deeper than MAX_JSON_DEPTH, an integer longer than
    MAX_INT_DIGITS digits, NaN/Infinity, or not a JSON object                 400
The body, once checked, is handed on unchanged. Before a refusal is sent, what is left of
the request body is read and dropped (up to DRAIN_BYTES or DRAIN_S): closing a socket
with unread data makes the kernel send a reset, and the client would see "connection
reset" instead of the answer (the lingering close of web servers). `HeaderTimeoutH11`
(the server's HTTP protocol) closes a connection whose request headers do not arrive within
HEADER_TIMEOUT_S (uvicorn's own time-out covers idle keep-alive connections only).
"""

from __future__ import annotations

import asyncio
import hmac
import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import urlsplit

from uvicorn.protocols.http.h11_impl import H11Protocol

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

MAX_BODY_BYTES = 1 << 20
MAX_JSON_DEPTH = 32
MAX_INT_DIGITS = 24  # a dpid is < 2**64 (20 digits)
BODY_TIMEOUT_S = 10.0
HEADER_TIMEOUT_S = 10.0
DRAIN_BYTES = 8 * MAX_BODY_BYTES  # read and dropped at most, before a refusal
DRAIN_S = 2.0
OPEN_PATHS = frozenset({("GET", "/health"), ("GET", "/openapi.json"), ("GET", "/metrics")})
MUTATING = frozenset({"POST", "PUT", "DELETE", "PATCH"})
WITH_BODY = frozenset({"POST", "PUT", "PATCH"})
LOCAL_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})


class Refused(Exception):
    """A request the guard answers itself."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def json_depth(text: str) -> int:
    """Deepest [ / { nesting in JSON text (strings skipped), without recursion."""
    depth = deepest = 0
    in_str = esc = False
    for ch in text:
        if in_str:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


def _int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise Refused(400, f"integer with more than {MAX_INT_DIGITS} digits")
    return int(text)


def _constant(text: str) -> Any:
    raise Refused(400, f"{text} is not a JSON number")


def parse_body(data: bytes) -> dict[str, Any]:
    """The JSON object in a request body, or Refused(400) saying why not."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Refused(400, f"body is not valid JSON: not UTF-8 ({exc.reason})") from None
    if json_depth(text) > MAX_JSON_DEPTH:
        raise Refused(400, f"body nests deeper than {MAX_JSON_DEPTH} levels")
    try:
        value = json.loads(text, parse_int=_int, parse_constant=_constant)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise Refused(400, f"body is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise Refused(400, "body must be a JSON object")
    return value


def host_name(value: str) -> str:
    """The host part of a Host header ('[::1]:8080' -> '::1'), lower case."""
    return host_port(value)[0]


def host_port(value: str) -> tuple[str, int]:
    """(host, port) of a Host header or an origin's netloc; port 80 if not given, -1 if
    malformed."""
    try:
        parts = urlsplit("//" + value)
        return (parts.hostname or "").lower(), parts.port or 80
    except ValueError:
        return "", -1


def _origin(value: str) -> tuple[str, int]:
    """(host, port) of an Origin header; only http origins can be this server's."""
    try:
        parts = urlsplit(value)
    except ValueError:
        return "", -1
    if parts.scheme != "http":
        return "", -1
    return host_port(parts.netloc)


class Guard:
    """ASGI middleware that enforces the rules in the module docstring."""

    def __init__(self, app: App, token: str, allowed_hosts: frozenset[str] | None) -> None:
        """allowed_hosts: host names a request may address (None: any, for a wildcard
        bind, where the token still guards everything but OPEN_PATHS)."""
        if not token:
            raise ValueError("the REST API needs a bearer token")
        self.app = app
        self.expected = f"Bearer {token}".encode()
        self.allowed_hosts = allowed_hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        done = False  # the request body has been read to its end

        async def tracked() -> Message:
            nonlocal done
            msg = await receive()
            done = done or msg["type"] != "http.request" or not msg.get("more_body")
            return msg

        try:
            checked = await self._check(scope, tracked)
        except Refused as exc:
            if not done and exc.status != 408 and scope["method"] in WITH_BODY:
                await _drain(tracked)
            await _reply(send, exc.status, exc.message)
            return
        receive = checked
        await self.app(scope, receive, send)

    async def _check(self, scope: Scope, receive: Receive) -> Receive:
        headers: dict[bytes, bytes] = {}
        for k, v in scope.get("headers", []):
            if k in headers and k in (b"host", b"authorization", b"content-length",
                                      b"content-type", b"origin"):
                raise Refused(400, f"header {k.decode()} given twice")
            headers[k] = v
        method = scope["method"]
        host = headers.get(b"host")
        if not host:
            raise Refused(400, "a Host header is required")
        name = host_name(host.decode("latin-1"))
        if self.allowed_hosts is not None and name not in self.allowed_hosts:
            raise Refused(421, f"this server does not answer for host {name!r}")
        if method in MUTATING:
            origin = headers.get(b"origin")
            if origin is not None and origin != b"null" and (
                    _origin(origin.decode("latin-1")) != host_port(host.decode("latin-1"))):
                raise Refused(403, "cross-origin request refused")
            if origin == b"null" or headers.get(b"sec-fetch-site") == b"cross-site":
                raise Refused(403, "cross-site request refused")
        if (method, scope["path"]) not in OPEN_PATHS and not hmac.compare_digest(
                headers.get(b"authorization", b""), self.expected):
            raise Refused(401, "missing or wrong bearer token")
        length = headers.get(b"content-length")
        if length is not None and not length.isdigit():
            raise Refused(400, "bad Content-Length")
        if length is not None and int(length) > MAX_BODY_BYTES:
            raise Refused(413, f"body larger than {MAX_BODY_BYTES} bytes")
        if method not in WITH_BODY:
            return receive
        ctype = headers.get(b"content-type", b"").split(b";")[0].strip().lower()
        if ctype != b"application/json":
            raise Refused(415, "the body must be JSON (Content-Type: application/json)")
        body = await _read(receive)
        parse_body(body)
        return _replay(body, receive)


async def _read(receive: Receive) -> bytes:
    chunks: list[bytes] = []
    size = 0
    more = True
    loop = asyncio.get_running_loop()
    deadline = loop.time() + BODY_TIMEOUT_S
    while more:
        try:
            msg = await asyncio.wait_for(receive(), max(0.0, deadline - loop.time()))
        except TimeoutError:
            raise Refused(408, f"body not received within {BODY_TIMEOUT_S:.0f} s") from None
        if msg["type"] == "http.disconnect":
            raise Refused(400, "client went away")
        chunk = msg.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise Refused(413, f"body larger than {MAX_BODY_BYTES} bytes")
        chunks.append(chunk)
        more = bool(msg.get("more_body"))
    return b"".join(chunks)


async def _drain(receive: Receive) -> None:
    """Read and drop the rest of a refused request's body (bounded in bytes and time)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DRAIN_S
    size = 0
    while size <= DRAIN_BYTES:
        try:
            msg = await asyncio.wait_for(receive(), max(0.0, deadline - loop.time()))
        except TimeoutError:
            return
        if msg["type"] != "http.request":
            return
        size += len(msg.get("body", b""))
        if not msg.get("more_body"):
            return


def _replay(body: bytes, rest: Receive) -> Receive:
    """receive() that gives the checked body once, then the connection's own messages."""
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await rest()

    return receive


async def _reply(send: Send, status: int, message: str) -> None:
    payload = json.dumps({"error": message}).encode()
    headers = [(b"content-type", b"application/json"),
               (b"content-length", str(len(payload)).encode()), (b"connection", b"close")]
    if status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})


class HeaderTimeoutH11(H11Protocol):
    """uvicorn's h11 protocol, closing a connection that is waiting for request headers
    for longer than HEADER_TIMEOUT_S (a slow client holds a socket, not forever)."""

    header_timeout_s: float = HEADER_TIMEOUT_S
    _header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def _waiting_for_headers(self) -> bool:
        return self.cycle is None or self.cycle.response_complete

    def _arm(self) -> None:
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(self.header_timeout_s, self._expire)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _expire(self) -> None:
        self._header_timer = None
        if self._waiting_for_headers():
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._waiting_for_headers():
            self._arm()
        else:
            self._disarm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)
