"""Benchmark the SDN controller on NSFNET with real OVS: set-up latency and restoration.

    sudo .venv/bin/python bench/bench_controller.py [--lightpaths 40]
    sudo .venv/bin/python bench/bench_controller.py --runs 10 --mode both --baseline HEAD

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
path (client side minus controller side: HTTP, FastAPI, the worker thread hop); the same
counters split the port-down cut's restoration.
--protection off: the controller without fast-failover groups (default on).
--client-rt: this process, the REST client, in the real-time class below the controller
(on a loaded machine its own wait for a CPU otherwise makes the client side's tail).

--runs N runs it N times, each in a fresh process, with one core kept busy
(`--mode busy`, bench/busy.py), idle, or both. `--baseline REV` runs the old code beside
the new: a copy of this working tree whose controller (controllers/,
testbed/sim/allreduce.py, testbed/routing/paths.py) and REST client
(testbed/orchestrate/ctl_process.py) are as at REV, the two alternating run by run
(ABBA). It prints per code and mode the medians and ranges over the runs, the p99 of
all set-ups pooled, and whether every run took the same decisions (routes, slots, VLAN
ids, restorations).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PHASES = ("lock", "rmsa", "store", "caps", "rules", "send", "barrier")
ROUNDS = ("new", "changed", "deleted")  # controllers.lightpath_app.SYNC_ROUNDS
# What the baseline takes from REV (the rest of its tree is this working tree's): the
# controller and its REST client.
BASELINE_PATHS = ("controllers", "testbed/sim/allreduce.py", "testbed/routing/paths.py",
                  "testbed/orchestrate/ctl_process.py")


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def metric(ctl: Any, name: str) -> float:
    text = ctl.request("GET", "/metrics")[1]
    return float(next(x for x in text.splitlines() if x.startswith(name + " ")).split()[-1])


def restorable(sc: Any, lps: list[dict[str, Any]], fibre: tuple[str, str]) -> int:
    """How many lightpaths a cut of `fibre` would restore (same decisions, pure core)."""
    from controllers.core import ControllerCore
    from controllers.store import Store

    with tempfile.TemporaryDirectory() as tmp:
        core = ControllerCore(sc, Store(Path(tmp) / "x.db"))
        for lp in lps:
            core.request(lp["src_dc"], lp["dst_dc"], slots=lp["n_slots"])
        return len(core.fail_fibre(*fibre).restored)


def phase_sums(ctl: Any) -> dict[str, float]:
    """The controller's seconds per phase so far."""
    text = ctl.request("GET", "/metrics")[1]
    out = dict.fromkeys(PHASES, 0.0)
    for line in text.splitlines():
        if line.startswith("lightpipe_controller_phase_seconds_total{"):
            name = line.split('phase="')[1].split('"')[0]
            out[name] = float(line.split()[-1])
    return out


def round_sums(ctl: Any) -> dict[str, float]:
    """The controller's seconds per make-before-break round so far (none in old code)."""
    text = ctl.request("GET", "/metrics")[1]
    out = dict.fromkeys(ROUNDS, 0.0)
    for line in text.splitlines():
        if line.startswith("lightpipe_controller_sync_round_seconds_sum{"):
            out[line.split('round="')[1].split('"')[0]] = float(line.split()[-1])
    return out


def per_phase_ms(before: dict[str, float], after: dict[str, float], n: int) -> dict[str, float]:
    return {k: (after[k] - before[k]) / n * 1e3 for k in PHASES}


def breakdown(per: dict[str, float], client_ms: float, ctl_ms: float) -> str:
    """Mean ms per set-up in each phase, the controller's other work and the REST path."""
    per = dict(per)
    per["other controller"] = ctl_ms - sum(per.values())
    per["REST path"] = client_ms - ctl_ms
    return "mean per set-up: " + ", ".join(f"{k} {v:.2f}" for k, v in per.items()) + " ms"


def _lp_key(lp: dict[str, Any]) -> list[Any]:
    return [lp["id"], lp["vid"], lp["nodes"], lp["first_slot"], lp["n_slots"],
            lp.get("backup"), lp.get("restored")]


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """One run on a fresh network and controller: the figures and the decisions taken."""
    os.environ["LIGHTPIPE_CTL_PROTECTION"] = "1" if args.protection == "on" else "0"
    if args.client_rt:  # the REST client in the real-time class, below the controller
        os.sched_setscheduler(0, os.SCHED_RR, os.sched_param(1))
    import yaml

    import controllers.core
    from testbed.emu.network import EmuNetwork
    from testbed.emu.plan import build_plan
    from testbed.orchestrate.glue import attach_controller, controller_address
    from testbed.spec import load_scenario, parse_scenario

    base = load_scenario(ROOT / "scenarios" / "quickstart.yaml").model_dump(mode="json")
    base["emulation"].update(hosts_per_dc=1, bandwidth_divisor=10000.0,
                             link_mode="userspace", datapath="user")
    sc = parse_scenario(base)
    out: dict[str, Any] = {"code": str(Path(controllers.core.__file__).resolve().parents[1]),
                           "decisions": []}
    with tempfile.TemporaryDirectory() as tmp:
        spec = Path(tmp) / "s.yaml"
        spec.write_text(yaml.safe_dump(base))
        t0 = time.perf_counter()
        net = EmuNetwork(build_plan(sc), link_mode="userspace", datapath="user",
                         controller=controller_address())
        ctl = None
        try:
            net.start()
            t1 = time.perf_counter()
            ctl = attach_controller(net, spec, Path(tmp) / "ctl")
            out["network_up_s"], out["controller_up_s"] = t1 - t0, time.perf_counter() - t1
            out["switches"] = len(net.plan.switches)
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
                    out["decisions"].append(["refused", i, status])
                    continue
                lat.append(dt * 1e3)
                ctl_lat.append(lp["setup_s"] * 1e3)
                ids.append(lp)
                out["decisions"].append(_lp_key(lp))
            out["setup_ms"], out["ctl_setup_ms"] = lat, ctl_lat
            out["setup_phases_ms"] = per_phase_ms(phases0, phase_sums(ctl), len(lat))
            if args.protection == "on":  # the protection follows the set-ups
                t = time.perf_counter()
                while not all(x.get("protected") or x.get("backup") is None
                              for x in ctl.request("GET", "/lightpaths")[1]["lightpaths"]):
                    time.sleep(0.005)
                out["protected_after_ms"] = (time.perf_counter() - t) * 1e3
            # The busiest fibre: cut it by taking its middle node's interface down.
            count: dict[tuple[str, str], int] = {}
            for lp in ids:
                for u, v in zip(lp["nodes"], lp["nodes"][1:], strict=False):
                    key = (min(u, v), max(u, v))
                    count[key] = count.get(key, 0) + 1
            (u, v), n_on = max(count.items(),
                               key=lambda kv: (restorable(sc, ids, kv[0]), kv[1]))
            f = net.plan.fibre(u, v)
            emu = net.emulators[f.middle]
            before = metric(ctl, "lightpipe_restoration_seconds_count")
            phases1, rounds1 = phase_sums(ctl), round_sums(ctl)
            subprocess.run(["mnexec", "-a", str(emu.ns_pid), "ip", "link", "set", emu.intf_u,
                            "down"], check=True)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and \
                    metric(ctl, "lightpipe_restoration_seconds_count") == before:
                time.sleep(0.01)
            out["restoration_phases_ms"] = per_phase_ms(phases1, phase_sums(ctl), 1)
            rounds2 = round_sums(ctl)
            out["restoration_rounds_ms"] = {k: (rounds2[k] - rounds1[k]) * 1e3 for k in ROUNDS}
            out["cut"] = {"fibre": [u, v], "on_it": n_on,
                          "ms": metric(ctl, "lightpipe_restoration_seconds_sum") * 1e3,
                          "restored": metric(ctl, "lightpipe_lightpaths_restored_total"),
                          "lost": metric(ctl, "lightpipe_lightpaths_lost_total"),
                          "on_backup": metric(
                              ctl, "lightpipe_lightpaths_restored_on_backup_total")}
            out["decisions"].append(["after cut", [
                _lp_key(x) for x in ctl.request("GET", "/lightpaths")[1]["lightpaths"]]])
            # A REST-injected cut of the next busiest fibre.
            rest = sorted(count.items(), key=lambda kv: -kv[1])
            (u2, v2), n2 = next(kv for kv in rest if kv[0] != (u, v))
            status, res = ctl.request("POST", "/failures", {"link": [u2, v2]})
            out["rest_cut"] = {"fibre": [u2, v2], "on_it": n2, "restored": res["restored"],
                               "lost": res["lost"], "ms": res["restoration_s"] * 1e3}
            out["decisions"].append(["rest cut", res["restored"], res["lost"]])
            # POST /jobs: placement (testbed.jobs policy on the controller's optical state)
            # + every boundary lightpath's rules installed; then DELETE.
            for lp in ids:
                ctl.request("DELETE", f"/lightpaths/{lp['id']}")
            for u_, v_ in ((u, v), (u2, v2)):
                ctl.request("POST", "/repairs", {"link": [u_, v_]})
            out["jobs"] = {}
            for policy in ("sp-ff", "cba") if args.jobs else ():
                place, drop, n_lp = [], [], 0
                for _ in range(args.jobs):
                    t = time.perf_counter()
                    status, job = ctl.request("POST", "/jobs", {
                        "model": "llama2-7b", "stages": 8, "gpus_per_stage": 32,
                        "policy": policy})
                    place.append((time.perf_counter() - t) * 1e3)
                    if status != 201:
                        out["decisions"].append(["job refused", policy, status])
                        continue
                    n_lp += len(job["lightpath_ids"])
                    out["decisions"].append(["job", policy, job["dcs"], [
                        b["lightpath"]["nodes"] for b in job["boundaries"] if b["lightpath"]]])
                    t = time.perf_counter()
                    ctl.request("DELETE", f"/jobs/{job['id']}")
                    drop.append((time.perf_counter() - t) * 1e3)
                out["jobs"][policy] = {"place_ms": place, "delete_ms": drop,
                                       "lightpaths": n_lp / max(1, len(drop))}
        finally:
            if ctl is not None:
                ctl.stop()
            net.stop()
    out["load"] = os.getloadavg()[0]
    return out


def print_run(r: dict[str, Any]) -> None:
    """The figures of one run, as lines."""
    lat, ctl_lat = r["setup_ms"], r["ctl_setup_ms"]
    print(f"network up {r['network_up_s']:.2f} s; controller up + all switches synced "
          f"{r['controller_up_s']:.2f} s ({r['switches']} switches)")
    print(f"lightpath set-up, REST -> rules installed (n={len(lat)}): median "
          f"{statistics.median(lat):.2f} ms, p99 {pct(lat, 0.99):.2f} ms "
          f"(controller side: median {statistics.median(ctl_lat):.2f} ms, "
          f"p99 {pct(ctl_lat, 0.99):.2f} ms; worst {max(lat):.2f} ms "
          f"at request {lat.index(max(lat)) + 1}; target p99 < 20 ms)")
    print("  " + breakdown(r["setup_phases_ms"], statistics.mean(lat),
                           statistics.mean(ctl_lat)))
    if "protected_after_ms" in r:
        print(f"  all {len(lat)} protected {r['protected_after_ms']:.0f} ms after the last "
              "set-up's reply")
    c = r["cut"]
    print(f"port-down cut of fibre {c['fibre'][0]}-{c['fibre'][1]} ({c['on_it']} lightpaths "
          f"on it): cut-detected -> restored {c['ms']:.1f} ms; restored {c['restored']:.0f} "
          f"({c['on_backup']:.0f} onto the backup their switches had failed over to), "
          f"lost {c['lost']:.0f}")
    ph = r["restoration_phases_ms"]
    print("  of which " + ", ".join(f"{k} {ph[k]:.2f}" for k in ("rules", "send", "barrier"))
          + f" ms, other {c['ms'] - sum(ph[k] for k in ('rules', 'send', 'barrier')):.2f} ms")
    rr = r.get("restoration_rounds_ms") or {}
    if any(rr.values()):
        print("  its make-before-break rounds (writes to last barrier reply): " + ", ".join(
            f"{k} {rr[k]:.2f}" for k in ROUNDS) + " ms")
    rc = r["rest_cut"]
    print(f"REST cut of fibre {rc['fibre'][0]}-{rc['fibre'][1]} ({rc['on_it']} lightpaths): "
          f"restored {len(rc['restored'])}, lost {len(rc['lost'])} in {rc['ms']:.1f} ms")
    for policy, j in r["jobs"].items():
        if j["place_ms"] and j["delete_ms"]:
            print(f"POST /jobs ({policy}, 8 stages, {j['lightpaths']:.1f} lightpaths each, "
                  f"n={len(j['place_ms'])}): median {statistics.median(j['place_ms']):.1f} ms, "
                  f"p99 {pct(j['place_ms'], 0.99):.1f} ms; DELETE median "
                  f"{statistics.median(j['delete_ms']):.1f} ms")


def tree_copy(into: Path, rev: str | None = None) -> Path:
    """A copy of this working tree (tracked and untracked files git does not ignore), so
    that edits made while the bench runs do not reach it; with `rev`, the controller's
    files (BASELINE_PATHS) as at that revision (read with git; nothing in the repository
    changes)."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.splitlines()

    def scoped(p: str) -> bool:
        return rev is not None and any(p == s or p.startswith(s + "/")
                                       for s in BASELINE_PATHS)

    for rel in files:
        src = ROOT / rel
        if scoped(rel) or not src.is_file():
            continue
        (into / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, into / rel)
    if rev is None:
        return into
    old = subprocess.run(["git", "ls-tree", "-r", "--name-only", rev, "--", *BASELINE_PATHS],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    for rel in old:
        blob = subprocess.run(["git", "show", f"{rev}:{rel}"], cwd=ROOT, capture_output=True,
                              check=True).stdout
        (into / rel).parent.mkdir(parents=True, exist_ok=True)
        (into / rel).write_bytes(blob)
    return into


def _span(xs: list[float]) -> str:
    return f"{statistics.median(xs):.1f} [{min(xs):.1f}-{max(xs):.1f}]"


def summarize(results: dict[tuple[str, str], list[dict[str, Any]]]) -> None:
    """Per code and mode: medians and ranges over the runs, pooled percentiles."""
    print("\nper code and mode: median [range] over the runs; pooled = all set-ups together")
    head = ("code", "mode", "runs", "set-up median/run", "worst/run", "pooled p50",
            "pooled p99 (n)", "ctl p99 pooled", "restoration ms", "of it send",
            "REST cut ms")
    print(" | ".join(head))
    for (code, mode), runs in results.items():
        lat = [x for r in runs for x in r["setup_ms"]]
        ctl = [x for r in runs for x in r["ctl_setup_ms"]]
        row = [code, mode, str(len(runs)),
               _span([statistics.median(r["setup_ms"]) for r in runs]),
               _span([max(r["setup_ms"]) for r in runs]),
               f"{statistics.median(lat):.1f}", f"{pct(lat, 0.99):.1f} ({len(lat)})",
               f"{pct(ctl, 0.99):.1f}", _span([r["cut"]["ms"] for r in runs]),
               _span([r["restoration_phases_ms"]["send"] for r in runs]),
               _span([r["rest_cut"]["ms"] for r in runs])]
        print(" | ".join(row))
        print(f"    {code} {mode} mean per set-up: " + ", ".join(
            f"{k} {statistics.mean(r['setup_phases_ms'][k] for r in runs):.2f}"
            for k in PHASES) + f"; load {_span([r['load'] for r in runs])}")
        print(f"    {code} {mode} restoration phases: " + ", ".join(
            f"{k} {_span([r['restoration_phases_ms'][k] for r in runs])}"
            for k in ("rules", "send", "barrier")))
        if any(any((r.get("restoration_rounds_ms") or {}).values()) for r in runs):
            print(f"    {code} {mode} restoration rounds: " + ", ".join(
                f"{k} {_span([(r.get('restoration_rounds_ms') or {}).get(k, 0.0) for r in runs])}"
                for k in ROUNDS))


def compare(args: argparse.Namespace) -> int:
    from busy import busy_core  # bench/busy.py (the script's folder is on sys.path)

    modes = ("idle", "busy") if args.mode == "both" else (args.mode,)
    with tempfile.TemporaryDirectory(prefix="lp-bench-") as tmp:
        trees = {"new": tree_copy(Path(tmp) / "new")}
        if args.baseline:
            trees = {"old": tree_copy(Path(tmp) / "old", args.baseline), **trees}
        results: dict[tuple[str, str], list[dict[str, Any]]] = {
            (c, m): [] for m in modes for c in trees}
        codes = list(trees)
        for i in range(args.runs):
            for mode in modes:
                order = codes if i % 2 == 0 else codes[::-1]
                for code in order:
                    out = Path(tmp) / f"run-{i}-{mode}-{code}.json"
                    cmd = [sys.executable, str(trees[code] / "bench" / "bench_controller.py"),
                           "--lightpaths", str(args.lightpaths), "--jobs", str(args.jobs),
                           "--protection", args.protection, "--json", str(out),
                           *(["--client-rt"] if args.client_rt else [])]
                    with busy_core(mode == "busy"):
                        rc = subprocess.run(cmd, cwd=trees[code], capture_output=True,
                                            text=True, timeout=600, check=False)
                    if rc.returncode != 0:
                        print(f"run {i} {mode} {code} failed: {rc.stderr[-2000:]}",
                              file=sys.stderr)
                        return 1
                    r = json.loads(out.read_text())
                    if Path(r["code"]) != trees[code].resolve():
                        print(f"run {i} {code}: ran {r['code']}, not {trees[code]}",
                              file=sys.stderr)
                        return 1
                    results[(code, mode)].append(r)
                    print(f"run {i + 1}/{args.runs} {mode:4s} {code}: set-up median "
                          f"{statistics.median(r['setup_ms']):.1f} worst "
                          f"{max(r['setup_ms']):.1f} ms; restoration {r['cut']['ms']:.1f} ms "
                          f"(send {r['restoration_phases_ms']['send']:.1f}); load "
                          f"{r['load']:.1f}", flush=True)
        summarize(results)
        decisions = {json.dumps(r["decisions"]) for runs in results.values() for r in runs}
        print(f"\ndecisions (routes, slots, VLAN ids, restorations, jobs): "
              f"{'identical in every run' if len(decisions) == 1 else 'DIFFER'} "
              f"({sum(len(v) for v in results.values())} runs)")
        if args.json:
            Path(args.json).write_text(json.dumps(
                {f"{c}/{m}": v for (c, m), v in results.items()}, indent=1))
        return 0 if len(decisions) == 1 else 1


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lightpaths", type=int, default=40)
    ap.add_argument("--jobs", type=int, default=20, help="POST /jobs + DELETE rounds")
    ap.add_argument("--protection", choices=("on", "off"), default="on")
    ap.add_argument("--runs", type=int, default=0,
                    help="this many runs, each in a fresh process (0: one, printed in full)")
    ap.add_argument("--mode", choices=("idle", "busy", "both"), default="idle",
                    help="with --runs: idle, one core kept busy (bench/busy.py), or both")
    ap.add_argument("--baseline", metavar="REV",
                    help="with --runs: also run the controller as at REV, alternating")
    ap.add_argument("--json", metavar="FILE", help="write the figures as JSON")
    ap.add_argument("--client-rt", action="store_true",
                    help="run this process (the REST client) at SCHED_RR 1, below the "
                    "controller: its own wait for a CPU leaves the client-side figure "
                    "(the busy core's spinner stays in the normal class)")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("needs root (network namespaces, Open vSwitch)", file=sys.stderr)
        return 2
    if args.runs:
        return compare(args)
    r = measure(args)
    if args.json:
        Path(args.json).write_text(json.dumps(r))
    else:
        print_run(r)
    return 0


if __name__ == "__main__":
    sys.exit(main())
