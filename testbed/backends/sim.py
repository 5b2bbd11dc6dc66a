"""SimBackend: the discrete-event simulation backend (lightpath traffic and PP jobs)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from testbed.io.atomic import atomic_write_json
from testbed.jobs.sim import run_jobs
from testbed.runs.rundir import FSYNC_S, run_dir
from testbed.spec import Scenario


class SimBackend:
    """Runs a scenario in simulation; always available (pure Python)."""

    name = "sim"

    def available(self) -> tuple[bool, str]:
        return True, ""

    def run(self, scenario: Scenario, out_dir: Path, quiet: bool = False) -> dict[str, Any]:
        """Simulate into out_dir: there from the start and marked running, records
        streamed as they come, summary.json and the finished manifest at the end
        (testbed.runs.rundir)."""
        wl = scenario.workload
        if wl.kind == "pp_jobs":
            with run_dir(out_dir, scenario, self.name) as rd:
                summary: dict[str, Any] = run_jobs(scenario, rd.path, quiet, rundir=rd)
            return summary

        if wl.kind == "allreduce_jobs":  # routing policies on the DC fabric (issue 12)
            from testbed.sim.allreduce import simulate_allreduce

            with run_dir(out_dir, scenario, self.name) as rd:
                summary = {"backend": "sim", "scenario": scenario.name,
                           "workload": "allreduce_jobs", "allreduce": simulate_allreduce(scenario)}
                atomic_write_json(rd.path / "summary.json", summary)
                rd.finish(records=["summary.json"])
            return summary

        from testbed.sim.engine import REQUESTS_COLUMNS, simulate_lightpaths

        with run_dir(out_dir, scenario, self.name) as rd:
            stream = rd.stream("requests.csv", REQUESTS_COLUMNS, flush_s=FSYNC_S,
                               buffer_bytes=1 << 20)
            summary = simulate_lightpaths(scenario, stream, quiet=quiet)
            atomic_write_json(rd.path / "summary.json", summary)
            rd.finish(records=["summary.json", "requests.csv"])
        return summary
