"""Optical layer: spectrum bitmaps, k shortest paths, modulation by reach, lightpaths.

Pure code (no mininet/os-ken/torch). Main entry point: `OpticalNetwork`; see
docs/optical.md for the model and the API.
"""

from testbed.optical.modulation import (
    DEFAULT_MODULATIONS,
    Modulation,
    choose_modulation,
    modulation_table,
    slots_for,
)
from testbed.optical.network import (
    NO_PATH,
    NO_REACH,
    NO_SPECTRUM,
    Lightpath,
    OpticalNetwork,
    PathInfo,
)
from testbed.optical.paths import k_shortest_paths
from testbed.optical.spectrum import POLICIES, choose_start, fitting_starts, free_runs

__all__ = [
    "DEFAULT_MODULATIONS", "NO_PATH", "NO_REACH", "NO_SPECTRUM", "POLICIES", "Lightpath",
    "Modulation", "OpticalNetwork", "PathInfo", "choose_modulation", "choose_start",
    "fitting_starts", "free_runs", "k_shortest_paths", "modulation_table", "slots_for",
]
