"""Example: train sb3-contrib's MaskablePPO (or plain PPO) on RMSA-v0 (or Placement-v0)
and compare it with first fit (or cba) in a Markdown table of blocking ratios, one row
per evaluation seed.

    python -m testbed.gym.train --scenario scenarios/quickstart.yaml --steps 20000 \\
        --out results.md

MaskablePPO (the default, `--algo maskable-ppo`) takes the env's `action_masks()` at
every step, so it only ever picks allowed actions, in training and in evaluation. Plain
stable-baselines3 PPO (`--algo ppo`) sees the mask as part of its input, and an action
the mask forbids is blocked by the environment (reward -1 in RMSA-v0, minus the block
penalty in Placement-v0), so it learns to avoid them. docs/gym.md shows a table this
wrote.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from testbed.errors import InputError, LightPipeError
from testbed.gym import PLACEMENT_ID, RMSA_ID
from testbed.gym.placement import PlacementEnv
from testbed.gym.rmsa import RMSAEnv, first_fit_action
from testbed.io.atomic import atomic_write_text

log = logging.getLogger("testbed.gym.train")

# policy(env, observation, action mask, rng) -> action
Policy = Callable[[gym.Env[Any, Any], np.ndarray, np.ndarray, np.random.Generator], int]


class FlatRMSA(gym.ObservationWrapper[np.ndarray, np.int64, dict[str, Any]]):
    """RMSA-v0's observation as one float32 vector scaled to about [0, 1], with the mask:
    spectrum, slots needed, block starts and free runs (/ slots), source and destination
    one-hot, bit rate (/ the largest), holding time (/ its mean), action mask."""

    def __init__(self, env: gym.Env[dict[str, Any], np.int64]) -> None:
        super().__init__(env)
        u = env.unwrapped
        assert isinstance(u, RMSAEnv)
        self.u = u
        self.n_nodes = len(u.nodes)
        self.rate_scale = max(u.workload.bitrate_gbps) if u.workload.trace is None else 400.0
        size = (u.k * u.n_slots + u.k + 2 * u.k * u.j + 2 * self.n_nodes + 2
                + int(u.action_space.n))
        self.observation_space = spaces.Box(0.0, np.inf, (size,), np.float32)

    def observation(self, obs: dict[str, Any]) -> np.ndarray:
        u, s = self.u, float(self.u.n_slots)
        nodes = np.zeros(2 * self.n_nodes, np.float32)
        nodes[obs["source"]] = 1.0
        nodes[self.n_nodes + obs["destination"]] = 1.0
        return np.concatenate([
            obs["spectrum"].ravel().astype(np.float32),
            obs["slots_needed"].astype(np.float32) / s,
            obs["block_start"].ravel().astype(np.float32) / s,
            obs["block_free"].ravel().astype(np.float32) / s,
            nodes,
            obs["bitrate_gbps"] / self.rate_scale,
            obs["holding_s"] / u.workload.mean_holding_s,
            u.action_masks().astype(np.float32),
        ]).astype(np.float32)


class FlatPlacement(gym.ObservationWrapper[np.ndarray, np.int64, dict[str, Any]]):
    """Placement-v0's observation as one float32 vector: free GPUs, estimates (/ the
    job's reference iteration time), spectrum in use, job (scaled), model one-hot, mask."""

    def __init__(self, env: gym.Env[dict[str, Any], np.int64]) -> None:
        super().__init__(env)
        u = env.unwrapped
        assert isinstance(u, PlacementEnv)
        self.u = u
        n_models = int(u.observation_space["model"].n)  # type: ignore[index]
        size = 2 * u.n_dcs + u.cluster.network.n_spectra + 4 + n_models + u.n_dcs + 1
        self.n_models = n_models
        self.observation_space = spaces.Box(0.0, np.inf, (size,), np.float32)

    def observation(self, obs: dict[str, Any]) -> np.ndarray:
        u = self.u
        ref_s = u.reference_ms(u.job) / 1000.0
        model = np.zeros(self.n_models, np.float32)
        model[obs["model"]] = 1.0
        job = obs["job"] / np.array([64.0, 64.0, 64.0, 1000.0], np.float32)
        return np.concatenate([obs["free_gpus"], obs["estimate_s"] / ref_s,
                               obs["spectrum_used"], job, model,
                               u.action_masks().astype(np.float32)]).astype(np.float32)


def make_env(kind: str, scenario: str | None, episode_steps: int) -> gym.Env[Any, Any]:
    if kind == "rmsa":
        return gym.make(RMSA_ID, scenario=scenario, episode_requests=episode_steps)
    return gym.make(PLACEMENT_ID, scenario=scenario, episode_jobs=episode_steps)


def flat(kind: str, env: gym.Env[Any, Any]) -> gym.Env[Any, Any]:
    return FlatRMSA(env) if kind == "rmsa" else FlatPlacement(env)


def evaluate(kind: str, scenario: str | None, steps: int, seed: int, policy: Policy
             ) -> dict[str, float]:
    """One evaluation episode of `steps` requests/jobs from reset(seed=seed)."""
    env = flat(kind, make_env(kind, scenario, steps))
    obs, info = env.reset(seed=seed)
    rng = np.random.default_rng(seed)
    done = False
    its: list[float] = []
    while not done:
        a = policy(env, obs, info["action_mask"], rng)
        obs, _, term, trunc, info = env.step(a)
        if info.get("placed"):
            its.append(info["iteration_time_s"])
        done = term or trunc
    u = env.unwrapped
    out = {"blocking": float(u.blocking_ratio)}  # type: ignore[attr-defined]
    if kind == "placement":
        out["iteration_s"] = statistics.fmean(its) if its else float("nan")
    return out


def random_valid(env: gym.Env[Any, Any], obs: np.ndarray, mask: np.ndarray,
                 rng: np.random.Generator) -> int:
    """A uniformly random action among those the mask allows."""
    return int(rng.choice(np.flatnonzero(mask)))


def heuristic(env: gym.Env[Any, Any], obs: np.ndarray, mask: np.ndarray,
              rng: np.random.Generator) -> int:
    """First fit (RMSA-v0) or the cba policy's choice (Placement-v0)."""
    u = env.unwrapped
    if isinstance(u, PlacementEnv):
        return u.cba_action()
    return first_fit_action(mask)


ALGOS = {"maskable-ppo": "MaskablePPO", "ppo": "PPO"}


def train(kind: str, scenario: str | None, steps: int, episode_steps: int, seed: int,
          algo: str = "maskable-ppo") -> Any:
    import torch

    if algo == "maskable-ppo":
        from sb3_contrib import MaskablePPO as Algo  # the example's dependency (extra "gym")
    else:
        from stable_baselines3 import PPO as Algo

    torch.set_num_threads(1)  # a small MLP: threads only contend
    env = flat(kind, make_env(kind, scenario, episode_steps))
    env.reset(seed=seed)
    model = Algo("MlpPolicy", env, seed=seed, n_steps=min(512, steps), batch_size=64,
                 n_epochs=5, learning_rate=3e-4, gamma=0.95, verbose=0, device="cpu")
    model.learn(total_timesteps=steps)
    return model


def table(kind: str, scenario: str | None, args: argparse.Namespace, rows: list[dict[str, Any]],
          train_s: float) -> str:
    base = "first fit" if kind == "rmsa" else "cba"
    unit = "requests" if kind == "rmsa" else "jobs"
    name = ALGOS[args.algo]
    lib = "sb3-contrib, masked" if args.algo == "maskable-ppo" else "stable-baselines3"
    lines = [f"# {name} vs {base} on {scenario or 'the bundled quickstart scenario'} "
             f"({'RMSA-v0' if kind == 'rmsa' else 'Placement-v0'})",
             "",
             f"{name} ({lib}, MlpPolicy, seed {args.train_seed}) trained for "
             f"{args.steps} steps ({train_s:.0f} s) on episodes of {args.episode_steps} {unit}; "
             f"each row is one evaluation episode of {args.eval_steps} {unit} from "
             f"reset(seed=...), the same for every policy. Blocking ratio (lower is better).",
             ""]
    head = ["eval seed", name, base, "random valid"]
    if kind == "placement":
        head += [f"{name} iteration s", f"{base} iteration s"]
    lines.append("| " + " | ".join(head) + " |")
    lines.append("|" + "---|" * len(head))
    for r in rows:
        cells = [str(r["seed"]), f"{r['ppo']['blocking']:.4f}", f"{r['base']['blocking']:.4f}",
                 f"{r['random']['blocking']:.4f}"]
        if kind == "placement":
            cells += [f"{r['ppo']['iteration_s']:.4f}", f"{r['base']['iteration_s']:.4f}"]
        lines.append("| " + " | ".join(cells) + " |")
    mean = ["mean"] + [f"{statistics.fmean(r[p]['blocking'] for r in rows):.4f}"
                       for p in ("ppo", "base", "random")]
    if kind == "placement":
        mean += [f"{statistics.fmean(r[p]['iteration_s'] for r in rows):.4f}"
                 for p in ("ppo", "base")]
    lines.append("| " + " | ".join(mean) + " |")
    return "\n".join(lines) + "\n"


def run(argv: Sequence[str] | None = None) -> str:
    ap = argparse.ArgumentParser(prog="python -m testbed.gym.train", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenario", default=None,
                    help="scenario file (default: the bundled quickstart scenario)")
    ap.add_argument("--env", choices=("rmsa", "placement"), default="rmsa")
    ap.add_argument("--algo", choices=tuple(ALGOS), default="maskable-ppo",
                    help="MaskablePPO (sb3-contrib, masked; default) or plain PPO")
    ap.add_argument("--steps", type=int, default=20_000, help="PPO training steps")
    ap.add_argument("--episode-steps", type=int, default=1000,
                    help="requests (jobs) per training episode")
    ap.add_argument("--eval-steps", type=int, default=2000,
                    help="requests (jobs) per evaluation episode")
    ap.add_argument("--seeds", type=int, nargs="+", default=[101, 102, 103],
                    help="evaluation seeds (one episode each)")
    ap.add_argument("--train-seed", type=int, default=1)
    ap.add_argument("--out", help="write the Markdown table here (atomically)")
    args = ap.parse_args(argv)
    for name in ("steps", "episode_steps", "eval_steps"):
        if getattr(args, name) < 1:
            raise InputError(f"--{name.replace('_', '-')}", "must be >= 1")
    t0 = time.perf_counter()
    model = train(args.env, args.scenario, args.steps, args.episode_steps, args.train_seed,
                  args.algo)
    train_s = time.perf_counter() - t0
    log.info("trained %d steps in %.1f s", args.steps, train_s)
    masked = args.algo == "maskable-ppo"

    def ppo(env: gym.Env[Any, Any], obs: np.ndarray, mask: np.ndarray,
            rng: np.random.Generator) -> int:
        if masked:
            return int(model.predict(obs, action_masks=mask, deterministic=True)[0])
        return int(model.predict(obs, deterministic=True)[0])

    rows = []
    for seed in args.seeds:
        rows.append({"seed": seed, **{name: evaluate(args.env, args.scenario, args.eval_steps,
                                                     seed, pol)
                                      for name, pol in (("ppo", ppo), ("base", heuristic),
                                                        ("random", random_valid))}})
        log.info("seed %d: %s", seed, rows[-1])
    text = table(args.env, args.scenario, args, rows, train_s)
    if args.out:
        atomic_write_text(args.out, text)
    return text


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        text = run(argv)
    except LightPipeError as exc:
        sys.stderr.write(f"train: error: {exc}\n")
        return getattr(exc, "exit_code", 1)
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
