"""Northbound REST API: FastAPI on uvicorn, in its own thread inside the controller process.

Each route stands next to its handler with typed request and response models; FastAPI
derives GET /openapi.json from them, so the document cannot drift from the code. In
front of the app, `controllers.apiguard.Guard` enforces Host/Origin, the bearer token
(always set: every path but /health, /openapi.json and /metrics needs it), JSON-only
bounded bodies. Every error is a JSON `{"error": "..."}` (plus `reason` where the
controller has one) with a 4xx status; handlers run in uvicorn's worker threads and call
`ControllerCore` (which takes its own lock).
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import socket
import threading
import time
from collections.abc import Callable
from typing import Annotated, Any, Literal

import uvicorn
from fastapi import FastAPI, Path, Request, Security
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, ConfigDict, Field, model_validator
from starlette.exceptions import HTTPException

from controllers.apiguard import HEADER_TIMEOUT_S, LOCAL_NAMES, Guard, HeaderTimeoutH11
from controllers.core import ControllerCore
from controllers.errors import RequestError
from controllers.jobs import JobService
from controllers.layout import Layout
from testbed.spec.models import SPECTRUM_POLICIES

log = logging.getLogger("lightpipe.controller.api")

API_VERSION = "2"
LISTEN_BACKLOG = 2048
KEEP_ALIVE_TIMEOUT_S = 5
MAX_HEADER_BYTES = 16 * 1024
MAX_ID = 999_999_999


BEARER = HTTPBearer(auto_error=False, description="the token in the controller's token "
                    "file (--token-file, or DB.token)")
LpId = Annotated[int, Path(ge=0, le=MAX_ID, description="lightpath id")]
JobId = Annotated[int, Path(ge=0, le=MAX_ID, description="job id")]


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
    src_host: Annotated[str, Field(max_length=64)] | None = Field(
        default=None, description="carry only this host pair")
    dst_host: Annotated[str, Field(max_length=64)] | None = None
    vid: Annotated[int, Field(ge=2, le=4094)] | None = Field(
        default=None, description="ask for this VLAN id (default: the lowest free one)")


class FibreEvent(_Body):
    """POST /failures or POST /repairs: a fibre by its two end nodes (cut / repair), or
    with `first_slot` and `slots` a block of its slots (wavelength loss / repair)."""

    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra={
        "dependentRequired": {"first_slot": ["slots"], "slots": ["first_slot"]}})

    link: Annotated[list[Annotated[str, Field(max_length=64)]],
                    Field(min_length=2, max_length=2)]
    first_slot: Annotated[int, Field(ge=0, le=4095)] | None = Field(
        default=None, description="wavelength loss / repair: first slot of the block "
        "(with `slots`; 400 if the block leaves the fibre's grid)")
    slots: Annotated[int, Field(ge=1, le=4096)] | None = Field(
        default=None, description="wavelength loss / repair: how many slots")

    @model_validator(mode="after")
    def _both(self) -> FibreEvent:
        if (self.first_slot is None) != (self.slots is None):
            raise ValueError("give both first_slot and slots, or neither")
        return self


class JobRequest(_Body):
    """POST /jobs: place a pipeline job with a named policy and set up its lightpaths."""

    model: Annotated[str, Field(min_length=1, max_length=64)]
    stages: Annotated[int, Field(ge=1, le=1024)] = 4
    gpus_per_stage: Annotated[int, Field(ge=1, le=65_536)] = 8
    microbatches: Annotated[int, Field(ge=1, le=100_000)] = 8
    iterations: Annotated[int, Field(ge=1, le=10**9)] = 100
    policy: Annotated[str, Field(max_length=64)] | None = Field(
        default=None, description="placement policy (default: the scenario's "
        "policy.placement)")
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


# ---- replies (documented in /openapi.json; extra keys pass through) -----------------------
class _Reply(BaseModel):
    model_config = ConfigDict(extra="allow")


class ErrorReply(BaseModel):
    """Every 4xx: what was wrong, and for a blocked request the reason code."""

    error: str
    reason: str | None = None


class Health(_Reply):
    status: Literal["ok"]
    lightpaths: int
    layout: bool
    switches: list[int]
    synced: list[int]
    uptime_s: float


class LightpathView(_Reply):
    """A lightpath: route, spectrum, modulation, capacity, VLAN id."""

    id: int
    vid: int
    src_dc: str
    dst_dc: str
    src_host: str | None = None
    dst_host: str | None = None
    bitrate_gbps: float | None = None
    slots_req: int | None = None
    policy: str
    nodes: list[str]
    first_slot: int
    n_slots: int
    modulation: str
    capacity_gbps: float
    job_id: int | None = None
    restored: int = 0
    fibres: list[list[str]]
    slots: list[int]
    length_km: float | None = None
    latency_ms: float | None = None
    setup_s: float | None = Field(default=None, description="set-up time (POST only)")


class LightpathList(_Reply):
    lightpaths: list[LightpathView]


class FibreSpectrum(_Reply):
    u: str
    v: str
    slots: int
    used: list[int]
    occupancy: str
    failed: bool
    lost_slots: list[int] = Field(default_factory=list, description="slots out of service "
                                  "(wavelength loss, until repaired)")


class Spectrum(_Reply):
    fibres: list[FibreSpectrum]


class Topology(_Reply):
    name: str
    nodes: list[str]
    fibres: list[dict[str, Any]]
    dcs: list[dict[str, Any]]
    slots: int
    k_paths: int
    hosts: list[dict[str, Any]]


class RestorationReply(_Reply):
    """A cut or a wavelength loss: lightpaths re-placed (`restored`) and dropped (`lost`),
    and the controller's time from the event until the new rules were installed."""

    fibre: list[str]
    restored: list[int]
    lost: list[int]
    restoration_s: float
    first_slot: int | None = Field(default=None, description="wavelength loss only")
    slots: int | None = Field(default=None, description="wavelength loss only")


class RepairReply(_Reply):
    """The fibre after the repair: still cut? and its slots still out of service."""

    fibre: list[str]
    failed: bool
    lost_slots: list[int] = Field(default_factory=list,
                                  description="slots of the fibre still out of service")
    first_slot: int | None = Field(default=None, description="wavelength repair only")
    slots: int | None = Field(default=None, description="wavelength repair only")


class JobList(_Reply):
    jobs: list[dict[str, Any]]


class LayoutReply(_Reply):
    switches: int
    hosts: int


ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorReply, "description": why} for code, why in (
        (400, "bad request (malformed JSON, bad value, Host missing)"),
        (401, "missing or wrong bearer token"),
        (403, "cross-site request"),
        (404, "no such resource"),
        (405, "method not allowed"),
        (408, "body not received in time"),
        (409, "blocked or conflicting (see `reason`)"),
        (413, "body too large"),
        (415, "body is not application/json"),
        (421, "Host is not this server"),
        (422, "the body does not fit the schema, or the state refuses it"),
        (503, "the controller cannot complete the request now"))}


def _error_text(exc: RequestValidationError) -> str:
    e = exc.errors()[0]
    loc = [str(x) for x in e.get("loc", ())]
    if loc and loc[0] == "body":
        loc = loc[1:]
    return f"{'.'.join(loc) or 'body'}: {e.get('msg', 'invalid')}"


def create_app(core: ControllerCore, jobs: JobService, token: str,
               on_layout: Callable[[Layout], None], started_s: float) -> FastAPI:
    """The FastAPI app: routes, models, error shape (without the Guard)."""
    app = FastAPI(
        title="LightPipe SDN controller", version=API_VERSION, docs_url=None, redoc_url=None,
        openapi_url="/openapi.json", responses=ERRORS,
        description="Lightpaths with routing and spectrum assignment (policies: "
        f"{', '.join(SPECTRUM_POLICIES)}), restoration, pipeline jobs, flow routing. "
        "Every path except /health, /openapi.json and /metrics needs "
        "`Authorization: Bearer <token>`; bodies are JSON objects.")
    expected = token

    def auth(cred: Annotated[HTTPAuthorizationCredentials | None, Security(BEARER)]) -> None:
        if cred is None or not hmac.compare_digest(cred.credentials.encode(),
                                                   expected.encode()):
            raise RequestError(401, "missing or wrong bearer token")

    guarded = [Security(auth)]

    @app.exception_handler(RequestError)
    async def _request_error(_req: Request, exc: RequestError) -> JSONResponse:
        body: dict[str, Any] = {"error": exc.message}
        if exc.reason:
            body["reason"] = exc.reason
        return JSONResponse(body, status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def _invalid(req: Request, exc: RequestValidationError) -> JSONResponse:
        if any(e.get("loc", ("",))[0] == "path" for e in exc.errors()):
            return JSONResponse({"error": f"no such resource {req.url.path!r}"}, 404)
        return JSONResponse({"error": _error_text(exc)}, 422)

    @app.exception_handler(HTTPException)
    async def _http(req: Request, exc: HTTPException) -> JSONResponse:
        if exc.status_code == 404:
            msg = f"no such resource {req.url.path!r} (see GET /openapi.json)"
        elif exc.status_code == 405:
            msg = f"{req.method} not allowed on {req.url.path}"
        else:
            msg = str(exc.detail)
        return JSONResponse({"error": msg}, exc.status_code, headers=exc.headers)

    @app.exception_handler(Exception)
    async def _internal(req: Request, exc: Exception) -> JSONResponse:
        log.exception("REST %s %s failed", req.method, req.url.path)
        return JSONResponse({"error": f"internal error: {type(exc).__name__}: {exc}"}, 500)

    # ---- open -------------------------------------------------------------------------
    @app.get("/health", summary="liveness and counts", response_model=Health)
    def health() -> dict[str, Any]:
        return {"status": "ok", "lightpaths": len(core.rows), "layout": core.layout is not None,
                "switches": sorted(getattr(core, "connected", set())),
                "synced": sorted(getattr(core, "synced", set())),
                "uptime_s": round(time.time() - started_s, 3)}

    @app.get("/metrics", summary="Prometheus metrics (text exposition format)",
             response_class=PlainTextResponse,
             responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}})
    def metrics() -> PlainTextResponse:
        return PlainTextResponse(core.metrics.exposition(),
                                 media_type="text/plain; version=0.0.4; charset=utf-8")

    # ---- optical state and lightpaths -----------------------------------------------------
    @app.get("/topology", summary="nodes, fibres (with failed state), DCs, hosts",
             response_model=Topology, dependencies=guarded)
    def topology() -> dict[str, Any]:
        return core.topology()

    @app.get("/spectrum", summary="slot occupancy per fibre", response_model=Spectrum,
             dependencies=guarded)
    def spectrum() -> dict[str, Any]:
        return {"fibres": core.spectrum()}

    @app.get("/lightpaths", summary="live lightpaths", response_model=LightpathList,
             response_model_exclude_unset=True, dependencies=guarded)
    def list_lightpaths() -> dict[str, Any]:
        return {"lightpaths": core.lightpaths()}

    @app.post("/lightpaths", status_code=201, response_model=LightpathView,
              response_model_exclude_unset=True,
              dependencies=guarded, summary="set up a lightpath (route, slots, modulation, "
              "capacity, VLAN id in the reply); 409 when blocked")
    def create_lightpath(req: LightpathRequest) -> dict[str, Any]:
        return core.request(req.src_dc, req.dst_dc, bitrate_gbps=req.bitrate_gbps,
                            slots=req.slots, policy=req.policy, src_host=req.src_host,
                            dst_host=req.dst_host, vid=req.vid)

    @app.get("/lightpaths/{id}", summary="one lightpath", response_model=LightpathView,
             response_model_exclude_unset=True,
             dependencies=guarded)
    def get_lightpath(id: LpId) -> dict[str, Any]:
        return core.lightpath(id)

    @app.delete("/lightpaths/{id}", summary="tear a lightpath down",
                response_model=LightpathView, response_model_exclude_unset=True,
                dependencies=guarded)
    def delete_lightpath(id: LpId) -> dict[str, Any]:
        return core.delete(id)

    @app.post("/failures", summary="cut a fibre, or with first_slot and slots lose a "
              "block of its slots: re-place the lightpaths it hits or drop them",
              response_model=RestorationReply, response_model_exclude_none=True,
              dependencies=guarded)
    def cut(ev: FibreEvent) -> dict[str, Any]:
        if ev.first_slot is not None and ev.slots is not None:
            return core.fail_slots(*ev.link, ev.first_slot, ev.slots).to_dict()
        return core.fail_fibre(*ev.link).to_dict()

    @app.post("/repairs", summary="repair a fibre, or with first_slot and slots a lost "
              "block of its slots", response_model=RepairReply,
              response_model_exclude_none=True, dependencies=guarded)
    def repair(ev: FibreEvent) -> dict[str, Any]:
        u, v = ev.link
        block: dict[str, int] = {}
        if ev.first_slot is not None and ev.slots is not None:
            core.repair_slots(u, v, ev.first_slot, ev.slots)
            block = {"first_slot": ev.first_slot, "slots": ev.slots}
        else:
            core.repair_fibre(u, v)
        return {"fibre": ev.link, **core.fibre_state(u, v), **block}

    # ---- pipeline jobs ----------------------------------------------------------------
    @app.get("/jobs", summary="placed pipeline jobs", response_model=JobList,
             dependencies=guarded)
    def list_jobs() -> dict[str, Any]:
        return {"jobs": jobs.list()}

    @app.post("/jobs", status_code=201, response_model=dict[str, Any], dependencies=guarded,
              summary="place a pipeline job and set up its lightpaths",
              responses={409: {"model": ErrorReply, "description": "refused by the "
                               "placement policy (`reason`: no_gpus, no_spectrum, "
                               "no_bandwidth, no_vlan), or `conflict`: the state changed "
                               "under every re-planning"},
                         503: {"model": ErrorReply, "description": "`timeout`: the "
                               "placement did not finish within the controller's limit "
                               "(LIGHTPIPE_CTL_PLACE_TIMEOUT_S; nothing placed), `busy`: "
                               "too many placements computing "
                               "(LIGHTPIPE_CTL_MAX_PLACEMENTS), or rules not installed"}})
    def create_job(req: JobRequest) -> dict[str, Any]:
        return jobs.place(req)

    @app.get("/jobs/{id}", summary="one placed job (its lightpaths as they are now)",
             response_model=dict[str, Any], dependencies=guarded)
    def get_job(id: JobId) -> dict[str, Any]:
        return jobs.get(id)

    @app.delete("/jobs/{id}", summary="remove a job (frees GPUs and lightpaths)",
                response_model=dict[str, Any], dependencies=guarded)
    def delete_job(id: JobId) -> dict[str, Any]:
        return jobs.remove(id)

    # ---- flow routing in the DC fabrics -------------------------------------------------
    @app.get("/routing", response_model=dict[str, Any], dependencies=guarded,
             summary="flow routing: policy, jobs, per-flow paths and rates, failed fabric "
             "links, last re-route; `wan`: which lightpath each cross-DC job flow takes")
    def get_routing() -> dict[str, Any]:
        return core.routing_view()

    @app.put("/routing", response_model=dict[str, Any], dependencies=guarded,
             summary="choose the flow routing policy (re-routes every flow)")
    def put_routing(req: RoutingPolicyRequest) -> dict[str, Any]:
        return core.routing_call("set_policy", req.policy)

    @app.post("/routing/jobs", status_code=201, response_model=dict[str, Any],
              dependencies=guarded, summary="register a ring all-reduce job (its flows "
              "are routed and installed)")
    def create_routing_job(req: RoutingJobRequest) -> dict[str, Any]:
        return core.routing_call("register", req.members, req.buffer_bytes)

    @app.delete("/routing/jobs/{id}", response_model=dict[str, Any],
                dependencies=guarded, summary="unregister a job (re-routes the rest)")
    def delete_routing_job(id: JobId) -> dict[str, Any]:
        return core.routing_call("unregister", id)

    # ---- data-plane layout ------------------------------------------------------------
    @app.get("/layout", summary="the data-plane layout", response_model=Layout,
             dependencies=guarded)
    def get_layout() -> dict[str, Any]:
        ix = core.layout
        if ix is None:
            raise RequestError(404, "no layout yet (PUT /layout or --layout FILE)")
        return ix.layout.model_dump()

    @app.put("/layout", summary="set the data-plane layout and program the switches "
             "(every link control must be one of the run's own)",
             response_model=LayoutReply, dependencies=guarded)
    def put_layout(layout: Layout) -> dict[str, Any]:
        try:
            on_layout(layout)
        except ValueError as exc:
            raise RequestError(422, str(exc)) from None
        return {"switches": len(layout.switches), "hosts": len(layout.hosts)}

    return app


def allowed_hosts(host: str) -> frozenset[str] | None:
    """Host names a request may address when bound to `host` (None: any, wildcard)."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return LOCAL_NAMES | {host.lower()}
    if ip.is_unspecified:
        return None
    return LOCAL_NAMES | {str(ip)}


def bind_listener(host: str, port: int) -> socket.socket:
    """A listening TCP socket bound by this process (port 0: any free one)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(LISTEN_BACKLOG)
    except OSError:
        sock.close()
        raise
    return sock


class RestApi:
    """The app behind its Guard, served by uvicorn; `serve()` starts it in a daemon thread."""

    def __init__(self, core: ControllerCore, host: str = "127.0.0.1", port: int = 8080,
                 token: str | None = None, jobs: JobService | None = None,
                 on_layout: Callable[[Layout], None] | None = None,
                 sock: socket.socket | None = None,
                 header_timeout_s: float = HEADER_TIMEOUT_S) -> None:
        if not token:
            raise ValueError("the REST API needs a bearer token")
        self.core = core
        self.token = token
        self.jobs = jobs if jobs is not None else JobService(core)
        self.sock = sock if sock is not None else bind_listener(host, port)
        self.host, self.port = self.sock.getsockname()[:2]
        self.app = create_app(core, self.jobs, token, on_layout or core.set_layout,
                              time.time())
        guarded = Guard(self.app, token, allowed_hosts(self.host))
        protocol = type("HeaderTimeoutH11", (HeaderTimeoutH11,),
                        {"header_timeout_s": header_timeout_s})
        config = uvicorn.Config(
            guarded, http=protocol, ws="none", lifespan="off", loop="asyncio",
            log_config=None, access_log=False, backlog=LISTEN_BACKLOG,
            timeout_keep_alive=KEEP_ALIVE_TIMEOUT_S, timeout_graceful_shutdown=2,
            h11_max_incomplete_event_size=MAX_HEADER_BYTES, server_header=False)
        self.server = uvicorn.Server(config)
        self.thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def serve(self, timeout_s: float = 10.0) -> None:
        """Start serving in a daemon thread; return once uvicorn listens."""
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                       name="rest-api", daemon=True)
        self.thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started and self.thread.is_alive():
            if time.monotonic() > deadline:
                raise RuntimeError(f"REST API did not start within {timeout_s:.0f} s")
            time.sleep(0.01)
        if not self.server.started:
            raise RuntimeError("REST API server thread ended at start-up")

    def close(self) -> None:
        self.server.should_exit = True
        if self.thread is not None:
            self.thread.join(5)
        self.sock.close()
