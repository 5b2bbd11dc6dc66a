"""RMSA-v0's baseline policies (testbed.gym.baselines) pick allowed actions, follow their
definitions (checked against plain recomputations from the reference env's network),
act alike on the compiled and the reference env, and `lightpipe gym baselines` reports
each one's blocking with its 95 % t-interval (JSON and table, --out atomically, exit 2
and one line on bad input)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("gymnasium")

from scipy import stats

from testbed.cli.main import main
from testbed.gym.baselines import BASELINES, evaluate, ff_ksp, ksp_ff, llp_ff, most_used, sap_ff
from testbed.gym.rmsa import RMSAEnv
from testbed.gym.rmsa_reference import ReferenceRMSAEnv
from tests.test_gym_fast import hard_spec

ROOT = Path(__file__).resolve().parents[1]
SPEC = hard_spec(workload={"kind": "lightpath_requests", "load_erlang": 60,
                           "requests": 600, "bitrate_gbps": [10, 100, 200], "seed": 4})


def episode(env: Any, name: str, seed: int = 3) -> list[int]:
    policy = BASELINES[name][1](seed)
    obs, info = env.reset(seed=seed)
    actions = []
    done = False
    while not done:
        mask = info["action_mask"]
        a = policy(mask, obs, env)
        assert mask[a] == 1, (name, a)  # allowed (the reject only when nothing fits)
        actions.append(a)
        obs, _, _, done, info = env.step(a)
    return actions


@pytest.mark.parametrize("name", list(BASELINES))
def test_baseline_acts_alike_on_both_envs_and_only_allowed(name: str) -> None:
    a = episode(RMSAEnv(SPEC), name)
    b = episode(ReferenceRMSAEnv(SPEC), name)
    assert a == b and len(a) == 600


def test_sap_ff_is_ksp_ff_since_candidates_come_sorted_by_length() -> None:
    assert episode(RMSAEnv(SPEC), "sap-ff") == episode(RMSAEnv(SPEC), "ksp-ff")


def held_on_fibres(env: ReferenceRMSAEnv) -> np.ndarray:
    """Per slot: on how many fibre spectra a lightpath holds it (from the network)."""
    used = np.zeros(env.n_slots, np.int64)
    for f in env.net.topology.fibres:
        for u, v in ((f.u, f.v), (f.v, f.u)) if env.net.per_direction else ((f.u, f.v),):
            used += np.array(env.net.occupancy(u, v), np.int64)
    return used


def test_definitions_against_plain_recomputations() -> None:
    """On the reference env's network state: most used maximises the block's held-slot
    count, least-loaded the path's free slots, lowest spectrum the first fitting slot;
    ties to the lower action. Checked on every step of an episode of first fit."""
    env = ReferenceRMSAEnv(SPEC)
    obs, info = env.reset(seed=5)
    j = env.j
    checked = 0
    done = False
    while not done:
        mask = info["action_mask"]
        allowed = [a for a in range(env.reject_action) if mask[a]]
        if allowed:
            used = held_on_fibres(env)
            starts, needs = obs["block_start"], obs["slots_needed"]
            score = {a: int(used[starts[a // j, a % j]:
                                 starts[a // j, a % j] + needs[a // j]].sum()) for a in allowed}
            best = max(score.values())
            assert most_used(mask, obs, env) == min(a for a in allowed if score[a] == best)
            paths = sorted({a // j for a in allowed})
            free = {p: bin(env.net.free_mask(env._cands[p][0])).count("1") for p in paths}
            assert llp_ff(mask, obs, env) == max(paths, key=lambda p: (free[p], -p)) * j
            assert ff_ksp(mask, obs, env) == min(paths, key=lambda p: (starts[p, 0], p)) * j
            assert sap_ff(mask, obs, env) == ksp_ff(mask, obs, env) == paths[0] * j
            checked += 1
        else:
            for pol in (most_used, llp_ff, ff_ksp, sap_ff, ksp_ff):
                assert pol(mask, obs, env) == env.reject_action
        obs, _, _, done, info = env.step(ksp_ff(mask, obs, env))
    assert checked > 400


def test_evaluate_gives_the_t_interval_over_episodes() -> None:
    env = RMSAEnv(SPEC, episode_requests=200)
    res = evaluate("ksp-ff", env, 4, 10).summary()
    b = res["per_episode"]
    assert len(b) == 4 and res["steps"] == 800
    half = stats.t.ppf(0.975, 3) * np.std(b, ddof=1) / math.sqrt(4)
    assert res["blocking"] == pytest.approx(np.mean(b))
    assert res["ci95_half"] == pytest.approx(half)
    assert res["ci95"] == pytest.approx([np.mean(b) - half, np.mean(b) + half])


def test_cli_reports_every_baseline(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                    ) -> None:
    out = tmp_path / "b.json"
    spec = tmp_path / "s.yaml"
    spec.write_text((ROOT / "scenarios" / "quickstart.yaml").read_text())
    assert main(["gym", "baselines", "--scenario", str(spec), "--episodes", "3",
                 "--requests", "400", "--json", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    doc = json.loads(out.read_text())
    assert json.loads(printed) == doc
    assert [r["policy"] for r in doc["results"]] == list(BASELINES)
    assert doc["seeds"] == [1, 2, 3] and doc["requests"] == 400
    for r in doc["results"]:
        assert r["ci95"][0] <= r["blocking"] <= r["ci95"][1]
        assert len(r["per_episode"]) == 3
    assert main(["gym", "baselines", "--episodes", "2", "--requests", "200",
                 "--policies", "ksp-ff,mu"]) == 0
    text = capsys.readouterr().out
    assert "| policy | blocking | 95 % CI |" in text
    assert [line.split("|")[1].strip() for line in text.splitlines()
            if line.startswith("| ") and "policy" not in line] == ["ksp-ff", "mu"]


@pytest.mark.parametrize(("argv", "says"), [
    (["--episodes", "1"], "--episodes"),
    (["--requests", "0"], "--requests"),
    (["--policies", "nope"], "--policies"),
    (["--blocks", "0"], "--blocks"),
    (["--scenario", "/nonexistent/s.yaml"], "/nonexistent/s.yaml"),
    (["--bogus"], "--bogus"),
])
def test_cli_bad_input_is_exit_2_and_one_line(argv: list[str], says: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["gym", "baselines", *argv]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and says in err
