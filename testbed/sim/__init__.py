"""Discrete-event simulator of dynamic lightpath traffic (RMSA) on the optical layer."""

from testbed.sim.engine import simulate_lightpaths
from testbed.sim.stats import batch_means_ci95, erlang_b

__all__ = ["batch_means_ci95", "erlang_b", "simulate_lightpaths"]
