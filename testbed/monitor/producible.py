"""Which dashboard queries a run cannot fill, decided from what the run is.

A run describes itself in `lightpipe_run_info` (its workload, forwarding, policies, DC
fabric, worker mode and event kinds: testbed.monitor.run.run_info). Each metric family a
dashboard uses needs something of the run (a pipeline workload, the SDN controller, a
routing policy on a leaf-spine fabric, a fibre cut, workers that train a model, fibres
run by the user-space link emulator, whose counters netem qdiscs do not keep); a query
that names a family the run lacks is empty because the run cannot produce it, and
`lightpipe grafana check` names it and the reason instead of counting it as a failure.
A label the run does not carry (older runs) never makes a query unproducible.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence

RunFacts = Mapping[str, str]  # the lightpipe_run_info labels of one run
Check = Callable[[RunFacts], "str | None"]  # why this run cannot produce it, or None

# spec event kinds after which the controller loses and restores lightpaths
CUTS = frozenset({"fiber_cut", "link_flap", "wavelength_loss"})
METRIC = re.compile(r"\blightpipe_[a-z0-9_]+")
# "a fibre is down": the cut annotations; only a cut, flap or wavelength loss makes one
FIBRE_DOWN = re.compile(r"lightpipe_fibre_up\{[^}]*\}\s*==\s*0")


def _pipeline(f: RunFacts) -> str | None:
    kind = f.get("workload")
    if kind and kind != "pp_jobs":
        return f"a {kind} workload runs no pipeline jobs or workers"
    return None


def _controller(f: RunFacts) -> str | None:
    fwd = f.get("forwarding")
    if fwd and fwd != "controller":
        return f"{fwd} forwarding: no SDN controller"
    return None


def _model(f: RunFacts) -> str | None:
    mode = f.get("workers")
    if mode and mode != "model":
        return f"{mode}-mode workers train no model, so report no loss"
    return None


def _fabric_routing(f: RunFacts) -> str | None:
    if "dc_fabric" not in f or "routing" not in f:
        return None
    if f["dc_fabric"] != "leaf_spine" or f["routing"] in ("", "none"):
        return ("no routing policy on a leaf-spine DC fabric (policy.routing, "
                "emulation.dc_fabric)")
    return None


def _forwarder(f: RunFacts) -> str | None:
    if f.get("link_mode") == "netem":
        return ("netem links are kernel qdiscs: no per-fibre or per-lightpath counters "
                "(the user-space link emulator exports them)")
    return None


def _cut(f: RunFacts) -> str | None:
    if "events" not in f:
        return None
    kinds = {k for k in f["events"].split(",") if k} - {"none"}
    if not kinds & CUTS:
        return "no fibre cut, flap or wavelength loss in the scenario's events"
    return None


NETWORK_KINDS = frozenset({"fiber_cut", "fiber_repair", "link_flap", "wavelength_loss",
                           "wavelength_repair"})


def _network_event(f: RunFacts) -> str | None:
    """The fault injector's network events (pp_jobs runs; a request replay applies its
    events itself and exports none)."""
    if "events" in f:
        kinds = {k for k in f["events"].split(",") if k} - {"none"}
        if not kinds & NETWORK_KINDS:
            return "no network event (fibre, flap or slot block) in the scenario's events"
    kind = f.get("workload")
    if kind and kind != "pp_jobs":
        return (f"a {kind} run replays its events without the fault injector, which "
                "exports them")
    return None


# metric name prefix -> what the run needs, checked in order (the first prefix that
# matches a metric decides; longer prefixes first)
NEEDS: tuple[tuple[str, tuple[Check, ...]], ...] = (
    ("lightpipe_network_event_", (_network_event,)),
    ("lightpipe_worker_loss", (_pipeline, _model)),
    ("lightpipe_worker_", (_pipeline,)),
    ("lightpipe_job_requests", (_pipeline, _controller)),
    ("lightpipe_job_refusals", (_pipeline, _controller)),
    ("lightpipe_job_", (_pipeline,)),
    ("lightpipe_jobs_", (_pipeline, _controller)),
    ("lightpipe_routing_", (_controller, _fabric_routing)),
    ("lightpipe_restoration_", (_controller, _cut)),
    ("lightpipe_lightpaths_restored", (_controller, _cut)),
    ("lightpipe_lightpaths_lost", (_controller, _cut)),
    ("lightpipe_lightpath_setup", (_controller,)),
    ("lightpipe_lightpath_requests", (_controller,)),
    ("lightpipe_lightpath_blocks", (_controller,)),
    ("lightpipe_lightpaths_active", (_controller,)),
    ("lightpipe_fibre_up", (_controller,)),
    ("lightpipe_fibre_slot", (_controller,)),
    # the user-space forwarders' counters (testbed.metrics.links.LINK_METRIC_NAMES)
    ("lightpipe_fibre_rx_", (_forwarder,)),
    ("lightpipe_fibre_tx_", (_forwarder,)),
    ("lightpipe_fibre_queue_", (_forwarder,)),
    ("lightpipe_fibre_loss_", (_forwarder,)),
    ("lightpipe_fibre_socket_", (_forwarder,)),
    ("lightpipe_fibre_timer_", (_forwarder,)),
    ("lightpipe_lightpath_bytes", (_forwarder,)),
    ("lightpipe_lightpath_drops", (_forwarder,)),
    ("lightpipe_lightpath_rate", (_forwarder,)),
)


def why_not(expr: str, facts: RunFacts) -> str | None:
    """Why a run with these facts cannot give the query `expr` data, or None (it can,
    as far as its facts tell)."""
    if FIBRE_DOWN.search(expr):
        for check in (_controller, _cut):
            reason = check(facts)
            if reason:
                return reason
    for metric in sorted(set(METRIC.findall(expr))):
        for prefix, checks in NEEDS:
            if metric.startswith(prefix):
                for check in checks:
                    reason = check(facts)
                    if reason:
                        return reason
                break
    return None


def why_none_can(expr: str, runs: Mapping[str, RunFacts]) -> str | None:
    """Why none of `runs` (run id -> facts) can give `expr` data, or None when one can
    (or when there is no run to judge by)."""
    if not runs:
        return None
    reasons = {run: why_not(expr, facts) for run, facts in sorted(runs.items())}
    if any(r is None for r in reasons.values()):
        return None
    distinct = sorted(set(reasons.values()))  # type: ignore[arg-type]
    if len(runs) == 1:
        return distinct[0]
    return f"none of the {len(runs)} runs can: " + "; ".join(distinct)


def run_facts(results: Sequence[Mapping[str, object]]) -> dict[str, dict[str, str]]:
    """run id -> lightpipe_run_info labels, from a Prometheus result of that metric."""
    out: dict[str, dict[str, str]] = {}
    for r in results:
        labels = r.get("metric")
        if isinstance(labels, dict) and isinstance(labels.get("run"), str):
            out[labels["run"]] = {str(k): str(v) for k, v in labels.items()}
    return out
