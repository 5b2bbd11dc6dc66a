"""Backend interface and registry: simulation and emulation run the same scenario."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any, Protocol

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


# name -> "module:Class"; a module that is not present yet is reported as unavailable.
BACKENDS: dict[str, str] = {
    "sim": "testbed.backends.sim:SimBackend",
    "emu": "testbed.backends.emu:EmuBackend",
}


def get_backend(name: str) -> Backend:
    if name not in BACKENDS:
        raise InputError("--backend", f"unknown backend {name!r} (known: {', '.join(BACKENDS)})")
    modname, cls = BACKENDS[name].split(":")
    try:
        module = importlib.import_module(modname)
    except ModuleNotFoundError as exc:
        if exc.name != modname:
            raise
        return _Missing(name)
    return getattr(module, cls)()


class _Missing:
    def __init__(self, name: str) -> None:
        self.name = name

    def available(self) -> tuple[bool, str]:
        return False, f"the {self.name} backend is not part of this build"

    def run(self, scenario: Scenario, out_dir: Path, quiet: bool = False) -> dict[str, Any]:
        raise InputError("--backend", self.available()[1])
