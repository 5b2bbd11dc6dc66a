"""Benchmark: the vector RMSA-v0 (make_vec's vector entry point) at N envs, the single env
beside it.

Setting: bench/bench_gym.py's (NSFNET, 80 slots, k = 5, J = 5, one guard slot, 25..100
Gb/s, 50 Erlang), episodes of --episode requests, autoreset (NEXT_STEP) as Gymnasium's
vector API does it. Each step takes a random valid action per env, drawn by a small
compiled picker from pre-drawn uniforms (the policy's cost stays out of the way: numpy's
rng.choice per env would cost more than the env). The single env (gym.make, default
wrappers) draws its random valid action as bench/bench_gym.py does.

Each configuration runs --runs times, the configurations alternating, and the table gives
the median env-steps/s (env-steps = envs x vector steps), the range over the runs, and
the CPU time per env-step (all threads); the load average is printed, since other work on
the machine moves every figure. Runs in a minute or two.

Run: .venv/bin/python bench/bench_gym_vec.py [--envs 1 64 1024 4096] [--runs 3]
     [--env-steps 400000] [--episode 1000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_gym import spec

import testbed.gym  # noqa: F401  (registers the environments)
from testbed.gym.jit import jit
from testbed.spec import parse_scenario

GOAL_ENV_STEPS_PER_S = 1_000_000


@jit()
def pick_valid(masks: Any, u: Any, out: Any) -> None:
    """out[i]: the int(u[i] x allowed)-th allowed action of masks[i]."""
    for i in range(masks.shape[0]):
        c = 0
        for a in range(masks.shape[1]):
            c += masks[i, a]
        t = int(u[i] * c)
        for a in range(masks.shape[1]):
            if masks[i, a]:
                if t == 0:
                    out[i] = a
                    break
                t -= 1


def vector_run(env: Any, steps: int, seed: int) -> tuple[float, float, int]:
    """(wall s, CPU s, env-steps) of `steps` vector steps from reset(seed)."""
    n = env.num_envs
    rng = np.random.default_rng(seed)
    u = rng.random((steps, n))
    actions = np.zeros(n, np.int64)
    _, info = env.reset(seed=seed)
    t0, c0 = time.perf_counter(), time.process_time()
    for t in range(steps):
        pick_valid(info["action_mask"], u[t], actions)
        _, _, _, _, info = env.step(actions)
    return time.perf_counter() - t0, time.process_time() - c0, n * steps


def single_run(env: Any, steps: int, seed: int) -> tuple[float, float, int]:
    rng = np.random.default_rng(seed)
    u = rng.random(steps).tolist()
    _, info = env.reset(seed=seed)
    t0, c0 = time.perf_counter(), time.process_time()
    for i in range(steps):
        allowed = info["action_mask"].nonzero()[0]
        _, _, _, trunc, info = env.step(int(allowed[int(u[i] * len(allowed))]))
        if trunc:
            _, info = env.reset()
    return time.perf_counter() - t0, time.process_time() - c0, steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--envs", type=int, nargs="+", default=[1, 64, 1024, 4096])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--env-steps", type=int, default=400_000,
                    help="env-steps per run (at least 200 vector steps)")
    ap.add_argument("--single-steps", type=int, default=100_000)
    ap.add_argument("--episode", type=int, default=1000, help="requests per episode")
    ap.add_argument("--load", type=float, default=50.0)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    sc = parse_scenario(spec(args.load, args.episode, 5, args.seed))
    print(f"NSFNET, 80 slots, k=5, J=5, 1 guard slot, 25..100 Gb/s, {args.load:g} Erlang, "
          f"episodes of {args.episode} requests; load average {os.getloadavg()[0]:.1f} on "
          f"{os.cpu_count()} cores")
    configs: dict[str, tuple[Any, Any, int]] = {
        "single env": (gym.make("LightPipe/RMSA-v0", scenario=sc), single_run,
                       args.single_steps)}
    for n in args.envs:
        env = gym.make_vec("LightPipe/RMSA-v0", num_envs=n, scenario=sc)
        configs[f"vector N={n}"] = (env, vector_run, max(200, args.env_steps // n))
    for env, fn, steps in configs.values():  # routes found, kernels loaded: not timed
        fn(env, min(steps, 300), args.seed)
    got: dict[str, list[tuple[float, float, int]]] = {k: [] for k in configs}
    for _ in range(args.runs):
        for name, (env, fn, steps) in configs.items():
            got[name].append(fn(env, steps, args.seed))
    print(f"{args.runs} runs each, alternating")
    print(f"{'':<15}{'env-steps/s median':>20}{'range':>26}{'CPU us/env-step':>17}")
    for name, runs in got.items():
        rates = [s / w for w, _, s in runs]
        cpu = statistics.median(c / s * 1e6 for _, c, s in runs)
        print(f"{name:<15}{statistics.median(rates):>20,.0f}"
              f"{f'{min(rates):,.0f}..{max(rates):,.0f}':>26}{cpu:>17.2f}")
    print(f"goal: >= {GOAL_ENV_STEPS_PER_S:,} env-steps/s at large N on this machine")


if __name__ == "__main__":
    main()
