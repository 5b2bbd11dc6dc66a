"""Reads worker records: per-iteration times, measured bubble ratio, Chrome trace.

Pure code (no torch). A job's iteration time is measured as in the simulator: from
the start of stage 0's first op to the end of the last op on any stage, using the
machine-wide monotonic clock every worker writes.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from testbed.emu.scale import Scale
from testbed.io.records import read_json_lines

UNSCALED = Scale()  # records of a run at 1:1


def read_records(path: Path) -> list[dict[str, Any]]:
    """The JSON lines of one worker ([] before it wrote any); a truncated last line
    (killed worker) is skipped; a link, a non-regular or an oversized file is refused
    (testbed.io.records)."""
    return read_json_lines(path, "worker records")


def quantile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolation quantile (numpy's default) of an ascending sequence."""
    if not sorted_values:
        raise ValueError("quantile of no values")
    pos = q * (len(sorted_values) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def iterations_of(records: Sequence[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    return {r["iteration"]: r for r in records if r.get("type") == "iteration"}


def job_iterations(stages: Sequence[Sequence[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per iteration completed by every stage: time (s), bubble ratio, warm-up flag."""
    per_stage = [iterations_of(recs) for recs in stages]
    if not per_stage:
        return []
    common = sorted(set.intersection(*(set(d) for d in per_stage)))
    p = len(stages)
    out = []
    for it in common:
        recs = [d[it] for d in per_stage]
        if not recs[0]["ops"] or not all(r["ops"] for r in recs):
            continue
        start = min(op[1] for op in recs[0]["ops"])
        end = max(op[2] for r in recs for op in r["ops"])
        dur = end - start
        busy = sum(op[2] - op[1] for r in recs for op in r["ops"])
        row = {"iteration": it, "warmup": bool(recs[0].get("warmup")), "time_s": dur,
               "bubble_ratio": 1.0 - busy / (p * dur) if dur > 0 else 0.0,
               "sent_bytes": sum(r["sent_bytes"] for r in recs)}
        # CPU starvation signs: the least CPU share any stage got (shadow workers), and
        # how much longer than asked the ops of the slowest stage ran.
        shares = [r["cpu_share"] for r in recs if isinstance(r.get("cpu_share"), (int, float))]
        if shares:
            row["cpu_share"] = min(shares)
        overruns = [sum(op[2] - op[1] for op in r["ops"]) / r["compute_s"] - 1.0
                    for r in recs if r.get("compute_s", 0) > 0]
        if overruns:
            row["op_overrun"] = max(overruns)
        if "loss" in recs[-1]:
            row["loss"] = recs[-1]["loss"]
        out.append(row)
    return out


def summarize_job(job: str, stages: Sequence[Sequence[dict[str, Any]]],
                  scale: Scale = UNSCALED) -> dict[str, Any]:
    """Median iteration time (emulated and rescaled to real seconds) over measured iterations."""
    its = job_iterations(stages)
    measured = [r for r in its if not r["warmup"]] or its
    out: dict[str, Any] = {"job": job, "iterations_measured": len(measured)}
    if measured:
        times = sorted(r["time_s"] for r in measured)
        med = statistics.median(times)
        out.update({"emulated_iteration_time_s": scale.real_s(med),
                    "emulated_p10_s": scale.real_s(quantile(times, 0.1)),
                    "emulated_p90_s": scale.real_s(quantile(times, 0.9)),
                    "wall_iteration_time_s": med,
                    "bubble_ratio": statistics.median(r["bubble_ratio"] for r in measured),
                    "iteration_times_s": [r["time_s"] for r in its]})
        for key in ("cpu_share", "op_overrun"):
            vals = [r[key] for r in measured if key in r]
            if vals:
                out[f"{key}_median"] = statistics.median(vals)
        losses = [r["loss"] for r in its if "loss" in r]
        if losses:
            out["losses"] = losses
    starts = [r for recs in stages for r in recs if r.get("type") == "start"]
    if starts:
        out["startup_s"] = max(r["ready_s"] - r["import_start_s"] for r in starts)
    return out


def chrome_trace(jobs: dict[str, Sequence[Sequence[dict[str, Any]]]]) -> dict[str, Any]:
    """Chrome trace (chrome://tracing, Perfetto): one process per job, one thread per stage.

    Ops are complete events ("X"); time spent waiting for an input is a separate event
    in category "wait". Times are microseconds from the earliest op of the run.
    """
    t0 = min((op[1] for stages in jobs.values() for recs in stages for r in recs
              if r.get("type") == "iteration" for op in r["ops"]), default=0.0)
    events: list[dict[str, Any]] = []
    for pid, (job, stages) in enumerate(sorted(jobs.items())):
        events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                       "args": {"name": f"job {job}"}})
        for stage, recs in enumerate(stages):
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": stage,
                           "args": {"name": f"stage {stage}"}})
            for r in recs:
                if r.get("type") != "iteration":
                    continue
                for cat, key in (("compute", "ops"), ("wait", "waits")):
                    for name, s, e in r[key]:
                        events.append({"ph": "X", "cat": cat, "pid": pid, "tid": stage,
                                       "name": name if cat == "compute" else f"wait {name}",
                                       "ts": (s - t0) * 1e6, "dur": (e - s) * 1e6,
                                       "args": {"iteration": r["iteration"]}})
    return {"traceEvents": events, "displayTimeUnit": "ms"}
