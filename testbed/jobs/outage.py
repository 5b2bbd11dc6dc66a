"""The simulator's prediction of what a scenario's network events do to its jobs.

`predict_outage(scenario, outage_s)` is what an emulation compares its measured
`fault_impact` with: the same rows, by the same definitions, from the job simulator
(testbed/jobs/engine.py) with the outage a restored job sees set per event (e.g. the
controller's measured restoration) and, by default, the jobs as the emulation runs
them: its first `emulation.max_jobs` jobs, all starting at the events' zero, and
`forwarding: static` (rules written once: a cut circuit stays down until its repair)
as protection scheme none.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from testbed.errors import InputError
from testbed.jobs.faults import TCP_TIMEOUT_MIN_S, CutPhase
from testbed.spec.models import PPJobsWorkload, Scenario
from testbed.traces import generate_jobs


def _outages(scenario: Scenario, outage_s: float | Mapping[int, float] | None
             ) -> dict[int, float]:
    """Spec event index -> outage (s); InputError naming the value when it is not a
    finite number >= 0 or names no network event."""
    if outage_s is None:
        return {}
    given = outage_s if isinstance(outage_s, Mapping) else {
        i: outage_s for i, ev in enumerate(scenario.events)}
    out: dict[int, float] = {}
    for i, v in given.items():
        if not isinstance(i, int) or not 0 <= i < len(scenario.events):
            raise InputError("outage_s", f"event index {i!r} is not one of the scenario's "
                             f"{len(scenario.events)} events")
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) \
                or v < 0:
            raise InputError("outage_s", f"must be a finite number of seconds >= 0 "
                             f"(got {v!r} for events[{i}])")
        out[i] = float(v)
    return out


PhaseArg = CutPhase | Mapping[str, Any] | str
PhasesArg = Mapping[str, Mapping[int, PhaseArg]] | Mapping[int, PhaseArg]


def _cut_phases(scenario: Scenario, phases: PhasesArg | None, as_emulated: bool
                ) -> dict[tuple[int, int], CutPhase]:
    """(job id, spec event index) -> CutPhase. `phases`: per job name (job<id>) and
    spec event index, or per event index for every job; each a CutPhase, its as_dict()
    or a kind. As emulated, the loss probe's constant (a constant of the kernel's clock,
    which the time dilation does not stretch) is TCP_TIMEOUT_MIN_S / time_factor of
    scenario time; for the real world TCP_TIMEOUT_MIN_S."""
    if not phases:
        return {}
    n_jobs = len(generate_jobs(scenario.workload))  # type: ignore[arg-type]
    per_job: dict[int, Mapping[int, PhaseArg]] = {}
    if all(isinstance(k, int) for k in phases):
        per_job = {j: phases for j in range(n_jobs)}  # type: ignore[misc]
    else:
        for name, evs in phases.items():
            if not isinstance(name, str) or not name.startswith("job") \
                    or not name[3:].isdigit():
                raise InputError("phases", f"job {name!r} is not a job<id> name")
            per_job[int(name[3:])] = evs  # type: ignore[assignment]
    slack = TCP_TIMEOUT_MIN_S / scenario.emulation.time_factor if as_emulated \
        else TCP_TIMEOUT_MIN_S
    out: dict[tuple[int, int], CutPhase] = {}
    for job, evs in per_job.items():
        for i, v in evs.items():
            i = int(i)
            if not 0 <= i < len(scenario.events):
                raise InputError("phases", f"event index {i!r} is not one of the "
                                 f"scenario's {len(scenario.events)} events")
            try:
                cut = CutPhase.of(v)
            except (TypeError, ValueError) as exc:
                raise InputError("phases", f"job{job} events[{i}]: {exc}") from exc
            out[(job, i)] = dataclasses.replace(cut, tlp_slack_s=slack)
    return out


def _phases_out(cuts: Mapping[tuple[int, int], CutPhase]) -> dict[str, dict[int, Any]]:
    out: dict[str, dict[int, Any]] = {}
    for (job, i), cut in sorted(cuts.items()):
        out.setdefault(f"job{job}", {})[i] = cut.as_dict()
    return out


def predict_outage(scenario: Scenario, outage_s: float | Mapping[int, float] | None = None,
                   *, as_emulated: bool = True, rto_min_s: float | None = None,
                   phases: PhasesArg | None = None) -> dict[str, Any]:
    """The simulator's per-job figures for the scenario's events (docs/faults.md, "The
    job's side"): {"source": "sim", "fault_impact": rows, "iterations": rows of
    fault_iterations.csv, "jobs": per job its iteration time, failure and reason,
    "model": the stated model}. `outage_s`: one outage for every event, or per spec
    event index (None: policy.protection's). `rto_min_s` overrides
    policy.workers.tcp_rto_min_s (an emulation's kernel keeps 200 ms of wall time:
    0.2 / time_factor on the scenario clock). `phases`: what each hit lightpath carried
    at the cut (testbed.jobs.faults.CutPhase: idle, control or bulk, the flight lost),
    per job name and spec event index or per event index; the transport model of that
    hit then follows it (docs/faults.md, "The cut's phase"); without one, the
    phase-free model."""
    from testbed.jobs.impact import hit_records, job_name
    from testbed.jobs.sim import simulate

    wl = scenario.workload
    if not isinstance(wl, PPJobsWorkload):
        raise InputError("workload.kind", "the outage prediction needs a pp_jobs workload")
    outages = _outages(scenario, outage_s)
    if rto_min_s is not None:
        if not math.isfinite(rto_min_s) or rto_min_s < 0:
            raise InputError("rto_min_s", f"must be a finite number >= 0 (got {rto_min_s!r})")
        workers = scenario.policy.workers.model_copy(update={"tcp_rto_min_s": rto_min_s})
        scenario = scenario.model_copy(update={
            "policy": scenario.policy.model_copy(update={"workers": workers})})
    if as_emulated and scenario.emulation.forwarding == "static":
        # static rules: a cut circuit stays down until its fibre's repair
        prot = scenario.policy.protection.model_copy(update={"scheme": "none"})
        scenario = scenario.model_copy(update={
            "policy": scenario.policy.model_copy(update={"protection": prot})})
    reqs = generate_jobs(wl)
    if as_emulated:
        reqs = [dataclasses.replace(r, arrival_s=0.0)
                for r in reqs[:scenario.emulation.max_jobs]]
    cuts = _cut_phases(scenario, phases, as_emulated)
    states, summary = simulate(scenario, requests=reqs, outages_s=outages, cut_phases=cuts)
    rows, its = hit_records(states, scenario) if scenario.events else ([], [])
    return {
        "source": "sim",
        "scenario": scenario.name,
        "as_emulated": as_emulated,
        "outages_s": outages,
        "cut_phases": _phases_out(cuts),
        "fault_impact": rows,
        "iterations": its,
        "jobs": {job_name(s): {
            "iteration_time_s": s.iteration_ms / 1000.0 if s.iteration_ms else None,
            "failed": s.reason == "collective_timeout", "reason": s.reason,
            "error": s.error, "restarts": s.restarts} for s in states},
        "model": summary.get("fault_model"),
    }
