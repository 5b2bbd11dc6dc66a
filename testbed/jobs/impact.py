"""A simulated run's job-side fault records: summary.json `fault_impact` and its iterations."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from testbed.analysis.faultimpact import TOLERANCE
from testbed.jobs.engine import JobSimulator, JobState
from testbed.jobs.faults import impact_of
from testbed.spec.faults import sim_fault_rows
from testbed.spec.models import Scenario


def job_name(st: JobState) -> str:
    """A job as the records name it (job<id>; the emulation's first job is job0 too)."""
    return f"job{st.job.req.job_id}"


def hit_records(states: Sequence[JobState], scenario: Scenario
                ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(fault_impact rows, fault_iterations.csv rows) of every job every network event
    hit, in time order then job order."""
    rows: list[tuple[float, int, dict[str, Any]]] = []
    its: list[dict[str, Any]] = []
    for st in states:
        for k, rec in enumerate(st.hits):  # a job's window ends at its next hit
            nxt = st.hits[k + 1]["at_s"] if k + 1 < len(st.hits) else None
            row, marks = impact_of(job_name(st), st.trace, st.start_s, rec, nxt,
                                   st.job.req.iterations, st.iterations_done)
            rows.append((rec["at_s"], st.job.req.job_id, row))
            its += marks
    rows.sort(key=lambda r: (r[0], r[1]))
    return [r for _, _, r in rows], its


def fault_summary(summary: dict[str, Any], scenario: Scenario, states: Sequence[JobState],
                  sim: JobSimulator) -> None:
    """Add `faults` (one row per spec event, with the jobs it hit and their outages),
    `fault_impact` and `fault_model` to a simulation's summary."""
    rows, _ = hit_records(states, scenario)
    faults = sim_fault_rows(scenario.events)
    order = sorted(range(len(scenario.events)), key=lambda i: scenario.events[i].at_s)
    by_index = {i: faults[k] for k, i in enumerate(order)}
    for r in rows:
        f = by_index.get(r["event"])
        if f is None:
            continue
        f.setdefault("jobs_hit", [])
        if r["job"] not in f["jobs_hit"]:
            f["jobs_hit"].append(r["job"])
        if r.get("outage_s") is not None:
            f["outage_s"] = max(f.get("outage_s") or 0.0, r["outage_s"])
        if not r["survived"]:
            f.setdefault("jobs_failed", []).append(r["job"])
    summary["faults"] = faults
    summary["fault_impact"] = rows
    w = sim.workers
    prot = sim.protection
    summary["fault_model"] = {
        "protection": prot.scheme, "restoration_s": prot.restoration_s,
        "switch_s": prot.switch_s, "collective_timeout_s": w.collective_timeout_s,
        "on_fault": w.on_fault, "restart_s": w.restart_s, "max_restarts": w.max_restarts,
        "transport": w.transport, "tcp_rto_min_s": w.tcp_rto_min_s,
        "tolerance": TOLERANCE,
        "model": "the whole pipeline waits for the hit boundary: frozen from the cut until "
                 "its traffic flows again (tcp: the first of the tail loss probe at 2 RTT "
                 "and the retransmissions rto0 = RTT + tcp_rto_min_s apart, doubling, at "
                 "or after the path's return, then 2 RTTs of the new path to recover; "
                 "given the cut's phase (testbed.jobs.faults.CutPhase): idle no wait, "
                 "a lost flight of k segments the probe after its last send, then "
                 "ceil(log2(k + 1)) RTTs of the new path; "
                 "ideal: the path's return), then the new route's iteration time. Longer "
                 "than the collective time-out (or TCP giving up): fail, or retry "
                 "(restart_s after the time-out and the path's return, the interrupted "
                 "iteration redone)."}
    summary["jobs_failed_collective"] = sum(1 for s in states
                                            if s.reason == "collective_timeout")
    summary["lightpaths_switched"] = sim.switched_lightpaths
    summary["unprotected_boundaries"] = sim.unprotected_boundaries
