"""Every registered LightPipe env makes with no arguments (the bundled quickstart
scenario), from the source tree and from a built wheel (package data), and the bundled
copy is scenarios/quickstart.yaml itself."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

gym = pytest.importorskip("gymnasium")

import testbed.gym  # noqa: E402
from testbed.gym.scenario import DEFAULT_SCENARIO, default_scenario  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PACKAGED = ROOT / "testbed" / "gym" / "data" / DEFAULT_SCENARIO


def lightpipe_ids() -> list[str]:
    return sorted(i for i in gym.envs.registration.registry if i.startswith("LightPipe/"))


def test_the_bundled_scenario_is_scenarios_quickstart() -> None:
    assert PACKAGED.read_bytes() == (ROOT / "scenarios" / "quickstart.yaml").read_bytes()
    assert default_scenario().name == "quickstart"


@pytest.mark.parametrize("env_id", lightpipe_ids())
def test_every_registered_env_makes_with_no_arguments(env_id: str) -> None:
    env = gym.make(env_id)
    assert env.unwrapped.scenario.name == "quickstart"
    obs, info = env.reset(seed=3)
    obs, _, term, _, info = env.step(env.action_space.sample(mask=info["action_mask"]))
    assert obs in env.observation_space and not term
    assert set(lightpipe_ids()) >= {testbed.gym.RMSA_ID, testbed.gym.PLACEMENT_ID}


def test_scenario_still_chooses_another() -> None:
    env = gym.make(testbed.gym.RMSA_ID, scenario=str(ROOT / "scenarios" / "cba-nsfnet.yaml"))
    assert env.unwrapped.scenario.name == "cba-nsfnet"
    v = gym.make_vec(testbed.gym.RMSA_ID, num_envs=2)
    assert v.unwrapped.scenario.name == "quickstart"


CHECK = """
import sys
import gymnasium as gym
import testbed, testbed.gym
assert testbed.__file__.startswith(sys.argv[1]), testbed.__file__
for env_id in (testbed.gym.RMSA_ID, testbed.gym.PLACEMENT_ID):
    env = gym.make(env_id)
    env.reset(seed=1)
    print(env_id, env.unwrapped.scenario.name)
"""


@pytest.mark.slow
def test_a_wheel_ships_the_default_scenario(tmp_path: Path) -> None:
    """Build the wheel from a copy of the tree (no build/ in the checkout), install it by
    unpacking it into a directory of its own, and make both envs with no arguments
    there, from a directory outside the tree."""
    src = tmp_path / "src"
    skip = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for name in ("testbed", "controllers", "workloads"):
        shutil.copytree(ROOT / name, src / name, ignore=skip)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    res = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                          "--no-build-isolation", "-q", "-w", str(tmp_path / "dist"),
                          str(src)], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    (wheel,) = (tmp_path / "dist").glob("lightpipe-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert f"testbed/gym/data/{DEFAULT_SCENARIO}" in names
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    res = subprocess.run([sys.executable, "-c", CHECK, str(site)], cwd=tmp_path,
                         env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"},
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.split() == [testbed.gym.RMSA_ID, "quickstart",
                                  testbed.gym.PLACEMENT_ID, "quickstart"]


def test_the_docs_examples_run_as_written() -> None:
    """docs/gym.md's python blocks but the training one (tests/test_gym_train.py): the
    two-line start, the first-fit loop (it prints what `lightpipe sim` gives) and the
    vector env's loop."""
    import contextlib
    import io
    import re

    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "gym.md").read_text(), re.S)
    blocks = [b for b in blocks if "MaskablePPO(" not in b]
    assert len(blocks) == 3
    for code in blocks:
        out = io.StringIO()
        ns: dict[str, object] = {"__name__": "doc_example"}
        with contextlib.redirect_stdout(out):
            exec(compile(code, "docs/gym.md", "exec"), ns)
        if "first_fit_action" in code:
            assert out.getvalue() == "0.04775\n"
        if "make_vec" in code:
            assert ns["rewards"].shape == (1024,)  # type: ignore[attr-defined]
