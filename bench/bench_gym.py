"""Benchmark: LightPipe/RMSA-v0 steps per second, its reference implementation beside it,
next to optical-rl-gym's DeepRMSA-v0.

Setting (both sides alike): NSFNET (the bundled `nsfnet`, 14 nodes, 22 fibres: the
DeepRMSA variant optical-rl-gym ships as nsfnet_chen.txt), 80 slots of 12.5 GHz, k = 5
shortest paths, J candidate blocks per path, one guard slot, bit rates uniform over
25..100 Gb/s (optical-rl-gym's DeepRMSA default), BPSK/QPSK/8QAM/16QAM with reaches
100000/2000/1000/500 km, Poisson arrivals, exponential holding (25 s mean), LOAD Erlang.
Two policies: a random valid action (masked; optical-rl-gym has no mask, so there the
random action is unmasked) and k-shortest-path first fit.

RMSA-v0 (the compiled env, testbed.gym.rmsa) and its reference implementation
(testbed.gym.rmsa_reference, what RMSA-v0 was before the kernel) both run through
gym.make with Gymnasium's default wrappers, in pairs of runs, alternating; the table
gives each one's median steps/s and the range over the runs (the machine's load moves
every figure: the load average is printed). The random valid action is drawn from a
pre-drawn uniform (`allowed[int(u * len(allowed))]`): numpy's rng.choice alone costs
about 7 us, as much as a whole step of the compiled env. The copies the env makes of
every observation array and the mask (so that no array handed out changes later) are
timed apart.

optical-rl-gym (github.com/carlosnatalino/optical-rl-gym, gym 0.21) runs in its own
virtualenv (ORLG_PYTHON, default /var/tmp/orlg-venv/bin/python; docs/gym.md says how to
make it); without it the bench prints the recorded anchor of 400 requests/s instead.
Run: .venv/bin/python bench/bench_gym.py [--steps 100000] [--ref-steps 20000] [--runs 3]
     [--orlg-steps 5000] [--load 50] [--no-orlg]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.envs.registration import EnvSpec

import testbed.gym  # noqa: F401  (registers the environments)
from testbed.gym.rmsa import first_fit_action
from testbed.spec import parse_scenario
from testbed.topologies import load_library

ORLG_PYTHON = os.environ.get("ORLG_PYTHON", "/var/tmp/orlg-venv/bin/python")
ORLG_ANCHOR_RPS = 400.0  # optical-rl-gym on these machines, an earlier measurement
GOAL_RATIO = 10.0
MODULATIONS = [  # (name, reach km, spectral efficiency: Gb/s per 12.5 GHz slot / 12.5)
    ("BPSK", 100000.0, 1), ("QPSK", 2000.0, 2), ("8QAM", 1000.0, 3), ("16QAM", 500.0, 4)]
BITRATES = list(range(25, 101))  # optical-rl-gym: randint(25, 100), both ends included
HOLDING_S = 25.0


def spec(load_erlang: float, requests: int, k: int, seed: int) -> dict[str, Any]:
    return {
        "name": "bench-gym", "topology": {"library": "nsfnet"},
        "optical": {"grid": "flex", "slots": 80, "slot_ghz": 12.5, "guard_slots": 1,
                    "k_paths": k, "modulations": [
                        {"name": n, "reach_km": r, "gbps_per_slot": 12.5 * se}
                        for n, r, se in MODULATIONS]},
        "workload": {"kind": "lightpath_requests", "load_erlang": load_erlang,
                     "mean_holding_s": HOLDING_S, "requests": requests,
                     "bitrate_gbps": [float(b) for b in BITRATES], "seed": seed},
    }


# the reference implementation, made by gym.make like RMSA-v0 (same default wrappers)
REFERENCE = EnvSpec("LightPipe/RMSA-reference-v0",
                    entry_point="testbed.gym.rmsa_reference:ReferenceRMSAEnv")


def make(which: str, load: float, steps: int, k: int, j: int, seed: int) -> gym.Env[Any, Any]:
    env_id: Any = "LightPipe/RMSA-v0" if which == "RMSA-v0" else REFERENCE
    return gym.make(env_id, scenario=parse_scenario(spec(load, steps, k, seed)), blocks=j)


def lightpipe(env: gym.Env[Any, Any], policy: str, seed: int, steps: int) -> dict[str, float]:
    """Steps/s of one episode of `steps` requests (gym.make's env, default wrappers)."""
    rng = np.random.default_rng(seed)
    _, info = env.reset(seed=seed)
    u = rng.random(steps + 1).tolist()
    done = False
    i = 0
    t0 = time.perf_counter()
    while not done:
        mask = info["action_mask"]
        if policy == "first_fit":
            a = first_fit_action(mask)
        else:
            allowed = mask.nonzero()[0]
            a = int(allowed[int(u[i] * len(allowed))])
            i += 1
        _, _, term, trunc, info = env.step(a)
        done = term or trunc
    wall = time.perf_counter() - t0
    un = env.unwrapped
    return {"steps_per_s": un.requests / wall, "blocking": un.blocking_ratio}


def copy_cost_us(env: gym.Env[Any, Any], reps: int = 20000) -> float:
    """Microseconds per step to copy one observation's arrays and the mask."""
    obs, info = env.reset(seed=1)
    arrays = [v for v in obs.values() if isinstance(v, np.ndarray)] + [info["action_mask"]]
    t0 = time.perf_counter()
    for _ in range(reps):
        for a in arrays:
            a.copy()
    return (time.perf_counter() - t0) / reps * 1e6


def paired_runs(args: argparse.Namespace) -> dict[tuple[str, str], list[dict[str, float]]]:
    """Each (env, policy) args.runs times, the envs alternating."""
    steps = {"RMSA-v0": args.steps, "reference": args.ref_steps}
    envs = {name: make(name, args.load, n, args.k, args.blocks, args.seed)
            for name, n in steps.items()}
    for name, env in envs.items():  # routes found, kernels loaded: not in the timings
        lightpipe(env, "first_fit", args.seed, steps[name])
    out: dict[tuple[str, str], list[dict[str, float]]] = {}
    for _ in range(args.runs):
        for policy in ("random", "first_fit"):
            for name, env in envs.items():
                out.setdefault((name, policy), []).append(
                    lightpipe(env, policy, args.seed, steps[name]))
    return out


# Runs inside optical-rl-gym's own virtualenv (gym 0.21); reads the setting as JSON.
ORLG_CHILD = r'''
import json, sys, time
import networkx as nx
from optical_rl_gym.envs.deeprmsa_env import DeepRMSAEnv, shortest_available_path_first_fit
from optical_rl_gym.utils import (Modulation, Path, get_best_modulation_format,
                                  get_k_shortest_paths, get_path_weight)
cfg = json.load(sys.stdin)
g = nx.Graph()
for i, (u, v, km) in enumerate(cfg["fibres"]):
    g.add_edge(u, v, id=i, index=i, weight=1, length=km)
mods = tuple(Modulation(name=n, maximum_length=r, spectral_efficiency=se, minimum_osnr=0,
                        inband_xt=0) for n, r, se in cfg["modulations"])
ksp, idp = {}, 0
nodes = list(g.nodes())
for a, n1 in enumerate(nodes):
    for b, n2 in enumerate(nodes):
        if a < b:
            objs = []
            for p in get_k_shortest_paths(g, n1, n2, cfg["k"], weight="length"):
                length = get_path_weight(g, p, weight="length")
                objs.append(Path(path_id=idp, node_list=p, hops=len(p) - 1, length=length,
                                 best_modulation=get_best_modulation_format(length, mods)))
                idp += 1
            ksp[n1, n2] = ksp[n2, n1] = objs
g.graph.update(name="nsfnet", ksp=ksp, modulations=mods, k_paths=cfg["k"],
               node_indices=nodes)
for i, n in enumerate(nodes):
    g.nodes[n]["index"] = i
out = {}
for policy in ("random", "first_fit"):
    env = DeepRMSAEnv(topology=g, j=cfg["j"], episode_length=cfg["steps"],
                      mean_service_holding_time=cfg["holding_s"],
                      mean_service_inter_arrival_time=cfg["holding_s"] / cfg["load"],
                      num_spectrum_resources=80, seed=cfg["seed"])
    env.reset()
    t0 = time.perf_counter()
    for _ in range(cfg["steps"]):
        a = (shortest_available_path_first_fit(env) if policy == "first_fit"
             else env.action_space.sample())
        env.step(a)
    wall = time.perf_counter() - t0
    out[policy] = {"steps_per_s": cfg["steps"] / wall,
                   "blocking": 1 - env.episode_services_accepted / env.episode_services_processed}
print(json.dumps(out))
'''


def orlg(steps: int, load: float, k: int, j: int, seed: int) -> dict[str, Any] | str:
    """optical-rl-gym's figures in its own virtualenv, or why they are missing."""
    if not os.path.exists(ORLG_PYTHON):
        return f"optical-rl-gym not installed ({ORLG_PYTHON} missing)"
    topo = load_library("nsfnet")
    cfg = {"fibres": [(f.u, f.v, f.length_km) for f in topo.fibres], "k": k, "j": j,
           "steps": steps, "load": load, "holding_s": HOLDING_S, "seed": seed,
           "modulations": MODULATIONS}
    res = subprocess.run([ORLG_PYTHON, "-c", ORLG_CHILD], input=json.dumps(cfg),
                         capture_output=True, text=True, timeout=3600, cwd="/")
    if res.returncode != 0:
        tail = (res.stderr.strip().splitlines() or ["(no output)"])[-1]
        return f"optical-rl-gym failed to run: {tail}"
    out: dict[str, Any] = json.loads(res.stdout.strip().splitlines()[-1])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=100_000, help="RMSA-v0 steps per run")
    ap.add_argument("--ref-steps", type=int, default=20_000,
                    help="steps per run of the reference implementation (it is slower)")
    ap.add_argument("--runs", type=int, default=3, help="runs of each (env, policy)")
    ap.add_argument("--orlg-steps", type=int, default=5_000,
                    help="optical-rl-gym steps per policy (it is slower)")
    ap.add_argument("--load", type=float, default=50.0, help="Erlang")
    ap.add_argument("--k", type=int, default=5)
    ap.add_argument("--blocks", type=int, default=5, help="J, candidate blocks per path")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--no-orlg", action="store_true", help="skip optical-rl-gym")
    args = ap.parse_args()
    print(f"NSFNET (bundled nsfnet), 80 slots, k={args.k}, J={args.blocks}, 1 guard slot, "
          f"25..100 Gb/s, {args.load:g} Erlang, seed {args.seed}; load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    runs = paired_runs(args)
    theirs = ("skipped (--no-orlg)" if args.no_orlg
              else orlg(args.orlg_steps, args.load, args.k, args.blocks, args.seed))
    print(f"{args.runs} runs each, alternating; {args.steps} RMSA-v0 and {args.ref_steps} "
          "reference steps per run, through gym.make (default wrappers)")
    print(f"{'policy':<11}{'env':<11}{'steps/s median':>16}{'range':>22}{'blocking':>10}"
          f"{'x reference':>13}")
    for policy in ("random", "first_fit"):
        ref = statistics.median(r["steps_per_s"] for r in runs[("reference", policy)])
        for name in ("RMSA-v0", "reference"):
            rs = [r["steps_per_s"] for r in runs[(name, policy)]]
            med = statistics.median(rs)
            rng = f"{min(rs):,.0f}..{max(rs):,.0f}"
            print(f"{policy:<11}{name:<11}{med:>16,.0f}{rng:>22}"
                  f"{runs[(name, policy)][0]['blocking']:>10.4f}{med / ref:>12.1f}x")
    env = make("RMSA-v0", args.load, 1000, args.k, args.blocks, args.seed)
    print(f"copying an observation's arrays and the mask: {copy_cost_us(env):.2f} us per step "
          "(part of RMSA-v0's step above)")
    print(f"goal: RMSA-v0 >= 100,000 steps/s with random valid actions; >= {GOAL_RATIO:g}x "
          "optical-rl-gym's steps/s on the same setting")
    if isinstance(theirs, dict):
        print(f"{'policy':<11}{'optical-rl-gym steps/s':>24}{'blocking':>10}"
              f"{'RMSA-v0 / optical-rl-gym':>27}")
        for p in ("random", "first_fit"):
            ours = statistics.median(r["steps_per_s"] for r in runs[("RMSA-v0", p)])
            t = theirs[p]
            print(f"{p:<11}{t['steps_per_s']:>24,.0f}{t['blocking']:>10.4f}"
                  f"{ours / t['steps_per_s']:>26.1f}x")
    else:
        ours = statistics.median(r["steps_per_s"] for r in runs[("RMSA-v0", "random")])
        print(f"optical-rl-gym: {theirs}; against the recorded anchor of about "
              f"{ORLG_ANCHOR_RPS:.0f} requests/s (measured earlier on these machines, not "
              f"now): {ours / ORLG_ANCHOR_RPS:,.0f}x")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
