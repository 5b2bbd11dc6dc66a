"""`lightpipe reproduce crosspipe|geopipe`: latency and bandwidth sweeps across one DC cut.

Each function writes CSV + Markdown tables, PNG plots and summary.json atomically into
out_dir and returns the summary. See docs/schedules.md for the set-ups and for how the
numbers compare with the papers' headlines.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from testbed.analysis.tables import rows_to_csv
from testbed.errors import InputError
from testbed.io.atomic import atomic_write_json, atomic_write_text, staged_dir
from testbed.progress import weighted
from testbed.schedule.bounds import lower_bound_ms
from testbed.schedule.budget import (
    best_fitting,
    measure,
    one_f_one_b_budget,
    one_f_one_b_peaks,
    optimal,
)
from testbed.schedule.memory import GB, MemoryModel, memory_model
from testbed.schedule.model import Hop, PipelineProblem, Schedule
from testbed.schedule.registry import build_schedule
from testbed.schedule.timer import time_schedule

log = logging.getLogger(__name__)

INTRA_DC = Hop(latency_ms=0.005, bandwidth_gbps=400.0)  # ~1 km inside a DC, 400G


def _problem(p: int, m: int, f: float, b: float, act_mb: float, cut: int, lat: float,
             bw: float, cap: int | None) -> PipelineProblem:
    hops = tuple(Hop(lat, bw) if h == cut else INTRA_DC for h in range(p - 1))
    return PipelineProblem((f,) * p, (b,) * p, hops, act_mb, m, cap)


# progress weights: expected seconds of one step. List/classic schedules are built and
# timed in a few ms (measured: <= 5 ms for p=4, m=16); an exact CP-SAT solve takes from
# ~20 ms to its time limit, so it is weighted by the limit (an upper bound: the ETA then
# scales by the share of it the solves so far really used, and says "unknown" until the
# first solve has finished).
EXACT_SCHEDULES = ("crosspipe-opt",)
HEURISTIC_STEP_S = 0.005


def step_weight(name: str, opts: dict[str, Any]) -> float:
    """Expected cost (s) of building and timing schedule `name` with `opts`."""
    if name in EXACT_SCHEDULES:
        return float(opts.get("time_limit_s", 5.0))
    return HEURISTIC_STEP_S


def _row(prob: PipelineProblem, label: str, name: str, ideal: float, **opts: Any) -> dict:
    sched = build_schedule(name, prob, **opts)
    t = time_schedule(prob, sched)
    row = {"schedule": label, "iteration_time_ms": round(t.iteration_time_ms, 4),
           "bubble_ratio": round(t.bubble_ratio, 5), "peak_inflight": max(t.peak_inflight),
           "vs_ideal_pct": round(100 * (t.iteration_time_ms / ideal - 1), 3),
           "lower_bound_ms": round(lower_bound_ms(prob, split_backward=sched.split_backward,
                                                  virtual_stages=sched.virtual_stages), 4)}
    if "solver_status" in sched.info:
        row["solver_status"] = sched.info["solver_status"]
        row["gap"] = sched.info.get("gap")
    return row


def _md_table(rows: Sequence[dict], x: str, labels: Sequence[str], metric: str,
              fmt: str = "{:.1f}") -> str:
    xs = sorted({r[x] for r in rows})
    head = f"| {x} | " + " | ".join(labels) + " |\n|" + "---|" * (len(labels) + 1) + "\n"
    body = ""
    for xv in xs:
        cells = []
        for lab in labels:
            v = [r[metric] for r in rows if r[x] == xv and r["schedule"] == lab]
            cells.append(fmt.format(v[0]) if v else "-")
        body += f"| {xv:g} | " + " | ".join(cells) + " |\n"
    return head + body


def _plot(rows: Sequence[dict], x: str, labels: Sequence[str], metric: str, path: Path,
          title: str, xlabel: str, ideal: float | None = None, marks: dict | None = None,
          logx: bool = False, groups: Sequence[tuple[str, Sequence[str]]] | None = None
          ) -> None:
    from testbed.report.figures import save
    from testbed.report.repro_plots import schedule_figure

    save(schedule_figure(rows, x, labels, metric, title, xlabel, ideal, marks, logx, groups),
         path, dpi=120)


def _check_opts(opts: dict, allowed: Sequence[str]) -> None:
    for k in opts:
        if k not in allowed:
            raise InputError(k, f"unknown option; valid: {', '.join(allowed)}")


# ------------------------------------------------------------------------------ memory
def _memory(model: str, stages: int, tensor_parallel: int) -> MemoryModel:
    from testbed.catalog import MODELS
    if model not in MODELS:
        raise InputError("model", f"unknown model {model!r}; valid: {', '.join(MODELS)}")
    return memory_model(MODELS[model], stages, int(tensor_parallel))


def _gb(x: float) -> float:
    return round(x / GB, 2)


def _fit_row(prob: PipelineProblem, mem: MemoryModel, label: str, sched: Schedule,
             budget: int | Sequence[int] | None, ideal: float, memory: str) -> dict:
    """One table row: time, bubble, peak GB per stage, and whether it fits the budget."""
    f = measure(prob, mem, sched, budget)
    row = {"schedule": label, "built_as": sched.name, "memory": memory,
           "iteration_time_ms": round(f.iteration_time_ms, 4),
           "bubble_ratio": round(f.bubble_ratio, 5),
           "vs_ideal_pct": round(100 * (f.iteration_time_ms / ideal - 1), 3),
           "peak_gb": _gb(max(f.peak_bytes)),
           "peak_gb_per_stage": " ".join(f"{_gb(x):g}" for x in f.peak_bytes),
           "fits_budget": f.fits, "split_backward": bool(sched.split_backward),
           "lower_bound_ms": round(lower_bound_ms(prob, split_backward=sched.split_backward,
                                                  virtual_stages=sched.virtual_stages), 4)}
    info = sched.info
    if "solver_status" in info:
        row["solver_status"] = info["solver_status"]
        # rounded up: a gap that is not zero never reads as a proven 0.0
        row["gap"] = None if info.get("gap") is None else math.ceil(float(info["gap"]) * 1e6) / 1e6
        row["proven_optimal"] = row["gap"] == 0.0 or (row["gap"] is None
                                                      and info["solver_status"] == "OPTIMAL")
        row["bound_ms"] = None if info.get("bound_ms") is None else round(info["bound_ms"], 4)
        if "unsplit_opt_ms" in info:
            row["unsplit_opt_ms"] = round(float(info["unsplit_opt_ms"]), 4)
        row["solve_s"] = round(float(info.get("solve_s", 0.0)), 3)
    return row


def _md_cells(rows: Sequence[dict], x: str, labels: Sequence[str], metric: str,
              fmt: str = "{:.1f}", mark_over: bool = False) -> str:
    """A Markdown table x -> one column per label; '(over)' marks a schedule over budget."""
    xs = sorted({r[x] for r in rows})
    head = f"| {x} | " + " | ".join(labels) + " |\n|" + "---|" * (len(labels) + 1) + "\n"
    body = ""
    for xv in xs:
        cells = []
        for lab in labels:
            v = [r for r in rows if r[x] == xv and r["schedule"] == lab]
            if not v:
                cells.append("-")
                continue
            cell = fmt.format(v[0][metric])
            if mark_over and not v[0].get("fits_budget", True):
                cell += " (over)"
            cells.append(cell)
        body += f"| {xv:g} | " + " | ".join(cells) + " |\n"
    return head + body


# ------------------------------------------------------------------------------ CrossPipe
CROSSPIPE_PAPER_PCT = 33.6


def crosspipe(out_dir: Path, quiet: bool = False, quick: bool = False, stages: int = 4,
              microbatches: int = 8, forward_ms: float = 10.0, backward_ms: float = 20.0,
              activation_mb: float = 50.0, time_limit_s: float = 5.0, model: str = "gpt3-175b",
              tensor_parallel: int = 8, **opts: Any) -> dict:
    """Schedules vs cross-DC latency (0-50 ms) and bandwidth, p stages split over 2 DCs,
    every schedule at one equal per-GPU byte budget (1F1B's most loaded stage)."""
    _check_opts(opts, [])
    p, m = int(stages), int(microbatches)
    if p < 2:
        raise InputError("stages", "need at least 2 stages for a DC cut")
    cut = p // 2 - 1
    mem = _memory(model, p, tensor_parallel)
    lats = [0, 10, 25, 50] if quick else [0, 2, 5, 10, 20, 30, 40, 50]
    bws = [25, 100, 400] if quick else [10, 25, 50, 100, 200, 400, 800]
    bw_lat = 10.0
    cases = [("latency", lat, lat, 100.0) for lat in lats] + \
            [("bandwidth", bw, bw_lat, bw) for bw in bws]
    base = ["gpipe", "1f1b", "interleaved-1f1b", "zb-h1"]
    if m % p:
        base.remove("interleaved-1f1b")
    labels = [*base, "crosspipe-greedy", "crosspipe-opt", "crosspipe-opt-strict",
              "crosspipe-opt-relaxed"]
    exact_per_case = 3 * 2  # three optima, two CP-SAT solves each
    weights = ([HEURISTIC_STEP_S] * (len(base) + 1) + [time_limit_s] * exact_per_case) \
        * len(cases)
    rows: list[dict] = []
    ideal = (m + p - 1) * (forward_ms + backward_ms)
    one_free = _problem(p, m, forward_ms, backward_ms, activation_mb, cut, 0.0, 100.0, None)
    per_stage_1f1b = one_f_one_b_peaks(one_free, mem)  # order-only: the same at every point
    budget = max(per_stage_1f1b)
    caps = mem.microbatch_caps(budget)
    with weighted(weights, "crosspipe sweep", quiet,
                  f"{exact_per_case * len(cases)} exact solves") as bar:
        for sweep, xval, lat, bw in cases:
            prob = _problem(p, m, forward_ms, backward_ms, activation_mb, cut, lat, bw, None)
            where = {"sweep": sweep, "latency_ms": lat, "bandwidth_gbps": bw,
                     "budget_gb": _gb(budget)}
            eq = "equal bytes"
            for name in base:
                bar.describe(f"{name}, {sweep} {xval:g}")
                rows.append({**where, **_fit_row(prob, mem, name, build_schedule(name, prob),
                                                 budget, ideal, eq)})
                bar.advance()
            greedy = build_schedule("crosspipe-greedy", prob.with_memory_cap(caps))
            rows.append({**where, **_fit_row(prob, mem, "crosspipe-greedy", greedy, budget,
                                             ideal, eq)})
            bar.advance()
            for label, bud, kind in (("crosspipe-opt", budget, eq),
                                     ("crosspipe-opt-strict", per_stage_1f1b,
                                      "1F1B's bytes per stage"),
                                     ("crosspipe-opt-relaxed", None, "relaxed (no limit)")):
                bar.describe(f"{label}, {sweep} {xval:g}")
                sched = optimal(prob, mem, bud, time_limit_s=time_limit_s)
                row = _fit_row(prob, mem, label, sched, budget, ideal, kind)
                rows.append({**where, **row})
                bar.advance(2)
    gains = _crosspipe_gains(rows, cases, base, ideal)
    never_beaten = all(g["opt_never_beaten"] for g in gains)
    opt_rows = [r for r in rows if r["schedule"].startswith("crosspipe-opt")]
    summary = {
        "reproduces": "CrossPipe (ATC 2025): schedules across a DC cut, at equal bytes",
        "setup": {"stages": p, "microbatches": m, "forward_ms": forward_ms,
                  "backward_ms": backward_ms, "activation_mb": activation_mb,
                  "cut_after_stage": cut, "model": model, "tensor_parallel": tensor_parallel,
                  "memory_model": mem.source,
                  "static_gb_per_stage": [_gb(s.static_bytes) for s in mem.stages],
                  "activation_gb_per_microbatch": [_gb(s.activation_bytes) for s in mem.stages],
                  "wgrad_gb_per_microbatch": [_gb(s.wgrad_bytes) for s in mem.stages],
                  "budget_gb": _gb(budget), "budget_microbatch_caps": caps,
                  "strict_budget_gb_per_stage": [_gb(x) for x in per_stage_1f1b],
                  "time_limit_s": time_limit_s,
                  "intra_dc_hop": {"latency_ms": INTRA_DC.latency_ms,
                                   "bandwidth_gbps": INTRA_DC.bandwidth_gbps},
                  "latency_sweep_bandwidth_gbps": 100.0, "bandwidth_sweep_latency_ms": bw_lat},
        "no_delay_ideal_ms": ideal,
        # equal bytes: every GPU gets what 1F1B needs on its most loaded stage
        "max_reduction_vs_1f1b_same_memory_pct": max(g["opt_vs_1f1b_equal_bytes_pct"]
                                                     for g in gains),
        "max_reduction_vs_1f1b_strict_pct": max(g["strict_vs_1f1b_pct"] for g in gains),
        "max_reduction_unsplit_vs_1f1b_pct": max(g["unsplit_vs_1f1b_pct"] for g in gains),
        "max_reduction_unsplit_strict_vs_1f1b_pct": max(g["unsplit_strict_vs_1f1b_pct"]
                                                        for g in gains),
        "max_reduction_vs_best_fitting_baseline_pct": max(g["opt_vs_best_fitting_pct"]
                                                          for g in gains),
        "max_reduction_relaxed_vs_best_traditional_pct": max(
            g["relaxed_vs_best_traditional_pct"] for g in gains),
        # a solve that reported no gap proved nothing: count it as the widest gap
        "max_gap": max((1.0 if r.get("gap") is None else r["gap"]) for r in opt_rows),
        "paper_headline_pct": CROSSPIPE_PAPER_PCT,
        "opt_never_beaten_at_equal_bytes": never_beaten,
        "reductions": gains,
        "all_optimal": all(r.get("proven_optimal", r.get("solver_status") == "OPTIMAL")
                           for r in opt_rows),
    }
    md = _crosspipe_md(summary, rows, labels, gains)
    out_dir = Path(out_dir)
    lat_rows = [r for r in rows if r["sweep"] == "latency"]
    bw_rows = [r for r in rows if r["sweep"] == "bandwidth"]
    with staged_dir(out_dir) as stage:
        atomic_write_text(stage / "crosspipe.csv", rows_to_csv(rows))
        atomic_write_text(stage / "crosspipe.md", md)
        atomic_write_text(stage / "summary.md", _crosspipe_summary_md(summary))
        atomic_write_json(stage / "summary.json", summary)
        groups = [("traditional schedules", base),
                  ("CrossPipe schedules", [lab for lab in labels if lab not in base])]
        _plot(lat_rows, "latency_ms", labels, "iteration_time_ms", stage / "crosspipe_latency.png",
              f"CrossPipe: p={p}, m={m}, cut bandwidth 100 Gb/s", "cut latency (ms)", ideal,
              groups=groups)
        _plot(bw_rows, "bandwidth_gbps", labels, "iteration_time_ms",
              stage / "crosspipe_bandwidth.png",
              f"CrossPipe: p={p}, m={m}, cut latency {bw_lat:g} ms", "cut bandwidth (Gb/s)",
              ideal, logx=True, groups=groups)
    return summary


def _pct(new: float, old: float) -> float:
    return round(100 * (1 - new / old), 2)


def _crosspipe_gains(rows: Sequence[dict], cases: Sequence[tuple], base: Sequence[str],
                     ideal: float) -> list[dict]:
    traditional = ("gpipe", "1f1b", "interleaved-1f1b")
    gains = []
    for sweep, _x, lat, bw in cases:
        sel = {r["schedule"]: r for r in rows
               if r["sweep"] == sweep and r["latency_ms"] == lat and r["bandwidth_gbps"] == bw}
        t = {k: v["iteration_time_ms"] for k, v in sel.items()}
        opt = sel["crosspipe-opt"]
        fitting = [k for k in (*base, "crosspipe-greedy") if sel[k]["fits_budget"]]
        best_fit = min(fitting, key=lambda k: t[k])
        trad = min(t[k] for k in traditional if k in t)
        gains.append({
            "sweep": sweep, "latency_ms": lat, "bandwidth_gbps": bw,
            "opt_vs_1f1b_equal_bytes_pct": _pct(t["crosspipe-opt"], t["1f1b"]),
            "strict_vs_1f1b_pct": _pct(t["crosspipe-opt-strict"], t["1f1b"]),
            "unsplit_vs_1f1b_pct": _pct(opt["unsplit_opt_ms"], t["1f1b"]),
            "unsplit_strict_vs_1f1b_pct": _pct(sel["crosspipe-opt-strict"]["unsplit_opt_ms"],
                                               t["1f1b"]),
            "best_fitting_baseline": best_fit,
            "opt_vs_best_fitting_pct": _pct(t["crosspipe-opt"], t[best_fit]),
            "opt_never_beaten": all(t["crosspipe-opt"] <= t[k] + 1e-6 for k in fitting),
            "gap": opt.get("gap"),
            "relaxed_vs_best_traditional_pct": _pct(t["crosspipe-opt-relaxed"], trad),
            "relaxed_peak_gb": sel["crosspipe-opt-relaxed"]["peak_gb"],
            "relaxed_vs_ideal_pct": round(100 * (t["crosspipe-opt-relaxed"] / ideal - 1), 2)})
    return gains


def _crosspipe_md(summary: dict, rows: Sequence[dict], labels: Sequence[str],
                  gains: Sequence[dict]) -> str:
    s = summary["setup"]
    lat_rows = [r for r in rows if r["sweep"] == "latency"]
    bw_rows = [r for r in rows if r["sweep"] == "bandwidth"]
    return (
        f"# CrossPipe reproduction\n\np={s['stages']} stages over 2 DCs (cut after stage "
        f"{s['cut_after_stage']}), m={s['microbatches']}, f={s['forward_ms']} ms, "
        f"b={s['backward_ms']} ms, activation {s['activation_mb']} MB; 1F1B with no network "
        f"delay, (m+p-1)(f+b): {summary['no_delay_ideal_ms']:g} ms (a bound for unsplit "
        "schedules only: interleaved and split-backward ones may go below it; each row's "
        "own lower bound is lower_bound_ms in crosspipe.csv).\n\n"
        f"Memory in bytes per GPU ({s['memory_model']}): static (weights + optimizer) "
        f"{s['static_gb_per_stage']} GB per stage, activations "
        f"{s['activation_gb_per_microbatch'][0]} GB per micro-batch, split-backward W "
        f"buffers {s['wgrad_gb_per_microbatch'][0]} GB. **Equal budget: "
        f"{s['budget_gb']} GB per GPU** (what 1F1B needs on its most loaded stage), for every "
        f"schedule; '(over)' marks a schedule that does not fit it. crosspipe-opt-strict "
        f"gets 1F1B's own bytes per stage ({s['strict_budget_gb_per_stage']} GB); "
        f"crosspipe-opt-relaxed has no limit (its peak is in the GB table). CP-SAT: "
        f"{s['time_limit_s']:g} s per solve.\n\n"
        f"## Iteration time (ms) vs cut latency at 100 Gb/s\n\n"
        + _md_cells(lat_rows, "latency_ms", labels, "iteration_time_ms", mark_over=True)
        + f"\n## Iteration time (ms) vs cut bandwidth at {s['bandwidth_sweep_latency_ms']:g} ms\n\n"
        + _md_cells(bw_rows, "bandwidth_gbps", labels, "iteration_time_ms", mark_over=True)
        + f"\n## Peak memory of the most loaded GPU (GB; budget {s['budget_gb']} GB) vs latency\n\n"
        + _md_cells(lat_rows, "latency_ms", labels, "peak_gb", "{:.2f}", mark_over=True)
        + "\n## Reductions (%; positive = faster)\n\n"
        "| sweep | latency_ms | bandwidth_gbps | opt vs 1F1B, equal bytes | opt-strict vs 1F1B |"
        " unsplit opt vs 1F1B, equal bytes | unsplit opt-strict vs 1F1B | best fitting "
        "baseline | opt vs it | gap | relaxed opt vs best traditional (peak GB) |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|\n"
        + "".join(f"| {g['sweep']} | {g['latency_ms']:g} | {g['bandwidth_gbps']:g} | "
                  f"{g['opt_vs_1f1b_equal_bytes_pct']} | {g['strict_vs_1f1b_pct']} | "
                  f"{g['unsplit_vs_1f1b_pct']} | {g['unsplit_strict_vs_1f1b_pct']} | "
                  f"{g['best_fitting_baseline']} | "
                  f"{g['opt_vs_best_fitting_pct']} | {g['gap']} | "
                  f"{g['relaxed_vs_best_traditional_pct']} ({g['relaxed_peak_gb']}) |\n"
                  for g in gains)
        + f"\n**Largest reduction vs 1F1B at equal bytes: "
        f"{summary['max_reduction_vs_1f1b_same_memory_pct']:.1f} %; with 1F1B's bytes per "
        f"stage: {summary['max_reduction_vs_1f1b_strict_pct']:.1f} %; vs the best baseline "
        f"that fits: {summary['max_reduction_vs_best_fitting_baseline_pct']:.1f} %; relaxed "
        f"memory vs the best traditional schedule: "
        f"{summary['max_reduction_relaxed_vs_best_traditional_pct']:.1f} %** (paper: up to "
        f"{summary['paper_headline_pct']} %). Largest proven gap: {summary['max_gap']:.4f}; "
        f"crosspipe-opt never beaten by a schedule that fits: "
        f"{summary['opt_never_beaten_at_equal_bytes']}.\n")


def _crosspipe_summary_md(summary: dict) -> str:
    s = summary["setup"]
    return (
        "# CrossPipe reproduction: summary\n\n"
        "| figure | paper | ours, equal bytes | ours, relaxed memory | what carries the gain |\n"
        "|---|---|---|---|---|\n"
        f"| iteration time vs traditional schedules | up to -{summary['paper_headline_pct']} % "
        f"(same memory) | up to -{summary['max_reduction_vs_1f1b_same_memory_pct']:.1f} % vs "
        f"1F1B at {s['budget_gb']} GB per GPU; "
        f"-{summary['max_reduction_vs_1f1b_strict_pct']:.1f} % with 1F1B's bytes per stage; "
        f"-{summary['max_reduction_vs_best_fitting_baseline_pct']:.1f} % vs the best baseline "
        "that fits (zb-h1 included) | up to "
        f"-{summary['max_reduction_relaxed_vs_best_traditional_pct']:.1f} % vs the best of "
        "GPipe/1F1B/interleaved | split backward (W fills the latency bubbles) plus in-flight "
        "micro-batches past 1F1B's p-s on the later stages, which the equal per-GPU budget "
        "leaves free |\n\n"
        f"Set-up: p={s['stages']}, m={s['microbatches']}, f={s['forward_ms']} ms, "
        f"b={s['backward_ms']} ms, {s['activation_mb']} MB activations, cut after stage "
        f"{s['cut_after_stage']}, memory of {s['memory_model']}; budget {s['budget_gb']} GB "
        f"per GPU (1F1B's most loaded stage). Unsplit optimum at the same budget (no split "
        f"backward): up to -{summary['max_reduction_unsplit_vs_1f1b_pct']:.1f} % vs 1F1B; "
        f"unsplit with 1F1B's bytes per stage: "
        f"-{summary['max_reduction_unsplit_strict_vs_1f1b_pct']:.1f} %. "
        f"Largest proven CP-SAT gap {summary['max_gap']:.4f} ({s['time_limit_s']:g} s per "
        "solve).\n\n"
        "Differences from the paper: (1) the paper's testbed, model and pipeline depth are "
        "not public; our gain grows with the ratio of cut latency (up to 50 ms) to per "
        "micro-batch compute (30 ms). (2) The paper's 'same memory' is an in-flight "
        "micro-batch limit; ours is bytes per GPU, so the optimum may use, on the later "
        "stages, the memory 1F1B leaves idle there; with 1F1B's own bytes per stage (the "
        "strict column) the gain is smaller. (3) Our optimum splits the backward (I/W), "
        "which CrossPipe does not describe; without it (unsplit column) the gain is "
        "smaller and zb-h1 alone beats it at most points. (4) We model no data parallelism, "
        "so no DP overlap (docs/schedules.md says why).\n")


# ------------------------------------------------------------------------------ GeoPipe
def _knee(points: Sequence[tuple[float, float]], tol: float = 0.01) -> float | None:
    """Smallest x whose y is within tol of the best y of all larger x (plateau start)."""
    pts = sorted(points)
    if not pts:
        return None
    floor = pts[-1][1]
    for x, y in pts:
        if y <= floor * (1 + tol):
            return x
    return None


def geopipe(out_dir: Path, quiet: bool = False, quick: bool = False, stages: int = 4,
            microbatches: int = 16, forward_ms: float = 10.0, backward_ms: float = 20.0,
            activation_mb: float = 50.0, model: str = "gpt3-175b", tensor_parallel: int = 8,
            **opts: Any) -> dict:
    """1F1B vs GeoPipe over a DC cut at equal bytes (1F1B's most loaded GPU) and with
    larger buffers (relaxed, labelled): latency sweep, bandwidth sweeps per buffer."""
    _check_opts(opts, [])
    p, m = int(stages), int(microbatches)
    if p < 2:
        raise InputError("stages", "need at least 2 stages for a DC cut")
    cut = p // 2 - 1
    f, b, a = forward_ms, backward_ms, activation_mb
    mem = _memory(model, p, tensor_parallel)
    ideal = (m + p - 1) * (f + b)
    lats = [0, 5, 20, 50] if quick else [0, 1, 2, 5, 10, 15, 20, 30, 40, 50]
    bws = [10, 25, 100, 400, 1600] if quick else \
        [5, 10, 15, 20, 25, 35, 50, 75, 100, 150, 200, 400, 800, 1600]
    buffers = sorted({p + 2, 2 * p} if quick else {p + 1, p + 2, p + 4, 2 * p})
    bw_lat = 5.0
    rows: list[dict] = []
    lat_bw = 400.0
    budget = one_f_one_b_budget(_problem(p, m, f, b, a, cut, 0.0, lat_bw, None), mem)
    caps = mem.microbatch_caps(budget)
    eq, relaxed = "equal bytes", "relaxed (buffer over budget)"
    total = len(lats) * 5 + len(bws) * (3 + len(buffers))
    # no exact solver here: every step is a list schedule of similar cost (equal weights)

    def point(prob: PipelineProblem, label: str, sched: Schedule, kind: str) -> dict:
        row = _fit_row(prob, mem, label, sched, budget, ideal, kind)
        if not row["fits_budget"]:
            row["memory"] = relaxed if kind == eq else kind
        return row

    def equal_bytes(prob: PipelineProblem) -> list[tuple[str, Schedule, str]]:
        return [("1f1b", build_schedule("1f1b", prob), eq),
                ("geopipe-equal-bytes", build_schedule("geopipe", prob.with_memory_cap(caps)),
                 eq),
                ("best-at-equal-bytes", best_fitting(prob, mem, budget).schedule, eq)]

    with weighted([step_weight("geopipe", {})] * total, "geopipe sweep", quiet) as bar:
        for lat in lats:
            prob = _problem(p, m, f, b, a, cut, lat, lat_bw, None)
            scheds = [*equal_bytes(prob),
                      (f"geopipe-buf{2 * p}", build_schedule("geopipe", prob,
                                                             buffer_microbatches=2 * p), relaxed),
                      ("geopipe-unbounded", build_schedule("geopipe", prob), relaxed)]
            for label, sched, kind in scheds:
                rows.append({"sweep": "latency", "latency_ms": lat, "bandwidth_gbps": lat_bw,
                             "budget_gb": _gb(budget), **point(prob, label, sched, kind)})
                bar.advance()
        for bw in bws:
            prob = _problem(p, m, f, b, a, cut, bw_lat, bw, None)
            scheds = [*equal_bytes(prob), *[
                (f"geopipe-buf{buf}", build_schedule("geopipe", prob, buffer_microbatches=buf),
                 eq) for buf in buffers]]
            for label, sched, kind in scheds:
                rows.append({"sweep": "bandwidth", "latency_ms": bw_lat, "bandwidth_gbps": bw,
                             "budget_gb": _gb(budget), **point(prob, label, sched, kind)})
                bar.advance()
    lat_rows = [r for r in rows if r["sweep"] == "latency"]
    bw_rows = [r for r in rows if r["sweep"] == "bandwidth"]
    lat_labels = ["1f1b", "geopipe-equal-bytes", "best-at-equal-bytes", f"geopipe-buf{2 * p}",
                  "geopipe-unbounded"]
    bw_labels = ["1f1b", "geopipe-equal-bytes"] + [f"geopipe-buf{buf}" for buf in buffers]

    def versus(one: dict, geo: dict) -> dict:
        return {
            "bubble_reduction_pct": round(100 * (1 - geo["bubble_ratio"] / one["bubble_ratio"]),
                                          2) if one["bubble_ratio"] > 0 else 0.0,
            "iteration_reduction_pct": _pct(geo["iteration_time_ms"], one["iteration_time_ms"]),
            # DCI-induced bubble: the time lost to the network over the no-delay ideal
            "dci_bubble_reduction_pct": round(
                100 * (1 - (geo["iteration_time_ms"] - ideal)
                       / (one["iteration_time_ms"] - ideal)), 2)
            if one["iteration_time_ms"] > ideal + 1e-9 else 0.0}

    compare = []
    for lat in lats:
        at = {r["schedule"]: r for r in lat_rows if r["latency_ms"] == lat}
        one, geo = at["1f1b"], at[f"geopipe-buf{2 * p}"]
        eqr = versus(one, at["geopipe-equal-bytes"])
        best = versus(one, at["best-at-equal-bytes"])
        compare.append({
            "latency_ms": lat, "bubble_1f1b": one["bubble_ratio"],
            "bubble_geopipe": geo["bubble_ratio"], **versus(one, geo),
            "geopipe_peak_gb": geo["peak_gb"], "budget_gb": _gb(budget),
            "equal_bytes_bubble_reduction_pct": eqr["bubble_reduction_pct"],
            "equal_bytes_iteration_reduction_pct": eqr["iteration_reduction_pct"],
            "equal_bytes_dci_bubble_reduction_pct": eqr["dci_bubble_reduction_pct"],
            "best_at_equal_bytes": at["best-at-equal-bytes"]["built_as"],
            "best_equal_bytes_iteration_reduction_pct": best["iteration_reduction_pct"],
            "best_equal_bytes_bubble_reduction_pct": best["bubble_reduction_pct"]})
    knees: dict[str, float | None] = {}
    predicted: dict[str, float | None] = {}
    for lab in bw_labels:
        knees[lab] = _knee([(r["bandwidth_gbps"], r["iteration_time_ms"])
                            for r in bw_rows if r["schedule"] == lab])
    # Steady state (geopipe.py): the k = w_cut - w_cut+1 micro-batches of slack at the cut
    # hide the cut's round trip once (k+1) P >= 2 P + 2 (l + 8a/g), P = f + b, i.e.
    # g >= 16 a / ((k-1) P - 2 l); past it only the fill/drain term 2*8a/g still shrinks.
    from testbed.schedule.geopipe import geopipe_warmups
    for buf in buffers:
        w = geopipe_warmups(_problem(p, m, f, b, a, cut, bw_lat, 1e9, None), buf)
        k = w[cut] - w[cut + 1]
        slack = (k - 1) * (f + b) - 2 * bw_lat
        predicted[f"geopipe-buf{buf}"] = round(16 * a / slack, 2) if slack > 0 else None
    summary = {
        "reproduces": "GeoPipe (Oct 2025): cross-DC overlap bounded by device memory",
        "setup": {"stages": p, "microbatches": m, "forward_ms": f, "backward_ms": b,
                  "activation_mb": a, "cut_after_stage": cut, "model": model,
                  "tensor_parallel": tensor_parallel, "memory_model": mem.source,
                  "budget_gb": _gb(budget), "budget_microbatch_caps": caps,
                  "static_gb_per_stage": [_gb(x.static_bytes) for x in mem.stages],
                  "activation_gb_per_microbatch": [_gb(x.activation_bytes) for x in mem.stages],
                  "latency_sweep_bandwidth_gbps": lat_bw, "bandwidth_sweep_latency_ms": bw_lat,
                  "buffers_microbatches": buffers},
        "no_delay_ideal_ms": ideal,
        # relaxed: GeoPipe with a buffer of 2p micro-batches (over the equal budget)
        "max_bubble_reduction_pct": max(c["bubble_reduction_pct"] for c in compare),
        "max_iteration_reduction_pct": max(c["iteration_reduction_pct"] for c in compare),
        "max_dci_bubble_reduction_pct": max(c["dci_bubble_reduction_pct"] for c in compare),
        "relaxed_peak_gb": max(c["geopipe_peak_gb"] for c in compare),
        # equal bytes: every GPU gets what 1F1B needs on its most loaded stage
        "equal_bytes_max_bubble_reduction_pct": max(c["equal_bytes_bubble_reduction_pct"]
                                                    for c in compare),
        "equal_bytes_max_iteration_reduction_pct": max(c["equal_bytes_iteration_reduction_pct"]
                                                       for c in compare),
        "best_equal_bytes_max_iteration_reduction_pct": max(
            c["best_equal_bytes_iteration_reduction_pct"] for c in compare),
        "best_equal_bytes_max_bubble_reduction_pct": max(
            c["best_equal_bytes_bubble_reduction_pct"] for c in compare),
        "paper_headline": {"bubble_reduction_pct": 78.91, "iteration_reduction_pct": 9.0},
        "latency_comparison": compare,
        "bandwidth_optimisation_point_gbps": knees,
        "predicted_optimisation_point_gbps": predicted,
    }
    md = (f"# GeoPipe reproduction\n\np={p} stages over 2 DCs (cut after stage {cut}), m={m}, "
          f"f={f} ms, b={b} ms, activation {a} MB; 1F1B with no network delay, (m+p-1)(f+b): "
          f"{ideal:g} ms. Memory per GPU "
          f"({mem.source}): **equal budget {_gb(budget)} GB** (what 1F1B needs on its most "
          f"loaded stage; {caps} micro-batches of activations per stage). "
          "geopipe-equal-bytes is GeoPipe within it; best-at-equal-bytes the fastest schedule "
          "we have that fits it (zb-h1 and list schedules included); '(over)' marks a schedule "
          "over the budget (relaxed memory).\n\n"
          f"## Bubble ratio vs cut latency at {lat_bw:g} Gb/s\n\n"
          + _md_cells(lat_rows, "latency_ms", lat_labels, "bubble_ratio", "{:.3f}", True)
          + "\n## Iteration time (ms) vs cut latency\n\n"
          + _md_cells(lat_rows, "latency_ms", lat_labels, "iteration_time_ms", mark_over=True)
          + "\n## Peak memory of the most loaded GPU (GB) vs cut latency\n\n"
          + _md_cells(lat_rows, "latency_ms", lat_labels, "peak_gb", "{:.2f}", True)
          + f"\n## Iteration time (ms) vs cut bandwidth at {bw_lat:g} ms, per buffer size\n\n"
          + _md_cells(bw_rows, "bandwidth_gbps", bw_labels, "iteration_time_ms", mark_over=True)
          + "\n## Bandwidth optimisation point (Gb/s): measured (within 1 % of the plateau) "
          "and predicted\n\n| schedule | measured | predicted |\n|---|---|---|\n"
          + "".join(f"| {lab} | {knees[lab]} | {predicted.get(lab, '-')} |\n"
                    for lab in bw_labels)
          + f"\n## GeoPipe vs 1F1B over latency\n\nRelaxed: geopipe-buf{2 * p} (peak GB "
          "column); equal bytes: geopipe-equal-bytes and the best schedule that fits.\n\n"
          "| latency_ms | bubble 1F1B | bubble GeoPipe (relaxed) | relaxed peak GB | bubble "
          "reduction %, relaxed | DCI-induced bubble reduction %, relaxed | iteration "
          "reduction %, relaxed | bubble reduction %, equal bytes | iteration reduction %, "
          "equal bytes | best at equal bytes | its iteration reduction % |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|\n"
          + "".join(f"| {c['latency_ms']:g} | {c['bubble_1f1b']:.3f} | {c['bubble_geopipe']:.3f}"
                    f" | {c['geopipe_peak_gb']} | {c['bubble_reduction_pct']} | "
                    f"{c['dci_bubble_reduction_pct']} | {c['iteration_reduction_pct']} | "
                    f"{c['equal_bytes_bubble_reduction_pct']} | "
                    f"{c['equal_bytes_iteration_reduction_pct']} | {c['best_at_equal_bytes']} | "
                    f"{c['best_equal_bytes_iteration_reduction_pct']} |\n" for c in compare)
          + f"\n**At equal bytes ({_gb(budget)} GB): GeoPipe's largest bubble-ratio reduction "
          f"vs 1F1B {summary['equal_bytes_max_bubble_reduction_pct']:.1f} %, iteration "
          f"{summary['equal_bytes_max_iteration_reduction_pct']:.1f} %; relaxed (buffer {2 * p},"
          f" up to {summary['relaxed_peak_gb']} GB): bubble "
          f"{summary['max_bubble_reduction_pct']:.1f} % (paper: up to 78.91 %), iteration "
          f"{summary['max_iteration_reduction_pct']:.1f} % (paper: ~9 %).**\n")
    out_dir = Path(out_dir)
    with staged_dir(out_dir) as stage:
        atomic_write_text(stage / "geopipe.csv", rows_to_csv(rows))
        atomic_write_text(stage / "geopipe.md", md)
        atomic_write_text(stage / "summary.md", _geopipe_summary_md(summary))
        atomic_write_json(stage / "summary.json", summary)
        _plot(lat_rows, "latency_ms", lat_labels, "bubble_ratio", stage / "geopipe_latency.png",
              f"GeoPipe: p={p}, m={m}, cut {lat_bw:g} Gb/s", "cut latency (ms)")
        _plot(bw_rows, "bandwidth_gbps", bw_labels, "iteration_time_ms",
              stage / "geopipe_bandwidth.png",
              f"GeoPipe: p={p}, m={m}, cut latency {bw_lat:g} ms (dotted: optimisation points)",
              "cut bandwidth (Gb/s)", ideal,
              marks={k: v for k, v in knees.items() if k != "1f1b"}, logx=True)
    return summary


def _geopipe_summary_md(summary: dict) -> str:
    s = summary["setup"]
    return (
        "# GeoPipe reproduction: summary\n\n"
        "| figure | paper | ours, equal bytes | ours, relaxed memory | what carries the gain |\n"
        "|---|---|---|---|---|\n"
        f"| bubble ratio vs 1F1B | up to -78.91 % | GeoPipe "
        f"-{summary['equal_bytes_max_bubble_reduction_pct']:.1f} %; best schedule that fits "
        f"-{summary['best_equal_bytes_max_bubble_reduction_pct']:.1f} % | "
        f"-{summary['max_bubble_reduction_pct']:.1f} % (DCI-induced part "
        f"-{summary['max_dci_bubble_reduction_pct']:.1f} %), at up to "
        f"{summary['relaxed_peak_gb']} GB per GPU vs {s['budget_gb']} GB | extra in-flight "
        "micro-batches before the cut (HBM beyond 1F1B's); at 1F1B's bytes GeoPipe's "
        "warm-ups cannot exceed 1F1B's on stage 0 |\n"
        f"| iteration time vs 1F1B | ~-9 % | GeoPipe "
        f"-{summary['equal_bytes_max_iteration_reduction_pct']:.1f} %; best schedule that fits "
        f"-{summary['best_equal_bytes_max_iteration_reduction_pct']:.1f} % | "
        f"-{summary['max_iteration_reduction_pct']:.1f} % | the same memory; at equal bytes "
        "only split backward (zb-h1 / list schedules) still gains |\n\n"
        f"Set-up: p={s['stages']}, m={s['microbatches']}, f={s['forward_ms']} ms, "
        f"b={s['backward_ms']} ms, {s['activation_mb']} MB activations, cut after stage "
        f"{s['cut_after_stage']}; memory of {s['memory_model']}; budget {s['budget_gb']} GB "
        "per GPU (1F1B's most loaded stage).\n\n"
        "Differences from the paper: (1) GeoPipe is public as an abstract only; ours is a "
        "documented model of its idea (1F1B with warm-ups sized to the round trip). "
        "(2) The paper runs on Ascend NPUs whose HBM has room beyond 1F1B's need, which "
        "GeoPipe spends on in-flight activations; at 1F1B's own bytes our GeoPipe is "
        "1F1B, so its whole gain is that memory. (3) Our bubble ratio includes the "
        "fill/drain bubble of a short pipeline, which no overlap removes, so the whole-bubble "
        "reduction is below 78.91 %; the DCI-induced part matches it. (4) At 120 km "
        "(0.6 ms) the iteration gain is a few %, at large latency far above 9 %; the "
        "paper's latency and depth are not public. (5) No DP overlap: we model one "
        "pipeline replica without data parallelism (docs/schedules.md).\n")
