"""Backend interface and registry: simulation and emulation run the same scenario."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from testbed.backends.cluster import ClusterBackend
from testbed.backends.emu import EmuBackend
from testbed.backends.sim import SimBackend
from testbed.errors import InputError
from testbed.spec import Scenario


class Backend(Protocol):
    """Runs a scenario and writes the shared run records into out_dir."""

    name: str

    def available(self) -> tuple[bool, str]:
        """(usable here, reason if not)."""
        ...

    def run(self, scenario: Scenario, out_dir: Path, quiet: bool = False) -> dict[str, Any]:
        """Run the scenario; write manifest.json, summary.json and records; return summary."""
        ...


BACKENDS: dict[str, type[Backend]] = {"sim": SimBackend, "emu": EmuBackend,
                                      "cluster": ClusterBackend}


def get_backend(name: str) -> Backend:
    """The backend called `name` (InputError naming the known ones otherwise)."""
    if name not in BACKENDS:
        raise InputError("--backend", f"unknown backend {name!r} (known: {', '.join(BACKENDS)})")
    return BACKENDS[name]()
