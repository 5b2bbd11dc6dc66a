"""LightPipe/RMSA-v0 as a Gymnasium VectorEnv: num_envs envs stepped in one compiled call.

`gymnasium.make_vec("LightPipe/RMSA-v0", num_envs=N, vectorization_mode=
"vector_entry_point")` makes it (and so does make_vec's default mode, since the id has a
vector entry point). Each sub-env is RMSA-v0 (testbed.gym.rmsa.RMSAEnv) with the same
keyword arguments; `step` runs them all through `kernel.step_vec`, which releases the
GIL: with PARALLEL_MIN_ENVS envs or more, each of `num_threads` threads (default: the
cores this process may use) runs a slice of them (threads that wait sleep, where
OpenMP's spin: on a shared machine that costs the others' time). Network events drop
into Python per env. Autoreset follows
Gymnasium 1.x's NEXT_STEP mode: the step after an env's episode ends resets it (its
action is ignored, reward 0, terminated and truncated False) and returns its first
observation. Seeds: reset(seed=s) seeds env i with s + i, a list gives one per env, None
gives each env RMSA-v0's unseeded rule. Observations, rewards, terminations,
truncations and infos equal those of SyncVectorEnv over N RMSA-v0 envs
(tests/test_gym_vec.py).
"""

from __future__ import annotations

import os
import random
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.utils import seeding
from gymnasium.vector.utils import batch_space
from gymnasium.vector.vector_env import AutoresetMode

from testbed.errors import InputError
from testbed.gym import kernel
from testbed.gym.base import EPISODE_SEED_BOUND
from testbed.gym.events import apply_event
from testbed.gym.layout import (
    F_T,
    I_ACC,
    I_ARG,
    I_DST,
    I_EVI,
    I_FIRST,
    I_NBLK,
    I_NREQ,
    I_PATH,
    I_RID,
    I_ROUTE,
    I_SRC,
    I_TRUNC,
    I_VER,
    ST_EVENT,
    ST_FULL,
    ST_KSP,
    grown,
    new_arenas,
)
from testbed.gym.mt19937 import MAX_KEY_WORDS, seed_key
from testbed.gym.rmsa_setup import DEFAULT_BLOCKS, RMSASetup
from testbed.gym.scenario import ScenarioLike, check_count, workload_seed

STEP, RESET, KEEP = 0, 1, 2  # what step_vec does with an env
MAX_ENVS = 1 << 20
PARALLEL_MIN_ENVS = 256  # fewer envs run on one thread (waking threads costs more)
MAX_THREADS = 256


class RMSAVectorEnv(gym.vector.VectorEnv[dict[str, Any], np.ndarray, np.ndarray]):
    """num_envs RMSA-v0 envs in arrays, stepped together (module docstring)."""

    metadata: dict[str, Any] = {  # noqa: RUF012 (gymnasium's API)
        "render_modes": [], "autoreset_mode": AutoresetMode.NEXT_STEP}

    def __init__(self, num_envs: int = 1, scenario: ScenarioLike | None = None, *,
                 blocks: int = DEFAULT_BLOCKS, k_paths: int | None = None,
                 episode_requests: int | None = None, allow_reject: bool = False,
                 num_threads: int | None = None, render_mode: str | None = None) -> None:
        if render_mode is not None:
            raise InputError("render_mode", f"RMSA-v0 renders nothing, got {render_mode!r}")
        check_count("num_envs", num_envs, 1, MAX_ENVS)
        if num_threads is not None:
            check_count("num_threads", num_threads, 1, MAX_THREADS)
        self.num_threads = num_threads or max(1, len(os.sched_getaffinity(0)))
        self._pool: ThreadPoolExecutor | None = None
        su = RMSASetup(scenario, blocks=blocks, k_paths=k_paths,
                       episode_requests=episode_requests, allow_reject=allow_reject)
        self.setup = su
        self.scenario = su.scenario
        self.num_envs = num_envs
        self.render_mode = None
        self.single_observation_space = su.observation_space
        self.single_action_space = su.action_space
        self.observation_space = batch_space(su.observation_space, num_envs)
        self.action_space = batch_space(su.action_space, num_envs)
        self.reject_action = su.reject_action
        self._ar = new_arenas(su.static(), num_envs) if su.workload.trace is None else None
        self._rngs: list[np.random.Generator | None] = [None] * num_envs
        self._seeds: list[int | None] = [None] * num_envs  # episode seeds
        self._restore: list[random.Random | None] = [None] * num_envs
        self._autoreset = np.zeros(num_envs, np.bool_)
        self._status = np.zeros(num_envs, np.int64)
        self._keys = np.zeros((num_envs, MAX_KEY_WORDS), np.int64)
        self._klens = np.ones(num_envs, np.int64)
        self._started = False
        self._names_version = -1
        self._names_arr = np.array([""], dtype=object)
        n_slots = su.n_slots
        self._pad = (n_slots + 7) // 8 * 8 != n_slots

    # ---- episodes --------------------------------------------------------------------
    def _episode_seed(self, i: int, seed: int | None) -> int:
        """RMSA-v0's rule (LightPipeEnv.start_episode) for env i."""
        if seed is None and self._seeds[i] is None:
            seed = workload_seed(self.scenario)
        if seed is not None:
            self._rngs[i], _ = seeding.np_random(seed)
        if seed is None:
            rng = self._rngs[i]
            assert rng is not None
            seed = int(rng.integers(EPISODE_SEED_BOUND))
        self._seeds[i] = seed
        self._restore[i] = None
        if self.setup.workload.trace is None:
            key = seed_key(seed)
            self._keys[i, :len(key)] = key
            self._klens[i] = len(key)
        return seed

    def reset(self, *, seed: int | list[int | None] | None = None,
              options: dict[str, Any] | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
        """Reset every env (or those of options["reset_mask"]); seeds as SyncVectorEnv."""
        n = self.num_envs
        if seed is None:
            seeds: list[int | None] = [None] * n
        elif isinstance(seed, int):
            seeds = [seed + i for i in range(n)]
        else:
            seeds = list(seed)
        if len(seeds) != n:
            raise InputError("seed", f"{len(seeds)} seeds for {n} envs")
        which = np.ones(n, np.bool_)
        if options is not None and "reset_mask" in options:
            which = np.asarray(options["reset_mask"], np.bool_)
            if which.shape != (n,) or not which.any():
                raise InputError("options.reset_mask", f"a bool array of {n} with a True")
        if self._ar is None:
            self._ar = new_arenas(self.setup.static(), n)
        if self.setup.total() < 1:
            raise InputError("workload", "the workload has no requests")
        for i in np.flatnonzero(which):
            self._episode_seed(int(i), seeds[i])
        mode = np.where(which, RESET, KEEP).astype(np.int8)
        self._run(np.zeros(n, np.int64), mode)
        self._autoreset[which] = False
        self._started = True
        ar = self._ar
        info = self._infos(None if which.all() else which)
        return self._obs(ar), info

    def step(self, actions: Any) -> tuple[dict[str, Any], np.ndarray, np.ndarray, np.ndarray,
                                         dict[str, Any]]:
        if not self._started:
            raise RuntimeError("call reset() before step()")
        a = np.asarray(actions)
        if a.shape != (self.num_envs,):
            raise ValueError(f"actions: expected shape ({self.num_envs},), got {a.shape}")
        a = a.astype(np.int64, copy=False)
        if a.size and (a.min() < 0 or a.max() > self.reject_action):
            raise ValueError(f"actions outside 0..{self.reject_action}")
        resets = self._autoreset
        every = not resets.any()  # (the usual case: no env resets at this step)
        if not every:
            for i in np.flatnonzero(resets):
                self._episode_seed(int(i), None)
        self._run(a, resets.view(np.int8))  # modes: 0 take the action, 1 reset
        ar = self._ar
        assert ar is not None
        stepped = ~resets
        acc = ar.ist[:, I_ACC] != 0
        rewards = np.where(acc, 1.0, -1.0)
        if not every:
            rewards[resets] = 0.0
        terminations = np.zeros(self.num_envs, np.bool_)
        truncations = stepped & (ar.ist[:, I_TRUNC] != 0)
        infos = self._infos(None)
        if stepped.any():
            infos["accepted"] = acc if every else acc & stepped
            infos["_accepted"] = stepped.copy()
            path, first = ar.ist[:, I_PATH], ar.ist[:, I_FIRST]
            infos["path_index"] = path.copy() if every else np.where(stepped, path, 0)
            infos["_path_index"] = stepped.copy()
            infos["first_slot"] = first.copy() if every else np.where(stepped, first, 0)
            infos["_first_slot"] = stepped.copy()
            route = self._names()[np.where(acc, ar.ist[:, I_ROUTE], -1)]
            if not every:
                route[resets] = None
            infos["route"] = route
            infos["_route"] = stepped.copy()
        self._autoreset = truncations | terminations
        return self._obs(ar), rewards, terminations, truncations, infos

    # ---- the kernel and what it leaves to Python ----------------------------------
    def _run(self, actions: np.ndarray, mode: np.ndarray) -> None:
        ar = self._ar
        assert ar is not None
        st, book = self.setup.static(), self.setup.book
        per_env = (ar.ist, ar.fst, ar.sb, ar.flags)
        outs = (ar.spectrum64, ar.slots_needed, ar.block_start, ar.block_free, ar.bitrate,
                ar.holding, ar.mask)
        static = (st.sta_i, st.sta_f, book.rt, book.rg, book.ksp)
        last = (actions, mode, self._keys, self._klens, self._status)
        n, threads = self.num_envs, min(self.num_threads, self.num_envs)
        if n < PARALLEL_MIN_ENVS or threads == 1:
            kernel.step_vec(*per_env, *static, *outs, *last)
        else:  # slices of envs on threads (the kernel releases the GIL)
            if self._pool is None:
                self._pool = ThreadPoolExecutor(threads - 1, "lightpipe-rmsa")
            cut = [n * i // threads for i in range(threads + 1)]

            def part(a: int, b: int) -> None:
                kernel.step_vec(*(x[a:b] for x in per_env), *static,
                                *(x[a:b] for x in outs), *(x[a:b] for x in last))

            futures = [self._pool.submit(part, cut[i], cut[i + 1])
                       for i in range(1, threads)]
            part(cut[0], cut[1])
            for f in futures:
                f.result()
        full = False
        for i in np.flatnonzero(self._status):  # (ST_OK for envs left as they were)
            s = int(self._status[i])
            while s == ST_EVENT or s == ST_KSP:
                if s == ST_EVENT:
                    self._event(int(i))
                else:
                    book.fill(self.setup.version_fs[int(ar.ist[i, I_VER])],
                              int(ar.ist[i, I_ARG]))
                s = kernel.advance1(ar.ist, ar.fst, ar.sb, ar.flags, int(i), st.sta_i,
                                    st.sta_f, book.rt, book.rg, book.ksp, ar.spectrum64,
                                    ar.slots_needed, ar.block_start, ar.block_free,
                                    ar.bitrate, ar.holding, ar.mask)[0]
            full = full or s == ST_FULL
        if full:
            ar.ist, ar.fst = grown(ar.ist, ar.fst, self.setup.k)

    def _event(self, i: int) -> None:
        ar, su = self._ar, self.setup
        assert ar is not None

        def rng() -> random.Random:
            got = self._restore[i]
            if got is None:
                seed = self._seeds[i]
                assert seed is not None
                got = self._restore[i] = su.restore_rng(seed)
            return got

        apply_event(su.events[int(ar.ist[i, I_EVI])], ar.ist[i], ar.fst[i], ar.sb[i],
                    ar.flags[i], su.static(), su.book, per_direction=su.net.per_direction,
                    guard=su.net.guard_slots, policy=su.policy, rng=rng)

    def _obs(self, ar: Any) -> dict[str, Any]:
        spec = ar.spectrum[:, :, :self.setup.n_slots] if self._pad else ar.spectrum
        return {
            "bitrate_gbps": ar.bitrate.copy(),
            "block_free": ar.block_free.copy(),
            "block_start": ar.block_start.copy(),
            "destination": ar.ist[:, I_DST].copy(),
            "holding_s": ar.holding.copy(),
            "slots_needed": ar.slots_needed.copy(),
            "source": ar.ist[:, I_SRC].copy(),
            "spectrum": np.ascontiguousarray(spec) if self._pad else spec.copy(),
        }

    def _names(self) -> np.ndarray:
        """Route names by id as an object array, "" last (index -1: not set up)."""
        book = self.setup.book
        if self._names_version != book.version:
            self._names_arr = np.array([*book.names, ""], dtype=object)
            self._names_version = book.version
        return self._names_arr

    def _infos(self, which: np.ndarray | None) -> dict[str, Any]:
        """The per-request infos (RMSA-v0's info keys) of the envs in `which` (None:
        every env)."""
        ar = self._ar
        assert ar is not None
        if which is None:
            every = np.ones(self.num_envs, np.bool_)
            return {
                "action_mask": ar.mask.copy(), "_action_mask": every,
                "request_id": ar.ist[:, I_RID].copy(), "_request_id": every.copy(),
                "time_s": ar.fst[:, F_T].copy(), "_time_s": every.copy(),
                "requests": ar.ist[:, I_NREQ].copy(), "_requests": every.copy(),
                "blocked": ar.ist[:, I_NBLK].copy(), "_blocked": every.copy(),
            }
        w = which.copy()
        zero_i = np.zeros(self.num_envs, np.int64)
        return {
            "action_mask": np.where(w[:, None], ar.mask, 0).astype(np.int8), "_action_mask": w,
            "request_id": np.where(w, ar.ist[:, I_RID], zero_i), "_request_id": w.copy(),
            "time_s": np.where(w, ar.fst[:, F_T], 0.0), "_time_s": w.copy(),
            "requests": np.where(w, ar.ist[:, I_NREQ], zero_i), "_requests": w.copy(),
            "blocked": np.where(w, ar.ist[:, I_NBLK], zero_i), "_blocked": w.copy(),
        }

    def close_extras(self, **kwargs: Any) -> None:
        """Stop the threads (also for an env whose construction failed)."""
        pool = getattr(self, "_pool", None)
        if pool is not None:
            pool.shutdown(wait=True)
            self._pool = None

    # ---- counters --------------------------------------------------------------------
    @property
    def requests(self) -> np.ndarray:
        """Requests decided in each env's episode so far."""
        assert self._ar is not None
        return self._ar.ist[:, I_NREQ].copy()

    @property
    def blocked(self) -> np.ndarray:
        assert self._ar is not None
        return self._ar.ist[:, I_NBLK].copy()

    def action_masks(self) -> np.ndarray:
        """The current masks, [num_envs, actions] (a copy)."""
        assert self._ar is not None
        return self._ar.mask.copy()
