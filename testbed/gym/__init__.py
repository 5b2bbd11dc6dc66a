"""Gymnasium environments on LightPipe's own models; importing this registers them.

* ``LightPipe/RMSA-v0`` (`testbed.gym.rmsa.RMSAEnv`): DeepRMSA-style dynamic RMSA, compiled;
  its vector entry point (`testbed.gym.rmsa_vec.RMSAVectorEnv`) steps N envs in one call:
  ``gymnasium.make_vec("LightPipe/RMSA-v0", num_envs=N)``.
* ``LightPipe/Placement-v0`` (`testbed.gym.placement.PlacementEnv`): CBA-style placement
  of pipeline jobs' stages on DCs.

Both take ``scenario=`` (a scenario file, a parsed spec dict or a Scenario; by default
the bundled quickstart scenario): see docs/gym.md.
"""

from __future__ import annotations

import gymnasium as gym

RMSA_ID = "LightPipe/RMSA-v0"
PLACEMENT_ID = "LightPipe/Placement-v0"


def register() -> None:
    """Register both environments with Gymnasium (idempotent)."""
    registry = gym.envs.registration.registry
    if RMSA_ID not in registry:
        gym.register(id=RMSA_ID, entry_point="testbed.gym.rmsa:RMSAEnv",
                     vector_entry_point="testbed.gym.rmsa_vec:RMSAVectorEnv")
    if PLACEMENT_ID not in registry:
        gym.register(id=PLACEMENT_ID, entry_point="testbed.gym.placement:PlacementEnv")


register()

__all__ = ["PLACEMENT_ID", "RMSA_ID", "register"]
