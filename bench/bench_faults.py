"""Faults (root): each bundled fault scenario emulated N times; detection and recovery.

Runs `lightpipe run scenarios/fault-*.yaml --backend emu` in turn and prints, per fault
kind, the mean and Student-t 95 % CI of the figures in summary.json `faults`
(docs/faults.md): Prometheus restart -> first scrape and the gap in the scraped data;
the SDN controller's outage and its restart until the switches are re-synced;
a killed worker's detection time and the iterations its job lost; each flap cut's
cut-to-restored time; a wavelength loss's restoration time (the controller's, and the
injector's REST round trip); and the run's wall time.

    sudo .venv/bin/python bench/bench_faults.py --runs 3
    sudo .venv/bin/python bench/bench_faults.py --runs 1 --only fault-worker --json f.json

Exit 1 if a run failed or a fault was not applied.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from testbed.analysis.stats import mean_ci95  # noqa: E402

ENTRY = "import sys; from testbed.cli.main import main; sys.exit(main(sys.argv[1:]))"
SCENARIOS = ("fault-prometheus", "fault-controller", "fault-worker", "fault-link-flap",
             "fault-wavelength")


def figures(summary: dict[str, Any]) -> dict[str, float]:
    """The measured figures of one run's fault row (the first)."""
    row = summary["faults"][0]
    out: dict[str, float] = {"wall_s": summary["wall_s"]}
    if row["kind"] == "prometheus_kill":
        out["restart_ready_s"] = row["ready_s"]
        out["restart_to_first_scrape_s"] = row["recovery_s"]
        out["scrape_gap_s"] = row["lost"]["prometheus_gap_s"]
        out["down_wall_s"] = row["down_wall_s"]
    elif row["kind"] == "controller_kill":
        out["down_wall_s"] = row["down_wall_s"]
        out["restart_to_resynced_s"] = row["recovery_s"]
        out["outage_s"] = row["outage_s"]
        out["lightpaths_lost"] = len(row["lost"]["lightpaths"])
        out["iterations_measured"] = summary["worker_jobs"][0]["iterations_measured"]
    elif row["kind"] == "worker_kill":
        out["detection_s"] = row["detection_s"]
        out["iterations_lost"] = row["lost"]["iterations"]
        out["iterations_kept"] = row["lost"]["iterations_finished"]
    elif row["kind"] == "wavelength_loss":
        out["restoration_s"] = row["recovery_s"]
        out["loss_to_restored_s"] = row["loss_to_restored_s"]
        out["lightpaths_moved"] = len(row["moved"])
        out["iterations_measured"] = summary["worker_jobs"][0]["iterations_measured"]
    else:
        for i, t in enumerate(row["cut_to_restored_s"]):
            out[f"cut{i + 1}_to_restored_s"] = t
    return out


def run_once(name: str, out: Path) -> dict[str, float]:
    res = subprocess.run([sys.executable, "-c", ENTRY, "run", f"scenarios/{name}.yaml",
                          "--backend", "emu", "--out", str(out), "-q"], cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    if res.returncode != 0:
        raise SystemExit(f"{name}: exit {res.returncode}: {res.stderr[-500:]}")
    summary = json.loads((out / "summary.json").read_text())
    if not all(r["applied"] for r in summary["faults"]):
        raise SystemExit(f"{name}: fault not applied: {summary['faults']}")
    return figures(summary)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--only", choices=SCENARIOS, action="append")
    ap.add_argument("--json", type=Path, default=None, help="write every run's figures")
    args = ap.parse_args()
    results: dict[str, list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="lp-faults-") as tmp:
        for name in args.only or SCENARIOS:
            for i in range(args.runs):
                results.setdefault(name, []).append(run_once(name, Path(tmp) / f"{name}-{i}"))
    for name, runs in results.items():
        print(f"{name} ({len(runs)} runs)")
        for key in runs[0]:
            vals = [r[key] for r in runs if r.get(key) is not None]
            if len(vals) >= 2:
                m, h = mean_ci95(vals)
                print(f"  {key}: {m:.3f} +- {h:.3f} (min {min(vals):.3f}, max {max(vals):.3f})")
            elif vals:
                print(f"  {key}: {vals[0]:.3f}")
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
