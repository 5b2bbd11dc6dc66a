"""`lightpipe reproduce cba|bace`: the CBA and BACE-Pipe experiments, tables and plots.

cba:  NSFNET (22 fibres), 80 x 12.5 GHz slots, six DCs, block admission, a load sweep
      (mean inter-arrival time); sp-ff vs cba vs joint (cba-ilp on a small case).
bace: six regions joined by long-haul fibres of different lengths (so different
      modulation and capacity per slot), different GPU types and electricity prices
      (two with daily price curves), four model sizes, queue admission;
      delay-first vs cost-first vs bace-pipe vs joint.

Each run is `testbed.jobs.sim.simulate` on a scenario built by `cba_scenario` /
`bace_scenario` (the bundled scenarios/cba-nsfnet.yaml and scenarios/bace-regions.yaml
are the same specs at their default load). Several seeds per point; tables give the
mean and a 95 % confidence interval over seeds (Student t).
"""

from __future__ import annotations

import logging
import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from testbed.analysis.stats import mean_ci95
from testbed.analysis.tables import rows_to_csv, short_float
from testbed.atomicio import atomic_write_json, atomic_write_text, staged_dir
from testbed.jobs.sim import SUMMARY_KEYS, simulate
from testbed.jobs.timing import Timer
from testbed.progress import progress
from testbed.spec import Scenario, parse_scenario

log = logging.getLogger(__name__)

CBA_POLICIES = ("sp-ff", "cba", "joint")
BACE_POLICIES = ("delay-first", "cost-first", "bace-pipe", "joint")
# Student t 0.975 quantiles by degrees of freedom (seeds - 1)
CBA_MIX = [  # cross-domain: every stage in a different DC (max_stages_per_dc = 1)
    {"model": "gpt3-6.7b", "stages": 4, "gpus_per_stage": 32, "microbatches": 32,
     "iterations": 60000, "weight": 1.0},
    {"model": "llama2-13b", "stages": 4, "gpus_per_stage": 16, "microbatches": 32,
     "iterations": 15000, "weight": 1.0},
    {"model": "llama2-70b", "stages": 8, "gpus_per_stage": 32, "microbatches": 64,
     "iterations": 4000, "weight": 0.5},
]
CBA_DC_NODES = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14)


def cba_scenario(mean_interarrival_s: float = 300.0, policy: str = "cba", seed: int = 1,
                 jobs: int = 300) -> Scenario:
    """NSFNET with a 1024-GPU DC on every node; each stage of a job in a different DC."""
    return parse_scenario({
        "version": 1, "name": "cba-nsfnet",
        "description": "CBA reproduction: cross-domain PP jobs on NSFNET, 80 slots.",
        "topology": {"library": "nsfnet"},
        "dcs": [{"name": f"dc{n}", "node": str(n), "gpus": 1024, "gpu": "h100"}
                for n in CBA_DC_NODES],
        "optical": {"grid": "flex", "slots": 80, "k_paths": 3},
        "workload": {"kind": "pp_jobs", "jobs": jobs, "max_stages_per_dc": 1,
                     "mean_interarrival_s": mean_interarrival_s, "mix": CBA_MIX, "seed": seed},
        "policy": {"placement": policy, "admission": "block", "schedule": "gpipe",
                   "fixed_slots": 4, "max_slots": 16},
    })


REGIONS = [  # name, GPUs, GPU type, flat price, daily curve (peak factor) or None
    ("us-east", 96, "h100", 0.085, 1.5),
    ("us-west", 64, "h100", 0.140, None),
    ("eu-west", 96, "a100", 0.180, 1.3),
    ("eu-north", 64, "h100", 0.060, None),
    ("ap-east", 64, "a100", 0.110, None),
    ("ap-south", 96, "h100", 0.095, None),
]
REGION_LINKS = [  # km: short (16QAM/8QAM) to long (BPSK) hops
    ("us-east", "us-west", 3500), ("us-east", "eu-west", 1800), ("us-east", "eu-north", 2600),
    ("us-west", "ap-east", 3800), ("eu-west", "eu-north", 450), ("eu-west", "ap-south", 2900),
    ("eu-north", "ap-south", 3400), ("ap-east", "ap-south", 900), ("us-west", "eu-north", 3900),
]
BACE_MIX = [
    {"model": "gpt3-6.7b", "stages": 4, "gpus_per_stage": 8, "microbatches": 32,
     "iterations": 30000, "weight": 1.0},
    {"model": "llama2-13b", "stages": 4, "gpus_per_stage": 8, "microbatches": 32,
     "iterations": 20000, "weight": 1.0},
    {"model": "llama2-70b", "stages": 8, "gpus_per_stage": 8, "microbatches": 64,
     "iterations": 4000, "weight": 0.6},
    {"model": "gpt3-175b", "stages": 8, "gpus_per_stage": 16, "microbatches": 64,
     "iterations": 1500, "weight": 0.3},
]


def _curve(flat: float, peak: float) -> list[float]:
    """Daily curve: cheap at night, `peak` x flat from 08:00 to 20:00, mean about flat."""
    day = [peak if 8 <= h < 20 else 2.0 - peak for h in range(24)]
    return [round(flat * f, 5) for f in day]


def bace_scenario(mean_interarrival_s: float = 1800.0, policy: str = "bace-pipe",
                  seed: int = 1, jobs: int = 200) -> Scenario:
    """Six regions with different prices, GPUs and inter-region bandwidth; queue admission."""
    dcs = []
    for name, gpus, gpu, price, peak in REGIONS:
        dc: dict[str, Any] = {"name": name, "node": name, "gpus": gpus, "gpu": gpu,
                              "price_usd_per_kwh": price}
        if peak is not None:
            dc["price_curve_usd_per_kwh"] = _curve(price, peak)
        dcs.append(dc)
    return parse_scenario({
        "version": 1, "name": "bace-regions",
        "description": "BACE-Pipe reproduction: six regions, prices and bandwidth differ.",
        "topology": {"links": [{"u": u, "v": v, "length_km": km} for u, v, km in REGION_LINKS]},
        "dcs": dcs,
        "optical": {"grid": "flex", "slots": 16, "k_paths": 3, "node_delay_ms": 0.1},
        "workload": {"kind": "pp_jobs", "jobs": jobs,
                     "mean_interarrival_s": mean_interarrival_s, "mix": BACE_MIX, "seed": seed},
        # scarce inter-region spectrum (16 slots); the bandwidth-oblivious baselines buy
        # one slot per boundary (cost-first) or as many as allowed (delay-first)
        "policy": {"placement": policy, "admission": "queue", "schedule": "1f1b",
                   "fixed_slots": 1, "max_slots": 8},
    })


def _mean_ci(values: Sequence[float]) -> tuple[float, float]:
    vals = [v for v in values if v is not None and not math.isnan(v)]
    if not vals:
        return float("nan"), float("nan")
    if len(vals) < 2:
        return vals[0], 0.0
    return mean_ci95(vals)


def _sweep(build, policies: Sequence[str], loads: Sequence[float], seeds: int, jobs: int,
           quiet: bool, bases: Sequence[str], paired: Sequence[str]) -> list[dict[str, Any]]:
    """Mean and 95 % CI over seeds per (load, policy), plus the paired relative change
    of each `paired` metric against each of `bases` on the same seed (same job trace):
    columns KEY_vs_BASE and KEY_vs_BASE_ci95."""
    rows: list[dict[str, Any]] = []
    timer = Timer()  # shared: the same pipelines recur across policies and seeds
    name = getattr(build, "__name__", "reproduce").removesuffix("_scenario")
    with progress(len(policies) * len(loads) * seeds, f"{name}: load points", quiet) as bar:
        for load in loads:
            runs: dict[str, list[dict[str, Any]]] = {}
            for pol in policies:
                runs[pol] = []
                for seed in range(1, seeds + 1):
                    bar.describe(f"1 job / {load:g} s, {pol}, seed {seed}")
                    states, summ = simulate(build(load, pol, seed, jobs), quiet=True,
                                            timer=timer)
                    summ["_iter"] = {s.job.req.job_id: s.run_s / s.iterations_done
                                     for s in states if s.iterations_done > 0}
                    runs[pol].append(summ)
                    bar.advance()
            for pol in policies:
                row: dict[str, Any] = {"policy": pol, "mean_interarrival_s": load,
                                       "seeds": seeds}
                for key in SUMMARY_KEYS:
                    if key in ("blocking_ci95", "jct_ci95"):
                        continue
                    vals = [r[key] for r in runs[pol]]
                    if all(isinstance(v, int | float) for v in vals):
                        row[key], row[f"{key}_ci95"] = _mean_ci([float(v) for v in vals])
                    else:
                        row[key] = row[f"{key}_ci95"] = None
                for base in bases:
                    for key in paired:
                        changes = []
                        for mine, ref in zip(runs[pol], runs[base], strict=True):
                            a, b = mine.get(key), ref.get(key)
                            if isinstance(a, int | float) and isinstance(b, int | float) and b:
                                changes.append((a - b) / b)
                        mean, ci = _mean_ci(changes) if changes else (None, None)
                        row[f"{key}_vs_{base}"], row[f"{key}_vs_{base}_ci95"] = mean, ci
                    # iteration time of the jobs both policies ran (no survivor bias)
                    common = []
                    for mine, ref in zip(runs[pol], runs[base], strict=True):
                        both = mine["_iter"].keys() & ref["_iter"].keys()
                        if both:
                            common.append(statistics.fmean(
                                mine["_iter"][j] / ref["_iter"][j] - 1.0 for j in both))
                    mean, ci = _mean_ci(common) if common else (None, None)
                    row[f"common_iteration_time_vs_{base}"] = mean
                    row[f"common_iteration_time_vs_{base}_ci95"] = ci
                row["wall_s"] = sum(r["wall_s"] for r in runs[pol])
                rows.append(row)
                log.info("%s load=%s: %s", pol, load, row)
    return rows


def _fmt(mean: float | None, ci: float | None, scale: float = 1.0, nd: int = 3) -> str:
    if mean is None or (isinstance(mean, float) and math.isnan(mean)):
        return "n/a"
    return f"{mean * scale:.{nd}f} ± {(ci or 0.0) * scale:.{nd}f}"


def _rel(new: float | None, base: float | None) -> str:
    if new is None or base is None or not base or math.isnan(new) or math.isnan(base):
        return "n/a"
    return f"{100.0 * (new - base) / base:+.1f} %"


def _markdown(rows: Sequence[dict[str, Any]], bases: Sequence[str],
              cols: Sequence[tuple[str, str, float]], title: str) -> str:
    out = [f"# {title}", "", "Mean ± 95 % CI over seeds (Student t); Δ is the paired change "
           "against the named baseline on the same seeds (same job traces), mean ± 95 % CI.",
           ""]
    head = ["arrival rate (jobs / hour)", "policy"] + [c[1] for c in cols] + \
        [f"Δ {c[1].split(' (')[0]} vs {b}" for b in bases for c in cols] + \
        [f"Δ iteration time, jobs run by both, vs {b}" for b in bases]
    out.append("| " + " | ".join(head) + " |")
    out.append("|" + "---|" * len(head))
    for r in rows:
        cells = [f"{3600.0 / r['mean_interarrival_s']:.3g}", r["policy"]]
        cells += [_fmt(r.get(k), r.get(f"{k}_ci95"), scale) for k, _, scale in cols]
        for k in [f"{c[0]}_vs_{b}" for b in bases for c in cols] + \
                [f"common_iteration_time_vs_{b}" for b in bases]:
            ch, ci = r.get(k), r.get(f"{k}_ci95")
            cells.append("n/a" if ch is None or (isinstance(ch, float) and math.isnan(ch))
                         else f"{100 * ch:+.1f} % ± {100 * (ci or 0):.1f}")
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def _plot(name: str, rows: Sequence[dict[str, Any]], path: Path) -> None:
    from testbed.report.figures import save  # one figure code for CLI and report
    from testbed.report.repro_plots import reproduction_figure

    save(reproduction_figure(name, rows), path)


def _write(out_dir: Path, name: str, rows: list[dict[str, Any]], markdown: str,
           metrics: Sequence[tuple[str, str]], extra: dict[str, Any]) -> dict[str, Any]:
    with staged_dir(out_dir) as stage:
        atomic_write_text(stage / "summary.csv", rows_to_csv(rows, cell=short_float))
        atomic_write_text(stage / "summary.md", markdown)
        _plot(name, rows, stage / f"{name}.png")
        result = {"experiment": name, "rows": rows, **extra}
        atomic_write_json(stage / "summary.json", result)
    return result


def cba(out_dir: Path, quiet: bool = False, quick: bool = False, seeds: int | None = None,
        jobs: int | None = None) -> dict[str, Any]:
    """CBA: cba (and joint) vs sp-ff on NSFNET over a load sweep; cba-ilp on a small case."""
    loads = [600.0, 200.0] if quick else [600.0, 300.0, 200.0, 150.0]
    n_seeds = seeds or (2 if quick else 5)
    jobs = jobs or (60 if quick else 250)
    paired = ("mean_iteration_time_s", "blocking_ratio", "spectrum_utilization",
              "mean_bubble_ratio")
    rows = _sweep(cba_scenario, CBA_POLICIES, loads, n_seeds, jobs, quiet, ["sp-ff"], paired)
    small = _sweep(cba_scenario, ("sp-ff", "cba", "cba-ilp"), [300.0], 1, 12 if quick else 30,
                   quiet, ["sp-ff"], paired)
    for r in small:
        r["case"] = "small"
    cols = [("mean_iteration_time_s", "iteration time (ms)", 1000.0),
            ("blocking_ratio", "blocking ratio", 1.0),
            ("spectrum_utilization", "spectrum util.", 1.0)]
    md = _markdown(rows, ["sp-ff"], cols,
                   "CBA reproduction: NSFNET, 80 slots, 14 DCs, cross-domain jobs")
    md += "\n" + _markdown(small, ["sp-ff"], cols, "Small case with the exact MILP (cba-ilp)")
    return _write(Path(out_dir), "cba", rows + small, md,
                  [("mean_iteration_time_s", "mean iteration time (s)"),
                   ("blocking_ratio", "blocking ratio")],
                  {"paper": {"iteration_time_change": -0.3125, "blocking_change": -0.1320}})


def bace(out_dir: Path, quiet: bool = False, quick: bool = False, seeds: int | None = None,
          jobs: int | None = None) -> dict[str, Any]:
    """BACE-Pipe: bace-pipe (and joint) vs delay-first and cost-first over six regions."""
    loads = [3600.0, 1200.0] if quick else [3600.0, 1800.0, 1200.0]
    n_seeds = seeds or (2 if quick else 5)
    jobs = jobs or (50 if quick else 200)
    paired = ("mean_jct_s", "total_cost_usd", "mean_wait_s", "mean_iteration_time_s")
    rows = _sweep(bace_scenario, BACE_POLICIES, loads, n_seeds, jobs, quiet,
                  ["delay-first", "cost-first"], paired)
    cols = [("mean_jct_s", "mean JCT (h)", 1 / 3600.0),
            ("total_cost_usd", "electricity cost (k$)", 1e-3),
            ("mean_wait_s", "mean wait (h)", 1 / 3600.0)]
    md = _markdown(rows, ["delay-first", "cost-first"], cols[:2],
                   "BACE-Pipe reproduction: six regions, four model sizes")
    return _write(Path(out_dir), "bace", rows, md,
                  [("mean_jct_s", "mean JCT (s)"), ("total_cost_usd", "electricity cost (USD)")],
                  {"paper": {"jct_change": [-0.279, -0.647], "cost_change": [-0.126, -0.306]}})
