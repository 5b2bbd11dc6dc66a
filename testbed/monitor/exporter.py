"""The run exporter: one /metrics per emulation run with the run's and its jobs' facts.

`lightpipe_run_info`, start and end times, and once the jobs are done, per training
job: completion time, iteration time (emulated and simulated), agreement, bubble
ratio, success and electricity cost; at the end the fidelity verdict (faithful or not,
and each measured invariant's value, threshold and pass/fail; testbed.emu.fidelity)
(docs/metrics.md). The run's targets carry the
`run` and `scenario` labels, so these series do too.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Gauge

from testbed.emu.scale import Scale

log = logging.getLogger(__name__)

JOB_METRICS = (
    "lightpipe_job_info", "lightpipe_job_completion_seconds", "lightpipe_job_iteration_seconds",
    "lightpipe_job_agreement_relative_error", "lightpipe_job_bubble_ratio",
    "lightpipe_job_succeeded", "lightpipe_job_electricity_cost_usd",
)
FIDELITY_METRICS = (
    "lightpipe_run_faithful", "lightpipe_fidelity_invariant_ok",
    "lightpipe_fidelity_invariant_value", "lightpipe_fidelity_invariant_threshold",
)


class RunExporter:
    """The run's own metrics, in their own registry, served on 127.0.0.1:any."""

    def __init__(self, info: Mapping[str, str]) -> None:
        r = self.registry = CollectorRegistry()
        keys = sorted(info)
        Gauge("lightpipe_run_info", "Constant 1; labels describe the run (backend, workload, "
              "policies, emulation modes)", keys, registry=r).labels(**info).set(1)
        self.start = Gauge("lightpipe_run_start_time_seconds",
                           "Unix time the run's network came up", registry=r)
        self.start.set(time.time())
        self.end = Gauge("lightpipe_run_end_time_seconds",
                         "Unix time the run's workload ended (0 while it runs)",
                         registry=r)
        j = ["training_job"]
        self.job_info = Gauge("lightpipe_job_info", "Constant 1 per emulated training job; "
                              "labels: model, schedule, worker mode, stage DCs",
                              [*j, "model", "schedule", "mode", "stage_dcs"], registry=r)
        self.jct = Gauge("lightpipe_job_completion_seconds",
                         "Job completion time of the emulated iterations, real seconds "
                         "(sum of iteration wall times / time_factor)", j, registry=r)
        self.iteration = Gauge("lightpipe_job_iteration_seconds",
                               "Median iteration time in real seconds; source=emulated "
                               "(measured) or simulated (predicted)", [*j, "source"],
                               registry=r)
        self.agreement = Gauge("lightpipe_job_agreement_relative_error",
                               "|emulated - simulated| / simulated iteration time "
                               "(shadow mode)", j, registry=r)
        self.bubble = Gauge("lightpipe_job_bubble_ratio",
                            "Median bubble ratio of the job's measured iterations", j,
                            registry=r)
        self.ok = Gauge("lightpipe_job_succeeded", "1 if every worker of the job finished, "
                        "else 0", j, registry=r)
        self.cost = Gauge("lightpipe_job_electricity_cost_usd",
                          "Electricity cost of the job's GPUs over its completion time "
                          "(GPU board power x PUE x DC price)", j, registry=r)
        self.faithful = Gauge("lightpipe_run_faithful", "1 if every measured fidelity "
                              "invariant held, else 0 (set when the workload ends)",
                              registry=r)
        inv = ["invariant", "unit"]
        self.inv_ok = Gauge("lightpipe_fidelity_invariant_ok", "1 if the measured invariant "
                            "is within its threshold, else 0", inv, registry=r)
        self.inv_value = Gauge("lightpipe_fidelity_invariant_value", "Measured value of a "
                               "fidelity invariant (its unit label; shares are 0..1, times "
                               "in scenario ms)", inv, registry=r)
        self.inv_threshold = Gauge("lightpipe_fidelity_invariant_threshold", "Bound of a "
                                   "fidelity invariant (bound=max: value <= it; min: >=)",
                                   [*inv, "bound"], registry=r)
        self.net_event = Gauge(
            "lightpipe_network_event_timestamp_seconds", "Unix time a network event was "
            "applied to the emulated network (the fault injector: a fibre cut or repair, "
            "each step of a flap, a slot block lost or repaired); event: its row in "
            "summary.json faults, kind: the spec's kind, action: what this step did, step: "
            "its number within the event (a flap's cuts and repairs)",
            ["event", "kind", "action", "target", "step"], registry=r)
        self.server: Any = None
        self.port: int | None = None
        self.ended = False

    def start_serving(self) -> str:
        from workloads.metrics import serve

        self.server, self.port = serve(self.registry, host="127.0.0.1", port=0)
        return self.target

    @property
    def target(self) -> str:
        assert self.port is not None, "start_serving() first"
        return f"127.0.0.1:{self.port}"

    def record_jobs(self, result: Mapping[str, Any], scenario: Any = None) -> None:
        """Per-job gauges from run_pp_jobs' result (worker_jobs, agreement)."""
        scale = Scale.of(getattr(scenario, "emulation", None))
        for s in result.get("worker_jobs", []):
            name = str(s["job"])
            self.job_info.labels(name, str(s.get("model", "")), str(s.get("schedule", "")),
                                 str(s.get("mode", "")),
                                 ",".join(s.get("stage_dcs", []))).set(1)
            self.ok.labels(name).set(1 if s.get("ok") else 0)
            its = s.get("iteration_times_s") or []
            if its:
                jct = scale.real_s(sum(its))
                self.jct.labels(name).set(jct)
                cost = job_cost_usd(scenario, name, s.get("stage_dcs", []), jct)
                if cost is not None:
                    self.cost.labels(name).set(cost)
            if s.get("emulated_iteration_time_s") is not None:
                self.iteration.labels(name, "emulated").set(s["emulated_iteration_time_s"])
            if s.get("simulated_iteration_time_s") is not None:
                self.iteration.labels(name, "simulated").set(s["simulated_iteration_time_s"])
            if s.get("bubble_ratio") is not None:
                self.bubble.labels(name).set(s["bubble_ratio"])
        for row in result.get("agreement", []):
            if row.get("relative_error") is not None:
                self.agreement.labels(str(row["job"])).set(row["relative_error"])

    def record_network_event(self, event: int, kind: str, action: str, target: str,
                             step: int, unix_s: float) -> None:
        """One applied network event (step): its time, for the dashboards' annotations
        (Grafana places each at the value: useValueForTime)."""
        self.net_event.labels(str(event), kind, action, target, str(step)).set(unix_s)

    def record_fidelity(self, verdict: Mapping[str, Any]) -> None:
        """The fidelity verdict's gauges: faithful, and each measured invariant (an
        unmeasured one has no value to show)."""
        for i in verdict.get("invariants", []):
            if not i.get("measured") and i.get("ok", True):
                continue  # not measured in this run (failed for want of a reply: ok 0)
            labels = (str(i["name"]), str(i.get("unit", "")))
            self.inv_ok.labels(*labels).set(1 if i.get("ok") else 0)
            if i.get("measured"):
                self.inv_value.labels(*labels).set(float(i["value"]))
            self.inv_threshold.labels(*labels, str(i.get("bound", ""))).set(
                float(i["threshold"]))
        self.faithful.set(1 if verdict.get("faithful") else 0)

    def finish(self) -> None:
        """Set the end time (once: a later call keeps the first)."""
        if not self.ended:
            self.ended = True
            self.end.set(time.time())

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None


def job_cost_usd(scenario: Any, job: str, stage_dcs: list[str], seconds: float
                 ) -> float | None:
    """Electricity cost of `job` (named job<id>, as the emulator names them) holding
    gpus_per_stage GPUs per stage in stage_dcs for `seconds` (the simulator's model)."""
    from testbed.jobs.model import energy_kwh, gpu_type, mean_price_usd_per_kwh
    from testbed.spec.models import PPJobsWorkload
    from testbed.traces import generate_jobs

    wl = getattr(scenario, "workload", None)
    if not isinstance(wl, PPJobsWorkload) or not job.startswith("job"):
        return None
    try:
        req = {f"job{r.job_id}": r for r in generate_jobs(wl)}.get(job)
        dcs = {d.name: d for d in scenario.dcs}
        if req is None or any(dc not in dcs for dc in stage_dcs):
            return None
        total = 0.0
        for dc_name in stage_dcs:
            dc = dcs[dc_name]
            price = mean_price_usd_per_kwh(dc.price_usd_per_kwh, dc.price_curve_usd_per_kwh,
                                           0.0, seconds)
            total += energy_kwh(req.gpus_per_stage, gpu_type(dc.gpu).power_w, seconds) * price
        return total
    except (KeyError, ValueError) as exc:
        log.debug("no electricity cost for %s: %s", job, exc)
        return None
