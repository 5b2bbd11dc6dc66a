"""Benchmark (root): how close emulated all-reduce rounds come to the fluid max-min model.

Runs `lightpipe run scenarios/routing-leafspine.yaml --backend both` N times (real OVS,
os-ken's per-flow rules, gloo all-reduce over TCP) and prints, per policy, the
distribution of |emulated - model| / model over every round of every run (median, p90,
worst), how many rounds are within 60 %, and greedy's round time over ECMP's against the
model's ratio. The test (tests/test_routing_emu.py) checks behaviour with loose bounds;
this is the fidelity figure (docs/routing-testbed.md).

    sudo .venv/bin/python bench/bench_routing_emu.py --runs 5 [--json r.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from busy import busy_core  # (bench/busy.py: the script's own folder is on sys.path)

ROOT = Path(__file__).resolve().parent.parent


def one_run(out: Path, busy: bool = False) -> dict[str, object]:
    with busy_core(busy):
        r = subprocess.run([str(Path(sys.executable).parent / "lightpipe"), "run",
                            str(ROOT / "scenarios" / "routing-leafspine.yaml"), "--backend",
                            "both", "--out", str(out), "-q"], capture_output=True, text=True,
                           cwd=ROOT, timeout=1200, check=False)
    if r.returncode != 0:
        return {"rc": r.returncode, "error": r.stderr.strip()[-500:]}
    summary = json.loads((out / "emu" / "summary.json").read_text())
    emu = summary["allreduce"]
    fidelity = summary.get("fidelity", {})
    tcp = next((i for i in fidelity.get("invariants", []) if i["name"] == "tcp_retransmits"),
               {})
    rounds = json.loads((out / "emu" / "allreduce.json").read_text())["rounds"]
    return {"rc": 0, "rounds": [{k: x[k] for k in ("policy", "round", "job", "emu_s",
                                                   "sim_s", "rel_error", "paths")}
                                for x in rounds],
            "faithful": bool(fidelity.get("faithful")),
            "reasons": [str(x) for x in fidelity.get("reasons", [])],
            "retransmit_share": tcp.get("value"), "retransmits": tcp.get("detail", ""),
            "ratio_emu": emu["greedy"]["mean_emu_s"] / emu["ecmp"]["mean_emu_s"],
            "ratio_model": emu["greedy"]["mean_sim_s"] / emu["ecmp"]["mean_sim_s"]}


def _q(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--mode", choices=("idle", "busy"), default="idle",
                    help="busy: one core kept busy through every run")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    runs = []
    with tempfile.TemporaryDirectory(prefix="lp-route-") as tmp:
        for i in range(args.runs):
            res = one_run(Path(tmp) / f"r{i}", args.mode == "busy")
            runs.append(res)
            print(f"run {i + 1}: " + (f"FAILED rc={res['rc']} {res['error']}" if res["rc"] else
                                      f"greedy/ecmp {res['ratio_emu']:.3f} (model "
                                      f"{res['ratio_model']:.3f}); faithful "
                                      f"{res['faithful']}, TCP retransmits "
                                      f"{res['retransmits']}"
                                      + ("" if res["faithful"] else
                                         "; not faithful: " + "; ".join(res["reasons"]))),
                  flush=True)
    ok = [r for r in runs if not r["rc"]]
    for policy in ("ecmp", "greedy"):
        errs = [abs(x["rel_error"]) for r in ok for x in r["rounds"]  # type: ignore[union-attr]
                if x["policy"] == policy]
        if errs:
            print(f"{policy}: {len(errs)} rounds, |error| median {statistics.median(errs):.3f}, "
                  f"p90 {_q(errs, 0.9):.3f}, worst {max(errs):.3f}, "
                  f"{sum(e <= 0.6 for e in errs)} within 0.6")
    if ok:
        shares = [r["retransmit_share"] for r in ok if r["retransmit_share"] is not None]
        print(f"faithful runs: {sum(bool(r['faithful']) for r in ok)} of {len(ok)}; "
              f"unexplained TCP retransmits: worst {max(shares, default=0):.4f} of segments")
        rel = [abs(r["ratio_emu"] / r["ratio_model"] - 1) for r in ok]  # type: ignore[operator]
        print(f"greedy/ecmp ratio vs model: |error| median {statistics.median(rel):.3f}, "
              f"worst {max(rel):.3f} over {len(ok)} runs")
    if args.json:
        args.json.write_text(json.dumps(runs, indent=1))
    return 0 if len(ok) == len(runs) else 1


if __name__ == "__main__":
    sys.exit(main())
