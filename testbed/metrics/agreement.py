"""Agreement between the simulator and the emulator: per job, predicted vs measured time."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from testbed.emu.fidelity import (
    MIN_COMPUTE_SHARE,
    starvation_reason,
    steal_invariant,
    worker_job_invariants,
)


def relative_error(simulated: float, emulated: float) -> float:
    """|emulated - simulated| / simulated."""
    if not simulated > 0:
        raise ValueError(f"simulated iteration time must be > 0, got {simulated}")
    return abs(emulated - simulated) / simulated


# When a run's agreement is a figure (docs/workers.md "Agreement"): enough measured
# iterations, and a faithful run. The CPU-starvation checks are the fidelity verdict's
# invariants (testbed.emu.fidelity: worker_compute_share, worker_timer_slack, host_steal),
# with their thresholds; the run path adds every other failed invariant to the reasons.
MIN_ITERATIONS = 20
MIN_CPU_SHARE = MIN_COMPUTE_SHARE  # median, over iterations, of the least CPU share of any stage
DETAIL_KEYS = ("iterations_measured", "emulated_p10_s", "emulated_p90_s",
               "cpu_share_median", "op_overrun_median")


def agreement_rows(simulated_s: Mapping[str, float],
                   emulated_s: Mapping[str, float | None],
                   details: Mapping[str, Mapping[str, Any]] | None = None
                   ) -> list[dict[str, Any]]:
    """One row per job in simulated_s: job, both iteration times (s), relative error of
    the median; with `details` (a job's summary) also p10/p90 of the measured iterations,
    their errors, the iteration count and the CPU-starvation signs (DETAIL_KEYS).

    A job without an emulated time (its workers failed) gets None for the emulated
    time and the error, so the table still lists it.
    """
    rows = []
    for job, sim in simulated_s.items():
        emu = emulated_s.get(job)
        ok = emu is not None and math.isfinite(emu)
        row: dict[str, Any] = {
            "job": job, "simulated_iteration_time_s": sim,
            "emulated_iteration_time_s": emu if ok else None,
            "relative_error": relative_error(sim, emu) if ok else None}  # type: ignore[arg-type]
        d = (details or {}).get(job, {})
        for key in DETAIL_KEYS:
            if d.get(key) is not None:
                row[key] = d[key]
        for q in ("p10", "p90"):
            v = d.get(f"emulated_{q}_s")
            if ok and v is not None:
                row[f"relative_error_{q}"] = (v - sim) / sim  # signed: where the spread lies
        row["starved"] = starvation_reasons(row)
        rows.append(row)
    return rows


def starvation_reasons(row: Mapping[str, Any]) -> list[str]:
    """Why one job's measured times do not measure the modelled network (empty: none):
    its failed fidelity invariants (testbed.emu.fidelity.worker_job_invariants)."""
    return [starvation_reason(i) for i in worker_job_invariants(row) if not i.ok]


def agreement_verdict(rows: Sequence[Mapping[str, Any]],
                      host: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The run's agreement in one record: median and worst job, and whether it is a figure
    (`reliable`) or not, with the reasons (CPU starvation, too few iterations)."""
    errs = [(r["relative_error"], r["job"]) for r in rows if r.get("relative_error") is not None]
    out: dict[str, Any] = {"jobs": len(rows), "jobs_measured": len(errs)}
    if errs:
        out["median_relative_error"] = statistics.median(e for e, _ in errs)
        worst = max(errs)
        out["worst_relative_error"], out["worst_job"] = worst
    reasons = []
    if len(errs) < len(rows):
        reasons.append(f"{len(rows) - len(errs)} job(s) without a measured time")
    for r in rows:
        n = r.get("iterations_measured")
        if n is not None and n < MIN_ITERATIONS:
            reasons.append(f"{r['job']}: only {n} measured iterations (< {MIN_ITERATIONS})")
        reasons += [f"{r['job']}: {w}" for w in r.get("starved") or []]
    steal = steal_invariant(host)
    if not steal.ok:
        assert steal.value is not None
        reasons.append(f"the hypervisor took {100 * steal.value:.0f} % of the CPU time (steal)")
    out["reliable"] = not reasons
    out["reasons"] = reasons
    if host:
        out["host"] = dict(host)
    return out


def verdict_line(verdict: Mapping[str, Any]) -> str:
    """One line for the console and agreement.md."""
    if verdict.get("worst_relative_error") is None:
        head = "agreement: no job measured"
    else:
        head = (f"agreement: median {100 * verdict['median_relative_error']:.1f} %, worst "
                f"{100 * verdict['worst_relative_error']:.1f} % ({verdict['worst_job']}) "
                f"over {verdict['jobs_measured']} job(s)")
    if verdict.get("reliable"):
        return head
    return head + " - UNRELIABLE: " + "; ".join(verdict.get("reasons", []))


def markdown_table(rows: Sequence[Mapping[str, Any]], title_cols: Sequence[str] = ()) -> str:
    """The agreement rows as a Markdown table (extra leading columns from title_cols)."""
    cols = [*title_cols, "job", "iterations_measured", "simulated_iteration_time_s",
            "emulated_iteration_time_s", "relative_error", "relative_error_p10",
            "relative_error_p90", "cpu_share_median", "starved"]
    cols = [c for c in cols if c in title_cols or c in ("job", "simulated_iteration_time_s",
                                                         "emulated_iteration_time_s",
                                                         "relative_error")
            or any(r.get(c) not in (None, []) for r in rows)]
    names = {"iterations_measured": "iterations", "simulated_iteration_time_s": "simulated (s)",
             "emulated_iteration_time_s": "emulated median (s)", "relative_error": "rel. error",
             "relative_error_p10": "p10", "relative_error_p90": "p90",
             "cpu_share_median": "CPU share", "starved": "CPU starvation"}
    head = [names.get(c, c) for c in cols]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        cells = []
        for c in cols:
            v = r.get(c)
            if v is None or v == []:
                cells.append("-")
            elif c == "starved":
                cells.append("; ".join(v))
            elif c.startswith("relative_error_"):
                cells.append(f"{100 * v:+.1f} %")
            elif c == "relative_error":
                cells.append(f"{100 * v:.1f} %")
            elif c == "cpu_share_median":
                cells.append(f"{100 * v:.0f} %")
            elif isinstance(v, float):
                cells.append(f"{v:.4f}")
            else:
                cells.append(str(v))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
