"""The one console summary of a run (run/sim/emu/reproduce), its README and report path."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from testbed.cli.common import emit

# the headline figures, in order, for any backend (shown when the summary has them)
HEADLINE = ("requests", "accepted", "blocked", "blocking_ratio", "blocking_ci95",
            "bitrate_blocking_ratio", "mean_spectrum_utilization", "jobs",
            "mean_iteration_time_s", "mean_bubble_ratio", "mean_jct_s", "total_cost_usd",
            "lightpaths_lost", "lightpaths_restored", "link_mode", "datapath", "forwarding",
            "hosts", "switches", "lightpaths", "verified", "mean_goodput_ratio",
            "min_goodput_ratio", "cut_to_restored_s", "wall_s")

# file name -> what it holds (the run directory's README)
FILES: dict[str, str] = {
    "manifest.json": "what ran: scenario, spec and its sha256, backend, version, seed, platform",
    "summary.json": "the headline figures of the run (the console summary, in full)",
    "lightpipe.log": "the run's log, step by step: every INFO line and up, timestamped "
                     "(the console shows warnings)",
    "requests.csv": "one row per lightpath request: route, modulation, slots, accepted or why not",
    "jobs.csv": "one row per pipeline job: placement, lightpaths, iteration time, JCT, cost",
    "lightpaths.csv": "one row per lightpath a pipeline job held: route, slots, set-up and "
                      "tear-down time (s)",
    "fault_iterations.csv": "each job a network event hit, iteration by iteration around the "
                            "event: end time, iteration time, redone (docs/faults.md)",
    "outage.png": "stall and failure boundary against the outage's length (reproduce outage)",
    "outage_ablation.png": "what each protection scheme buys, and the detour's cost afterwards",
    "probes.csv": "iperf3 goodput per emulated lightpath against its configured rate",
    "network.json": "the emulated network: hosts, IPs, lightpaths (0600 when it holds the "
                    "controller's token)",
    "verification.json": "reachability checks run on the emulated network before the workload",
    "iterations.csv": "every measured iteration of the emulated PyTorch workers",
    "trace.json": "Chrome trace of the workers (open in chrome://tracing or Perfetto)",
    "agreement.md": "simulated vs emulated iteration time per job",
    "report.html": "the report: figures and tables of this directory in one page "
                   "(`lightpipe report DIR` rewrites it)",
    "sim-reference": "the simulator's decisions for the replayed requests",
    "controller": "the SDN controller's log, database, scenario and token (0600)",
    "prometheus": "Prometheus config and TSDB of the run (charts in report.html)",
    "workers": "per-stage records of the emulated workers",
    "sim": "the simulation backend's run (its own README)",
    "emu": "the emulation backend's run (its own README)",
    "summary.csv": "the reproduction's table as CSV (mean and 95 % CI over seeds)",
    "summary.md": "the reproduction's table, Markdown",
    "sweep.csv": "one row per sweep point and seed",
    "sweep_mean.csv": "mean and 95 % CI per sweep point",
    "sweep.json": "what the sweep varied",
    "points": "each sweep point's run directory (--records)",
}


def _fmt(v: Any) -> str:
    if v is None:
        return "not measured"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return "nan" if math.isnan(v) else f"{v:.6g}"
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_fmt(x) for x in v) + "]" if v else "none"
    return str(v)


def write_readme(out: Path, title: str) -> Path:
    """DIR/README.md: one line per file or folder present, saying what it holds."""
    from testbed.io.atomic import atomic_write_text

    lines = [f"# {title}", "", "Files in this directory:", ""]
    for p in sorted(out.iterdir()):
        if p.name.startswith(".") or p.name == "README.md":
            continue
        what = FILES.get(p.name)
        if what is None and p.suffix == ".png":
            what = "a figure (also in report.html)"
        elif what is None and p.suffix in (".csv", ".md"):
            what = "a table of the reproduction"
        lines.append(f"- `{p.name}{'/' if p.is_dir() else ''}`: {what or 'output'}")
    if not (out / "report.html").exists():
        lines.append("- `report.html` (once written by `--report` or `lightpipe report DIR`): "
                     "every figure and table of this directory in one page")
    lines += ["", f"See it all as one page: `lightpipe report {out}`.", ""]
    return atomic_write_text(out / "README.md", "\n".join(lines))


def capped(summary: Mapping[str, Any], spec_requests: int | None) -> list[str]:
    """Why the run did less than the spec asks (in the user's terms)."""
    notes = []
    n = summary.get("requests")
    if summary.get("backend") == "emu" and isinstance(n, int) and spec_requests and \
            n < spec_requests:
        notes.append(f"replayed the first {n} of the spec's {spec_requests} requests through "
                     "the SDN controller in real time (emulation.max_requests caps it; raise "
                     "it in the spec, up to 10000); `lightpipe sim` runs all of them")
    if summary.get("held"):
        notes.append("--hold: the workload and the iperf3 probes were skipped (the network "
                     "was held for your own commands)")
    if summary.get("forwarding_fallback"):
        notes.append(f"static forwarding instead of the controller: "
                     f"{summary['forwarding_fallback']}")
    return notes


def print_run(backend: str, out: Path, shown_out: str, summary: Mapping[str, Any],
              scenario: Any, report: Path | None) -> None:
    """The same summary for the same run, whichever command ran it."""
    wl = getattr(scenario, "workload", None)
    emit(f"{backend}: scenario {getattr(scenario, 'name', '?')} "
         f"({getattr(wl, 'kind', '?')}) on the {backend} backend")
    for key in HEADLINE:
        if key in summary and not isinstance(summary[key], dict):
            emit(f"  {key}: {_fmt(summary[key])}")
    agr = summary.get("agreement")
    if isinstance(agr, dict):
        emit(f"  agreement with sim: {agr['same']}/{agr['requests']} request decisions "
             "identical (route, slots, accept)")
    for line in allreduce_lines(summary.get("allreduce")):
        emit(f"  {line}")
    for line in fault_lines(summary.get("faults")):
        emit(f"  {line}")
    prom = summary.get("prometheus")
    if isinstance(prom, dict) and prom.get("tsdb"):
        emit(f"  prometheus: run {prom['run']}, data in {prom['tsdb']}"
             + (f" and at {prom['monitor_url']}" if prom.get("monitor_url") else ""))
    for note in capped(summary, getattr(wl, "requests", None)):
        emit(f"  note: {note}")
    files = sorted(p.name + ("/" if p.is_dir() else "") for p in out.iterdir()
                   if not p.name.startswith(".")) if out.is_dir() else []
    emit(f"  records: {shown_out}/ ({', '.join(files)})")
    report_line(shown_out, report)
    fidelity_line(summary)


def fidelity_line(summary: Mapping[str, Any]) -> None:
    """An emulated run's fidelity verdict, last (testbed.emu.fidelity): one line, with
    the failed invariants when it was not faithful."""
    v = summary.get("fidelity")
    if isinstance(v, dict):
        from testbed.emu.fidelity import verdict_line

        emit(verdict_line(v))


def report_line(shown_out: str, report: Path | None) -> None:
    if report is not None:
        emit(f"  report: {shown_out}/report.html")
    else:
        emit(f"  next: lightpipe report {shown_out}   (one HTML page of figures)")


def maybe_report(out: Path, want: bool) -> Path | None:
    """Write the report when asked (--report); its path or None."""
    if not want:
        return None
    from testbed.report.build import build_report

    return build_report(out)


def print_reproduction(name: str, shown_out: str, summary: Mapping[str, Any],
                       report: Path | None) -> None:
    """The reproduction's headline against the paper's, where its files are, what next."""
    from testbed.report.headline import headline_rows

    emit(f"reproduce {name}: {summary.get('reproduces') or summary.get('experiment', name)}")
    rows: Sequence[tuple[str, str, str]] = headline_rows(dict(summary))
    for fig, ours, paper in rows:
        emit(f"  {fig}: {ours} (paper: {paper})")
    for key, value in summary.items():
        if key not in ("experiment", "reproduces") and isinstance(value, int | float | str) \
                and not rows:
            emit(f"  {key}: {value}")
    out = Path(shown_out)
    files = sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) \
        if out.is_dir() else []
    emit(f"  records: {shown_out}/ ({', '.join(files)})")
    report_line(shown_out, report)


def allreduce_lines(res: object) -> list[str]:
    """allreduce_jobs: one line per routing policy (sim: real time; emu: measured vs
    simulated on the paths taken, and the agreement)."""
    if not isinstance(res, dict):
        return []
    if "policies" in res:
        return [f"{p}: mean all-reduce {v['mean_allreduce_time_s'] * 1e3:.3f} ms, max "
                f"{v['max_allreduce_time_s'] * 1e3:.3f} ms" for p, v in res["policies"].items()]
    return [f"{p}: mean round {v['mean_emu_s']:.3f} s emulated vs {v['mean_sim_s']:.3f} s "
            f"simulated (|error| median {v['abs_rel_error_median']:.1%}, worst "
            f"{v['abs_rel_error_max']:.1%}, {v['samples']} samples); collision: "
            f"{v.get('collision')}" for p, v in res.items()]


def fault_lines(rows: object) -> list[str]:
    """One line per `faults` row: what, when, detection/recovery, what was lost."""
    if not isinstance(rows, list):
        return []
    out = []
    for r in rows:
        if not isinstance(r, dict):
            continue
        line = f"fault: {r.get('kind')} {r.get('target')} at {_fmt(r.get('at_s'))} s"
        if not r.get("applied", r.get("simulated", False)):
            why = r.get("note", r.get("skipped", r.get("error", "?")))
            out.append(f"{line}: not applied ({why})")
            continue
        parts = [f"{k.removesuffix('_s')} {_fmt(r[k])} s" for k in ("detection_s", "recovery_s")
                 if isinstance(r.get(k), int | float)]
        lost = r.get("lost")
        if isinstance(lost, dict):
            parts.append("lost " + ", ".join(f"{k} {_fmt(v)}" for k, v in lost.items()))
        if r.get("note"):
            parts.append(str(r["note"]))
        out.append(line + (": " + "; ".join(parts) if parts else ""))
    return out
