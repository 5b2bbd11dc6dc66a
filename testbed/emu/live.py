"""Typed interfaces of a live emulation: the network the run steps drive, the controller client."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from testbed.emu.forwarding import PortMap
from testbed.emu.links import LinkEmulator
from testbed.emu.ovs import PrivateOVS
from testbed.emu.plan import EmuPlan, LightpathPlan
from testbed.emu.state import RunState


class RestClient(Protocol):
    """A REST client of the run's SDN controller (testbed.orchestrate.ctl_process)."""

    def request(self, method: str, path: str, body: Any = None,
                timeout_s: float | None = None) -> tuple[int, Any]:
        """One call; (HTTP status, decoded JSON or text)."""
        ...


class LiveNetwork(Protocol):
    """What the run steps use of a started network (testbed.emu.network.EmuNetwork)."""

    plan: EmuPlan
    link_mode: str
    datapath: str
    controller: str | None
    controller_client: RestClient | None
    state: RunState | None
    ovs: PrivateOVS | None
    ports: PortMap
    emulators: Mapping[str, LinkEmulator]
    timings_s: dict[str, float]
    startup_timeout_s: float  # how long a part (OVS, links, controller) may take to come up

    @property
    def state_dir(self) -> Path: ...

    @property
    def home_netns_fd(self) -> int | None: ...

    @property
    def home_netns_path(self) -> str: ...

    def host_pid(self, name: str) -> int: ...

    def host_iface(self, name: str) -> str: ...

    def attach_controller_client(self, client: RestClient) -> None: ...

    def adopt_lightpaths(self, lightpaths: Sequence[LightpathPlan]) -> None: ...
