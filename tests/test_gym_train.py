"""docs/gym.md's MaskablePPO loop runs as written (fewer steps): sb3-contrib's
MaskablePPO trains on RMSA-v0 (the bundled quickstart scenario) with the env's
action_masks(), and its masked evaluation episode only ever picks allowed actions."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

pytest.importorskip("gymnasium")
pytest.importorskip("sb3_contrib")

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "gym.md"


def doc_loop() -> str:
    """The python block of docs/gym.md that trains MaskablePPO."""
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
    (loop,) = [b for b in blocks if "MaskablePPO(" in b]
    assert "STEPS = 20_000" in loop and "action_masks=mask" in loop
    return loop


@pytest.mark.slow
@pytest.mark.cost(90)
def test_the_documented_maskable_ppo_loop_trains_and_picks_only_allowed_actions() -> None:
    code = doc_loop().replace("STEPS = 20_000", "STEPS = 4_096")
    ns: dict[str, object] = {"__name__": "doc_loop"}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, str(DOC), "exec"), ns)  # the assert inside checks each action
    env = ns["env"]
    u = env.unwrapped  # type: ignore[attr-defined]
    assert u.requests == 1000 and 0.0 <= u.blocking_ratio < 1.0
    assert ns["model"].num_timesteps >= 4096  # type: ignore[attr-defined]
    assert re.fullmatch(r"blocking 0\.\d{4}\n", out.getvalue())
