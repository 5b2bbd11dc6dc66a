"""Sweep points as Ray tasks (`lightpipe sweep --ray-address`); the only module importing ray.

A point runs the same `sweep.run_point` as in a local worker process, so the same seeds
give the same rows. What differs is where: a task may run on another node, so a point's
run directory (`--records`) is packed into the task's result and written by this process,
and each task checks that its node runs the same LightPipe code as this one (a node with
another version would give other rows without a word).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import signal
import socket
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from testbed.emu.state import ProcRecord, descendants, kill_procs, proc_start_ticks
from testbed.errors import InputError, RuntimeFailure
from testbed.experiments.sweep import Result, Task, run_point_caught
from testbed.io.atomic import atomic_write_bytes

T = TypeVar("T")
log = logging.getLogger(__name__)

MISSING = "ray is not installed: pip install 'lightpipe[ray]'"
FORMS = "auto (the cluster on this machine), HOST:PORT (a head's GCS address), " \
        "or local (start a Ray instance for this sweep)"
PROBE_TIMEOUT_S = 5.0
# HTTP/2 client preface and an empty SETTINGS frame (RFC 9113 section 3.4).
H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
# Joining a cluster: Ray retries an unanswered GCS address for minutes (20 tries of 40 s
# in Ray 2.60); these bound it to about half a minute (the user's own settings win).
JOIN_ENV = {"RAY_py_gcs_connect_timeout_s": "5", "RAY_gcs_server_port_wait_time_s": "2"}
# Ray (2.52+) clusters want a token by default, and Ray sends one to an explicit address
# only when asked to (RAY_AUTH_MODE=token): said with the error, as Ray's own is silent.
AUTH_HINT = ("if the cluster uses token authentication, export RAY_AUTH_MODE=token with "
             "its token in ~/.ray/auth_token or RAY_AUTH_TOKEN")
# Starting a local instance: tries in all (start_local).
LOCAL_START_ATTEMPTS = 3
# A point whose worker process died is tried once more (a lost node), not three times.
MAX_RETRIES = 1


def check_address(text: str) -> str:
    """'auto', 'local' or 'HOST:PORT' (port 1..65535), else an InputError naming the flag."""
    address = text.strip()
    if address in ("auto", "local"):
        return address
    host, sep, port = address.rpartition(":")
    host = host.strip("[]")  # [::1]:6379
    if (not sep or not host or "/" in host or any(c.isspace() for c in host)
            or not port.isdigit() or not 1 <= int(port) <= 65535):
        raise InputError("--ray-address", f"expected {FORMS}; got {text!r}")
    return address


def import_ray(address: str | None = None) -> Any:
    """The ray module, or an InputError with the install command. Joining a cluster
    (`address` other than local), Ray's connect retries are bounded first: Ray reads
    them when it is imported."""
    if address is not None and address != "local":
        for key, value in JOIN_ENV.items():
            os.environ.setdefault(key, value)
    try:
        import ray
    except ImportError as exc:
        if exc.name == "ray":
            raise InputError("--ray-address", MISSING) from None
        raise InputError("--ray-address", f"ray cannot be imported ({exc}): pip install "
                         "'lightpipe[ray]'") from None
    return ray


@functools.lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """sha256 over the testbed package's Python sources (relative paths and bytes)."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(path.relative_to(root).as_posix().encode() + b"\0")
        h.update(path.read_bytes())
    return h.hexdigest()


def _probe(address: str) -> None:
    """Fail at once, in one line, when nothing at HOST:PORT speaks HTTP/2 (gRPC, as a Ray
    GCS does): nothing listening, or another service (a dashboard port given by mistake).
    Ray itself would retry such an address for minutes."""
    host, _, port = address.rpartition(":")
    try:
        conn = socket.create_connection((host.strip("[]"), int(port)), timeout=PROBE_TIMEOUT_S)
    except OSError as exc:
        reason = exc.strerror or ("timed out" if isinstance(exc, TimeoutError) else str(exc))
        raise InputError("--ray-address", f"cannot reach a Ray cluster at {address} "
                         f"({reason.lower()}); `ray start --head` prints the address to give"
                         ) from None
    reply = b""
    with conn:
        if os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true"):
            return  # a TLS port does not answer a plain preface
        try:
            conn.sendall(H2_PREFACE)
            while len(reply) < 9:
                chunk = conn.recv(9 - len(reply))
                if not chunk:
                    break
                reply += chunk
        except OSError:  # reset or no answer in time: judged below by what came
            pass
    if len(reply) < 9 or reply[3] != 0x04:  # a server's first HTTP/2 frame is SETTINGS
        raise InputError("--ray-address", f"{address} does not answer as a Ray GCS port "
                         "(no gRPC reply); `ray start --head` prints the address to give")


@contextmanager
def _env_defaults(values: dict[str, str]) -> Iterator[None]:
    added = [k for k in values if k not in os.environ]
    os.environ.update({k: values[k] for k in added})
    try:
        yield
    finally:
        for k in added:
            os.environ.pop(k, None)


KEPT_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextmanager
def signal_handlers_kept() -> Iterator[None]:
    """Put this process's SIGINT/SIGTERM handlers back after Ray has had them: ray.init
    installs its own SIGTERM handler and ray.shutdown resets the signal to the default
    in the kernel while Python still names Ray's handler, so a later SIGTERM killed the
    process without its clean-up (seen as a disposition mismatch in the test suite)."""
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread may set handlers (Ray's init runs there too)
        return
    saved = {sig: signal.getsignal(sig) for sig in KEPT_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            if handler is not None:  # None: set from C before Python; nothing to restore
                signal.signal(sig, handler)


@contextmanager
def session(address: str, num_cpus: int) -> Iterator[RayRunner]:
    """Join the cluster at `address` (or start a local instance with `num_cpus` CPUs), yield a
    runner, disconnect at the end (a local instance is stopped). Not reachable: InputError."""
    address = check_address(address)
    ray = import_ray(address)
    if address not in ("auto", "local"):
        _probe(address)
    if ray.is_initialized():
        raise RuntimeFailure("ray is already initialised in this process; use RayRunner()")
    common: dict[str, Any] = {"log_to_driver": False, "logging_level": logging.WARNING,
                              "include_dashboard": False}
    with signal_handlers_kept():
        yield from _joined(ray, address, num_cpus, common)


def _joined(ray: Any, address: str, num_cpus: int, common: dict[str, Any]
            ) -> Iterator[RayRunner]:
    """session()'s body: join or start, yield the runner, always disconnect."""
    if address == "local":
        # No usage report from an instance LightPipe starts (RAY_USAGE_STATS_ENABLED=1 wins).
        with _env_defaults({"RAY_USAGE_STATS_ENABLED": "0"}):
            start_local(ray, num_cpus, **common)
    else:
        try:
            ray.init(address=address, **common)
        except Exception as exc:  # ConnectionError, RpcError, a version mismatch, ...
            _shutdown(ray)
            # (auto finds the token itself)
            hint = "" if address == "auto" or os.environ.get("RAY_AUTH_MODE") \
                else f" ({AUTH_HINT})"
            where = "on this machine (auto)" if address == "auto" else f"at {address}"
            raise InputError("--ray-address", f"no Ray cluster {where} let this process "
                             f"join: {_first_line(exc)}{hint}") from None
    try:
        yield RayRunner()
    finally:
        _shutdown(ray)


def start_local(ray: Any, num_cpus: int, attempts: int = LOCAL_START_ATTEMPTS,
                **common: Any) -> None:
    """ray.init() a local instance. Ray waits a fixed 30 s for its raylet to register and
    gives up, which a busy 2-core machine can miss (CI of 4714e83: three test lanes beside
    it); then what the attempt started is ended and the start tried again
    (started_with_retries). RuntimeFailure when the last one fails."""
    started_with_retries(lambda: ray.init(num_cpus=num_cpus, **common),
                         lambda: _shutdown(ray), "a local Ray instance", attempts)


def started_with_retries(start: Callable[[], T], undo: Callable[[], None], what: str,
                         attempts: int = LOCAL_START_ATTEMPTS) -> T:
    """start() (a Ray node or cluster on this machine), `attempts` times in all: after a
    failed try, undo() and end what the try started (this process's new descendants, by
    PID and start time: Ray's shutdown knows nothing of a node that never came up).
    RuntimeFailure naming `what` when the last one fails."""
    for attempt in range(1, attempts + 1):
        before = _own_descendants()
        try:
            return start()
        except Exception as exc:
            undo()
            ended = kill_procs([r for r in _own_descendants() - before])
            why = _first_line(exc)
            if attempt == attempts:
                raise RuntimeFailure(f"cannot start {what} ({attempts} attempts): "
                                     f"{why}") from None
            log.warning("ray: %s did not start (attempt %d of %d; %d process(es) it left "
                        "ended): %s", what, attempt, attempts, ended, why)
    raise AssertionError("unreachable")


def _own_descendants() -> set[ProcRecord]:
    """This process's descendants as (PID, start time) records."""
    me = os.getpid()
    return {ProcRecord(p, t, "ray") for p in descendants(me)[1:]
            if (t := proc_start_ticks(p)) is not None}


def _shutdown(ray: Any) -> None:
    try:
        ray.shutdown()
    except Exception as exc:  # disconnecting must not hide the sweep's own outcome
        log.warning("ray.shutdown failed: %s", _first_line(exc))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


class RayRunner:
    """Runs sweep tasks on the Ray cluster this process has joined (ray.init done)."""

    def __init__(self) -> None:
        ray = import_ray()
        if not ray.is_initialized():
            raise RuntimeFailure("RayRunner needs ray.init() first (or use session())")
        self._ray = ray
        self._remote = ray.remote(num_cpus=1, max_retries=MAX_RETRIES)(run_task_located)
        self.points_by_node: dict[str, int] = {}  # Ray node id -> points it returned

    def describe(self) -> dict[str, Any]:
        """What ran the sweep (for the manifest): nodes and CPUs of the cluster."""
        nodes = [n for n in self._ray.nodes() if n.get("Alive")]
        return {"kind": "ray", "ray_version": self._ray.__version__, "nodes": len(nodes),
                "cpus": int(self._ray.cluster_resources().get("CPU", 0))}

    def results(self, tasks: list[Task]) -> Iterator[tuple[int, Result]]:
        """Submit every task, yield each point's result as it finishes (any order); a
        point's run directory, if kept, is written under the task's records path first."""
        fingerprint = code_fingerprint()
        refs = {self._remote.remote(_for_node(t), fingerprint): t for t in tasks}
        pending = list(refs)
        while pending:
            done, pending = self._ray.wait(pending, num_returns=1)
            for ref in done:
                index, labels, _data, records = refs.pop(ref)
                try:
                    node, (row, error, code, files) = self._ray.get(ref)
                    self.points_by_node[node] = self.points_by_node.get(node, 0) + 1
                except Exception as exc:  # the task did not return: worker or node died, ...
                    row, error, code, files = None, (
                        f"point {index} {labels}: {_first_line(exc)}"), 1, {}
                if records is not None and files:
                    try:
                        _unpack(Path(records) / f"{index:04d}", files)
                    except (OSError, RuntimeFailure) as exc:
                        row, error, code = None, f"point {index} {labels}: {_first_line(exc)}", 1
                yield index, (row, error, code)

    def placement(self) -> list[dict[str, Any]]:
        """Where the points ran: each node that returned any, with its address, host name
        and count (for the manifest; a user checks that a sweep used the nodes meant)."""
        known = {n.get("NodeID"): n for n in self._ray.nodes()}
        return [{"node_id": node, "address": known.get(node, {}).get("NodeManagerAddress"),
                 "hostname": known.get(node, {}).get("NodeManagerHostname"), "points": n}
                for node, n in sorted(self.points_by_node.items())]


def run_task_located(task: Task, fingerprint: str) -> tuple[str, tuple[
        dict[str, Any] | None, str | None, int, dict[str, bytes]]]:
    """On a Ray worker: run_task's result with the id of the node that ran it."""
    import ray

    return ray.get_runtime_context().get_node_id(), run_task(task, fingerprint)


def _for_node(task: Task) -> Task:
    """The task as sent: records as a flag (the node writes into its own temp dir)."""
    index, labels, data, records = task
    return index, labels, data, "" if records is not None else None


def run_task(task: Task, fingerprint: str) -> tuple[dict[str, Any] | None, str | None, int,
                                                      dict[str, bytes]]:
    """On a Ray worker: run one point; (row, error, exit code, files of its run directory)."""
    index, labels, data, records = task
    if fingerprint != code_fingerprint():
        return None, (f"point {index} {labels}: node {socket.gethostname()} runs other "
                      "LightPipe code than the sweep's driver (install the same lightpipe "
                      "on every Ray node)"), 1, {}
    if records is None:
        row, error, code = run_point_caught((index, labels, data, None))
        return row, error, code, {}
    with tempfile.TemporaryDirectory(prefix="lightpipe-point-") as tmp:
        row, error, code = run_point_caught((index, labels, data, tmp))
        return row, error, code, _pack(Path(tmp) / f"{index:04d}")


def _pack(root: Path) -> dict[str, bytes]:
    if not root.is_dir():
        return {}
    return {p.relative_to(root).as_posix(): p.read_bytes()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _unpack(root: Path, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        target = (root / rel).resolve()
        if root.resolve() not in target.parents:  # a name from another process: stay inside
            raise RuntimeFailure(f"ray task returned a file outside its point: {rel!r}")
        target.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(target, data)
