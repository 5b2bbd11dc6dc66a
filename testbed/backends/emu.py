"""EmuBackend: run a scenario on the emulated network (testbed.orchestrate.run does the run).

Every run verifies the lightpaths and measures each DC pair with iperf3 (TCP goodput)
and ICMP (RTT) into probes.csv; then the workload runs: lightpath requests replayed
through the SDN controller, or pipeline jobs on the PyTorch workers. Records use the
simulation backend's layout (manifest.json, summary.json, requests.csv / jobs records)
plus network.json.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from testbed.emu.plan import build_plan
from testbed.envprobe import probe
from testbed.errors import InputError
from testbed.orchestrate.controller import controller_available
from testbed.orchestrate.probes import PROBE_SECONDS
from testbed.orchestrate.run import RunOptions, run_emulation
from testbed.spec import Scenario


class EmuBackend:
    """Runs a scenario on emulation (root, Mininet's mnexec and Open vSwitch needed)."""

    name = "emu"

    def available(self) -> tuple[bool, str]:
        rep = probe()
        if not rep.emulation_possible:
            return False, "; ".join(rep.reasons)
        if not rep.iperf3:
            return False, "iperf3 not installed"
        return True, ""

    def supports(self, scenario: Scenario) -> tuple[bool, str]:
        """Whether this scenario can be emulated at all (e.g. links not too fast), and why not.

        `lightpipe run --backend auto` can use it to fall back to simulation.
        """
        try:
            build_plan(scenario, prefix="lp0000")
        except InputError as exc:
            return False, str(exc)
        if scenario.emulation.forwarding == "controller":
            return controller_available()
        return True, ""

    def run(self, scenario: Scenario, out_dir: Path, quiet: bool = False, *,
            hold: bool = False, link_mode: str | None = None,
            probe_seconds: float = PROBE_SECONDS,
            ready: threading.Event | None = None,
            on_hold: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
        """Build, verify and measure; with hold, keep the network up until SIGINT/SIGTERM."""
        return run_emulation(scenario, Path(out_dir), RunOptions(
            quiet=quiet, hold=hold, link_mode=link_mode, probe_seconds=probe_seconds,
            ready=ready, on_hold=on_hold))
