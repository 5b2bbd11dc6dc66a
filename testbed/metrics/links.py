"""Per-fibre and per-lightpath link metrics of a live emulated network, for Prometheus.

Each fibre's forwarder lives in its own middle network namespace, which has no route to
the namespace the Prometheus server runs in, so its own `--metrics-port` listener would
be unreachable. This exporter serves one /metrics endpoint (127.0.0.1, in the caller's
namespace) and reads every forwarder's counters at scrape time over its control socket
(a Unix socket: reachable from any network namespace), with the forwarder's own
collector (`testbed.emu.fwdmetrics.ForwarderCollector`), so the metric names and labels
are exactly those a forwarder's --metrics-port serves: `lightpipe_fibre_*{fibre,
direction}` and `lightpipe_lightpath_*{fibre, direction, vlan}` (docs/metrics.md).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from prometheus_client.registry import CollectorRegistry

log = logging.getLogger(__name__)

LINK_METRIC_NAMES = (
    "lightpipe_fibre_rx_bytes_total", "lightpipe_fibre_tx_bytes_total",
    "lightpipe_fibre_queue_drops_total", "lightpipe_fibre_loss_drops_total",
    "lightpipe_fibre_socket_drops_total", "lightpipe_fibre_timer_slack_seconds_count",
    "lightpipe_fibre_queue_depth_bytes",
    "lightpipe_lightpath_bytes_total", "lightpipe_lightpath_drops_total",
    "lightpipe_lightpath_rate_bits_per_second",
    "lightpipe_fibre_released_lightpath_drops_total",
)


class _SafeStats:
    """An emulator whose stats() never raises (a stopped forwarder yields no samples)."""

    def __init__(self, emu: Any) -> None:
        self.emu = emu

    def stats(self) -> dict[str, Any]:
        try:
            st = self.emu.stats()
        except Exception as exc:  # a scrape must not fail on one link
            log.debug("link stats unavailable: %s", exc)
            return {"directions": {}}
        return st if isinstance(st, dict) and "directions" in st else {"directions": {}}


def fibre_label(fibre: Any) -> str:
    return f"{fibre.u}-{fibre.v}"


class LinkExporter:
    """Serves the link metrics of `emulators` (objects with .fibre and .stats()): the
    links that keep user-space counters (LinkEmulator.counters)."""

    def __init__(self, emulators: Iterable[Any]) -> None:
        from testbed.emu.fwdmetrics import ForwarderCollector

        self.registry = CollectorRegistry()
        self.fibres: list[str] = []
        self._collectors: list[ForwarderCollector] = []
        for emu in emulators:
            name = fibre_label(emu.fibre)
            coll = ForwarderCollector(_SafeStats(emu), name)
            self.registry.register(coll)
            self._collectors.append(coll)
            self.fibres.append(name)
        self.server: Any = None
        self.port: int | None = None
        self.addr = "127.0.0.1"

    def start(self, addr: str = "127.0.0.1") -> int:
        """Start serving on addr (default 127.0.0.1; any port) in the calling thread's
        namespace."""
        from prometheus_client import start_http_server

        self.server, _thread = start_http_server(0, addr=addr, registry=self.registry)
        self.addr = addr
        self.port = int(self.server.server_port)
        return self.port

    @property
    def target(self) -> str:
        assert self.port is not None, "start() first"
        host = f"[{self.addr}]" if ":" in self.addr else self.addr
        return f"{host}:{self.port}"

    def snapshot(self) -> dict[str, Any]:
        """Per fibre and direction: bytes, drops and per-lightpath drops now."""
        out: dict[str, Any] = {}
        for coll in self._collectors:
            dirs = coll.fwd.stats().get("directions", {})
            out[coll.fibre] = {
                name: {"tx_bytes": d.get("tx_bytes"), "queue_drops": d.get("queue_drops"),
                       "loss_drops": d.get("loss_drops"),
                       "lightpath_drops": {v: c.get("drops") for v, c in
                                           d.get("vlans", {}).items()}}
                for name, d in dirs.items()}
        return out

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None
