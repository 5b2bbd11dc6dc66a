"""The ring the controller's root tests and bench/bench_restoration.py emulate, up with the
real controller: A-B-C-D (dc-a on A, dc-c on C), forwarder fibres, private OVS."""

from __future__ import annotations

import os
import shutil
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pytest


def ring_spec(name: str = "ctl-ring", *, hosts_per_dc: int = 2, link_mode: str = "userspace",
              datapath: str = "user") -> str:
    """The ring's scenario, as YAML."""
    return f"""
version: 1
name: {name}
topology:
  links:
    - {{u: A, v: B, length_km: 100}}
    - {{u: B, v: C, length_km: 100}}
    - {{u: C, v: D, length_km: 150}}
    - {{u: D, v: A, length_km: 150}}
dcs:
  - {{name: dc-a, node: A, gpus: 8}}
  - {{name: dc-c, node: C, gpus: 8}}
optical: {{slots: 16, k_paths: 2}}
workload: {{kind: lightpath_requests}}
emulation: {{hosts_per_dc: {hosts_per_dc}, bandwidth_divisor: 1000, link_mode: {link_mode}, \
datapath: {datapath}}}
"""


def why_skip() -> str | None:
    """Why the ring cannot be built here (not root, an Open vSwitch tool or mnexec
    missing), or None."""
    if os.geteuid() != 0:
        return "needs root (network namespaces, Open vSwitch)"
    for tool in ("ovs-vswitchd", "ovsdb-server", "ovs-vsctl", "ovs-ofctl", "mnexec"):
        if shutil.which(tool) is None and not os.path.exists(f"/usr/sbin/{tool}"):
            return f"{tool} not installed"
    return None


@contextmanager
def ring_up(spec: Path, run_dir: Path, *, link_mode: str = "userspace",
            datapath: str = "user", token: str | None = None,
            timeout_s: float = 30.0) -> Iterator[dict[str, Any]]:
    """The network of `spec` started and its controller attached, as {"net": ..., "ctl":
    ...} (a test may stop the controller and put a new one under "ctl"). On the way out
    the controller under "ctl" is continued (a test may have paused it) and stopped, then
    the network is stopped."""
    from testbed.emu.network import EmuNetwork
    from testbed.emu.plan import build_plan
    from testbed.orchestrate.glue import attach_controller, controller_address
    from testbed.spec import load_scenario

    net = EmuNetwork(build_plan(load_scenario(spec)), link_mode=link_mode, datapath=datapath,
                     controller=controller_address())
    state: dict[str, Any] = {"net": net}
    try:
        net.start()
        state["ctl"] = attach_controller(net, spec, run_dir, token=token, timeout_s=timeout_s)
        yield state
    finally:
        ctl = state.get("ctl")
        if ctl is not None:
            if ctl.proc.poll() is None:
                os.kill(ctl.proc.pid, signal.SIGCONT)
            ctl.stop()
        net.stop()


def ring_env(tmp_path_factory: pytest.TempPathFactory, name: str) -> Iterator[dict[str, Any]]:
    """A module fixture's body: the ring named `name` up with its controller (token
    "t0ken"), as ring_up's state with the scenario file ("spec") and the run directory
    ("dir") added; the test skipped where the ring cannot be built."""
    import pytest  # (not at the top: bench/bench_restoration.py imports this module)

    why = why_skip()
    if why:
        pytest.skip(why)
    tmp = tmp_path_factory.mktemp(name)
    spec = tmp / "ring.yaml"
    spec.write_text(ring_spec(name))
    with ring_up(spec, tmp / "run", token="t0ken") as state:
        state |= {"spec": spec, "dir": tmp / "run"}
        yield state
