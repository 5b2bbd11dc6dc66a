"""ClusterBackend: run a scenario's emulation across the machines of a cluster file.

testbed.cluster.run does the run (docs/cluster.md): every machine's share over SSH, one
controller and one Prometheus on this machine (the driver), workers or the request
replay on every machine, and the one-machine emulation's records (manifest.json and
summary.json with backend "emu", the workload's records) plus the cluster's own files.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from testbed.cluster.bringup import UpOptions
from testbed.cluster.checks import Echo, log_line
from testbed.cluster.run import run_cluster_emulation
from testbed.errors import InputError
from testbed.spec import Scenario


class ClusterBackend:
    """Runs a scenario across machines (the cluster file's; this machine drives)."""

    name = "cluster"

    def available(self) -> tuple[bool, str]:
        """The driver's own needs: an OpenSSH client (each machine is checked over SSH
        when the run starts: `lightpipe cluster check`)."""
        if shutil.which("ssh") is None:
            return False, "no OpenSSH client (ssh) on PATH"
        return True, ""

    def run(self, scenario: Scenario, out_dir: Path, quiet: bool = False, *,
            cluster: str | Path | None = None, options: UpOptions | None = None,
            echo: Echo = log_line) -> dict[str, Any]:
        """The run across the machines of `cluster` (a cluster file), or of
        `options.cluster_file`; its summary. Without either: InputError naming --cluster."""
        if options is None:
            if cluster is None:
                raise InputError("--cluster", "the cluster backend needs a cluster file "
                                 "(--cluster FILE; docs/cluster.md)")
            options = UpOptions(cluster_file=str(cluster))
        elif cluster is not None and str(cluster) != options.cluster_file:
            raise InputError("--cluster", "given twice, as two files")
        return run_cluster_emulation(scenario, Path(out_dir), options, quiet, echo)
