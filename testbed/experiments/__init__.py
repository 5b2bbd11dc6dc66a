"""Paper reproductions and parameter sweeps built on the simulator and the schedule engine."""
