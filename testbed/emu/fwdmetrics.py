"""Prometheus metrics of one forwarder (per direction and per lightpath VLAN), on a port.

Besides traffic and the model's own drops (queue tail drops, random loss), two signs of
the emulator falling behind, which the fidelity verdict reads (testbed.emu.fidelity):
frames the kernel dropped before the forwarder read them (`socket_drops`), and how late
its timed wake-ups came (`timer_slack`, a histogram).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.registry import Collector, CollectorRegistry


class ForwarderCollector(Collector):
    """Reads the forwarder's counters at scrape time (no copies kept)."""

    def __init__(self, fwd: Any, fibre: str) -> None:
        self.fwd = fwd
        self.fibre = fibre

    def collect(self) -> Iterator[Any]:
        st = self.fwd.stats()
        labels = ["fibre", "direction"]
        fams = {
            "rx_bytes": CounterMetricFamily("lightpipe_fibre_rx_bytes", "bytes in", labels=labels),
            "tx_bytes": CounterMetricFamily("lightpipe_fibre_tx_bytes", "bytes out",
                                            labels=labels),
            "rx_packets": CounterMetricFamily("lightpipe_fibre_rx_packets", "frames in",
                                              labels=labels),
            "queue_drops": CounterMetricFamily("lightpipe_fibre_queue_drops",
                                               "segments tail-dropped", labels=labels),
            "loss_drops": CounterMetricFamily("lightpipe_fibre_loss_drops",
                                              "segments lost at random", labels=labels),
            "socket_drops": CounterMetricFamily(
                "lightpipe_fibre_socket_drops", "frames the kernel dropped before the "
                "forwarder read them (it fell behind; not part of the modelled link)",
                labels=labels),
        }
        depth = GaugeMetricFamily("lightpipe_fibre_queue_depth_bytes", "serialiser backlog",
                                  labels=labels)
        vl = ["fibre", "direction", "vlan"]
        vbytes = CounterMetricFamily("lightpipe_lightpath_bytes", "bytes per lightpath",
                                     labels=vl)
        vdrops = CounterMetricFamily("lightpipe_lightpath_drops", "drops per lightpath",
                                     labels=vl)
        released = CounterMetricFamily(
            "lightpipe_fibre_released_lightpath_drops", "tail drops of lightpath caps "
            "since removed (their lightpaths released)", labels=labels)
        vrate = GaugeMetricFamily("lightpipe_lightpath_rate_bits_per_second",
                                  "lightpath rate cap (emulated units)", labels=vl)
        for dname, d in st["directions"].items():
            for key, fam in fams.items():
                fam.add_metric([self.fibre, dname], d.get(key, 0))
            depth.add_metric([self.fibre, dname], d["queue_depth_bytes"])
            released.add_metric([self.fibre, dname],
                                (d.get("released_lightpaths") or {}).get("drops", 0))
            for vlan, v in d["vlans"].items():
                vbytes.add_metric([self.fibre, dname, vlan], v["bytes"])
                vdrops.add_metric([self.fibre, dname, vlan], v["drops"])
                vrate.add_metric([self.fibre, dname, vlan], v["rate_mbps"] * 1e6)
        yield from fams.values()
        yield from (depth, vbytes, vdrops, vrate, released)
        slack = st.get("timer_slack")
        if slack:
            yield slack_family(slack, self.fibre)


def slack_family(record: Any, fibre: str) -> HistogramMetricFamily:
    """The forwarder's timer slack histogram (testbed.emu.slack record) for Prometheus."""
    fam = HistogramMetricFamily("lightpipe_fibre_timer_slack_seconds",
                                "how late the forwarder's timed wake-ups came against "
                                "their deadline (emulated seconds)", labels=["fibre"])
    cum, buckets = 0, []
    for le, c in zip([*record["bounds_s"], float("inf")], record["counts"], strict=True):
        cum += int(c)
        buckets.append(("+Inf" if le == float("inf") else repr(float(le)), cum))
    fam.add_metric([fibre], buckets, sum_value=float(record["sum_s"]))
    return fam


def serve_metrics(fwd: Any, port: int, fibre: str = "") -> None:
    """Start prometheus_client's HTTP server (a thread) for this forwarder."""
    from prometheus_client import start_http_server

    registry = CollectorRegistry()
    registry.register(ForwarderCollector(fwd, fibre))
    start_http_server(port, registry=registry)
