"""The compiled RMSA-v0 (testbed.gym.rmsa.RMSAEnv) equals its reference implementation
(testbed.gym.rmsa_reference.ReferenceRMSAEnv): on the same scenario, seeds and actions
(allowed, forbidden and rejects; several episodes, seeded and unseeded resets) every
observation, reward, termination, truncation, info and mask is the same, step by step,
on bundled scenarios with and without network events and on hard cases (guard slots,
per-direction spectra, cuts, slot losses, random-fit restoration, traces, fixed grid,
multi-word spectra, a departure heap that grows). Digests of whole runs are recorded,
and the pure-Python fallback of the kernels gives the same digests."""

from __future__ import annotations

import hashlib
import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("gymnasium")

from testbed.gym.mt19937 import new_state, random53
from testbed.gym.rmsa import RMSAEnv
from testbed.gym.rmsa_reference import ReferenceRMSAEnv
from testbed.sim.requests import poisson_requests
from testbed.spec import parse_scenario
from testbed.spec.models import LightpathRequestsWorkload

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = ROOT / "scenarios"


def _bytes(x: Any) -> bytes:
    if isinstance(x, np.ndarray):
        return f"{x.dtype}{x.shape}".encode() + x.tobytes()
    return f"{type(x).__name__}:{x!r}".encode()


def step_digest(obs: dict[str, Any], reward: float, term: bool, trunc: bool,
                info: dict[str, Any]) -> str:
    """A hash of everything one step hands the agent (types, dtypes and shapes too)."""
    h = hashlib.blake2b(digest_size=16)
    for key in sorted(obs):
        h.update(key.encode() + _bytes(obs[key]))
    for x in (reward, term, trunc):
        h.update(_bytes(x))
    for key, value in info.items():
        h.update(key.encode() + _bytes(value))
    return h.hexdigest()


def run(env: Any, steps: int, seed: int = 0) -> list[str]:
    """Digests of `steps` steps (and of each reset) with a seeded mix of actions: mostly
    allowed ones, some forbidden ones and rejects; a new episode (seeded or not) after
    each truncation. The counters are checked against the infos on the way."""
    rng = random.Random(seed)
    obs, info = env.reset(seed=seed)
    out = [step_digest(obs, 0.0, False, False, info)]
    for _ in range(steps):
        mask = info["action_mask"]
        if rng.random() < 0.8:
            a = rng.choice([int(i) for i in np.flatnonzero(mask)])
        else:
            a = rng.randrange(len(mask))
        obs, r, term, trunc, info = env.step(a)
        out.append(step_digest(obs, r, term, trunc, info))
        u = env.unwrapped
        assert (u.requests, u.blocked) == (info["requests"], info["blocked"])
        if trunc:
            obs, info = env.reset(seed=None if rng.random() < 0.5 else rng.randrange(1000))
            out.append(step_digest(obs, 0.0, False, False, info))
    u = env.unwrapped
    out.append(json.dumps([u.requests, u.blocked, u.lost, u.restored,
                           u.bitrate_requested_gbps, u.bitrate_blocked_gbps]))
    return out


def whole(digests: list[str]) -> str:
    return hashlib.blake2b("".join(digests).encode(), digest_size=12).hexdigest()


def hard_spec(**over: Any) -> dict[str, Any]:
    """NSFNET, 40 slots, a guard slot, heavy load, cuts, repairs and slot losses."""
    spec: dict[str, Any] = {
        "name": "gym-hard", "topology": {"library": "nsfnet"},
        "optical": {"slots": 40, "k_paths": 3, "guard_slots": 1},
        "workload": {"kind": "lightpath_requests", "load_erlang": 60, "requests": 700,
                     "bitrate_gbps": [10, 100, 200], "seed": 4},
        "events": [
            {"at_s": 2, "kind": "fiber_cut", "link": ["9", "10"]},
            {"at_s": 3, "kind": "wavelength_loss", "link": ["1", "2"], "first_slot": 0,
             "slots": 10},
            {"at_s": 6, "kind": "fiber_repair", "link": ["9", "10"]},
            {"at_s": 7, "kind": "fiber_cut", "link": ["4", "5"]},
            {"at_s": 8, "kind": "wavelength_loss", "link": ["4", "5"], "first_slot": 16,
             "slots": 8},
            {"at_s": 9, "kind": "wavelength_repair", "link": ["1", "2"], "first_slot": 0,
             "slots": 10},
            {"at_s": 11, "kind": "fiber_repair", "link": ["4", "5"]},
            {"at_s": 11.5, "kind": "wavelength_repair", "link": ["4", "5"],
             "first_slot": 16, "slots": 8},
            {"at_s": 12, "kind": "link_flap", "link": ["2", "3"], "period_s": 0.5,
             "count": 2}],
    }
    spec.update(over)
    return spec


def trace_spec(tmp: Path) -> dict[str, Any]:
    trace = tmp / "requests.csv"
    rows = "".join(f"{i * 0.05:.2f},{2 + i % 7},{1 + i % 14},{1 + (i * 5 + 3) % 14},"
                   f"{(100, 40, 400)[i % 3]},{1000 + i}\n" for i in range(900)
                   if 1 + i % 14 != 1 + (i * 5 + 3) % 14)
    trace.write_text("arrival_s,holding_s,src,dst,bitrate_gbps,id\n" + rows)
    spec = hard_spec()
    spec["workload"] = {"kind": "lightpath_requests", "trace": str(trace)}
    return spec


# name -> (scenario, keyword arguments, steps)
CASES: dict[str, tuple[Any, dict[str, Any], int]] = {
    "quickstart": (str(SCENARIOS / "quickstart.yaml"), {"episode_requests": 1500}, 4000),
    "fault-wavelength": (str(SCENARIOS / "fault-wavelength.yaml"),
                         {"episode_requests": 400}, 3000),
    "fault-link-flap": (str(SCENARIOS / "fault-link-flap.yaml"),
                        {"episode_requests": 400}, 3000),
    "cba-nsfnet": (str(SCENARIOS / "cba-nsfnet.yaml"), {"episode_requests": 1200}, 3000),
    "hard": (hard_spec(), {}, 2500),
    "hard-per-direction-random-fit": (hard_spec(
        optical={"slots": 40, "k_paths": 3, "guard_slots": 1,
                 "spectrum_sharing": "per_direction"},
        policy={"spectrum": "random_fit"}), {"blocks": 3}, 2500),
    "hard-best-fit-reject": (hard_spec(policy={"spectrum": "best_fit"}),
                             {"allow_reject": True, "k_paths": 2, "blocks": 2}, 2000),
    "fixed-grid": (hard_spec(optical={"grid": "fixed", "wavelengths": 24,
                                      "gbps_per_wavelength": 100, "k_paths": 4}),
                   {"blocks": 4}, 2000),
    # 130 slots: three words, a block of more than 64 slots; heavy load: the heap grows
    "wide-grown": (hard_spec(
        optical={"slots": 130, "k_paths": 3, "guard_slots": 2},
        workload={"kind": "lightpath_requests", "load_erlang": 400, "requests": 1500,
                  "mean_holding_s": 1.0, "bitrate_gbps": [10, 40, 1000], "seed": 9}),
        {"blocks": 6}, 3500),
}

# whole-run digests of the reference env (run(env, steps), seed 0), recorded
RECORDED = {
    "quickstart": "0e1198bc9bc36d271369baf7",
    "fault-wavelength": "eecee6a249873f0edf018b64",
    "fault-link-flap": "41fe77f4168f919513a7518d",
    "cba-nsfnet": "d04ec47e0eea9f56267fec02",
}


def case_envs(name: str, tmp: Path) -> tuple[Any, Any, int]:
    if name == "trace":
        spec = trace_spec(tmp)
        return ReferenceRMSAEnv(spec), RMSAEnv(spec), 2500
    scenario, kwargs, steps = CASES[name]
    return ReferenceRMSAEnv(scenario, **kwargs), RMSAEnv(scenario, **kwargs), steps


@pytest.mark.parametrize("name", [*CASES, "trace"])
def test_compiled_env_equals_the_reference(name: str, tmp_path: Path) -> None:
    ref, fast, steps = case_envs(name, tmp_path)
    want, got = run(ref, steps), run(fast, steps)
    first = next((i for i, (a, b) in enumerate(zip(want, got, strict=False)) if a != b), None)
    assert first is None and len(want) == len(got), f"{name}: first difference at {first}"
    if RECORDED.get(name):
        assert whole(want) == RECORDED[name], (name, whole(want))


def test_cases_exercise_events_restoration_and_growth(tmp_path: Path) -> None:
    """The hard cases hit what they are there for: lightpaths lost and restored, a heap
    grown past its first capacity, blocks of more than 64 slots."""
    env = RMSAEnv(CASES["hard"][0])
    _, info = env.reset(seed=0)
    lost = restored = 0
    done = False
    while not done:
        _, _, _, done, info = env.step(int(np.flatnonzero(info["action_mask"])[0]))
        lost, restored = env.lost, env.restored
    assert lost > 0 and restored > 0
    scenario, kwargs, _ = CASES["wide-grown"]
    env = RMSAEnv(scenario, **kwargs)
    obs, info = env.reset(seed=0)
    wide = False
    for _ in range(1500):
        wide = wide or int(obs["slots_needed"].max()) > 64
        obs, _, _, done, info = env.step(int(np.flatnonzero(info["action_mask"])[0]))
        if done:
            break
    assert wide
    assert env._pk is not None and int(env._pk.ist[0]) > 64  # I_CAP grew


def test_arrays_handed_out_are_never_changed_later() -> None:
    env = RMSAEnv(str(SCENARIOS / "quickstart.yaml"), episode_requests=50)
    obs, info = env.reset(seed=1)
    kept = {k: np.copy(v) for k, v in obs.items()}
    mask = info["action_mask"].copy()
    masks = env.action_masks()
    for _ in range(20):
        env.step(int(np.flatnonzero(info["action_mask"])[0]))
    assert all(np.array_equal(kept[k], obs[k]) for k in obs)
    assert np.array_equal(mask, info["action_mask"]) and np.array_equal(masks, mask)


@pytest.mark.parametrize("seed", [0, 1, 7, 2**31 - 2, 2**40 + 5, 12345678901234567890])
def test_mt19937_is_pythons_random(seed: int) -> None:
    mt = new_state(seed)
    r = random.Random(seed)
    assert [random53(mt, 0, 0) for _ in range(1500)] == [r.random() for _ in range(1500)]


def test_request_stream_is_poisson_requests() -> None:
    """The kernel's draws give poisson_requests' stream (ids, times, pairs, bit rates)."""
    spec = hard_spec(events=[])
    env = RMSAEnv(spec, episode_requests=300)
    wl = parse_scenario(spec).workload
    assert isinstance(wl, LightpathRequestsWorkload)
    want = list(poisson_requests(wl.model_copy(update={"requests": 300}), list(env.nodes),
                                 random.Random(77)))
    _, info = env.reset(seed=77)
    got = []
    for _ in range(300):
        got.append((info["request_id"], info["time_s"]))
        _, _, _, _, info = env.step(env.reject_action)
    assert got == [(r[0], r[1]) for r in want]


FALLBACK = """
import json, sys
from tests.test_gym_fast import CASES, run, whole
from testbed.gym.jit import COMPILED
from testbed.gym.rmsa import RMSAEnv
assert not COMPILED
out = {}
for name in sys.argv[1:]:
    scenario, kwargs, _ = CASES[name]
    out[name] = whole(run(RMSAEnv(scenario, **kwargs), 250))
print(json.dumps(out))
"""


def test_pure_python_fallback_gives_the_same_digests() -> None:
    """LIGHTPIPE_GYM_KERNEL=0 (as without numba): the same kernels as plain Python."""
    names = ["hard", "fault-wavelength", "wide-grown"]
    env = dict(os.environ, LIGHTPIPE_GYM_KERNEL="0")
    res = subprocess.run([sys.executable, "-c", FALLBACK, *names], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    got = json.loads(res.stdout.strip().splitlines()[-1])
    for name in names:
        scenario, kwargs, _ = CASES[name]
        assert got[name] == whole(run(ReferenceRMSAEnv(scenario, **kwargs), 250)), name
