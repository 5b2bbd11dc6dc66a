"""Emulation points of "an outage of this length does that to a job" (issue 58).

For `lightpipe reproduce outage` (the simulator's sweep of outage length against stall
and survival, testbed/experiments) and bench/bench_fault_stall.py:

* `outage_variant(base, outage_s, ...)`: a scenario (YAML data) whose fibre cut is
  repaired `outage_s` later (scenario seconds), with the workers' collective time-out and
  on_fault as given: scenarios/fault-outage.yaml by default (one job across two DCs
  joined by one fibre, static forwarding: nothing restores the circuit, so the outage is
  exactly cut to repair);
* `run_points(outages_s, runs=, out_dir=)` (root): emulates each `runs` times with
  `lightpipe run --backend emu` and returns `sweep_points(out_dir)`;
* `sweep_points(out_dir)` (no root): the points of every run directory below out_dir,
  one per (scenario, fault length, time-out, on_fault) with the mean stall over its
  runs, its 95 % interval, the share that survived, the simulator's stall for the same
  outage (summary.json fault_agreement) and the errors seen, in the format `reproduce
  outage` reads (`--set emu_points=PATH`, or this function when importable).

A point's figures are the emulation's own (summary.json fault_impact, computed with
testbed.analysis.faultimpact from the workers' iteration times).
"""

from __future__ import annotations

import json
import logging
import math
import statistics
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from testbed.emu.scale import Scale
from testbed.errors import InputError, RuntimeFailure

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[2]
BASE_SCENARIO = ROOT / "scenarios" / "fault-outage.yaml"
ENTRY = "import sys; from testbed.cli.main import main; sys.exit(main(sys.argv[1:]))"
RUN_TIMEOUT_S = 900.0
"""The longest one emulation may take (a long outage x time_factor included)."""
MAX_OUTAGE_S = 60.0
"""The longest outage a point may ask for (scenario s; x time_factor of wall clock)."""


def outage_variant(base: Mapping[str, Any], outage_s: float, *,
                   collective_timeout_s: float | None = None, on_fault: str | None = None,
                   restart_s: float | None = None, name: str | None = None
                   ) -> dict[str, Any]:
    """`base` (scenario data with a fiber_cut and its fiber_repair) with the repair
    `outage_s` after the cut and, where given, policy.workers' collective time-out,
    on_fault and restart_s. InputError naming the value when it cannot be."""
    if isinstance(outage_s, bool) or not isinstance(outage_s, int | float) \
            or not math.isfinite(outage_s) or not 0 < outage_s <= MAX_OUTAGE_S:
        raise InputError("outage_s", f"must be a number of seconds in (0, {MAX_OUTAGE_S:g}] "
                         f"(got {outage_s!r})")
    data = json.loads(json.dumps(dict(base)))  # a deep copy of plain data
    events = data.get("events") or []
    cuts = [e for e in events if e.get("kind") == "fiber_cut"]
    if len(cuts) != 1:
        raise InputError("events", "the base scenario needs exactly one fiber_cut")
    cut = cuts[0]
    repairs = [e for e in events if e.get("kind") == "fiber_repair"
               and sorted(map(str, e.get("link", []))) == sorted(map(str, cut["link"]))]
    if len(repairs) != 1:
        raise InputError("events", "the base scenario needs the cut fibre's fiber_repair")
    repairs[0]["at_s"] = round(float(cut["at_s"]) + float(outage_s), 6)
    workers = data.setdefault("policy", {}).setdefault("workers", {})
    if collective_timeout_s is not None:
        workers["collective_timeout_s"] = float(collective_timeout_s)
    if on_fault is not None:
        workers["on_fault"] = on_fault
    if restart_s is not None:
        workers["restart_s"] = float(restart_s)
    data["name"] = name or f"{data['name']}-{_tag(outage_s)}"
    return data


def _tag(seconds: float) -> str:
    return f"{round(seconds * 1000)}ms"


def run_emulation(spec: Path, out: Path, timeout_s: float = RUN_TIMEOUT_S) -> dict[str, Any]:
    """`lightpipe run SPEC --backend emu --out OUT --force -q` (root); its summary.
    RuntimeFailure with the tail of its error output when it fails."""
    res = subprocess.run([sys.executable, "-c", ENTRY, "run", str(spec), "--backend", "emu",
                          "--out", str(out), "--force", "-q"], cwd=ROOT,
                         capture_output=True, text=True, timeout=timeout_s, check=False)
    if res.returncode != 0:
        raise RuntimeFailure(f"{spec.name}: lightpipe run exited {res.returncode}: "
                             f"{res.stderr.strip()[-400:]}")
    summary: dict[str, Any] = json.loads((out / "summary.json").read_text())
    return summary


def run_points(outages_s: Sequence[float], *, runs: int = 1, out_dir: Path,
               base: Path = BASE_SCENARIO, collective_timeout_s: float | None = None,
               on_fault: str | None = None, restart_s: float | None = None
               ) -> list[dict[str, Any]]:
    """Emulate `base` with each outage `runs` times (root; each run about half a minute
    plus the outage x time_factor), into out_dir/<variant>/run-<k>; the points
    (sweep_points of out_dir)."""
    if runs < 1:
        raise InputError("runs", f"must be >= 1 (got {runs})")
    data = yaml.safe_load(Path(base).read_text())
    out_dir = Path(out_dir)
    for outage in outages_s:
        variant = outage_variant(data, outage, collective_timeout_s=collective_timeout_s,
                                 on_fault=on_fault, restart_s=restart_s)
        vdir = out_dir / variant["name"]
        vdir.mkdir(parents=True, exist_ok=True)
        spec = vdir / "scenario.yaml"
        spec.write_text(yaml.safe_dump(variant, sort_keys=False))
        for k in range(runs):
            summary = run_emulation(spec, vdir / f"run-{k}")
            log.info("%s run %d: %s", variant["name"], k, [
                (r.get("stall_s"), r.get("survived")) for r in summary.get("fault_impact", [])
                if r.get("hit")])
    return sweep_points(out_dir)


def run_record(run_dir: Path) -> dict[str, Any] | None:
    """One emulation's point figures (None: not a finished emulation with a hit job):
    the first hit job through its first hit event."""
    try:
        summary = json.loads((Path(run_dir) / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    if summary.get("backend") != "emu":
        return None
    rows = [r for r in summary.get("fault_impact") or [] if r.get("hit")]
    if not rows:
        return None
    row = rows[0]
    agree = next((a for a in (summary.get("fault_agreement") or {}).get("rows", [])
                  if a["job"] == row["job"] and a["event"] == row["event"]), {})
    policy = summary.get("worker_fault_policy") or {}
    tf = Scale.of_record(summary, f"{run_dir}/summary.json").time_factor
    timeout = policy.get("collective_timeout_s")
    return {"scenario": summary.get("scenario"), "run_dir": str(run_dir),
            "job": row["job"], "event": row["event"], "kind": row["kind"],
            "protection": "none" if summary.get("forwarding") == "static" else "restoration",
            "fault_s": _fault_s(summary, row), "outage_s": row.get("outage_s"),
            "collective_timeout_s": None if timeout is None else timeout / tf,
            "on_fault": policy.get("on_fault", "fail"),
            "stall_s": row.get("stall_s"), "survived": bool(row.get("survived")),
            "failed_after_s": None if row.get("failed_at_s") is None else
            row["failed_at_s"] - row.get("applied_at_s", row["at_s"]),
            "recovery_s": row.get("recovery_s"), "error": row.get("error"),
            "restarts": row.get("restarts", 0), "iterations_redone":
            row.get("iterations_redone", 0), "sim_stall_s": agree.get("sim_stall_s"),
            "sim_survived": agree.get("sim_survived"), "within": agree.get("within"),
            "band_s": agree.get("band_s")}


def _fault_s(summary: Mapping[str, Any], row: Mapping[str, Any]) -> float | None:
    """How long the fibre was down: its cut to its repair (the faults rows' times)."""
    faults = summary.get("faults") or []
    flap = next((f for f in faults if f.get("kind") == "link_flap"
                 and f.get("target") == row.get("target")), None)
    if flap is not None and isinstance(flap.get("period_s"), int | float):
        return round(flap["period_s"] / 2.0, 6)  # each of its cuts: half a period down
    cut = next((f for f in faults if f.get("kind") == "fiber_cut"
                and f.get("target") == row.get("target")), None)
    rep = next((f for f in faults if f.get("kind") == "fiber_repair"
                and f.get("target") == row.get("target")), None)
    if cut and rep and cut.get("run_s") is not None and rep.get("run_s") is not None:
        tf = Scale.of_record(summary, "summary.json").time_factor
        return round((rep["run_s"] - cut["run_s"]) / tf, 6)
    if cut and rep:  # the repair not reached (the job failed first): the spec's
        return round(float(rep["at_s"]) - float(cut["at_s"]), 6)
    return row.get("outage_s")


def run_records(out_dir: Path) -> list[dict[str, Any]]:
    """run_record of every run directory below out_dir (sorted by path)."""
    out = []
    for s in sorted(Path(out_dir).rglob("summary.json")):
        rec = run_record(s.parent)
        if rec is not None:
            out.append(rec)
    return out


def sweep_points(out_dir: Path | str) -> list[dict[str, Any]]:
    """The emulation points below out_dir (see the module docstring): one per scenario,
    fault length, time-out and on_fault, in that order."""
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for rec in run_records(Path(out_dir)):
        key = (rec["scenario"], rec["protection"], _rounded(rec["fault_s"]),
               rec["collective_timeout_s"], rec["on_fault"])
        groups.setdefault(key, []).append(rec)
    return [point(recs) for _key, recs in sorted(groups.items(), key=lambda kv: tuple(
        (v is None, v) for v in kv[0]))]


def _rounded(v: float | None) -> float | None:
    return None if v is None else round(v, 3)


def point(recs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One point from the runs of the same variant."""
    first = recs[0]
    stalls = [r["stall_s"] for r in recs if r.get("stall_s") is not None and r["survived"]]
    sims = [r["sim_stall_s"] for r in recs if r.get("sim_stall_s") is not None]
    out: dict[str, Any] = {
        "source": "emu", "scenario": first["scenario"], "protection": first["protection"],
        "fault_s": _rounded(first["fault_s"]),
        "outage_s": _mean([r["outage_s"] for r in recs if r.get("outage_s") is not None]),
        "collective_timeout_s": first["collective_timeout_s"],
        "on_fault": first["on_fault"], "runs": len(recs),
        "stall_s": _mean(stalls), "stall_ci95_s": _ci95(stalls),
        "stall_min_s": min(stalls) if stalls else None,
        "stall_max_s": max(stalls) if stalls else None,
        "survived": sum(1 for r in recs if r["survived"]) / len(recs),
        "failed_after_s": _mean([r["failed_after_s"] for r in recs
                                 if r.get("failed_after_s") is not None]),
        "recovery_s": _mean([r["recovery_s"] for r in recs if r.get("recovery_s") is not None]),
        "restarts": sum(int(r.get("restarts") or 0) for r in recs),
        "sim_stall_s": sims[0] if sims else None,
        "within": sum(1 for r in recs if r.get("within")),
        "errors": sorted({str(r["error"]) for r in recs if r.get("error")}),
    }
    if out["errors"]:
        out["error"] = out["errors"][0]
    return out


def _mean(vals: Iterable[float]) -> float | None:
    v = list(vals)
    return statistics.fmean(v) if v else None


def _ci95(vals: Sequence[float]) -> float | None:
    if len(vals) < 2:
        return None
    from testbed.analysis.stats import mean_ci95

    return float(mean_ci95(list(vals))[1])
