"""How long the controller's lock is held around a POST /jobs placement, and how long other
REST calls wait meanwhile (no root): a served controller, one big crosspipe-opt placement,
GET /lightpaths polled while it computes.

    .venv/bin/python bench/bench_place_lock.py                    # 12 stages, 20 micro-batches
    .venv/bin/python bench/bench_place_lock.py --microbatches 24  # a longer solve

Prints the placement's wall time, the longest and median GET /lightpaths latency during it,
and the time to snapshot the state under the lock for the bundled NSFNET scenarios.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from controllers.api import RestApi
from controllers.core import ControllerCore
from controllers.jobs import JobService
from controllers.layout import default_layout
from controllers.store import Store
from testbed.jobs.cluster import Cluster
from testbed.orchestrate.ctl_process import rest_call
from testbed.spec import load_scenario
from tests.test_controller_core import Recorder
from tests.test_controller_jobs import scenario

REPO = Path(__file__).resolve().parent.parent


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--microbatches", type=int, default=20)
    p.add_argument("--stages", type=int, default=12)
    args = p.parse_args()
    job = {"model": "llama2-7b", "stages": args.stages, "gpus_per_stage": 48 // args.stages,
           "microbatches": args.microbatches, "iterations": 10, "policy": "sp-ff",
           "schedule": "crosspipe-opt"}
    with tempfile.TemporaryDirectory() as d:
        sc = scenario()
        core = ControllerCore(sc, Store(Path(d) / "c.db"), layout=default_layout(sc),
                              southbound=Recorder())
        api = RestApi(core, port=0, token="t", jobs=JobService(core))
        api.serve()
        try:
            done = threading.Event()
            out: dict[str, object] = {}

            def place() -> None:
                t = time.perf_counter()
                out["reply"] = rest_call(api.url, "POST", "/jobs", job, "t", timeout_s=600)
                out["place_s"] = time.perf_counter() - t
                done.set()

            threading.Thread(target=place, daemon=True).start()
            waits: list[float] = []
            while not done.is_set():
                t = time.perf_counter()
                rest_call(api.url, "GET", "/lightpaths", None, "t", timeout_s=600)
                waits.append(time.perf_counter() - t)
                time.sleep(0.02)
            status = out["reply"][0]  # type: ignore[index]
            print(f"POST /jobs ({args.stages} stages, {args.microbatches} micro-batches, "
                  f"crosspipe-opt): {status} in {out['place_s']:.2f} s")
            print(f"GET /lightpaths during it: {len(waits)} calls, median "
                  f"{statistics.median(waits) * 1e3:.1f} ms, max {max(waits) * 1e3:.1f} ms")
        finally:
            api.close()
            core.store.close()
    for name in ("pp-jobs", "cba-nsfnet"):
        cl = Cluster.from_scenario(load_scenario(REPO / "scenarios" / f"{name}.yaml"))
        n = 200
        t = time.perf_counter()
        for _ in range(n):
            cl.snapshot()
        print(f"snapshot under the lock ({name}): {(time.perf_counter() - t) / n * 1e6:.0f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
