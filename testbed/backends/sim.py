"""SimBackend: the discrete-event simulation backend (lightpath traffic and PP jobs)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from testbed.atomicio import atomic_write_json, staged_dir
from testbed.jobs.sim import run_jobs
from testbed.records import write_manifest
from testbed.spec import Scenario


class SimBackend:
    """Runs a scenario in simulation; always available (pure Python)."""

    name = "sim"

    def available(self) -> tuple[bool, str]:
        return True, ""

    def run(self, scenario: Scenario, out_dir: Path, quiet: bool = False) -> dict[str, Any]:
        """Simulate; write manifest.json, summary.json and the records into out_dir atomically."""
        wl = scenario.workload
        if wl.kind == "pp_jobs":
            with staged_dir(out_dir) as stage:
                summary: dict[str, Any] = run_jobs(scenario, stage, quiet)
                if not (stage / "summary.json").exists():
                    atomic_write_json(stage / "summary.json", summary)
                if not (stage / "manifest.json").exists():
                    write_manifest(stage, scenario, self.name)
            return summary

        if wl.kind == "allreduce_jobs":  # routing policies on the DC fabric (issue 12)
            from testbed.sim.allreduce import simulate_allreduce

            with staged_dir(out_dir) as stage:
                summary = {"backend": "sim", "scenario": scenario.name,
                           "workload": "allreduce_jobs", "allreduce": simulate_allreduce(scenario)}
                atomic_write_json(stage / "summary.json", summary)
                write_manifest(stage, scenario, self.name, records=["summary.json"])
            return summary

        from testbed.sim.engine import simulate_lightpaths

        with staged_dir(out_dir) as stage:
            summary = simulate_lightpaths(scenario, stage / "requests.csv", quiet=quiet)
            atomic_write_json(stage / "summary.json", summary)
            write_manifest(stage, scenario, self.name,
                           records=["summary.json", "requests.csv"])
        return summary
