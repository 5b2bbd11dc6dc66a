"""The vector RMSA-v0 (testbed.gym.rmsa_vec.RMSAVectorEnv, make_vec's vector entry point)
equals Gymnasium's SyncVectorEnv over N RMSA-v0 envs: the same seeds give the same
observations, rewards, terminations, truncations and infos (with their `_key` masks),
through NEXT_STEP autoresets, partial resets, network events, traces and the parallel
(prange) path. Gymnasium 1.2 has no vector env checker, hence the comparison."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

gym = pytest.importorskip("gymnasium")

from gymnasium.vector import AutoresetMode, SyncVectorEnv  # noqa: E402
from gymnasium.vector.utils import batch_space  # noqa: E402

import testbed.gym  # noqa: E402, F401
from testbed.errors import InputError  # noqa: E402
from testbed.gym.rmsa_vec import PARALLEL_MIN_ENVS, RMSAVectorEnv  # noqa: E402
from tests.test_gym_fast import hard_spec, trace_spec  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = ROOT / "scenarios"
ID = "LightPipe/RMSA-v0"


def same(a: Any, b: Any, where: str = "") -> None:
    """Equal values, dtypes and shapes, recursively (dicts compared as dicts)."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), (where, sorted(a), sorted(b))
        for k in a:
            same(a[k], b[k], f"{where}/{k}")
        return
    assert isinstance(a, np.ndarray) and isinstance(b, np.ndarray), (where, type(a), type(b))
    assert (a.dtype, a.shape) == (b.dtype, b.shape), (where, a.dtype, b.dtype, a.shape, b.shape)
    if a.dtype == object:
        assert list(a) == list(b), where
    else:
        assert np.array_equal(a, b), where


def both(n: int, scenario: Any, **kwargs: Any) -> tuple[Any, Any]:
    v = gym.make_vec(ID, num_envs=n, vectorization_mode="vector_entry_point",
                     scenario=scenario, **kwargs)
    s = gym.make_vec(ID, num_envs=n, vectorization_mode="sync", scenario=scenario, **kwargs)
    assert isinstance(v.unwrapped, RMSAVectorEnv) and isinstance(s, SyncVectorEnv)
    return v, s


def drive(v: Any, s: Any, steps: int, seed: int = 0, resets_on_the_way: bool = True) -> int:
    """Step both with the same actions (mostly allowed, some forbidden); a full reset
    (unseeded), a reset by list and a partial reset on the way. Returns the number of
    episodes that ended (then autoreset)."""
    rng = np.random.default_rng(seed)
    n = v.num_envs
    for got in zip(v.reset(seed=seed), s.reset(seed=seed), strict=True):
        same(*got)
    info = v.reset(seed=seed)[1]
    s.reset(seed=seed)
    resets = 0
    for t in range(steps):
        masks = info["action_mask"]
        acts = np.array([int(rng.choice(np.flatnonzero(m))) if rng.random() < 0.85
                         else int(rng.integers(len(m))) for m in masks], np.int64)
        rv, rs = v.step(acts), s.step(acts)
        for name, a, b in zip(("obs", "reward", "terminated", "truncated", "info"), rv, rs,
                              strict=True):
            same(a, b, f"step {t} {name}")
        resets += int(rv[3].sum())
        info = rv[4]
        if t == steps // 3 and resets_on_the_way:
            for got in zip(v.reset(), s.reset(), strict=True):
                same(*got, "unseeded reset")
            seeds: list[int | None] = [int(x) for x in rng.integers(0, 100, n)]
            seeds[0] = None
            for got in zip(v.reset(seed=seeds), s.reset(seed=seeds), strict=True):
                same(*got, "reset by list")
            info = v.reset(seed=seeds)[1]
            s.reset(seed=seeds)
        if t == 2 * steps // 3 and n > 1 and resets_on_the_way:
            which = np.zeros(n, np.bool_)
            which[::2] = True
            ov, iv = v.reset(options={"reset_mask": which})
            os_, is_ = s.reset(options={"reset_mask": which.copy()})
            same(ov, os_, "partial reset obs")
            same(iv, is_, "partial reset info")
            info = {"action_mask": v.unwrapped.action_masks()}  # every env's, current
    return resets


def test_make_vec_gives_the_vector_env_with_next_step_autoreset() -> None:
    for mode in ("vector_entry_point", None):
        kwargs = {} if mode is None else {"vectorization_mode": mode}
        v = gym.make_vec(ID, num_envs=3, **kwargs)
        assert isinstance(v.unwrapped, RMSAVectorEnv), mode
    assert v.metadata["autoreset_mode"] == AutoresetMode.NEXT_STEP
    single = gym.make(ID)
    assert v.single_observation_space == single.observation_space
    assert v.single_action_space == single.action_space
    assert v.observation_space == batch_space(single.observation_space, 3)
    assert v.action_space == batch_space(single.action_space, 3)
    obs, info = v.reset(seed=1)
    assert obs in v.observation_space and info["action_mask"].shape == (3, single.action_space.n)


@pytest.mark.parametrize(("name", "n", "steps", "kwargs"), [
    ("quickstart", 5, 260, {"episode_requests": 60}),
    ("fault-link-flap", 4, 240, {"episode_requests": 90}),
    ("fault-wavelength", 3, 240, {"episode_requests": 80, "allow_reject": True}),
    ("hard", 4, 200, {"episode_requests": 120, "blocks": 3}),
])
def test_vector_env_equals_sync_vector_env(name: str, n: int, steps: int,
                                           kwargs: dict[str, Any]) -> None:
    scenario: Any = hard_spec() if name == "hard" else str(SCENARIOS / f"{name}.yaml")
    v, s = both(n, scenario, **kwargs)
    assert drive(v, s, steps) >= 2  # episodes ended, then autoreset


def test_vector_env_on_a_trace(tmp_path: Path) -> None:
    v, s = both(3, trace_spec(tmp_path), episode_requests=70)
    assert drive(v, s, 160) >= 1


def test_parallel_path_equals_sync_vector_env() -> None:
    n = PARALLEL_MIN_ENVS + 3
    v, s = both(n, str(SCENARIOS / "quickstart.yaml"), episode_requests=25)
    assert drive(v, s, 60, resets_on_the_way=False) >= 2 * n  # each env twice


def test_bad_actions_and_sizes() -> None:
    v = gym.make_vec(ID, num_envs=2, vectorization_mode="vector_entry_point")
    with pytest.raises(RuntimeError):
        v.step(np.zeros(2, np.int64))
    v.reset(seed=0)
    for bad in (np.array([0, 999]), np.array([-1, 0]), np.zeros(3, np.int64)):
        with pytest.raises(ValueError):
            v.step(bad)
    with pytest.raises(InputError) as exc:
        RMSAVectorEnv(num_envs=0)
    assert exc.value.path == "num_envs"
    with pytest.raises(InputError) as exc:
        RMSAVectorEnv(num_envs=2, blocks=0)
    assert exc.value.path == "blocks"
