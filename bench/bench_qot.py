"""Benchmark: optical.qot: gnpy against the reach table on the quickstart scenario.

Prints the time of `lightpipe sim scenarios/quickstart.yaml` (a fresh process each, median
of --repeat) with qot: reach, with qot: gnpy and GNPy's results already in the on-disk
cache (warm), and with no cache (cold: GNPy computes every link), each as a ratio to
reach (anchor: warm <= 1.5x reach); then the simulator alone in one process (the Python
API, GNPy's results in memory). With --reach-table it also finds, by bisection over the
length of a one-link path, where each format stops being feasible under the spec's
defaults (docs/optical.md, "QoT from GNPy").
Run: .venv/bin/python bench/bench_qot.py [--repeat 3] [--reach-table]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
QUICKSTART = ROOT / "scenarios" / "quickstart.yaml"
ANCHOR = 1.5


def spec_file(tmp: Path, qot: str) -> Path:
    data = yaml.safe_load(QUICKSTART.read_text())
    data["optical"]["qot"] = qot
    path = tmp / f"quickstart-{qot}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def cli_seconds(spec: Path, out: Path, cache: str) -> tuple[float, float]:
    """(wall, CPU) seconds of one `lightpipe sim` in a fresh process."""
    env = {**os.environ, "LIGHTPIPE_QOT_CACHE": cache}
    lightpipe = Path(sys.executable).with_name("lightpipe")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    subprocess.run([str(lightpipe), "sim", str(spec), "--out", str(out), "--force", "-q"],
                   check=True, env=env, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def api_seconds(repeat: int) -> tuple[float, float, float]:
    """simulate_lightpaths in this process: the first gnpy run (GNPy computes), then the
    medians of interleaved reach and gnpy runs (GNPy's results in memory)."""
    from testbed.sim import simulate_lightpaths
    from testbed.spec import parse_scenario

    specs = {}
    for qot in ("reach", "gnpy"):
        data = yaml.safe_load(QUICKSTART.read_text())
        data["optical"]["qot"] = qot
        specs[qot] = data

    def once(qot: str) -> float:
        sc = parse_scenario(specs[qot])
        t = time.process_time()
        simulate_lightpaths(sc)
        return time.process_time() - t

    first = once("gnpy")
    times: dict[str, list[float]] = {"reach": [], "gnpy": []}
    for _ in range(repeat):
        for qot in times:
            times[qot].append(once(qot))
    return first, statistics.median(times["reach"]), statistics.median(times["gnpy"])


def reach_table() -> None:
    """Per format, the one-link path length (km) beyond which it is no longer feasible."""
    from testbed.optical.modulation import DEFAULT_MODULATIONS
    from testbed.optical.qot import REQUIRED_GSNR_DB, qot_model
    from testbed.spec import OpticalSpec

    opt = OpticalSpec(qot="gnpy")
    model = qot_model(opt)
    margin = opt.gsnr_margin_db
    bundled = {m.name: m.reach_km for m in DEFAULT_MODULATIONS}
    print(f"reach per format, one-link path, spans of {opt.span_length_km:g} km, margin "
          f"{margin:g} dB (bisection to 1 km):")
    print(f"{'format':8} {'needs dB':>9} {'GNPy reach km':>14} {'reach table km':>15}")
    for name, need in REQUIRED_GSNR_DB.items():
        lo, hi = 1.0, 40_000.0  # the longest link a spec allows

        def ok(km: float, need: float = need) -> bool:
            return model.gsnr_db([km]) >= need + margin

        if not ok(lo):
            print(f"{name:8} {need:9.2f} {'none':>14}")
            continue
        if ok(hi):
            lo = hi
        while hi - lo > 1.0:
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if ok(mid) else (lo, mid)
        table = f"{bundled[name]:15.0f}" if name in bundled else f"{'-':>15}"
        print(f"{name:8} {need:9.2f} {lo:14.0f} {table}")
    sample = [100, 500, 1000, 2000, 4000, 8000]
    print("GSNR dB at " + ", ".join(f"{km} km: {model.gsnr_db([km]):.2f}" for km in sample))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--reach-table", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        reach_spec, gnpy_spec = spec_file(tmp, "reach"), spec_file(tmp, "gnpy")
        cache = tmp / "qot-cache"
        cli_seconds(gnpy_spec, tmp / "fill", str(cache))  # fills the cache
        runs: dict[str, list[tuple[float, float]]] = {"reach": [], "warm": [], "cold": []}
        for _ in range(args.repeat):  # interleaved: load on a shared machine hits all alike
            runs["reach"].append(cli_seconds(reach_spec, tmp / "reach", "off"))
            runs["warm"].append(cli_seconds(gnpy_spec, tmp / "warm", str(cache)))
            runs["cold"].append(cli_seconds(gnpy_spec, tmp / "cold", "off"))
        wall = {k: statistics.median(w for w, _ in v) for k, v in runs.items()}
        cpu = {k: statistics.median(c for _, c in v) for k, v in runs.items()}
        print(f"lightpipe sim scenarios/quickstart.yaml, fresh process, median of {args.repeat}"
              " (wall s, CPU s):")
        notes = {"reach": "qot: reach", "warm": "qot: gnpy, cache warm",
                 "cold": "qot: gnpy, no cache (cold)"}
        for k in ("reach", "warm", "cold"):
            line = f"  {notes[k]:28} {wall[k]:6.2f} {cpu[k]:6.2f}"
            if k != "reach":
                line += (f"  = {wall[k] / wall['reach']:4.2f}x wall, "
                         f"{cpu[k] / cpu['reach']:4.2f}x CPU of reach")
                line += (f" (anchor: <= {ANCHOR}x)" if k == "warm" else
                         " (GNPy designs and propagates every distinct link)")
            print(line)
        os.environ["LIGHTPIPE_QOT_CACHE"] = "off"
        first, api_reach, api_gnpy = api_seconds(args.repeat)
        print(f"simulate_lightpaths (Python API), one process, CPU s, median of {args.repeat}:")
        print(f"  qot: reach                   {api_reach:6.3f}")
        print(f"  qot: gnpy, results in memory {api_gnpy:6.3f}  = {api_gnpy / api_reach:4.2f}x "
              f"reach (anchor: <= {ANCHOR}x); the first gnpy run {first:.2f}")
    if args.reach_table:
        reach_table()


if __name__ == "__main__":
    main()
