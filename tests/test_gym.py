"""testbed.gym: RMSA-v0 and Placement-v0 pass Gymnasium's checker on bundled scenarios,
masks are exactly the feasible actions, seeds repeat episodes, and first fit (cba) through
the env makes exactly the decisions of `lightpipe sim` on the same scenario and seed."""

from __future__ import annotations

import copy
import csv
import gc
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

gym = pytest.importorskip("gymnasium")

from gymnasium.utils.env_checker import check_env  # noqa: E402

import testbed.gym  # noqa: E402
from testbed.errors import InputError  # noqa: E402
from testbed.gym.placement import PlacementEnv  # noqa: E402
from testbed.gym.rmsa import RMSAEnv, first_fit_action  # noqa: E402
from testbed.gym.rmsa_reference import ReferenceRMSAEnv  # noqa: E402
from testbed.jobs.sim import simulate  # noqa: E402
from testbed.sim import simulate_lightpaths  # noqa: E402
from testbed.spec import load_scenario, parse_scenario  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = ROOT / "scenarios"


def rmsa_spec(**over: Any) -> dict[str, Any]:
    """NSFNET, 40 slots, a guard slot, heavy load, cuts and slot losses: a hard case."""
    spec: dict[str, Any] = {
        "name": "gym-rmsa", "topology": {"library": "nsfnet"},
        "optical": {"slots": 40, "k_paths": 3, "guard_slots": 1},
        "workload": {"kind": "lightpath_requests", "load_erlang": 60, "requests": 3000,
                     "bitrate_gbps": [10, 100, 200], "seed": 4},
        "events": [
            {"at_s": 5, "kind": "fiber_cut", "link": ["9", "10"]},
            {"at_s": 8, "kind": "wavelength_loss", "link": ["1", "2"], "first_slot": 0,
             "slots": 10},
            {"at_s": 20, "kind": "fiber_repair", "link": ["9", "10"]},
            {"at_s": 25, "kind": "fiber_cut", "link": ["4", "5"]},
            {"at_s": 40, "kind": "wavelength_repair", "link": ["1", "2"], "first_slot": 0,
             "slots": 10}],
    }
    spec.update(over)
    return spec


def jobs_spec() -> dict[str, Any]:
    """14 DCs of 64 GPUs on NSFNET, one stage per DC, 24 slots: jobs blocked both for
    GPUs and for spectrum, CBA upgrades, two cuts (lightpaths restored, a job
    interrupted) and their repairs."""
    return {
        "name": "gym-jobs", "topology": {"library": "nsfnet"},
        "dcs": [{"name": f"dc{i}", "node": str(i), "gpus": 64,
                 "gpu": "a100" if i % 3 == 0 else "h100"} for i in range(1, 15)],
        "optical": {"slots": 24, "k_paths": 3},
        "workload": {"kind": "pp_jobs", "jobs": 80, "mean_interarrival_s": 600, "seed": 3,
                     "max_stages_per_dc": 1, "mix": [
                         {"model": "gpt3-6.7b", "stages": 4, "gpus_per_stage": 32,
                          "microbatches": 32, "iterations": 20000},
                         {"model": "llama2-13b", "stages": 6, "gpus_per_stage": 16,
                          "microbatches": 32, "iterations": 8000}]},
        "policy": {"placement": "cba", "schedule": "1f1b"},
        "events": [{"at_s": 10000, "kind": "fiber_cut", "link": ["6", "10"]},
                   {"at_s": 16000, "kind": "fiber_repair", "link": ["6", "10"]},
                   {"at_s": 20000, "kind": "fiber_cut", "link": ["9", "12"]},
                   {"at_s": 26000, "kind": "fiber_repair", "link": ["9", "12"]}],
    }


def run_episode(env: Any, policy: Any, seed: int | None = None) -> list[tuple[Any, ...]]:
    """(action, reward, truncated, info without the mask) per step of one episode."""
    _, info = env.reset(seed=seed)
    out = []
    done = False
    while not done:
        a = policy(env, info)
        _, r, term, trunc, info = env.step(a)
        out.append((a, r, trunc, {k: v for k, v in info.items() if k != "action_mask"}))
        done = term or trunc
    return out


def test_import_registers_both() -> None:
    assert testbed.gym.RMSA_ID in gym.envs.registration.registry
    assert testbed.gym.PLACEMENT_ID in gym.envs.registration.registry
    testbed.gym.register()  # idempotent


@pytest.mark.parametrize("name", ["quickstart", "pp-jobs", "cba-nsfnet", "fault-wavelength",
                                  "monitor-demo", "routing-leafspine"])
@pytest.mark.parametrize("env_id", ["LightPipe/RMSA-v0", "LightPipe/Placement-v0"])
def test_env_checker_passes_on_bundled_scenarios(env_id: str, name: str) -> None:
    """Every workload kind (lightpath_requests, pp_jobs, allreduce_jobs) as either env;
    the default episode lengths, no warning from the checker."""
    env = gym.make(env_id, scenario=str(SCENARIOS / f"{name}.yaml"))
    gc.collect()  # what earlier tests in this process left (their unclosed sockets' warnings)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(env.unwrapped)
    assert [str(w.message) for w in caught] == []
    obs, info = env.reset(seed=5)
    assert obs in env.observation_space
    assert info["action_mask"].dtype == np.int8
    assert info["action_mask"].shape == (env.action_space.n,)
    assert info["action_mask"].any()


def test_every_bundled_scenario_makes_both_envs() -> None:
    files = sorted(SCENARIOS.glob("*.yaml"))
    assert len(files) >= 10
    for f in files:
        for env_id in ("LightPipe/RMSA-v0", "LightPipe/Placement-v0"):
            env = gym.make(env_id, scenario=str(f))
            obs, info = env.reset(seed=1)
            obs, _, term, _, info = env.step(env.action_space.sample(
                mask=info["action_mask"]))
            assert obs in env.observation_space and not term, (f.name, env_id)


def expected_blocks(free_slots: list[bool], n: int, j: int) -> list[int]:
    """DeepRMSA blocks, plainly: starts of the first j free runs at least n slots long."""
    starts, i, s = [], 0, len(free_slots)
    while i < s and len(starts) < j:
        if free_slots[i]:
            k = i
            while k < s and free_slots[k]:
                k += 1
            if k - i >= n:
                starts.append(i)
            i = k
        else:
            i += 1
    return starts


def busy_map(env: ReferenceRMSAEnv) -> dict[tuple[str, str], list[int]]:
    net = env.net
    return {(f.u, f.v): net.unavailable(f.u, f.v) for f in net.topology.fibres}


def test_rmsa_mask_is_exactly_the_feasible_actions() -> None:
    """The mask equals a plain recomputation from the spectrum; every allowed action is
    accepted and holds exactly its block, every forbidden one is blocked and takes
    nothing (checked against the fibres' slot lists before and after). On the reference
    implementation, whose OpticalNetwork state the check reads; the compiled env gives
    the same masks and observations (tests/test_gym_fast.py)."""
    env = ReferenceRMSAEnv(parse_scenario(rmsa_spec()), blocks=3, episode_requests=1500)
    rng = np.random.default_rng(0)
    obs, info = env.reset(seed=9)
    seen = {"allowed": 0, "forbidden": 0, "reject": 0}
    done = False
    while not done:
        rid, src, dst, br = env._req[0], env._req[3], env._req[4], env._req[5]
        mask = info["action_mask"]
        paths = env.net.candidate_paths(src, dst)
        expect = np.zeros_like(mask)
        blocks: dict[int, tuple[Any, int, list[int]]] = {}
        for p_i, path in enumerate(paths[:env.k]):
            n = env.net.slots_needed(br, path) if env.net.path_up(path) else None
            if n is None:
                continue
            free = [not any(s in env.net.unavailable(u, v) for u, v in path.fibres)
                    for s in range(env.n_slots)]
            starts = expected_blocks(free, n, env.j)
            blocks[p_i] = (path, n, starts)
            expect[p_i * env.j:p_i * env.j + len(starts)] = 1
            assert list(obs["block_start"][p_i][:len(starts)]) == starts
            assert obs["slots_needed"][p_i] == n
            assert list(obs["spectrum"][p_i]) == [0 if f else 1 for f in free]
        expect[-1] = 0 if expect[:-1].any() else 1
        assert list(mask) == list(expect)
        a = int(rng.integers(env.action_space.n))
        before = busy_map(env)
        event_before = env._ev_i
        obs, r, _, trunc, info = env.step(a)
        after = busy_map(env)
        # slots taken since: this request's (a departure before the next arrival only
        # frees slots; steps where a cut or slot loss came in between are not compared)
        added = {f: sorted(set(after[f]) - set(before[f])) for f in after}
        if env._ev_i != event_before:
            added = {}
        if a < env.reject_action and mask[a]:
            seen["allowed"] += 1
            path, n, starts = blocks[a // env.j]
            first = starts[a % env.j]
            assert r == 1.0 and info["accepted"] and info["first_slot"] == first
            want = list(range(first, first + n))
            for f in path.fibres:
                key = f if f in before else (f[1], f[0])
                assert not set(want) & set(before[key])  # the block was free
            if rid not in env._live:  # it left again before the next arrival
                want = []
            for f, got in added.items():
                on_path = f in path.fibres or (f[1], f[0]) in path.fibres
                assert got == (want if on_path else []), f
        else:
            seen["reject" if a == env.reject_action else "forbidden"] += 1
            assert r == -1.0 and not info["accepted"]
            assert all(v == [] for v in added.values())
        done = trunc
    assert min(seen.values()) > 20, seen


def test_rmsa_same_seed_same_episode_and_first_reset_is_the_scenarios() -> None:
    sc = parse_scenario(rmsa_spec(events=[]))

    def episode(seed: int | None) -> list[tuple[Any, ...]]:
        env = gym.make("LightPipe/RMSA-v0", scenario=sc, episode_requests=400)
        rng = np.random.default_rng(3)  # any action, allowed or not
        return run_episode(env, lambda e, info: int(rng.integers(e.action_space.n)), seed)

    a, b, c = episode(11), episode(11), episode(12)
    assert a == b
    assert a != c
    assert episode(None) == episode(4)  # the scenario's workload seed
    env = gym.make("LightPipe/RMSA-v0", scenario=sc, episode_requests=50)
    env.reset(seed=11)
    env.reset()
    o2, _ = env.reset()
    env2 = gym.make("LightPipe/RMSA-v0", scenario=sc, episode_requests=50)
    env2.reset(seed=11)
    env2.reset()
    o3, _ = env2.reset()
    assert all(np.array_equal(o2[k], o3[k]) for k in o2)  # unseeded resets follow the seed


@pytest.mark.parametrize("grid", ["flex", "per_direction"])
def test_first_fit_through_the_env_is_lightpipe_sim(tmp_path: Path, grid: str) -> None:
    """k-shortest-path first fit via the env gives the simulator's decision for every
    request (accepted, route, first slot), through cuts, slot losses and restorations."""
    opt = {"slots": 40, "k_paths": 3, "guard_slots": 1}
    if grid == "per_direction":
        opt["spectrum_sharing"] = "per_direction"
    sc = parse_scenario(rmsa_spec(optical=opt))
    summary = simulate_lightpaths(sc, requests_csv=tmp_path / "requests.csv")
    with open(tmp_path / "requests.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    env = gym.make("LightPipe/RMSA-v0", scenario=sc)
    steps = run_episode(env, lambda e, info: first_fit_action(info["action_mask"]))
    assert len(steps) == len(rows) == 3000
    u = env.unwrapped
    for (_, r, _, info), row in zip(steps, rows, strict=True):
        assert info["accepted"] == (row["accepted"] == "1"), row["id"]
        assert r == (1.0 if info["accepted"] else -1.0)
        if info["accepted"]:
            assert (info["route"], info["first_slot"]) == (row["path"], int(row["first_slot"]))
    assert u.blocked == summary["blocked"] > 100
    assert (u.lost, u.restored) == (summary["lightpaths_lost"],
                                    summary["lightpaths_restored"])
    assert u.lost + u.restored > 0
    assert u.bitrate_blocked_gbps == pytest.approx(summary["bitrate_blocked_gbps"])


def test_first_fit_on_quickstart_is_lightpipe_sims_blocking() -> None:
    sc = load_scenario(SCENARIOS / "quickstart.yaml")
    want = simulate_lightpaths(sc)
    env = gym.make("LightPipe/RMSA-v0", scenario=str(SCENARIOS / "quickstart.yaml"))
    run_episode(env, lambda e, info: first_fit_action(info["action_mask"]))
    assert env.unwrapped.requests == want["requests"]
    assert env.unwrapped.blocked == want["blocked"]


def test_rmsa_trace_workload(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,holding_s,src,dst,bitrate_gbps\n"
                     + "".join(f"{i * 0.1},{5 + i % 3},1,{2 + i % 12},100\n" for i in range(30)))
    spec = rmsa_spec(events=[])
    spec["workload"] = {"kind": "lightpath_requests", "trace": str(trace)}
    env = gym.make("LightPipe/RMSA-v0", scenario=spec)
    assert len(run_episode(env, lambda e, info: first_fit_action(info["action_mask"]))) == 30
    env = gym.make("LightPipe/RMSA-v0", scenario=spec, episode_requests=7)
    assert len(run_episode(env, lambda e, info: first_fit_action(info["action_mask"]))) == 7


def test_allow_reject_keeps_reject_in_the_mask() -> None:
    env = gym.make("LightPipe/RMSA-v0", scenario=rmsa_spec(), allow_reject=True,
                   episode_requests=50)
    _, info = env.reset(seed=1)
    assert info["action_mask"][-1] == 1 and info["action_mask"][:-1].any()
    _, r, _, _, info = env.step(env.action_space.n - 1)
    assert r == -1.0 and not info["accepted"]


def test_placement_cba_through_the_env_is_lightpipe_sim() -> None:
    """cba_action through the env: every job the same DCs, the same first lightpaths
    (route, slots, set-up time) and the same blocking reasons as `lightpipe sim`."""
    sc = parse_scenario(jobs_spec())
    states, summary = simulate(sc)
    env = gym.make("LightPipe/Placement-v0", scenario=sc)
    steps = run_episode(env, lambda e, info: e.unwrapped.cba_action())
    u = env.unwrapped
    assert len(steps) == 80 and u.blocked == summary["blocked"]
    reasons = {st.reason for st in states if st.blocked}
    assert {"no_gpus", "no_spectrum"} <= reasons
    assert summary["lightpaths_restored"] > 0 and summary["interrupted"] > 0
    assert summary["lightpaths_upgraded"] > 0
    mine = {st.job.req.job_id: st for st in [*u.sim.done, *u.sim.running.values()]}

    def key(st: Any) -> tuple[Any, ...]:
        ended = st.end_s is not None and st.end_s <= u.sim.now
        return (st.blocked, st.reason if ended else "", st.end_s if ended else None,
                st.placement,
                [(b, lp.nodes, lp.first_slot, lp.n_slots, up)
                 for b, lp, up, _ in st.lightpath_log if up <= u.sim.now], st.start_s)

    for st in states:
        if st.arrival_s <= u.sim.now:
            assert key(mine[st.job.req.job_id]) == key(st), st.job.req.job_id
    for (_, r, _, info), st in zip(steps, sorted(states, key=lambda s: s.arrival_s),
                                   strict=True):
        if info["placed"]:
            assert info["placement"] == st.placement
            assert r == pytest.approx(-info["iteration_time_s"]) and r < 0
        else:
            assert r == pytest.approx(-u.block_penalty_s(st.job)) and r < 0


def test_placement_mask_is_exactly_the_feasible_actions() -> None:
    """On copies of the env, every action the mask allows places the job (on the layout
    the anchor gives), every one it forbids (and reject) blocks it."""
    env = PlacementEnv(parse_scenario(jobs_spec()), episode_jobs=30)
    _, info = env.reset(seed=2)
    seen = {"allowed": 0, "forbidden": 0}
    for _ in range(12):
        mask = info["action_mask"]
        for a in range(env.action_space.n):
            trial = copy.deepcopy(env)
            lay = env.planner.fill(env.job, env.planner.nearest_order(a % env.n_dcs))
            _, r, _, _, tinfo = trial.step(a)
            if a < env.n_dcs and mask[a]:
                seen["allowed"] += 1
                assert tinfo["placed"] and r < 0 and lay is not None
                assert tinfo["placement"] == [env.cluster.dcs[d].name for d in lay]
            else:
                seen["forbidden"] += a < env.n_dcs
                assert not tinfo["placed"] and r == pytest.approx(-env.block_penalty_s(env.job))
                assert tinfo["reason"] in {"no_gpus", "no_spectrum", "no_path", "rejected"}
        _, _, _, trunc, info = env.step(first_fit_action(mask))  # the lowest allowed DC
        if trunc:
            break
    assert seen["allowed"] > 20 and seen["forbidden"] > 20, seen


def test_placement_same_seed_same_episode() -> None:
    def episode(seed: int) -> list[tuple[Any, ...]]:
        env = gym.make("LightPipe/Placement-v0", scenario=jobs_spec(), episode_jobs=40)
        rng = np.random.default_rng(5)
        return run_episode(env, lambda e, info: int(rng.integers(e.action_space.n)), seed)

    assert episode(3) == episode(3)
    assert episode(3) != episode(4)


def test_default_workloads_follow_the_rule() -> None:
    rm = RMSAEnv(str(SCENARIOS / "pp-jobs.yaml"))
    assert rm.workload.kind == "lightpath_requests" and rm.workload.seed == 7
    assert rm.workload.load_erlang == 50 and rm.workload.requests == 10_000
    assert rm.endpoints == list(rm.nodes)
    pl = PlacementEnv(str(SCENARIOS / "quickstart.yaml"))
    (tmpl,) = pl.workload.mix
    assert (tmpl.model, tmpl.stages, tmpl.gpus_per_stage) == ("gpt3-6.7b", 4, 8)
    pl = PlacementEnv(str(SCENARIOS / "routing-leafspine.yaml"))  # one DC of 8 GPUs
    (tmpl,) = pl.workload.mix
    assert tmpl.stages * tmpl.gpus_per_stage <= 4


@pytest.mark.parametrize("cls", [RMSAEnv, ReferenceRMSAEnv])
@pytest.mark.parametrize(("kwargs", "field"), [
    ({"scenario": "/nonexistent/x.yaml"}, ""),
    ({"scenario": rmsa_spec(), "blocks": 0}, "blocks"),
    ({"scenario": rmsa_spec(), "k_paths": 0}, "k_paths"),
    ({"scenario": rmsa_spec(), "episode_requests": 0}, "episode_requests"),
    ({"scenario": rmsa_spec(), "blocks": 2.5}, "blocks"),
    ({"scenario": rmsa_spec(), "blocks": True}, "blocks"),
    ({"scenario": 3}, "scenario"),
])
def test_bad_input_names_the_field(kwargs: dict[str, Any], field: str, cls: type) -> None:
    with pytest.raises(InputError) as exc:
        cls(**kwargs)
    assert exc.value.path == field
    assert "\n" not in str(exc.value)


def test_placement_needs_dcs() -> None:
    spec = rmsa_spec(events=[])
    with pytest.raises(InputError) as exc:
        PlacementEnv(spec)
    assert exc.value.path == "dcs"
    for kwargs, field in (({"episode_jobs": 0}, "episode_jobs"),
                          ({"block_penalty": -1.0}, "block_penalty"),
                          ({"block_penalty": float("nan")}, "block_penalty")):
        with pytest.raises(InputError) as exc:
            PlacementEnv(jobs_spec(), **kwargs)
        assert exc.value.path == field


def test_train_example_writes_the_table(tmp_path: Path) -> None:
    pytest.importorskip("stable_baselines3")
    from testbed.gym.train import main

    out = tmp_path / "results.md"
    assert main(["--scenario", str(SCENARIOS / "quickstart.yaml"), "--steps", "128",
                 "--episode-steps", "64", "--eval-steps", "60", "--seeds", "1", "2",
                 "--out", str(out)]) == 0
    text = out.read_text()
    assert "| eval seed | MaskablePPO | first fit | random valid |" in text
    rows = [line for line in text.splitlines() if line.startswith(("| 1 ", "| 2 ", "| mean"))]
    assert len(rows) == 3
    for line in rows:
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert all(0.0 <= float(c) <= 1.0 for c in cells[1:])
    assert main(["--algo", "ppo", "--steps", "64", "--episode-steps", "32", "--eval-steps",
                 "20", "--seeds", "1", "--out", str(out)]) == 0  # the bundled scenario
    assert "| eval seed | PPO | first fit | random valid |" in out.read_text()
    assert main(["--scenario", str(SCENARIOS / "quickstart.yaml"), "--steps", "0"]) == 2


def test_placement_job_trace(tmp_path: Path) -> None:
    trace = tmp_path / "jobs.csv"
    trace.write_text("job_id,arrival_s,model,stages,gpus_per_stage,microbatches,iterations\n"
                     + "".join(f"{i},{i * 100.0},gpt3-6.7b,4,32,16,5000\n" for i in range(12)))
    spec = jobs_spec()
    spec["workload"] = {"kind": "pp_jobs", "trace": str(trace), "max_stages_per_dc": 1}
    env = gym.make("LightPipe/Placement-v0", scenario=spec)
    steps = run_episode(env, lambda e, info: e.unwrapped.cba_action())
    assert [s[3]["job_id"] for s in steps] == [*range(1, 12), 11]  # the next job; the last repeats
    env = gym.make("LightPipe/Placement-v0", scenario=spec, episode_jobs=5)
    assert len(run_episode(env, lambda e, info: e.unwrapped.cba_action())) == 5
