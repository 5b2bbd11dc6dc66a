"""Prometheus metrics of the controller (own registry; `lightpipe_` prefix, base units)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

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
        self.sync_round_seconds = Histogram(
            "lightpipe_controller_sync_round_seconds",
            "One make-before-break round of a rule sync, its writes to the last barrier "
            "reply (round: new entries, changed head ends, deleted entries)", ["round"],
            buckets=LATENCY_BUCKETS_S, registry=r)
        self.restored = Counter("lightpipe_lightpaths_restored",
                                "Lightpaths re-routed after a fibre cut", registry=r)
        self.restored_on_backup = Counter(
            "lightpipe_lightpaths_restored_on_backup",
            "Restored lightpaths re-placed on the backup route their fast-failover groups "
            "had already switched to", registry=r)
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
        self.job_unavailable = Counter("lightpipe_job_unavailable",
                                       "POST /jobs answered 503: too many placements "
                                       "computing (busy) or over the time limit (timeout)",
                                       ["reason"], registry=r)
        self.job_replans = Counter("lightpipe_job_replans",
                                   "Placements planned again because the state changed "
                                   "while they computed on a snapshot", registry=r)
        self.job_planning = Gauge("lightpipe_job_placements_planning",
                                  "Placements computing on a snapshot now (outside the "
                                  "controller's lock; abandoned ones included)", registry=r)
        self.job_setup_seconds = Histogram("lightpipe_job_setup_seconds",
                                           "POST /jobs to placement done and every boundary "
                                           "lightpath's rules installed",
                                           buckets=LATENCY_BUCKETS_S, registry=r)
        # Per-flow routing of all-reduce jobs in DC fabrics (controllers.flowjobs).
        self.routing_moved = Counter("lightpipe_routing_flows_moved",
                                     "Flows whose path changed in a re-route", ["policy"],
                                     registry=r)
        self.routing_reroutes = Counter("lightpipe_routing_reroutes",
                                        "Flow re-routes (job arrival/departure, link "
                                        "failure/repair, policy change)", ["policy", "reason"],
                                        registry=r)
        self.routing_seconds = Histogram("lightpipe_routing_computation_seconds",
                                         "Path computation time of one re-route", ["policy"],
                                         buckets=LATENCY_BUCKETS_S, registry=r)
        self.routing_bottleneck = Gauge("lightpipe_routing_job_bottleneck_bytes_per_second",
                                        "Max-min rate of a job's slowest flow (real units) "
                                        "under the chosen paths", ["policy", "allreduce_job"],
                                        registry=r)

        # Which lightpath each cross-DC job flow takes (controllers.wanroute).
        self.wan_moved = Counter("lightpipe_wan_flows_moved",
                                 "Cross-DC flows moved to another lightpath in a "
                                 "re-assignment", ["policy"], registry=r)
        self.wan_reassignments = Counter("lightpipe_wan_reassignments",
                                         "Lightpath re-assignments of cross-DC flows (job "
                                         "arrival/departure, lightpath down/up, policy)",
                                         ["policy", "reason"], registry=r)

        self.phase_seconds = Counter(
            "lightpipe_controller_phase_seconds",
            "Seconds spent per phase of lightpath set-ups and rule installs: lock (waiting "
            "for the core's lock), rmsa, store "
            "(SQLite), caps (fibre emulators), rules (desired + diff), send (flow-mods "
            "encoded and sent), barrier (waiting for the switches' replies)", ["phase"],
            registry=r)

    def phase(self, name: str, since: float) -> float:
        """Count the time since `since` (time.perf_counter) to phase `name`; now."""
        now = time.perf_counter()
        self.phase_seconds.labels(phase=name).inc(now - since)
        return now

    def watch_network(self, net: Any) -> None:
        """Export `net`'s (an OpticalNetwork) spectrum and fibre state at scrape time."""
        self.registry.register(SpectrumCollector(net))

    def exposition(self) -> bytes:
        """Text exposition format (GET /metrics)."""
        return generate_latest(self.registry)


class SpectrumCollector(Collector):
    """Per fibre at scrape time: slots in the grid, which slots are used, and up/cut."""

    def __init__(self, net: Any) -> None:
        self.net = net

    def collect(self) -> Iterator[Any]:
        total = GaugeMetricFamily("lightpipe_fibre_slots",
                                  "Spectrum slots (or wavelengths) in each fibre's grid",
                                  labels=["fibre"])
        used = GaugeMetricFamily("lightpipe_fibre_slot_used",
                                 "1 while the spectrum slot is held by a lightpath (or "
                                 "blocked), else 0", labels=["fibre", "slot"])
        up = GaugeMetricFamily("lightpipe_fibre_up", "1 while the fibre is up, 0 while cut",
                               labels=["fibre"])
        n = int(self.net.slots)
        for f in self.net.topology.fibres:
            name = f"{f.u}-{f.v}"
            total.add_metric([name], n)
            mask = self.net.mask(f.u, f.v)
            for i in range(n):
                used.add_metric([name, str(i)], mask >> i & 1)
            up.add_metric([name], 0 if self.net.is_failed(f.u, f.v) else 1)
        yield from (total, used, up)
