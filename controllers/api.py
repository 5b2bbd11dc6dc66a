"""Northbound REST API (JSON over HTTP, threaded server, optional bearer token, OpenAPI).

Runs in its own threads inside the controller process and calls `ControllerCore`.
Every error is a JSON `{"error": "..."}` with a 4xx status; handler exceptions never
reach the server loop.
"""

from __future__ import annotations

import hmac
import json
import logging
import re
import socket
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from controllers.core import ControllerCore, RequestError
from controllers.jobs import JobService
from controllers.layout import Layout
from testbed.spec.models import SPECTRUM_POLICIES

log = logging.getLogger("lightpipe.controller.api")

MAX_BODY_BYTES = 1 << 20
API_VERSION = "1"


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class LightpathRequest(_Body):
    """POST /lightpaths: a lightpath between two DCs, by bitrate or by slot count."""

    src_dc: Annotated[str, Field(min_length=1, max_length=64)]
    dst_dc: Annotated[str, Field(min_length=1, max_length=64)]
    bitrate_gbps: Annotated[float, Field(gt=0, le=1e6, allow_inf_nan=False)] | None = None
    slots: Annotated[int, Field(ge=1, le=4096)] | None = None
    policy: Literal["first_fit", "last_fit", "random_fit", "best_fit"] | None = Field(
        default=None, description="spectrum policy (default: the scenario's)")
    src_host: str | None = Field(default=None, description="carry only this host pair")
    dst_host: str | None = None
    vid: Annotated[int, Field(ge=2, le=4094)] | None = Field(
        default=None, description="ask for this VLAN id (default: the lowest free one)")


class FibreEvent(_Body):
    """POST /failures (cut) or POST /repairs: a fibre by its two end nodes."""

    link: Annotated[list[str], Field(min_length=2, max_length=2)]


class JobRequest(_Body):
    """POST /jobs: place a pipeline job with a named policy and set up its lightpaths."""

    model: Annotated[str, Field(min_length=1, max_length=64)]
    stages: Annotated[int, Field(ge=1, le=1024)] = 4
    gpus_per_stage: Annotated[int, Field(ge=1, le=65_536)] = 8
    microbatches: Annotated[int, Field(ge=1, le=100_000)] = 8
    iterations: Annotated[int, Field(ge=1)] = 100
    policy: str | None = Field(default=None, description="placement policy "
                               "(default: the scenario's policy.placement)")
    schedule: Literal["gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "crosspipe-greedy",
                      "crosspipe-opt", "geopipe"] | None = Field(
        default=None, description="pipeline schedule (default: the scenario's)")
    max_stages_per_dc: Annotated[int, Field(ge=1, le=1024)] | None = Field(
        default=None, description="most stages of this job in one DC (default: the "
        "scenario's workload.max_stages_per_dc, as in the simulator)")


class RoutingJobRequest(_Body):
    """POST /routing/jobs: a ring all-reduce job whose flows the controller routes."""

    members: Annotated[list[Annotated[str, Field(min_length=1, max_length=64)]],
                       Field(min_length=2, max_length=256)] = Field(
        description="host names in ring order (member i sends to member i+1)")
    buffer_bytes: Annotated[int, Field(ge=1, le=1 << 40)] = Field(
        default=1 << 20, description="all-reduced bytes (flow demand: 2 (n-1)/n of it)")


class RoutingPolicyRequest(_Body):
    """PUT /routing: the policy that routes every registered flow (re-routes at once)."""

    policy: Annotated[str, Field(min_length=1, max_length=32)]


def _error_text(exc: ValidationError) -> str:
    e = exc.errors()[0]
    loc = ".".join(str(x) for x in e["loc"]) or "body"
    return f"{loc}: {e['msg']}"


class RestApi:
    """Route table + server; `serve()` starts it in a daemon thread."""

    def __init__(self, core: ControllerCore, host: str = "127.0.0.1", port: int = 8080,
                 token: str | None = None, jobs: JobService | None = None,
                 on_layout: Callable[[Layout], None] | None = None,
                 sock: socket.socket | None = None) -> None:
        self.core = core
        self.token = token
        self.jobs = jobs if jobs is not None else JobService(core)
        self.on_layout = on_layout or core.set_layout
        self.started_s = time.time()
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            server_version = "lightpipe-controller"

            def log_message(self, fmt: str, *args: Any) -> None:
                log.debug("%s " + fmt, self.address_string(), *args)

            def do_GET(self) -> None:
                api.handle(self, "GET")

            def do_POST(self) -> None:
                api.handle(self, "POST")

            def do_PUT(self) -> None:
                api.handle(self, "PUT")

            def do_DELETE(self) -> None:
                api.handle(self, "DELETE")

        if sock is None:
            self.server = ThreadingHTTPServer((host, port), Handler)
        else:  # a socket bound and listening already (e.g. in another network namespace)
            self.server = ThreadingHTTPServer(sock.getsockname()[:2], Handler,
                                              bind_and_activate=False)
            self.server.socket.close()
            self.server.socket = sock
            self.server.server_address = sock.getsockname()[:2]
        self.server.daemon_threads = True
        self.thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    def serve(self) -> None:
        self.thread = threading.Thread(target=self.server.serve_forever, name="rest-api",
                                       daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    # ---- dispatch ------------------------------------------------------------------
    ROUTES: ClassVar[list[tuple[str, re.Pattern[str], str]]] = [
        ("GET", re.compile(r"^/health$"), "health"),
        ("GET", re.compile(r"^/openapi\.json$"), "openapi"),
        ("GET", re.compile(r"^/metrics$"), "metrics"),
        ("GET", re.compile(r"^/topology$"), "topology"),
        ("GET", re.compile(r"^/spectrum$"), "spectrum"),
        ("GET", re.compile(r"^/lightpaths$"), "list_lightpaths"),
        ("POST", re.compile(r"^/lightpaths$"), "create_lightpath"),
        ("GET", re.compile(r"^/lightpaths/(\d{1,9})$"), "get_lightpath"),
        ("DELETE", re.compile(r"^/lightpaths/(\d{1,9})$"), "delete_lightpath"),
        ("POST", re.compile(r"^/failures$"), "cut"),
        ("POST", re.compile(r"^/repairs$"), "repair"),
        ("GET", re.compile(r"^/jobs$"), "list_jobs"),
        ("POST", re.compile(r"^/jobs$"), "create_job"),
        ("GET", re.compile(r"^/jobs/(\d{1,9})$"), "get_job"),
        ("DELETE", re.compile(r"^/jobs/(\d{1,9})$"), "delete_job"),
        ("GET", re.compile(r"^/routing$"), "get_routing"),
        ("PUT", re.compile(r"^/routing$"), "put_routing"),
        ("POST", re.compile(r"^/routing/jobs$"), "create_routing_job"),
        ("DELETE", re.compile(r"^/routing/jobs/(\d{1,9})$"), "delete_routing_job"),
        ("GET", re.compile(r"^/layout$"), "get_layout"),
        ("PUT", re.compile(r"^/layout$"), "put_layout"),
    ]
    OPEN: ClassVar[set[str]] = {"health", "openapi", "metrics"}

    def handle(self, h: BaseHTTPRequestHandler, method: str) -> None:
        try:
            status, body = self._dispatch(h, method)
        except RequestError as exc:
            status, body = exc.status, {"error": exc.message}
            if exc.reason:
                body["reason"] = exc.reason
        except Exception as exc:  # never let a request kill the server thread
            log.exception("REST %s %s failed", method, h.path)
            status, body = 500, {"error": f"internal error: {type(exc).__name__}: {exc}"}
        if isinstance(body, bytes):
            payload, ctype = body, "text/plain; version=0.0.4; charset=utf-8"
        else:
            payload, ctype = json.dumps(body).encode(), "application/json"
        try:
            h.send_response(status)
            h.send_header("Content-Type", ctype)
            h.send_header("Content-Length", str(len(payload)))
            h.end_headers()
            h.wfile.write(payload)
        except OSError:  # client went away
            pass

    def _dispatch(self, h: BaseHTTPRequestHandler, method: str) -> tuple[int, Any]:
        path = h.path.split("?", 1)[0]
        allowed = []
        for m, rx, name in self.ROUTES:
            match = rx.match(path)
            if not match:
                continue
            allowed.append(m)
            if m != method:
                continue
            if name not in self.OPEN:
                self._auth(h)
            raw = self._body(h) if method in ("POST", "PUT") else None
            if method not in ("POST", "PUT"):
                self._drain(h)
            return getattr(self, "_" + name)(raw, *match.groups())
        self._drain(h)
        if allowed:
            raise RequestError(405, f"{method} not allowed on {path} "
                               f"(allowed: {', '.join(allowed)})")
        raise RequestError(404, f"no such resource {path!r} (see GET /openapi.json)")

    def _auth(self, h: BaseHTTPRequestHandler) -> None:
        if not self.token:
            return
        got = h.headers.get("Authorization", "")
        if not hmac.compare_digest(got.encode(), f"Bearer {self.token}".encode()):
            self._drain(h)
            raise RequestError(401, "missing or wrong bearer token")

    @staticmethod
    def _drain(h: BaseHTTPRequestHandler) -> None:
        n = h.headers.get("Content-Length")
        if n and n.isdigit() and 0 < int(n) <= MAX_BODY_BYTES:
            h.rfile.read(int(n))
        elif n:
            h.close_connection = True

    @staticmethod
    def _body(h: BaseHTTPRequestHandler) -> Any:
        n = h.headers.get("Content-Length")
        if n is None or not n.isdigit():
            h.close_connection = True
            raise RequestError(411, "a JSON body with Content-Length is required")
        if int(n) > MAX_BODY_BYTES:
            h.close_connection = True
            raise RequestError(413, f"body larger than {MAX_BODY_BYTES} bytes")
        data = h.rfile.read(int(n))
        try:
            return json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise RequestError(400, f"body is not valid JSON: {exc}") from None

    @staticmethod
    def _parse(model: type[BaseModel], raw: Any) -> Any:
        if not isinstance(raw, dict):
            raise RequestError(400, "body must be a JSON object")
        try:
            return model.model_validate(raw)
        except ValidationError as exc:
            raise RequestError(422, _error_text(exc)) from None

    # ---- handlers --------------------------------------------------------------------
    def _health(self, _raw: Any) -> tuple[int, Any]:
        c = self.core
        return 200, {"status": "ok", "lightpaths": len(c.rows), "layout": c.layout is not None,
                     "switches": sorted(getattr(c, "connected", set())),
                     "synced": sorted(getattr(c, "synced", set())),
                     "uptime_s": round(time.time() - self.started_s, 3)}

    def _openapi(self, _raw: Any) -> tuple[int, Any]:
        return 200, openapi_document()

    def _metrics(self, _raw: Any) -> tuple[int, Any]:
        return 200, self.core.metrics.exposition()

    def _topology(self, _raw: Any) -> tuple[int, Any]:
        return 200, self.core.topology()

    def _spectrum(self, _raw: Any) -> tuple[int, Any]:
        return 200, {"fibres": self.core.spectrum()}

    def _list_lightpaths(self, _raw: Any) -> tuple[int, Any]:
        return 200, {"lightpaths": self.core.lightpaths()}

    def _create_lightpath(self, raw: Any) -> tuple[int, Any]:
        req = self._parse(LightpathRequest, raw)
        return 201, self.core.request(req.src_dc, req.dst_dc, bitrate_gbps=req.bitrate_gbps,
                                      slots=req.slots, policy=req.policy,
                                      src_host=req.src_host, dst_host=req.dst_host,
                                      vid=req.vid)

    def _get_lightpath(self, _raw: Any, lp_id: str) -> tuple[int, Any]:
        return 200, self.core.lightpath(int(lp_id))

    def _delete_lightpath(self, _raw: Any, lp_id: str) -> tuple[int, Any]:
        return 200, self.core.delete(int(lp_id))

    def _cut(self, raw: Any) -> tuple[int, Any]:
        ev = self._parse(FibreEvent, raw)
        return 200, self.core.fail_fibre(*ev.link).to_dict()

    def _repair(self, raw: Any) -> tuple[int, Any]:
        ev = self._parse(FibreEvent, raw)
        self.core.repair_fibre(*ev.link)
        return 200, {"fibre": ev.link, "failed": False}

    def _list_jobs(self, _raw: Any) -> tuple[int, Any]:
        return 200, {"jobs": self.jobs.list()}

    def _create_job(self, raw: Any) -> tuple[int, Any]:
        req = self._parse(JobRequest, raw)
        return 201, self.jobs.place(req)

    def _get_job(self, _raw: Any, job_id: str) -> tuple[int, Any]:
        return 200, self.jobs.get(int(job_id))

    def _delete_job(self, _raw: Any, job_id: str) -> tuple[int, Any]:
        return 200, self.jobs.remove(int(job_id))

    def _get_routing(self, _raw: Any) -> tuple[int, Any]:
        return 200, self.core.routing_view()

    def _put_routing(self, raw: Any) -> tuple[int, Any]:
        req = self._parse(RoutingPolicyRequest, raw)
        return 200, self.core.routing_call("set_policy", req.policy)

    def _create_routing_job(self, raw: Any) -> tuple[int, Any]:
        req = self._parse(RoutingJobRequest, raw)
        return 201, self.core.routing_call("register", req.members, req.buffer_bytes)

    def _delete_routing_job(self, _raw: Any, job_id: str) -> tuple[int, Any]:
        return 200, self.core.routing_call("unregister", int(job_id))

    def _get_layout(self, _raw: Any) -> tuple[int, Any]:
        ix = self.core.layout
        if ix is None:
            raise RequestError(404, "no layout yet (PUT /layout or --layout FILE)")
        return 200, ix.layout.model_dump()

    def _put_layout(self, raw: Any) -> tuple[int, Any]:
        if not isinstance(raw, dict):
            raise RequestError(400, "body must be a JSON object")
        try:
            layout = Layout.model_validate(raw)
        except ValidationError as exc:
            raise RequestError(422, _error_text(exc)) from None
        try:
            self.on_layout(layout)
        except ValueError as exc:
            raise RequestError(422, str(exc)) from None
        return 200, {"switches": len(layout.switches), "hosts": len(layout.hosts)}


def openapi_document() -> dict[str, Any]:
    """OpenAPI 3.0 description of the REST API (served at GET /openapi.json)."""
    def schema(model: type[BaseModel]) -> dict[str, Any]:
        return model.model_json_schema(ref_template="#/components/schemas/{model}")

    def body(name: str) -> dict[str, Any]:
        return {"required": True, "content": {"application/json": {
            "schema": {"$ref": f"#/components/schemas/{name}"}}}}

    err = {"description": "error", "content": {"application/json": {"schema": {
        "type": "object", "properties": {"error": {"type": "string"},
                                         "reason": {"type": "string"}}}}}}
    ok = {"description": "OK (JSON)"}
    bad = {"400": err, "401": err, "404": err, "409": err, "422": err}
    lp_id = [{"name": "id", "in": "path", "required": True, "schema": {"type": "integer"}}]
    paths: dict[str, Any] = {
        "/health": {"get": {"summary": "liveness and counts", "security": [],
                            "responses": {"200": ok}}},
        "/openapi.json": {"get": {"summary": "this document", "security": [],
                                  "responses": {"200": ok}}},
        "/metrics": {"get": {"summary": "Prometheus metrics (text format)", "security": [],
                             "responses": {"200": {"description": "text exposition"}}}},
        "/topology": {"get": {"summary": "nodes, fibres (with failed state), DCs, hosts",
                              "responses": {"200": ok}}},
        "/spectrum": {"get": {"summary": "slot occupancy per fibre", "responses": {"200": ok}}},
        "/lightpaths": {
            "get": {"summary": "live lightpaths", "responses": {"200": ok}},
            "post": {"summary": "set up a lightpath (route, slots, modulation, capacity, "
                     "VLAN id in the reply); 409 when blocked",
                     "requestBody": body("LightpathRequest"),
                     "responses": {"201": ok, **bad}}},
        "/lightpaths/{id}": {
            "get": {"summary": "one lightpath", "parameters": lp_id,
                    "responses": {"200": ok, "404": err}},
            "delete": {"summary": "tear a lightpath down", "parameters": lp_id,
                       "responses": {"200": ok, "404": err}}},
        "/failures": {"post": {"summary": "cut a fibre: re-route its lightpaths or drop them",
                               "requestBody": body("FibreEvent"),
                               "responses": {"200": ok, **bad}}},
        "/repairs": {"post": {"summary": "repair a fibre", "requestBody": body("FibreEvent"),
                              "responses": {"200": ok, **bad}}},
        "/jobs": {
            "get": {"summary": "placed pipeline jobs", "responses": {"200": ok}},
            "post": {"summary": "place a pipeline job and set up its lightpaths",
                     "requestBody": body("JobRequest"), "responses": {"201": ok, **bad}}},
        "/jobs/{id}": {"get": {"summary": "one placed job (its lightpaths as they are now)",
                               "parameters": lp_id, "responses": {"200": ok, "404": err}},
                       "delete": {"summary": "remove a job (frees GPUs and lightpaths)",
                                  "parameters": lp_id, "responses": {"200": ok, "404": err}}},
        "/routing": {
            "get": {"summary": "flow routing: policy, jobs, per-flow paths and rates, failed "
                    "fabric links, last re-route; `wan`: which lightpath each cross-DC "
                    "job flow takes",
                    "responses": {"200": ok}},
            "put": {"summary": "choose the flow routing policy (re-routes every flow)",
                    "requestBody": body("RoutingPolicyRequest"),
                    "responses": {"200": ok, **bad}}},
        "/routing/jobs": {"post": {"summary": "register a ring all-reduce job (its flows "
                                   "are routed and installed)",
                                   "requestBody": body("RoutingJobRequest"),
                                   "responses": {"201": ok, **bad}}},
        "/routing/jobs/{id}": {"delete": {"summary": "unregister a job (re-routes the rest)",
                                          "parameters": lp_id,
                                          "responses": {"200": ok, "404": err}}},
        "/layout": {
            "get": {"summary": "the data-plane layout", "responses": {"200": ok}},
            "put": {"summary": "set the data-plane layout and program the switches",
                    "requestBody": body("Layout"), "responses": {"200": ok, **bad}}},
    }
    schemas: dict[str, Any] = {}
    for model in (LightpathRequest, FibreEvent, JobRequest, RoutingJobRequest,
                  RoutingPolicyRequest, Layout):
        s = schema(model)
        schemas.update(s.pop("$defs", {}))
        schemas[model.__name__] = s
    return {"openapi": "3.0.3",
            "info": {"title": "LightPipe SDN controller", "version": API_VERSION,
                     "description": "Lightpaths with routing and spectrum assignment "
                     f"(policies: {', '.join(SPECTRUM_POLICIES)}), restoration, jobs."},
            "servers": [{"url": "/"}],
            "components": {"schemas": schemas, "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer"}}},
            "security": [{"bearer": []}],
            "paths": paths}
