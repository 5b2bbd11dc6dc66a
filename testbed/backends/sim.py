"""SimBackend: the discrete-event simulation backend (lightpath traffic and PP jobs)."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from testbed.atomicio import atomic_write_json, staged_dir
from testbed.errors import InputError
from testbed.records import write_manifest
from testbed.spec import Scenario


def _jobs_runner() -> Any:
    """testbed.jobs.sim:run_jobs when this build has it, else None."""
    try:
        module = importlib.import_module("testbed.jobs.sim")
    except ModuleNotFoundError as exc:
        if exc.name not in ("testbed.jobs", "testbed.jobs.sim"):
            raise
        return None
    return getattr(module, "run_jobs", None)


class SimBackend:
    """Runs a scenario in simulation; always available (pure Python)."""

    name = "sim"

    def available(self) -> tuple[bool, str]:
        return True, ""

    def run(self, scenario: Scenario, out_dir: Path, quiet: bool = False) -> dict[str, Any]:
        """Simulate; write manifest.json, summary.json and the records into out_dir atomically."""
        wl = scenario.workload
        if wl.kind == "pp_jobs":
            run_jobs = _jobs_runner()
            if run_jobs is None:
                raise InputError("workload.kind", "pp_jobs simulation is not available in "
                                 "this build")
            with staged_dir(out_dir) as stage:
                summary: dict[str, Any] = run_jobs(scenario, stage, quiet)
                if not (stage / "summary.json").exists():
                    atomic_write_json(stage / "summary.json", summary)
                if not (stage / "manifest.json").exists():
                    write_manifest(stage, scenario, self.name)
            return summary

        from testbed.sim.engine import simulate_lightpaths

        with staged_dir(out_dir) as stage:
            summary = simulate_lightpaths(scenario, stage / "requests.csv", quiet=quiet)
            atomic_write_json(stage / "summary.json", summary)
            write_manifest(stage, scenario, self.name,
                           records=["summary.json", "requests.csv"])
        return summary
