"""Benchmark the SDN controller on NSFNET with real OVS: set-up latency and restoration.

    sudo .venv/bin/python bench/bench_controller.py [--lightpaths 40]

Brings up the quickstart scenario (NSFNET, 4 DCs, 1 host each) through the emulation
backend, starts the controller, then prints
  - REST POST /lightpaths -> reply (rules installed, barrier-confirmed) per lightpath:
    median and p99 (client side) and the controller's own set-up time;
  - restoration time of one cut fibre (port down on the busiest fibre): the
    controller's cut-detected -> re-routed-rules-installed time, and the count of
    lightpaths restored / lost; also a REST-injected cut;
  - POST /jobs (placement + all boundary lightpaths' rules installed) and DELETE
    latency for 8-stage jobs under sp-ff and cba.

Where a set-up's time goes is printed beside it, from the controller's own phase
counters (lightpipe_controller_phase_seconds_total: RMSA, SQLite, emulator caps, rules
computed, flow-mods sent, barrier replies awaited), the rest of its request, and the REST
path (client side minus controller side: HTTP, FastAPI, the worker thread hop).
--protection off: the controller without fast-failover groups (default on).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def metric(ctl, name: str) -> float:  # type: ignore[no-untyped-def]
    text = ctl.request("GET", "/metrics")[1]
    return float(next(x for x in text.splitlines() if x.startswith(name + " ")).split()[-1])


def restorable(sc, lps, fibre) -> int:  # type: ignore[no-untyped-def]
    """How many lightpaths a cut of `fibre` would restore (same decisions, pure core)."""
    from controllers.core import ControllerCore
    from controllers.store import Store

    with tempfile.TemporaryDirectory() as tmp:
        core = ControllerCore(sc, Store(Path(tmp) / "x.db"))
        for lp in lps:
            core.request(lp["src_dc"], lp["dst_dc"], slots=lp["n_slots"])
        return len(core.fail_fibre(*fibre).restored)


PHASES = ("lock", "rmsa", "store", "caps", "rules", "send", "barrier")


def phase_sums(ctl) -> dict[str, float]:  # type: ignore[no-untyped-def]
    """The controller's seconds per phase so far."""
    text = ctl.request("GET", "/metrics")[1]
    out = dict.fromkeys(PHASES, 0.0)
    for line in text.splitlines():
        if line.startswith("lightpipe_controller_phase_seconds_total{"):
            name = line.split('phase="')[1].split('"')[0]
            out[name] = float(line.split()[-1])
    return out


def breakdown(before: dict[str, float], after: dict[str, float], n: int, client_s: float,
              ctl_s: float) -> str:
    """Mean ms per set-up in each phase, the controller's other work and the REST path."""
    per = {k: (after[k] - before[k]) / n * 1e3 for k in PHASES}
    per["other controller"] = ctl_s * 1e3 - sum(per.values())
    per["REST path"] = (client_s - ctl_s) * 1e3
    return "mean per set-up: " + ", ".join(f"{k} {v:.2f}" for k, v in per.items()) + " ms"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lightpaths", type=int, default=40)
    ap.add_argument("--jobs", type=int, default=20, help="POST /jobs + DELETE rounds")
    ap.add_argument("--protection", choices=("on", "off"), default="on")
    args = ap.parse_args()
    import os

    os.environ["LIGHTPIPE_CTL_PROTECTION"] = "1" if args.protection == "on" else "0"
    from testbed.emu.network import EmuNetwork
    from testbed.emu.plan import build_plan
    from testbed.orchestrate.glue import attach_controller, controller_address
    from testbed.spec import load_scenario, parse_scenario

    base = load_scenario(ROOT / "scenarios" / "quickstart.yaml").model_dump(mode="json")
    base["emulation"].update(hosts_per_dc=1, bandwidth_divisor=10000.0,
                             link_mode="userspace", datapath="user")
    sc = parse_scenario(base)
    with tempfile.TemporaryDirectory() as tmp:
        spec = Path(tmp) / "s.yaml"
        import yaml

        spec.write_text(yaml.safe_dump(base))
        t0 = time.perf_counter()
        net = EmuNetwork(build_plan(sc), link_mode="userspace", datapath="user",
                         controller=controller_address())
        ctl = None
        try:
            net.start()
            t1 = time.perf_counter()
            ctl = attach_controller(net, spec, Path(tmp) / "ctl")
            t2 = time.perf_counter()
            print(f"network up {t1 - t0:.2f} s; controller up + all switches synced "
                  f"{t2 - t1:.2f} s ({len(net.plan.switches)} switches)")
            dcs = [d.name for d in sc.dcs]
            pairs = [(a, b) for a in dcs for b in dcs if a < b]
            lat, ctl_lat, ids = [], [], []
            phases0 = phase_sums(ctl)
            for i in range(args.lightpaths):
                a, b = pairs[i % len(pairs)]
                t = time.perf_counter()
                status, lp = ctl.request("POST", "/lightpaths",
                                         {"src_dc": a, "dst_dc": b, "slots": 1})
                dt = time.perf_counter() - t
                if status != 201:
                    print(f"request {i} refused: {status} {lp}")
                    continue
                lat.append(dt)
                ctl_lat.append(lp["setup_s"])
                ids.append(lp)
            print(f"lightpath set-up, REST -> rules installed (n={len(lat)}): median "
                  f"{statistics.median(lat) * 1e3:.2f} ms, p99 {pct(lat, 0.99) * 1e3:.2f} ms "
                  f"(controller side: median {statistics.median(ctl_lat) * 1e3:.2f} ms, "
                  f"p99 {pct(ctl_lat, 0.99) * 1e3:.2f} ms; worst {max(lat) * 1e3:.2f} ms "
                  f"at request {lat.index(max(lat)) + 1}; target p99 < 20 ms)")
            print("  " + breakdown(phases0, phase_sums(ctl), len(lat), statistics.mean(lat),
                                   statistics.mean(ctl_lat)))
            if args.protection == "on":  # the protection follows the set-ups
                t = time.perf_counter()
                while not all(x.get("protected") or x.get("backup") is None
                              for x in ctl.request("GET", "/lightpaths")[1]["lightpaths"]):
                    time.sleep(0.005)
                print(f"  all {len(ids)} protected {(time.perf_counter() - t) * 1e3:.0f} ms "
                      "after the last set-up's reply")
            # The busiest fibre: cut it by taking its middle node's interface down.
            count: dict[tuple[str, str], int] = {}
            for lp in ids:
                for u, v in zip(lp["nodes"], lp["nodes"][1:], strict=False):
                    key = tuple(sorted((u, v)))
                    count[key] = count.get(key, 0) + 1  # type: ignore[index]
            (u, v), n_on = max(count.items(),
                               key=lambda kv: (restorable(sc, ids, kv[0]), kv[1]))
            f = net.plan.fibre(u, v)
            emu = net.emulators[f.middle]
            before = metric(ctl, "lightpipe_restoration_seconds_count")
            subprocess.run(["mnexec", "-a", str(emu.ns_pid), "ip", "link", "set", emu.intf_u,
                            "down"], check=True)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and \
                    metric(ctl, "lightpipe_restoration_seconds_count") == before:
                time.sleep(0.01)
            rest_s = metric(ctl, "lightpipe_restoration_seconds_sum")
            restored = metric(ctl, "lightpipe_lightpaths_restored_total")
            lost = metric(ctl, "lightpipe_lightpaths_lost_total")
            on_backup = metric(ctl, "lightpipe_lightpaths_restored_on_backup_total")
            print(f"port-down cut of fibre {u}-{v} ({n_on} lightpaths on it): "
                  f"cut-detected -> restored {rest_s * 1e3:.1f} ms; restored {restored:.0f} "
                  f"({on_backup:.0f} onto the backup their switches had failed over to), "
                  f"lost {lost:.0f}")
            # A REST-injected cut of the next busiest fibre.
            rest = sorted(count.items(), key=lambda kv: -kv[1])
            (u2, v2), n2 = next(kv for kv in rest if kv[0] != (u, v))
            status, res = ctl.request("POST", "/failures", {"link": [u2, v2]})
            print(f"REST cut of fibre {u2}-{v2} ({n2} lightpaths): restored "
                  f"{len(res['restored'])}, lost {len(res['lost'])} in "
                  f"{res['restoration_s'] * 1e3:.1f} ms")
            # POST /jobs: placement (testbed.jobs policy on the controller's optical state)
            # + every boundary lightpath's rules installed; then DELETE.
            for lp in ids:
                ctl.request("DELETE", f"/lightpaths/{lp['id']}")
            for u_, v_ in ((u, v), (u2, v2)):
                ctl.request("POST", "/repairs", {"link": [u_, v_]})
            for policy in ("sp-ff", "cba"):
                place, drop, n_lp = [], [], 0
                for _ in range(args.jobs):
                    t = time.perf_counter()
                    status, job = ctl.request("POST", "/jobs", {
                        "model": "llama2-7b", "stages": 8, "gpus_per_stage": 32,
                        "policy": policy})
                    place.append(time.perf_counter() - t)
                    if status != 201:
                        print(f"job refused: {status} {job}")
                        continue
                    n_lp += len(job["lightpath_ids"])
                    t = time.perf_counter()
                    ctl.request("DELETE", f"/jobs/{job['id']}")
                    drop.append(time.perf_counter() - t)
                print(f"POST /jobs ({policy}, 8 stages, {n_lp / max(1, len(drop)):.1f} "
                      f"lightpaths each, n={len(place)}): median "
                      f"{statistics.median(place) * 1e3:.1f} ms, p99 "
                      f"{pct(place, 0.99) * 1e3:.1f} ms; DELETE median "
                      f"{statistics.median(drop) * 1e3:.1f} ms")
        finally:
            if ctl is not None:
                ctl.stop()
            net.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
