"""The base of LightPipe's Gymnasium environments: episode seeds, the mask, blocking ratio."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from testbed.errors import InputError
from testbed.gym.scenario import workload_seed
from testbed.spec.models import Scenario

EPISODE_SEED_BOUND = 2**31 - 1  # an unseeded reset draws the episode seed below this


class LightPipeEnv(gym.Env[dict[str, Any], np.int64]):
    """What RMSA-v0 and Placement-v0 share: the episode seed rule, `action_masks()` (the
    name sb3-contrib's MaskablePPO calls) and the blocking ratio of the episode so far.

    Subclasses set `scenario`, `_mask` (the current mask, np.int8), `blocked`,
    `reject_action` (the highest action) and `_ended` (no episode to step), and say in
    `decided()` how many requests (jobs) the episode has decided.
    """

    metadata: dict[str, Any] = {"render_modes": []}  # noqa: RUF012 (gymnasium's API)
    scenario: Scenario
    blocked: int
    reject_action: int
    _ended: bool
    _mask: np.ndarray
    _episode_seed: int | None = None

    @staticmethod
    def check_render_mode(env_name: str, render_mode: str | None) -> None:
        if render_mode is not None:
            raise InputError("render_mode", f"{env_name} renders nothing, got {render_mode!r}")

    def start_episode(self, seed: int | None) -> int:
        """Seed the env as gym.Env.reset does and return the episode seed: `seed` when
        given; the scenario's workload seed on the first reset without one (that
        episode is the one `lightpipe sim` runs); later resets without a seed draw it
        from the env's seeded generator."""
        if seed is None and self._episode_seed is None:
            seed = workload_seed(self.scenario)
        super().reset(seed=seed)
        ep = seed if seed is not None else int(self.np_random.integers(EPISODE_SEED_BOUND))
        self._episode_seed = ep
        return ep

    def step_action(self, action: Any) -> int:
        """What step() is given, as an action number: refused (RuntimeError) when the
        episode has ended, and (ValueError) outside 0..reject_action."""
        if self._ended:
            raise RuntimeError("the episode has ended: call reset()")
        a = int(action)
        if not 0 <= a <= self.reject_action:
            raise ValueError(f"action {a} outside 0..{self.reject_action}")
        return a

    def action_masks(self) -> np.ndarray:
        """The current action mask (a copy of `info["action_mask"]`)."""
        return self._mask.copy()

    def decided(self) -> int:
        """Requests (jobs) decided in the episode so far."""
        raise NotImplementedError

    @property
    def episode_seed(self) -> int | None:
        return self._episode_seed

    @property
    def blocking_ratio(self) -> float:
        n = self.decided()
        return self.blocked / n if n else 0.0
