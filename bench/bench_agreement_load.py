"""Benchmark (root): emulated vs simulated iteration time on a calibration scenario, on an
idle machine and with one core kept busy, over several runs.

Each run is `lightpipe run SCENARIO --backend both` (default calib-latency-1f1b: two 4-stage
jobs, 20 measured iterations each). Per run and job it prints the relative error of the
emulated iteration time against the simulated one (median, p10, p90 over the measured
iterations), the verdict and the host's busy share. The contract it checks (exit 1 if
broken): every run either agrees (every job's median within 5 %) or says it is UNRELIABLE
and why, in its agreement table. The tests check the verdict's logic on made-up records
(tests/test_workers.py); this measures it.

    sudo .venv/bin/python bench/bench_agreement_load.py                  # 3 idle + 3 busy
    sudo .venv/bin/python bench/bench_agreement_load.py --runs 10 --mode busy --json a.json
    sudo .venv/bin/python bench/bench_agreement_load.py --mode busy \
        --scenario scenarios/calib-bandwidth-gpipe.yaml \
        --set worker_compute=device --set time_factor=auto   # emulation overrides
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from busy import busy_core  # (bench/busy.py: the script's own folder is on sys.path)

ROOT = Path(__file__).resolve().parent.parent
AGREEMENT_TOLERANCE = 0.05  # every job, median of its measured iterations


def _pct(x: object) -> str:
    return f"{x:+.3f}" if isinstance(x, float) else "n/a"


def one_run(scenario: Path, out: Path, busy: bool) -> dict[str, object]:
    with busy_core(busy):
        r = subprocess.run([str(Path(sys.executable).parent / "lightpipe"), "run",
                            str(scenario), "--backend", "both", "--out", str(out), "-q"],
                           capture_output=True, text=True, timeout=1200, cwd=ROOT,
                           check=False)
    if r.returncode != 0:
        return {"rc": r.returncode, "error": r.stderr.strip()[-500:], "contract": False}
    summary = json.loads((out / "emu" / "summary.json").read_text())
    verdict, rows = summary["agreement_verdict"], summary["agreement"]
    fidelity = summary.get("fidelity") or {}
    table = (out / "agreement.md").read_text()
    if verdict["reliable"]:
        ok = verdict["worst_relative_error"] <= AGREEMENT_TOLERANCE and "UNRELIABLE" not in table
    else:
        ok = bool(verdict["reasons"]) and "UNRELIABLE" in table \
            and verdict["reasons"][0] in table
    return {"rc": 0, "contract": ok, "reliable": verdict["reliable"],
            "reasons": verdict.get("reasons", []),
            "busy_frac": verdict["host"]["busy_frac"],
            "worst_relative_error": verdict.get("worst_relative_error"),
            "time_factor": fidelity.get("time_factor"), "faithful": fidelity.get("faithful"),
            "reruns_at": [r.get("time_factor") for r in summary.get("time_factor_reruns", [])],
            "steal_frac": verdict["host"].get("steal_frac"),
            "worker_duty": verdict["host"].get("worker_duty"),
            "invariants": {i.get("name"): {"value": i.get("value"), "ok": i.get("ok"),
                                           "detail": i.get("detail")}
                           for i in fidelity.get("invariants", []) if isinstance(i, dict)},
            "jobs": [{k: row.get(k) for k in ("relative_error", "relative_error_p10",
                                              "relative_error_p90", "iterations_measured",
                                              "cpu_share_median")} for row in rows],
            "transfers": {j["job"]: j.get("transfers", {}).get("boundaries", [])
                          for j in summary.get("worker_jobs", [])}}


def transfers_line(transfers: dict[str, list[dict[str, object]]]) -> str:
    """Per job, each boundary's median message excess over the model (scenario ms):
    `0a` is boundary 0's activations, `1g` boundary 1's gradients, `*` inside a DC."""
    parts = []
    for job, rows in transfers.items():
        cells = [f"{r['boundary']}{str(r['direction'])[0]}{'*' if r.get('inside_dc') else ''}"
                 f" {r['excess_ms_median']:+.2f}" for r in rows if r.get("seen")]
        parts.append(f"{job} [{', '.join(cells)}]")
    return "; ".join(parts)


def with_emulation(scenario: Path, sets: list[str], tmp: Path) -> Path:
    """The scenario, or a copy of it in tmp with the given emulation fields set."""
    if not sets:
        return scenario
    import yaml

    data = yaml.safe_load(scenario.read_text())
    for item in sets:
        key, sep, value = item.partition("=")
        if not sep or not key.isidentifier():
            raise SystemExit(f"--set {item!r}: expected KEY=VALUE")
        data.setdefault("emulation", {})[key] = yaml.safe_load(value)
    out = tmp / scenario.name
    out.write_text(yaml.safe_dump(data, sort_keys=False))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3, help="runs per mode")
    ap.add_argument("--mode", choices=("idle", "busy", "both"), default="both")
    ap.add_argument("--scenario", type=Path,
                    default=ROOT / "scenarios" / "calib-latency-1f1b.yaml")
    ap.add_argument("--json", type=Path, help="write every run here")
    ap.add_argument("--keep", type=Path, metavar="DIR",
                    help="write the runs' directories under DIR and keep them (a fresh "
                    "directory; default: a temporary one, removed at the end)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override an emulation field of the scenario (YAML value), e.g. "
                    "worker_compute=device; repeatable")
    args = ap.parse_args()
    modes = ["idle", "busy"] if args.mode == "both" else [args.mode]
    results: dict[str, list[dict[str, object]]] = {m: [] for m in modes}
    broken = 0
    if args.keep is not None:
        args.keep.mkdir(parents=True)  # fresh: never mixed with an earlier bench's runs
    with (contextlib.nullcontext(str(args.keep)) if args.keep is not None
          else tempfile.TemporaryDirectory(prefix="lp-agree-")) as tmp:
        scenario = with_emulation(args.scenario, args.set, Path(tmp))
        for mode in modes:
            for i in range(args.runs):
                res = one_run(scenario, Path(tmp) / f"{mode}-{i}", mode == "busy")
                results[mode].append(res)
                broken += not res["contract"]
                if res["rc"]:
                    print(f"{mode} run {i + 1}: FAILED rc={res['rc']} {res['error']}")
                    continue
                errs = " ".join(f"{_pct(j['relative_error'])} [{_pct(j['relative_error_p10'])},"
                                f"{_pct(j['relative_error_p90'])}]"
                                for j in res["jobs"])  # type: ignore[union-attr]
                reruns = (f" (not faithful at {res['reruns_at']}, run again)"
                          if res["reruns_at"] else "")
                print(f"{mode} run {i + 1}: busy {res['busy_frac']:.2f}, steal "
                      f"{res['steal_frac']}; time_factor {res['time_factor']}{reruns}; "
                      "per job median "
                      f"[p10,p90]: {errs}; "
                      + ("agrees" if res["reliable"] else f"UNRELIABLE: {res['reasons']}")
                      + ("" if res["contract"] else "  CONTRACT BROKEN"), flush=True)
                if res["transfers"]:
                    print(f"  message excess over the model, ms (median per boundary, * "
                          f"inside a DC): {transfers_line(res['transfers'])}",  # type: ignore[arg-type]
                          flush=True)
            medians = [abs(j["relative_error"]) for r in results[mode] if not r["rc"]
                       for j in r["jobs"]  # type: ignore[union-attr]
                       if isinstance(j["relative_error"], float)]
            if medians:
                print(f"{mode}: |median error| over {len(medians)} job runs: median "
                      f"{statistics.median(medians):.3f}, worst {max(medians):.3f}; "
                      f"{sum(bool(r.get('reliable')) for r in results[mode])} of "
                      f"{len(results[mode])} runs reliable")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
