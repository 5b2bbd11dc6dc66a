"""Benchmark (root): the fidelity verdict of emulated runs, idle and with one core busy.

Each run is `lightpipe emu SCENARIO` (default quickstart). Per invariant it prints the
median and worst value over the runs next to its threshold and how many runs it failed,
then how many runs were faithful, with the machine's load average. The contract it
checks (exit 1 if broken): every run has a verdict, every unfaithful run names at least
one failed invariant, and its console output ends with the verdict line. What counts as
faithful is the verdict's (testbed/emu/fidelity.py, docs/emulation.md "Fidelity verdict");
this measures how often a run on this machine is.

    sudo .venv/bin/python bench/bench_fidelity.py                         # 2 idle + 2 busy
    sudo .venv/bin/python bench/bench_fidelity.py scenarios/calib-latency-1f1b.yaml \
        --runs 5 --mode busy --json f.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from busy import busy_core  # (bench/busy.py: the script's own folder is on sys.path)

ROOT = Path(__file__).resolve().parent.parent


def one_run(scenario: Path, out: Path, busy: bool) -> dict[str, object]:
    with busy_core(busy):
        r = subprocess.run([str(Path(sys.executable).parent / "lightpipe"), "emu",
                            str(scenario), "--out", str(out), "-q"], capture_output=True,
                           text=True, timeout=1200, cwd=ROOT, check=False)
    load1 = os.getloadavg()[0]
    if r.returncode != 0:
        return {"rc": r.returncode, "error": r.stderr.strip()[-500:], "contract": False}
    v = json.loads((out / "summary.json").read_text())["fidelity"]
    last = [ln for ln in r.stdout.splitlines() if ln.strip()][-1]
    contract = last.startswith("fidelity: ") and (v["faithful"] or bool(v["reasons"]))
    return {"rc": 0, "faithful": v["faithful"], "reasons": v["reasons"], "load1": load1,
            "invariants": {i["name"]: i for i in v["invariants"]}, "contract": contract}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("scenario", nargs="?", default=str(ROOT / "scenarios" / "quickstart.yaml"))
    p.add_argument("--runs", type=int, default=2, help="runs per mode (default 2)")
    p.add_argument("--mode", choices=("idle", "busy", "both"), default="both")
    p.add_argument("--json", default=None, help="write every run's figures here")
    args = p.parse_args()
    modes = ["idle", "busy"] if args.mode == "both" else [args.mode]
    results: dict[str, list[dict[str, object]]] = {}
    with tempfile.TemporaryDirectory(prefix="lp-bench-fidelity-") as tmp:
        for mode in modes:
            results[mode] = [one_run(Path(args.scenario), Path(tmp) / f"{mode}{k}",
                                     mode == "busy") for k in range(args.runs)]
    ok = True
    for mode, runs in results.items():
        good = [r for r in runs if r["rc"] == 0]
        loads = [float(r["load1"]) for r in good]  # type: ignore[arg-type]
        print(f"{Path(args.scenario).name}, {mode}: {sum(bool(r['faithful']) for r in good)}"
              f"/{len(runs)} runs faithful; load average {min(loads or [0]):.1f}-"
              f"{max(loads or [0]):.1f}")
        names = list(good[0]["invariants"]) if good else []  # type: ignore[call-overload]
        for name in names:
            recs = [r["invariants"][name] for r in good]  # type: ignore[index]
            vals = [x["value"] for x in recs if x["measured"]]
            if not vals:
                print(f"  {name:<24} not measured")
                continue
            worst = max(vals) if recs[0]["bound"] == "max" else min(vals)
            op = "<=" if recs[0]["bound"] == "max" else ">="
            print(f"  {name:<24} median {statistics.median(vals):.4g}, worst {worst:.4g} "
                  f"{recs[0]['unit']} (goal {op} {recs[0]['threshold']:g}); failed in "
                  f"{sum(not x['ok'] for x in recs)}/{len(recs)}")
        for r in runs:
            if not r["faithful"]:
                print(f"  not faithful: {r.get('reasons') or r.get('error')}")
            ok = ok and bool(r["contract"])
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=str))
    print("contract (a verdict per run, reasons when unfaithful, last console line): "
          + ("kept" if ok else "BROKEN"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
