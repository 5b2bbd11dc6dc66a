"""Benchmark what monitoring adds to every emulation run (no root, no network needed).

    .venv/bin/python bench/bench_monitor.py [--trials 20]

With a long-lived Prometheus up (`lightpipe monitor up` in a temporary directory), each
trial starts a RunMonitor as an emulation run does (its own Prometheus, run exporter,
registration), and prints over the trials (median, p90, worst):
  - start: RunMonitor.start() until the run's own Prometheus is ready;
  - visible: from start until the long-lived Prometheus returns the run's series
    (file service discovery pick-up + first scrape);
  - flush: end time set until both servers have scraped it;
  - stop: unregister + stop the run's Prometheus (SIGTERM, head flushed).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=20)
    args = ap.parse_args()
    import yaml

    from testbed.metrics.query import wait_for
    from testbed.monitor.run import RunMonitor
    from testbed.monitor.server import Monitor
    from testbed.spec import parse_scenario

    scen = parse_scenario(yaml.safe_load((ROOT / "scenarios/pp-jobs.yaml").read_text()))
    times: dict[str, list[float]] = {"start": [], "visible": [], "flush": [], "stop": []}
    with tempfile.TemporaryDirectory() as tmp:
        mon = Monitor(Path(tmp) / "monitor")
        st = mon.up(0)
        try:
            for i in range(args.trials):
                stage = Path(tmp) / f"run{i}"
                stage.mkdir()
                t0 = time.perf_counter()
                rm = RunMonitor(scen, stage, stage, monitor_dir=mon.dir).start()
                t1 = time.perf_counter()
                wait_for(str(st.url), f'lightpipe_run_info{{run="{rm.run_id}"}}',
                         timeout_s=60, interval_s=0.05)
                t2 = time.perf_counter()
                rm.flush()
                t3 = time.perf_counter()
                rm.stop()
                t4 = time.perf_counter()
                for k, v in zip(times, (t1 - t0, t2 - t0, t3 - t2, t4 - t3), strict=True):
                    times[k].append(v)
                time.sleep(1.1)  # run ids have one-second resolution
        finally:
            mon.down()
    print(f"RunMonitor over {args.trials} trials (seconds): median / p90 / worst")
    for k, xs in times.items():
        print(f"  {k:8s} {statistics.median(xs):6.2f} / {pct(xs, 0.9):6.2f} / {max(xs):6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
