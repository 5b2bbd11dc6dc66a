"""Heuristic baselines of RMSA-v0 as policies (mask, obs, env) -> action, and their blocking.

The literature's RMSA heuristics (optical-rl-gym's rmsa_env heuristics, XLRON's
xlron/heuristics/heuristics.py) on RMSA-v0's action space, where an action is a
(candidate path, block) pair and a block starts at the low end of a free run:

* ``ksp-ff`` k-shortest-path first fit (XLRON ``ksp_ff``; optical-rl-gym's
  ``shortest_available_path_first_fit``): the first candidate path, shortest first,
  with a block that fits, at its lowest fitting slot. `lightpipe sim`'s first_fit.
* ``sap-ff`` first fit over the k paths sorted by length (km): the same rule with the
  candidates re-sorted by length. The candidates are the k shortest by length in order,
  so it picks what ksp-ff picks (tests/test_gym_baselines.py checks it, step by step).
* ``llp-ff`` least-loaded path first fit (optical-rl-gym's
  ``least_loaded_path_first_fit``): among the paths with a fitting block, the one with
  the most slots free along the whole route (ties: the shorter), first fit there.
* ``mu`` most used (XLRON ``mu_ksp``): among all allowed actions, the block whose slots
  are held on the most fibres across the network (summed over its slots; ties: the
  lower action, so the shorter path and the lower block).
* ``ff-ksp`` lowest spectrum (XLRON ``ff_ksp``): the path whose lowest fitting block
  starts at the lowest slot over all k paths (ties: the shorter path), that block.
* ``random`` a uniformly random allowed action (seeded).

Each returns the reject action when nothing fits. `evaluate` runs a policy for several
episodes (one seed each) and gives each episode's blocking; `summary` the mean with its
95 % Student-t interval over episodes.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from testbed.analysis.stats import mean_ci95
from testbed.errors import InputError
from testbed.gym.rmsa import RMSAEnv, first_fit_action

Policy = Callable[[np.ndarray, dict[str, Any], Any], int]  # (mask, obs, env) -> action


def _paths_with_blocks(mask: np.ndarray, env: Any) -> np.ndarray:
    """Per candidate path: True when it has a fitting block (its block 0 is allowed)."""
    k, j = env.k, env.j
    return mask[:k * j].reshape(k, j)[:, 0] != 0


def ksp_ff(mask: np.ndarray, obs: dict[str, Any], env: Any) -> int:
    """k-shortest-path first fit (module docstring)."""
    return first_fit_action(mask)


def sap_ff(mask: np.ndarray, obs: dict[str, Any], env: Any) -> int:
    """First fit over the candidate paths sorted by length (module docstring)."""
    has = _paths_with_blocks(mask, env)
    lengths = env.candidate_lengths_km()
    for p in sorted(range(env.k), key=lambda i: (lengths[i], i)):
        if has[p]:
            return p * env.j
    return env.reject_action


def llp_ff(mask: np.ndarray, obs: dict[str, Any], env: Any) -> int:
    """Least-loaded path first fit (module docstring)."""
    has = _paths_with_blocks(mask, env)
    if not has.any():
        return env.reject_action
    free = env.n_slots - obs["spectrum"].sum(axis=1, dtype=np.int64)
    return int(np.argmax(np.where(has, free, -1))) * env.j


def most_used(mask: np.ndarray, obs: dict[str, Any], env: Any) -> int:
    """Most used (module docstring)."""
    allowed = np.flatnonzero(mask[:env.reject_action])
    if not len(allowed):
        return env.reject_action
    used = env.occupied().sum(axis=0, dtype=np.int64)
    cum = np.concatenate([[0], np.cumsum(used)])
    p, b = np.divmod(allowed, env.j)
    start = obs["block_start"][p, b].astype(np.int64)
    score = cum[start + obs["slots_needed"][p]] - cum[start]
    return int(allowed[int(np.argmax(score))])


def ff_ksp(mask: np.ndarray, obs: dict[str, Any], env: Any) -> int:
    """Lowest spectrum (module docstring)."""
    has = _paths_with_blocks(mask, env)
    if not has.any():
        return env.reject_action
    start = np.where(has, obs["block_start"][:, 0], np.iinfo(np.int32).max)
    return int(np.argmin(start)) * env.j


def random_valid(seed: int) -> Policy:
    """A uniformly random allowed action, from its own generator."""
    rng = np.random.default_rng(seed)

    def policy(mask: np.ndarray, obs: dict[str, Any], env: Any) -> int:
        return int(rng.choice(np.flatnonzero(mask)))

    return policy


# name -> (description, policy factory (seed -> policy))
BASELINES: dict[str, tuple[str, Callable[[int], Policy]]] = {
    "ksp-ff": ("kSP-FF: first path with a fit, first fit", lambda s: ksp_ff),
    "sap-ff": ("first fit over the k paths sorted by length", lambda s: sap_ff),
    "llp-ff": ("least-loaded path, first fit", lambda s: llp_ff),
    "mu": ("most used: the block most held across the network", lambda s: most_used),
    "ff-ksp": ("lowest spectrum: the lowest first-fit slot over k paths", lambda s: ff_ksp),
    "random": ("a random allowed action", random_valid),
}


@dataclass
class Result:
    """One baseline over the episodes: blocking per episode and the summary."""

    name: str
    description: str
    blocking: list[float] = field(default_factory=list)
    bitrate_blocking: list[float] = field(default_factory=list)
    steps: int = 0
    wall_s: float = 0.0

    def summary(self) -> dict[str, Any]:
        mean, half = mean_ci95(self.blocking)
        br_mean, br_half = mean_ci95(self.bitrate_blocking)
        return {"policy": self.name, "description": self.description,
                "episodes": len(self.blocking), "blocking": mean,
                "ci95_half": None if math.isnan(half) else half,
                "ci95": None if math.isnan(half) else [mean - half, mean + half],
                "min": min(self.blocking), "max": max(self.blocking),
                "bitrate_blocking": br_mean,
                "bitrate_ci95_half": None if math.isnan(br_half) else br_half,
                "per_episode": self.blocking, "steps": self.steps,
                "steps_per_s": self.steps / self.wall_s if self.wall_s > 0 else None}


def evaluate(name: str, env: RMSAEnv, episodes: int, seed: int) -> Result:
    """Baseline `name` on `episodes` episodes of env, reset(seed=seed + e) each."""
    if name not in BASELINES:
        raise InputError("--policies", f"unknown baseline {name!r} (known: "
                         f"{', '.join(BASELINES)})")
    description, make = BASELINES[name]
    policy = make(seed)
    res = Result(name, description)
    t0 = time.perf_counter()
    for e in range(episodes):
        obs, info = env.reset(seed=seed + e)
        done = False
        while not done:
            obs, _, term, trunc, info = env.step(policy(info["action_mask"], obs, env))
            done = term or trunc
        res.blocking.append(env.blocking_ratio)
        req = env.bitrate_requested_gbps
        res.bitrate_blocking.append(env.bitrate_blocked_gbps / req if req else 0.0)
        res.steps += env.requests
    res.wall_s = time.perf_counter() - t0
    return res
