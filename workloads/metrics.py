"""Prometheus metrics of one pipeline worker, served over HTTP (prometheus-client).

Names follow Prometheus conventions (`lightpipe_` prefix, base units, `_total`
counters); every series carries `training_job` (the pipeline job; Prometheus keeps
`job` for the scrape job) and `stage` labels (docs/metrics.md).
The HTTP listener may be a socket inherited from the launcher (`serve_fd`): the
launcher binds it in the root network namespace, so a Prometheus server there can
scrape workers that run inside Mininet hosts without any traffic on emulated links.
"""

from __future__ import annotations

import logging
import socket
import sys
import threading
import time
from http.server import HTTPServer, ThreadingHTTPServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import MetricsHandler

log = logging.getLogger(__name__)

ITERATION_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                       float("inf"))

METRIC_NAMES = (
    "lightpipe_worker_iteration_duration_seconds",
    "lightpipe_worker_bubble_ratio",
    "lightpipe_worker_sent_bytes_total",
    "lightpipe_worker_received_bytes_total",
    "lightpipe_worker_compute_seconds_total",
    "lightpipe_worker_wait_seconds_total",
    "lightpipe_worker_iterations_total",
    "lightpipe_worker_loss",
    "lightpipe_worker_restarts_total",
)


class WorkerMetrics:
    """The metric objects of one worker, in their own registry."""

    def __init__(self, job: str, stage: int) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        labels = {"training_job": job, "stage": str(stage)}
        names = list(labels)
        r = self.registry
        self.iteration = Histogram(
            "lightpipe_worker_iteration_duration_seconds",
            "Wall time of one pipeline iteration as seen by this stage (emulated seconds)",
            names, buckets=ITERATION_BUCKETS_S, registry=r).labels(**labels)
        self.bubble = Gauge("lightpipe_worker_bubble_ratio",
                            "Idle share of this stage's last iteration (1 - compute/duration)",
                            names, registry=r).labels(**labels)
        self.sent = Counter("lightpipe_worker_sent_bytes",
                            "Payload bytes this stage sent to its pipeline neighbours",
                            names, registry=r).labels(**labels)
        self.received = Counter("lightpipe_worker_received_bytes",
                                "Payload bytes this stage received from its neighbours",
                                names, registry=r).labels(**labels)
        self.compute = Counter("lightpipe_worker_compute_seconds",
                               "Seconds this stage spent computing forward/backward ops",
                               names, registry=r).labels(**labels)
        self.wait = Counter("lightpipe_worker_wait_seconds",
                            "Seconds this stage waited for an input (activation or gradient) "
                            "from a neighbour: communication plus upstream idle time",
                            names, registry=r).labels(**labels)
        self.iterations = Counter("lightpipe_worker_iterations",
                                  "Pipeline iterations this stage completed",
                                  names, registry=r).labels(**labels)
        self.restarts = Counter("lightpipe_worker_restarts",
                                "Process-group restarts of this stage after a collective's "
                                "error (policy.workers.on_fault: retry)",
                                names, registry=r).labels(**labels)
        # No series until a loss is reported: shadow-mode stages and non-last stages
        # train nothing, so they export no (misleading zero) loss.
        self.loss = _OnFirstSet(Gauge("lightpipe_worker_loss",
                                      "Training loss of the last iteration (model mode, "
                                      "last stage)", names, registry=r), labels)


class _OnFirstSet:
    """A labelled gauge child created when first set (absent from /metrics before)."""

    def __init__(self, family: Gauge, labels: dict[str, str]) -> None:
        self.family, self.labels = family, labels

    def set(self, value: float) -> None:
        self.family.labels(**self.labels).set(value)


class _Server(ThreadingHTTPServer):
    """One thread per scrape: scrapes that gave up while the worker was still importing
    (their connections wait in the inherited socket's backlog) are answered side by side,
    not one after another ahead of the next live scrape."""

    daemon_threads = True

    def handle_error(self, request: object, client_address: object) -> None:
        """A scraper that gave up (its scrape time-out, e.g. on a starved machine) closes
        the connection before the answer: one debug line, not a traceback on stderr."""
        if isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            log.debug("/metrics: %s closed the connection before the answer", client_address)
            return
        super().handle_error(request, client_address)  # type: ignore[arg-type]


class Scrapes:
    """Counts the scrapes of /metrics, so a worker can wait, before it exits, for one that
    began after its last update and was answered whole (readiness by signal, not by a
    sleep). A scrape that began earlier does not count, even if answered later."""

    def __init__(self) -> None:
        self.started = 0  # scrapes begun
        self.latest = 0  # the newest begun scrape (by start order) answered whole
        self._cond = threading.Condition()

    def begin(self) -> int:
        with self._cond:
            self.started += 1
            return self.started

    def delivered(self, seq: int) -> None:
        with self._cond:
            self.latest = max(self.latest, seq)
            self._cond.notify_all()

    def wait_after(self, mark: int, timeout_s: float) -> bool:
        """True once a scrape begun after the first `mark` ones was answered; False at
        timeout_s. Take `mark` from `started` when the values are final."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self.latest <= mark:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            return True


def _handler(registry: CollectorRegistry, scrapes: Scrapes | None = None
             ) -> type[MetricsHandler]:
    base = MetricsHandler.factory(registry)
    if scrapes is None:
        return base

    class Counted(base):  # type: ignore[misc,valid-type]
        def do_GET(self) -> None:
            seq = scrapes.begin()
            super().do_GET()
            self.wfile.flush()
            scrapes.delivered(seq)  # not reached if the answer could not be written

    return Counted


def serve(registry: CollectorRegistry, *, fd: int | None = None, host: str = "127.0.0.1",
          port: int = 0, scrapes: Scrapes | None = None) -> tuple[HTTPServer, int]:
    """Serve /metrics in a daemon thread on an inherited listening fd or a new socket;
    `scrapes` (optional) counts the answers delivered."""
    handler = _handler(registry, scrapes)
    if fd is not None:
        server = _Server(("127.0.0.1", 0), handler, bind_and_activate=False)
        server.socket.close()
        server.socket = socket.socket(fileno=fd)
        server.server_address = server.socket.getsockname()[:2]
    else:
        server = _Server((host, port), handler)
    bound_port = int(server.server_address[1])
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return server, bound_port
