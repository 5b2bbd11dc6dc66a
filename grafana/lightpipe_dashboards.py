"""LightPipe's Grafana dashboards as code (grafana-foundation-sdk): Overview, Optical
network, Workers, Routing. `lightpipe grafana build` writes them to grafana/dashboards/.

Every panel has a unit and a description; every query filters on the template
variables (run, scenario, training job, stage, fibre) that come from label values.
Metric names and labels: docs/metrics.md.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from grafana_foundation_sdk.builders import bargauge, heatmap, stat, table, timeseries
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import prometheus as pq
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import (
    DataSourceRef,
    GridPos,
    VariableRefresh,
    VariableSort,
)
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

DATASOURCE_UID = "lightpipe-prometheus"
DS = DataSourceRef(type_val="prometheus", uid=DATASOURCE_UID)
TAGS = ["lightpipe"]
WIDTH = 24  # Grafana's grid is 24 columns wide

# Label filters shared by the queries ($run etc. are the template variables).
R = 'run=~"$run", scenario=~"$scenario"'
J = f'{R}, training_job=~"$training_job"'
S = f'{J}, stage=~"$stage"'
F = f'{R}, fibre=~"$fibre"'


@dataclass
class Q:
    """One PromQL query of a panel and its legend."""

    expr: str
    legend: str = ""
    instant: bool = False
    fmt: str = "time_series"


@dataclass
class P:
    """One panel: kind (timeseries, stat, table, heatmap, bargauge), text, unit, queries."""

    kind: str
    title: str
    description: str
    unit: str
    queries: list[Q]
    w: int = 12
    h: int = 8
    extra: dict[str, Any] = field(default_factory=dict)


def _target(q: Q, ref: str) -> pq.Dataquery:
    t = pq.Dataquery().expr(q.expr).ref_id(ref).datasource(DS)
    if q.legend:
        t = t.legend_format(q.legend)
    t = t.instant() if q.instant else t.range()
    if q.fmt != "time_series":
        t = t.format(PromQueryFormat(q.fmt))
    return t


def _panel(p: P, pid: int, pos: GridPos) -> Any:
    kinds = {"timeseries": timeseries.Panel, "stat": stat.Panel, "table": table.Panel,
             "heatmap": heatmap.Panel, "bargauge": bargauge.Panel}
    b = (kinds[p.kind]().id(pid).title(p.title).description(p.description).unit(p.unit)
         .datasource(DS).grid_pos(pos))
    if p.kind == "heatmap":
        b = b.calculate(False)
    for i, q in enumerate(p.queries):
        b = b.with_target(_target(q, chr(ord("A") + i)))
    return b


def _variable(name: str, label: str, query: str, *, multi: bool = True) -> db.QueryVariable:
    v = (db.QueryVariable(name).label(label).query(query).datasource(DS)
         .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED).sort(VariableSort.ALPHABETICAL_ASC)
         .multi(multi).include_all(True).all_value(".*"))
    return v


VARIABLES = {
    "scenario": ("Scenario", "label_values(lightpipe_run_info, scenario)"),
    "run": ("Run", 'label_values(lightpipe_run_info{scenario=~"$scenario"}, run)'),
    "training_job": ("Training job",
                     f"label_values(lightpipe_worker_iterations_total{{{R}}}, training_job)"),
    "stage": ("Stage", f"label_values(lightpipe_worker_iterations_total{{{J}}}, stage)"),
    "fibre": ("Fibre", f"label_values(lightpipe_fibre_tx_bytes_total{{{R}}}, fibre)"),
}


def _quantiles(metric: str, sel: str, by: str = "run") -> list[Q]:
    """Median and p99 of a histogram over every observation so far (short runs: a
    rate window would hold one or two events at most)."""
    return [Q(f"histogram_quantile({q}, sum by ({by}, le) ({metric}_bucket{{{sel}}}))",
              f"p{round(q * 100)} {{{{{by.split(', ')[-1]}}}}}") for q in (0.5, 0.99)]


def last(selector: str) -> str:
    """The selector's last value in the dashboard's time range (finished runs too)."""
    return f"last_over_time({selector}[$__range])"


def _ratio(num: str, den: str, sel: str) -> str:
    """num/den per run; 0 (not absent) while num has no series yet (nothing refused)."""
    return (f"(sum by (run) ({num}{{{sel}}}) or sum by (run) ({den}{{{sel}}}) * 0)"
            f" / clamp_min(sum by (run) ({den}{{{sel}}}), 1)")


def overview() -> tuple[str, str, list[str], list[P]]:
    return "lightpipe-overview", "LightPipe / Overview", ["scenario", "run", "training_job"], [
        P("table", "Runs", "One row per run: backend, workload, policies, emulation modes "
          "(lightpipe_run_info).", "none",
          [Q(last(f"lightpipe_run_info{{{R}}}"), instant=True, fmt="table")], w=24, h=5),
        P("table", "Jobs", "One row per emulated training job: model, schedule, worker mode, "
          "stage DCs (lightpipe_job_info).", "none",
          [Q(last(f"lightpipe_job_info{{{J}}}"), instant=True, fmt="table")], w=24, h=5),
        P("timeseries", "Iteration time per job",
          "Mean pipeline iteration wall time per training job over every iteration so far "
          "(emulated seconds: divide by the run's time_factor for real seconds). Not a rate "
          "window: a short job may be scraped once, after its last iteration.", "s",
          [Q("sum by (run, training_job) (lightpipe_worker_iteration_duration_seconds_sum"
             f"{{{J}}}) / sum by (run, training_job) ("
             f"lightpipe_worker_iteration_duration_seconds_count{{{J}}} > 0)",
             "{{training_job}}")]),
        P("timeseries", "Bubble ratio", "Idle share of each stage's last iteration, averaged "
          "over the job's stages (1 - compute / iteration time).", "percentunit",
          [Q(f"avg by (run, training_job) (lightpipe_worker_bubble_ratio{{{J}}})",
             "{{training_job}}")]),
        P("bargauge", "Job completion time", "Real seconds the job's emulated iterations took "
          "(sum of iteration wall times / time_factor), once the job has ended.", "s",
          [Q(last(f"lightpipe_job_completion_seconds{{{J}}}"), "{{training_job}}", instant=True)],
          w=8),
        P("bargauge", "Electricity cost", "Electricity cost of each job's GPUs over its "
          "completion time: GPU board power x PUE x the DC's price (the simulator's model).",
          "currencyUSD",
          [Q(last(f"lightpipe_job_electricity_cost_usd{{{J}}}"), "{{training_job}}", instant=True)],
          w=8),
        P("bargauge", "Sim-vs-emu agreement", "Relative error of the emulated iteration time "
          "against the simulator's prediction, per job (shadow-mode workers only).",
          "percentunit",
          [Q(last(f"lightpipe_job_agreement_relative_error{{{J}}}"), "{{training_job}}",
             instant=True)], w=8),
        P("timeseries", "Lightpath blocking ratio", "Lightpath requests the controller refused "
          "/ lightpath requests, per run (controller runs).", "percentunit",
          [Q(_ratio("lightpipe_lightpath_blocks_total", "lightpipe_lightpath_requests_total",
                    R), "{{run}}")]),
        P("timeseries", "Job blocking ratio", "POST /jobs placements the controller refused / "
          "placement requests, per run (controller runs).", "percentunit",
          [Q(_ratio("lightpipe_job_refusals_total", "lightpipe_job_requests_total", R),
             "{{run}}")]),
        P("bargauge", "Iteration time: emulated vs simulated", "Median iteration time per job "
          "in real seconds: measured on the emulated network and predicted by the simulator.",
          "s", [Q(last(f"lightpipe_job_iteration_seconds{{{J}}}"), "{{training_job}} {{source}}",
                  instant=True)], w=24, h=6),
        P("stat", "Faithful run (fidelity verdict)", "Whether every measured fidelity "
          "invariant of the emulated run held (1: faithful; 0: not, see the invariants): "
          "RTT per lightpath, how long forwarders and switch waited for a CPU per wake-up, "
          "the workers' CPU share, timer slack, drops "
          "and retransmissions (docs/emulation.md, Fidelity verdict). Set when the "
          "workload ends.", "bool_yes_no",
          [Q(last(f"lightpipe_run_faithful{{{R}}}"), "{{run}}", instant=True)], w=6),
        P("table", "Fidelity invariants", "Each measured fidelity invariant of the run: its "
          "value (shares 0..1, times in scenario ms), its threshold (bound max: value <= it; "
          "min: value >= it) and whether it held (ok 1/0; a listed one, judged by another, "
          "is always 1).", "none",
          [Q(last(f"lightpipe_fidelity_invariant_value{{{R}}}"), instant=True, fmt="table"),
           Q(last(f"lightpipe_fidelity_invariant_threshold{{{R}}}"), instant=True,
             fmt="table"),
           Q(last(f"lightpipe_fidelity_invariant_ok{{{R}}}"), instant=True, fmt="table")],
          w=18, h=8),
    ]


def optical() -> tuple[str, str, list[str], list[P]]:
    occ = (f"sum by (run, fibre) (lightpipe_fibre_slot_used{{{F}}}) / "
           f"max by (run, fibre) (lightpipe_fibre_slots{{{F}}})")
    return "lightpipe-optical", "LightPipe / Optical network", ["scenario", "run", "fibre"], [
        P("heatmap", "Spectrum occupancy per fibre", "Share of each fibre's spectrum slots held "
          "by lightpaths over time (one row per fibre; controller runs).", "percentunit",
          [Q(occ, "{{fibre}}")]),
        P("heatmap", "Spectrum slots in use", "Each spectrum slot of the selected fibres over "
          "time: 1 while a lightpath holds it (one row per fibre and slot).", "bool",
          [Q(f"max by (fibre, slot) (lightpipe_fibre_slot_used{{{F}}})",
             "{{fibre}} #{{slot}}")]),
        P("timeseries", "Active lightpaths", "Lightpaths set up through the controller now.",
          "short", [Q(f"lightpipe_lightpaths_active{{{R}}}", "{{run}}")], w=8),
        P("timeseries", "Lightpath set-up time", "Request to rules installed per lightpath: "
          "median and p99 over the run so far.", "s",
          _quantiles("lightpipe_lightpath_setup_seconds", R), w=8),
        P("timeseries", "Restoration time", "Fibre cut detected to re-routed rules installed: "
          "median and p99 over the run so far.", "s",
          _quantiles("lightpipe_restoration_seconds", R), w=8),
        P("timeseries", "Per-fibre throughput", "Bits per second each fibre's link emulator "
          "forwarded, per direction (emulated units: x bandwidth_divisor for real).", "bps",
          [Q(f"8 * sum by (run, fibre, direction) (rate(lightpipe_fibre_tx_bytes_total{{{F}}}"
             "[$__rate_interval]))", "{{fibre}} {{direction}}")]),
        P("timeseries", "Per-lightpath throughput", "Bits per second per lightpath (VLAN) and "
          "fibre direction, with each lightpath's rate cap (emulated units).", "bps",
          [Q(f"8 * sum by (run, fibre, direction, vlan) (rate(lightpipe_lightpath_bytes_total"
             f"{{{F}}}[$__rate_interval]))", "{{fibre}} {{direction}} vlan {{vlan}}"),
           Q(f"max by (run, vlan) (lightpipe_lightpath_rate_bits_per_second{{{F}}})",
             "cap vlan {{vlan}}")]),
        P("timeseries", "Queue depth", "Serialiser backlog of each fibre direction's link "
          "emulator.", "bytes",
          [Q(f"lightpipe_fibre_queue_depth_bytes{{{F}}}", "{{fibre}} {{direction}}")]),
        P("timeseries", "Drops", "Segments dropped per second per fibre direction: queue "
          "overflow (tail drop) and configured random loss; and frames the kernel dropped "
          "before the link emulator read them (emulator: it fell behind, outside the "
          "model).", "pps",
          [Q(f"sum by (run, fibre, direction) (rate(lightpipe_fibre_queue_drops_total{{{F}}}"
             "[$__rate_interval]))", "queue {{fibre}} {{direction}}"),
           Q(f"sum by (run, fibre, direction) (rate(lightpipe_fibre_loss_drops_total{{{F}}}"
             "[$__rate_interval]))", "loss {{fibre}} {{direction}}"),
           Q(f"sum by (run, fibre, direction) (rate(lightpipe_fibre_socket_drops_total"
             f"{{{F}}}[$__rate_interval]))", "emulator {{fibre}} {{direction}}")]),
        P("timeseries", "Link emulator timer slack", "How late each fibre's link emulator "
          "woke against its deadline (emulated seconds): median and p99 over the run so "
          "far. A late wake-up delays every frame due then.", "s",
          _quantiles("lightpipe_fibre_timer_slack_seconds", F, "run, fibre")),
        P("stat", "Lightpaths restored / lost", "Lightpaths re-routed after fibre cuts, and "
          "lightpaths dropped for want of a route or spectrum, in the selected runs.", "short",
          [Q("sum(" + last(f"lightpipe_lightpaths_restored_total{{{R}}}") + ")", "restored",
             instant=True),
           Q("sum(" + last(f"lightpipe_lightpaths_lost_total{{{R}}}") + ")", "lost",
             instant=True)]),
    ]


def workers() -> tuple[str, str, list[str], list[P]]:
    return ("lightpipe-workers", "LightPipe / Workers",
            ["scenario", "run", "training_job", "stage"], [
        P("timeseries", "Compute vs waiting time", "Share of wall time each stage spent "
          "computing, and waiting for an input from a neighbour (communication plus upstream "
          "idle time).", "percentunit",
          [Q(f"sum by (run, training_job, stage) (rate(lightpipe_worker_compute_seconds_total"
             f"{{{S}}}[$__rate_interval]))", "compute {{training_job}}/{{stage}}"),
           Q(f"sum by (run, training_job, stage) (rate(lightpipe_worker_wait_seconds_total"
             f"{{{S}}}[$__rate_interval]))", "wait {{training_job}}/{{stage}}")], w=24),
        P("timeseries", "Bytes sent", "Payload bytes per second each stage sends to its "
          "pipeline neighbours (activations and gradients).", "Bps",
          [Q(f"sum by (run, training_job, stage) (rate(lightpipe_worker_sent_bytes_total"
             f"{{{S}}}[$__rate_interval]))", "{{training_job}}/{{stage}}")]),
        P("timeseries", "Bytes received", "Payload bytes per second each stage receives from "
          "its pipeline neighbours.", "Bps",
          [Q(f"sum by (run, training_job, stage) (rate(lightpipe_worker_received_bytes_total"
             f"{{{S}}}[$__rate_interval]))", "{{training_job}}/{{stage}}")]),
        P("heatmap", "Iteration duration histogram", "Iterations completed per duration "
          "bucket over time, all selected stages (emulated seconds).", "s",
          [Q(f"sum by (le) (increase(lightpipe_worker_iteration_duration_seconds_bucket{{{S}}}"
             "[$__rate_interval]))", "{{le}}", fmt="heatmap")]),
        P("timeseries", "Iterations completed", "Pipeline iterations each stage has "
          "completed.", "short",
          [Q(f"lightpipe_worker_iterations_total{{{S}}}", "{{training_job}}/{{stage}}")]),
        P("timeseries", "Training loss", "Loss of the last iteration, reported by the last "
          "stage of model-mode jobs (shadow-mode workers train nothing).", "none",
          [Q(f"lightpipe_worker_loss{{{S}}}", "{{training_job}}/{{stage}}")], w=24),
    ])


def routing() -> tuple[str, str, list[str], list[P]]:
    return "lightpipe-routing", "LightPipe / Routing", ["scenario", "run"], [
        P("timeseries", "Per-job bottleneck rate", "Max-min fair rate of each all-reduce "
          "job's slowest flow under the chosen paths, per routing policy (real units).", "Bps",
          [Q(f"lightpipe_routing_job_bottleneck_bytes_per_second{{{R}}}",
             "{{policy}} {{allreduce_job}}")], w=24),
        P("timeseries", "Flows moved per re-route", "Flows whose path changed, divided by the "
          "re-routes (job arrival/departure, link failure/repair) in the window.", "short",
          [Q(f"sum by (run, policy) (increase(lightpipe_routing_flows_moved_total{{{R}}}"
             f"[$__rate_interval])) / sum by (run, policy) (increase("
             f"lightpipe_routing_reroutes_total{{{R}}}[$__rate_interval]))", "{{policy}}")]),
        P("timeseries", "Path computation time", "Time the routing policy took to compute the "
          "paths of one re-route: median and p99 over the run so far.", "s",
          _quantiles("lightpipe_routing_computation_seconds", R, "run, policy")),
    ]


DASHBOARDS = {"overview": overview, "optical": optical, "workers": workers,
              "routing": routing}

# Annotation on every dashboard: fibre cuts (the controller's lightpipe_fibre_up == 0).
CUT_ANNOTATION = {"expr": f"lightpipe_fibre_up{{{R}}} == 0", "name": "Fibre cuts",
                  "titleFormat": "fibre {{fibre}} cut", "textFormat": "run {{run}}",
                  "step": "1s", "iconColor": "red"}
# On the Workers dashboard: every network event the fault injector applied (a cut, a
# repair, each step of a flap, a slot block lost or repaired; the run exporter's
# lightpipe_network_event_timestamp_seconds, static forwarding included), placed at the
# time it was applied: the series' value, in ms (useValueForTime), not the scrape's.
NETWORK_EVENT_ANNOTATION = {
    "expr": "max by (run, event, kind, action, target, step) "
            f"(lightpipe_network_event_timestamp_seconds{{{R}}}) * 1000",
    "name": "Network events", "titleFormat": "{{action}} {{target}}",
    "textFormat": "{{kind}}: faults row {{event}}, step {{step}}; run {{run}}",
    "tagKeys": "kind,action", "useValueForTime": True, "step": "10s", "iconColor": "orange"}
ANNOTATIONS = {"workers": (CUT_ANNOTATION, NETWORK_EVENT_ANNOTATION)}
"""Each dashboard's annotations (CUT_ANNOTATION where not named)."""
PROM_ANNOTATION_FIELDS = ("titleFormat", "textFormat", "step", "tagKeys", "useValueForTime")
"""Prometheus annotation fields the SDK's builder lacks, set on the JSON."""


def _layout(panels: Sequence[P]) -> list[GridPos]:
    """Left to right, wrapping at 24 columns; a row is as tall as its tallest panel."""
    out, x, y, row_h = [], 0, 0, 0
    for p in panels:
        if x + p.w > WIDTH:
            x, y, row_h = 0, y + row_h, 0
        out.append(GridPos(x=x, y=y, w=p.w, h=p.h))
        x += p.w
        row_h = max(row_h, p.h)
    return out


def build(name: str) -> dict[str, Any]:
    """One dashboard as Grafana JSON (a dict)."""
    uid, title, var_names, panels = DASHBOARDS[name]()
    d = (db.Dashboard(title).uid(uid).tags(TAGS).time("now-1h", "now").refresh("10s")
         .timezone("browser").editable()
         .description("LightPipe emulation runs from Prometheus (docs/metrics.md)"))
    for v in var_names:
        label, query = VARIABLES[v]
        d = d.with_variable(_variable(v, label, query))
    annotations = ANNOTATIONS.get(name, (CUT_ANNOTATION,))
    for a in annotations:
        d = d.annotation(db.AnnotationQuery().name(str(a["name"])).datasource(DS)
                         .expr(str(a["expr"])).icon_color(str(a["iconColor"])).enable(True))
    for pid, (p, pos) in enumerate(zip(panels, _layout(panels), strict=True), start=1):
        d = d.with_panel(_panel(p, pid, pos))
    out = json.loads(json.dumps(d.build(), cls=JSONEncoder))
    for a in out["annotations"]["list"]:  # Prometheus annotation fields the SDK lacks
        spec = next(x for x in annotations if x["name"] == a["name"])
        a.update({k: spec[k] for k in PROM_ANNOTATION_FIELDS if k in spec})
    for v in out["templating"]["list"]:
        v["definition"] = v["query"]
    return out


def build_all() -> dict[str, str]:
    """{file name: JSON text} of every dashboard, stable (sorted keys, 2-space indent)."""
    return {f"{name}.json": json.dumps(build(name), indent=2, sort_keys=True) + "\n"
            for name in DASHBOARDS}
