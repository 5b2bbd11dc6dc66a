"""Prometheus metrics of the controller (own registry; `lightpipe_` prefix, base units)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

# Set-up and restoration: 0.5 ms .. 10 s (the target for restoration is 50 ms).
LATENCY_BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0,
                     2.0, 5.0, 10.0)


class ControllerMetrics:
    """The controller's metrics, in a registry of their own (several controllers per test)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = self.registry = registry or CollectorRegistry()
        self.active = Gauge("lightpipe_lightpaths_active", "Lightpaths set up now", registry=r)
        self.slots_used = Gauge("lightpipe_fibre_slots_used",
                                "Spectrum slots held by lightpaths per fibre", ["fibre"],
                                registry=r)
        self.requests = Counter("lightpipe_lightpath_requests",
                                "Lightpath set-up requests", registry=r)
        self.blocks = Counter("lightpipe_lightpath_blocks",
                              "Lightpath requests refused (blocked)", ["reason"], registry=r)
        self.setup_seconds = Histogram("lightpipe_lightpath_setup_seconds",
                                       "Request to rules installed (barrier) per lightpath",
                                       buckets=LATENCY_BUCKETS_S, registry=r)
        self.restoration_seconds = Histogram("lightpipe_restoration_seconds",
                                             "Fibre cut detected to re-routed rules installed",
                                             buckets=LATENCY_BUCKETS_S, registry=r)
        self.restored = Counter("lightpipe_lightpaths_restored",
                                "Lightpaths re-routed after a fibre cut", registry=r)
        self.lost = Counter("lightpipe_lightpaths_lost",
                            "Lightpaths dropped after a fibre cut (no route or spectrum)",
                            registry=r)
        self.capacity_errors = Counter("lightpipe_capacity_errors",
                                       "Failed per-lightpath capacity updates to link emulators",
                                       registry=r)
        self.switches = Gauge("lightpipe_switches_connected", "OpenFlow switches connected",
                              registry=r)
        self.jobs_active = Gauge("lightpipe_jobs_active", "Pipeline jobs placed now (POST /jobs)",
                                 registry=r)
        self.job_requests = Counter("lightpipe_job_requests", "POST /jobs placement requests",
                                    registry=r)
        self.job_refusals = Counter("lightpipe_job_refusals",
                                    "POST /jobs refused by the placement policy",
                                    ["reason"], registry=r)
        self.job_setup_seconds = Histogram("lightpipe_job_setup_seconds",
                                           "POST /jobs to placement done and every boundary "
                                           "lightpath's rules installed",
                                           buckets=LATENCY_BUCKETS_S, registry=r)

    def exposition(self) -> bytes:
        """Text exposition format (GET /metrics)."""
        return generate_latest(self.registry)
