"""Fault stall (root): the emulated stall of a job through a network event against the
simulator's prediction, over N runs per scenario; and emulation points of outage length.

Each run is `lightpipe run SCENARIO --backend emu`; its summary.json `fault_agreement`
holds, per job and network event, the stall measured from the workers' iteration times
(testbed.analysis.faultimpact) and the simulator's for the same measured outage
(testbed.jobs.outage.predict_outage), and whether they agree within max(10 %, 20 ms).
Prints per scenario the distribution of the emulated stall, the simulator's, the
difference, how many runs agree and the worst run (its directory kept under --out).

    sudo .venv/bin/python bench/bench_fault_stall.py --runs 10
    sudo .venv/bin/python bench/bench_fault_stall.py --runs 10 --mode busy --out runs/fs-busy
    sudo .venv/bin/python bench/bench_fault_stall.py --sweep 0.1,0.3,1 --timeout-s 0.5 \\
        --on-fault fail --runs 2 --out runs/outage-points     # `reproduce outage` points
    .venv/bin/python bench/bench_fault_stall.py --summarize --reagree --out runs/fs  # again

Per run it names the cut's phase (what the hit lightpath carried at the cut: idle,
control or bulk, and the segments lost; summary.json fault_agreement rows `cut_phase`)
and prints the agreement per phase and that of the phase-free prediction on the same
runs.

Exit 1 if a run failed, 0 otherwise (disagreement is a figure, not an error).
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from busy import busy_core  # noqa: E402  (bench/busy.py: the script's own folder)

from testbed.errors import RuntimeFailure  # noqa: E402
from testbed.orchestrate.results import quantile  # noqa: E402

SCENARIOS = ("fault-outage", "fault-link-flap")
log = logging.getLogger("bench_fault_stall")


def agreement_rows(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The run's compared (job, event) rows."""
    return [r for r in (summary.get("fault_agreement") or {}).get("rows", [])
            if r.get("within") is not None]


def host_busy(run_dir: Path) -> float | None:
    """The machine's busy share over the run's workload (summary.json host_load)."""
    try:
        load = json.loads((run_dir / "summary.json").read_text()).get("host_load") or {}
    except (OSError, ValueError):
        return None
    v = load.get("busy_frac")
    return float(v) if isinstance(v, int | float) else None


def phase_free(run_dir: Path) -> dict[tuple[str, int], dict[str, Any]]:
    """The run's agreement rows against the phase-free prediction (the model before the
    cut's phase), by (job, event): the same emulated rows, predict_outage without phases."""
    from testbed.orchestrate.impact import fault_agreement
    from testbed.spec.load import parse_scenario

    try:
        summary = json.loads((run_dir / "summary.json").read_text())
        scen = parse_scenario(json.loads((run_dir / "manifest.json").read_text())["spec"])
    except (OSError, ValueError, KeyError):
        return {}
    agree = fault_agreement(scen, summary.get("fault_impact") or [],
                            summary.get("worker_fault_policy"))
    return {(r["job"], int(r["event"])): r for r in agree.get("rows", [])}


def tcp_timers(run_dir: Path) -> str | None:
    """The run's TCP timer events over its hosts (summary.json fidelity.tcp, nstat):
    `probes/time-outs`, e.g. `1/2` (None: not measured)."""
    try:
        tcp = (json.loads((run_dir / "summary.json").read_text()).get("fidelity") or {}
               ).get("tcp") or {}
    except (OSError, ValueError):
        return None
    if not isinstance(tcp, dict) or not tcp:
        return None
    hosts = [c for c in tcp.values() if isinstance(c, dict)]
    probes = sum(int(c.get("TcpExtTCPLossProbes", 0)) for c in hosts)
    rtos = sum(int(c.get("TcpExtTCPTimeouts", 0)) for c in hosts)
    return f"{probes}/{rtos}"


def describe(name: str, runs: list[tuple[Path, list[dict[str, Any]]]]) -> dict[str, Any]:
    rows = [(d, r) for d, rs in runs for r in rs]
    if not rows:
        return {"scenario": name, "runs": len(runs), "compared": 0}
    phases: dict[str, dict[str, Any]] = {}
    free_within = 0
    for d, r in rows:
        kind = (r.get("cut_phase") or {}).get("kind", "unknown")
        p = phases.setdefault(kind, {"runs": 0, "within": 0, "emu_ms": [], "sim_ms": []})
        p["runs"] += 1
        p["within"] += bool(r["within"])
        p["emu_ms"].append(round(1e3 * r["emu_stall_s"], 1))
        p["sim_ms"].append(round(1e3 * r["sim_stall_s"], 1))
        f = phase_free(d).get((r["job"], int(r["event"])))
        free_within += bool(f and f.get("within"))
    busy = sorted(b for d, _ in runs if (b := host_busy(d)) is not None)
    emu = sorted(r["emu_stall_s"] for _, r in rows)
    sim = sorted(r["sim_stall_s"] for _, r in rows)
    diff = [r["difference_s"] for _, r in rows]
    worst_dir, worst = max(rows, key=lambda dr: abs(dr[1]["difference_s"]) / dr[1]["band_s"])
    return {"scenario": name, "runs": len(runs), "compared": len(rows),
            "within": sum(1 for _, r in rows if r["within"]),
            "emu_stall_ms": {"median": 1e3 * statistics.median(emu),
                             "p10": 1e3 * quantile(emu, 0.1), "p90": 1e3 * quantile(emu, 0.9),
                             "min": 1e3 * emu[0], "max": 1e3 * emu[-1]},
            "sim_stall_ms": {"min": 1e3 * sim[0], "max": 1e3 * sim[-1]},
            "difference_ms": {"median": 1e3 * statistics.median(diff),
                              "abs_max": 1e3 * max(abs(d) for d in diff)},
            "worst": {"run_dir": str(worst_dir), "emu_stall_ms": 1e3 * worst["emu_stall_s"],
                      "sim_stall_ms": 1e3 * worst["sim_stall_s"],
                      "band_ms": 1e3 * worst["band_s"], "within": worst["within"]},
            "host_busy": {"min": busy[0], "median": statistics.median(busy),
                          "max": busy[-1]} if busy else None,
            "phases": phases, "phase_free_within": free_within,
            "tcp_timers": {"within": sorted(str(tcp_timers(d)) for d, r in rows if r["within"]),
                           "outside": sorted(str(tcp_timers(d)) for d, r in rows
                                             if not r["within"])},
            "survived": sum(1 for _, r in rows if r.get("emu_survived")),
            "same_outcome": sum(1 for _, r in rows if r.get("same_outcome"))}


def print_result(d: dict[str, Any]) -> None:
    if not d.get("compared"):
        print(f"{d['scenario']}: {d['runs']} runs, nothing compared")
        return
    e, s, df, w = d["emu_stall_ms"], d["sim_stall_ms"], d["difference_ms"], d["worst"]
    print(f"{d['scenario']}: {d['runs']} runs, {d['within']}/{d['compared']} within "
          f"max(10 %, 20 ms) of the simulator")
    print(f"  emulated stall: median {e['median']:.1f} ms (p10 {e['p10']:.1f}, p90 "
          f"{e['p90']:.1f}; min {e['min']:.1f}, max {e['max']:.1f})")
    print(f"  simulated stall: {s['min']:.1f}..{s['max']:.1f} ms (per run's measured outage)")
    print(f"  emu - sim: median {df['median']:+.1f} ms, worst |{df['abs_max']:.1f}| ms")
    print(f"  worst run: emu {w['emu_stall_ms']:.1f} ms vs sim {w['sim_stall_ms']:.1f} ms "
          f"(band {w['band_ms']:.1f} ms) {'within' if w['within'] else 'OUTSIDE'}: "
          f"{w['run_dir']}")
    for kind, p in sorted(d.get("phases", {}).items()):
        print(f"  cut phase {kind}: {p['within']}/{p['runs']} within; emu {p['emu_ms']} ms, "
              f"sim {p['sim_ms']} ms")
    print(f"  the phase-free prediction: {d.get('phase_free_within')}/{d['compared']} within")
    t = d.get("tcp_timers") or {}
    print(f"  TCP loss probes/time-outs per run (nstat, all hosts): within {t.get('within')}; "
          f"outside {t.get('outside')}")
    print(f"  survived {d['survived']}/{d['compared']}, same outcome as the simulator "
          f"{d['same_outcome']}/{d['compared']}")
    if d.get("host_busy"):
        b = d["host_busy"]
        print(f"  machine busy over the runs: median {b['median']:.0%} ({b['min']:.0%}.."
              f"{b['max']:.0%})")


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--scenario", action="append", choices=SCENARIOS,
                    help="a bundled scenario (repeatable; default both)")
    ap.add_argument("--mode", choices=("idle", "busy"), default="idle",
                    help="busy: one core kept spinning beside the runs")
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "bench-fault-stall",
                    help="where the runs' directories stay (the worst run is named)")
    ap.add_argument("--sweep", default=None,
                    help="outage lengths (scenario s, comma-separated) of "
                    "scenarios/fault-outage.yaml instead: emulation points for "
                    "`lightpipe reproduce outage` (testbed.emu.outage)")
    ap.add_argument("--timeout-s", type=float, default=None,
                    help="--sweep: policy.workers.collective_timeout_s")
    ap.add_argument("--on-fault", choices=("fail", "retry"), default=None,
                    help="--sweep: policy.workers.on_fault")
    ap.add_argument("--reagree", action="store_true",
                    help="--summarize: compare with today's prediction, the phase of each "
                    "cut taken again from the run's records (testbed.orchestrate.impact.reagree)")
    ap.add_argument("--json", type=Path, default=None, help="write the results")
    ap.add_argument("--summarize", action="store_true",
                    help="only read the run directories already under --out (no runs)")
    args = ap.parse_args()
    if args.runs < 1:
        ap.error(f"--runs: must be >= 1 (got {args.runs})")
    from testbed.emu.outage import run_emulation, run_points

    t0 = time.monotonic()
    results: list[dict[str, Any]] = []
    try:
        with busy_core(args.mode == "busy"):
            if args.summarize:
                for name in args.scenario or SCENARIOS:
                    dirs = sorted((args.out / name).glob("run-*"))
                    runs = []
                    for d in dirs:
                        try:
                            summary = json.loads((d / "summary.json").read_text())
                        except (OSError, ValueError):
                            continue
                        if args.reagree:  # today's model on the run's own records
                            from testbed.orchestrate.impact import reagree

                            summary = {"fault_agreement": reagree(d)}
                        runs.append((d, agreement_rows(summary)))
                    d = describe(name, runs)
                    results.append(d)
                    print_result(d)
            elif args.sweep:
                outages = [float(x) for x in args.sweep.split(",") if x.strip()]
                points = run_points(outages, runs=args.runs, out_dir=args.out,
                                    collective_timeout_s=args.timeout_s,
                                    on_fault=args.on_fault)
                for p in points:
                    print(json.dumps(p))
                results = points
            else:
                for name in args.scenario or SCENARIOS:
                    runs = []
                    for k in range(args.runs):
                        out = args.out / name / f"run-{k}"
                        summary = run_emulation(ROOT / "scenarios" / f"{name}.yaml", out)
                        rows = agreement_rows(summary)
                        log.info("%s run %d: %s", name, k, [
                            (round(r["emu_stall_s"] * 1e3, 1),
                             round(r["sim_stall_s"] * 1e3, 1), r["within"],
                             (r.get("cut_phase") or {}).get("kind"),
                             (r.get("cut_phase") or {}).get("lost_segments")) for r in rows])
                        runs.append((out, rows))
                    d = describe(name, runs)
                    d["mode"] = args.mode
                    results.append(d)
                    print_result(d)
    except RuntimeFailure as exc:
        print(f"bench_fault_stall: {exc}", file=sys.stderr)
        return 1
    print(f"({args.mode}, {time.monotonic() - t0:.0f} s)")
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
