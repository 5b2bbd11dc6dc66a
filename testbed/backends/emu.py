"""EmuBackend: run a scenario on the emulated network (testbed.orchestrate.run does the run).

Every run verifies the lightpaths and measures each DC pair with iperf3 (TCP goodput)
and ICMP (RTT) into probes.csv; then the workload runs: lightpath requests replayed
through the SDN controller, or pipeline jobs on the PyTorch workers. Records use the
simulation backend's layout (manifest.json, summary.json, requests.csv / jobs records)
plus network.json. With `time_factor: auto`, a run judged not faithful on what time
dilation shrinks is run again at the factor its own measurements ask for
(fidelity-evaluated dilation; testbed.emu.timefactor.rerun_factor).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from testbed.emu.plan import build_plan
from testbed.emu.scale import Scale
from testbed.emu.timefactor import rerun_factor
from testbed.envprobe import probe
from testbed.errors import InputError
from testbed.orchestrate.controller import controller_available
from testbed.orchestrate.probes import PROBE_SECONDS
from testbed.orchestrate.run import RunOptions, run_emulation
from testbed.progress import say
from testbed.spec import Scenario

log = logging.getLogger(__name__)
# Overrides emulation.time_factor_reruns (0..3): `make test`'s lanes set 0, so that a run
# the suite's own load makes unfaithful does not run again beside the packet-timing tests.
RERUNS_ENV = "LIGHTPIPE_TIME_FACTOR_RERUNS"


def reruns_allowed(em: Any) -> int:
    """How many times an auto run may be run again: RERUNS_ENV where it is set to 0..3
    (anything else is logged and ignored), else the spec's time_factor_reruns."""
    raw = os.environ.get(RERUNS_ENV, "").strip()
    if raw in ("0", "1", "2", "3"):
        return int(raw)
    if raw:
        log.warning("%s=%r is not 0..3: ignored", RERUNS_ENV, raw[:20])
    return int(em.time_factor_reruns)


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
        """Build, verify and measure; with hold, keep the network up until SIGINT/SIGTERM.
        time_factor auto: a run whose verdict fails on what dilation shrinks is run again
        at the factor it asks for (emulation.time_factor_reruns; rerun_factor)."""
        earlier: list[dict[str, Any]] = []
        em = scenario.emulation
        while True:
            summary = run_emulation(scenario, Path(out_dir), RunOptions(
                quiet=quiet, hold=hold, link_mode=link_mode, probe_seconds=probe_seconds,
                ready=ready, on_hold=on_hold, earlier=tuple(earlier)))
            if hold or not Scale.is_auto(em) or len(earlier) >= reruns_allowed(em):
                return summary
            fidelity = summary.get("fidelity") or {}
            factor = Scale.of_record(summary, "summary.json").time_factor
            nxt, why = rerun_factor(fidelity, factor, em.time_factor_max)
            if nxt is None:
                if not fidelity.get("faithful", True):
                    log.info("time factor auto: no rerun: %s", "; ".join(why))
                return summary
            earlier.append({"time_factor": factor, "faithful": False,
                            "reasons": list(fidelity.get("reasons", [])), "asks": why,
                            "next_time_factor": nxt})
            say(f"emu: time factor auto: not faithful at {factor:g} ({'; '.join(why)}): "
                f"running again with time_factor_min {nxt:g}", False)
            em = em.model_copy(update={"time_factor_min": nxt})
            scenario = scenario.model_copy(update={"emulation": em})
