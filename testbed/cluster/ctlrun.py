"""The SDN controller of a cluster run: one os-ken controller beside the driver, every
machine's switches reaching it through their agents, the layout of the whole plan.

The steps (`start_cluster_controller`), each an existing piece:

    start       testbed.orchestrate.ctl_process.start_controller here, OpenFlow and REST
                on this machine's loopback only, a fresh token, tied to the driver (the
                kernel ends it with the driver, even on SIGKILL: no run state here
                records it)
    relay       testbed.cluster.ofrelay through each agent: the share holder points its
                switches at the run's relay socket and answers with their port numbers
    caps        testbed.cluster.caprelay: one socket per fibre here, the controller's run
                state; each lightpath rate it sets goes to the emulator of that fibre
                on its machine (through the agent and the share holder)
    layout      testbed.orchestrate.glue.layout_from_plan on every machine's port map
                merged (a switch lives on one machine), each fibre's control the
                relay's socket
    sync        every switch of the plan connected and holding the controller's rules
                (the static rules it forwarded on until then are replaced in place)
    lightpaths  the plan's DC-pair lightpaths set up through POST /lightpaths, as on one
                machine (testbed.orchestrate.controller.setup_plan_lightpaths)

A `controller_kill` event restarts it (ClusterControllerRestarter): the same database,
ports, token and caps relay, the layout again, every switch synced again.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from testbed.errors import RuntimeFailure
from testbed.orchestrate.controller import ControllerRestarter

if TYPE_CHECKING:
    from testbed.cluster.agentlink import ClusterWorkers
    from testbed.cluster.bringup import UpRun
    from testbed.cluster.caprelay import CapRelay
    from testbed.emu.plan import EmuPlan
    from testbed.orchestrate.ctl_process import ControllerProcess

log = logging.getLogger(__name__)


def merged_ports(replies: dict[str, dict[str, Any]]) -> dict[tuple[str, str], int]:
    """(switch, neighbour) -> OpenFlow port from every machine's reply (RuntimeFailure
    naming the machine whose reply is not ok or names a switch twice)."""
    ports: dict[tuple[str, str], int] = {}
    owner: dict[str, str] = {}
    for machine, r in sorted(replies.items()):
        if not r.get("ok"):
            raise RuntimeFailure(f"machine {machine}: OpenFlow relay: "
                                 f"{str(r.get('why') or 'refused')[:300]}")
        for sw in r.get("switches", []):
            if owner.setdefault(str(sw), machine) != machine:
                raise RuntimeFailure(f"switch {sw} answered by machines {owner[str(sw)]} "
                                     f"and {machine}")
        for row in r.get("ports", []):
            if not (isinstance(row, list) and len(row) == 3 and isinstance(row[2], int)):
                raise RuntimeFailure(f"machine {machine}: OpenFlow relay: a bad port row")
            ports[(str(row[0]), str(row[1]))] = int(row[2])
    return ports


def start_cap_relay(up: UpRun, workers: ClusterWorkers, run_dir: Path) -> CapRelay:
    """The caps relay (testbed.cluster.caprelay) for every fibre of the plan, each to the
    agent session of the machine whose share emulates it (RuntimeFailure naming a fibre
    no machine emulates)."""
    from testbed.cluster.caprelay import CapRelay, relay_dir, remove_relay_dir

    machine_of = {f.middle: m for m, sh in up.shares.items() for f in sh.fibres}
    owners = {}
    for f in up.plan.fibres:
        m = machine_of.get(f.middle)
        if m is None or m not in workers.sessions:
            raise RuntimeFailure(f"fibre {f.u}-{f.v}: no machine's agent emulates it")
        owners[f.middle] = workers.sessions[m]
    longest = max((f"{m}.sock" for m in owners), key=len, default="x.sock")
    directory, temp = relay_dir(run_dir, up.plan.prefix, longest)
    try:
        relay = CapRelay(directory, owners).start()
    except BaseException:
        remove_relay_dir(directory, temp)
        raise
    relay.temp_parent = temp
    return relay


def stop_cap_relay(relay: CapRelay) -> None:
    from testbed.cluster.caprelay import remove_relay_dir

    relay.close()
    remove_relay_dir(relay.dir, relay.temp_parent)


@dataclass
class ClusterController:
    """A cluster run's controller and what its restart needs."""

    ctl: ControllerProcess
    plan: EmuPlan           # the plan with the controller's lightpaths
    record: dict[str, Any]  # summary.json controller_run
    relay: CapRelay         # the caps relay (stop_cap_relay after the controller)
    layout: Any             # the layout it was given (again after a restart)
    run_dir: Path
    timeout_s: float

    def restarter(self) -> ClusterControllerRestarter:
        return ClusterControllerRestarter(self)


class ClusterControllerRestarter(ControllerRestarter):
    """controller_kill across machines: SIGKILL by PID as on one machine, then the
    controller started again here on the same database, ports, token and caps relay, tied
    to the driver, given the layout again; it returns once every machine's switches have
    come back to it through their agents' relays and hold its rules."""

    def __init__(self, cc: ClusterController) -> None:
        super().__init__(cc.ctl, cast(Any, None), cc.run_dir)  # no one-machine network
        self.cc = cc

    def restart(self) -> int:
        from urllib.parse import urlsplit

        from testbed.orchestrate.ctl_process import start_controller
        from testbed.orchestrate.glue import put_layout, wait_synced

        cc = self.cc
        new = start_controller(
            self.run_dir / "controller-scenario.yaml", self.run_dir / "controller.db",
            of_port=self.ctl.of_port, rest_port=urlsplit(self.ctl.rest_url).port,
            token=self.ctl.token, log_path=self.run_dir / "controller.log",
            timeout_s=cc.timeout_s, die_with_parent=True, run_state=cc.relay.dir)
        try:
            put_layout(new, cc.layout, timeout_s=cc.timeout_s)
            wait_synced(new, cc.plan, cc.timeout_s)
        except BaseException:
            new.stop()
            raise
        for f in dataclasses.fields(new):
            setattr(self.ctl, f.name, getattr(new, f.name))
        return new.proc.pid


def start_cluster_controller(up: UpRun, workers: ClusterWorkers, run_dir: Path,
                             timeout_s: float) -> ClusterController:
    """Start the controller, relay every machine's switches to it, give it the layout and
    set up the plan's lightpaths (see the module docstring). Returns the controller, the
    plan with its lightpaths, the record for the summary and the caps relay (stop it with
    stop_cap_relay after the controller); RuntimeFailure naming the step, the controller
    and the relay stopped."""
    import time

    from testbed.cluster.caprelay import caps_mismatch
    from testbed.orchestrate.controller import launch_controller, setup_plan_lightpaths
    from testbed.orchestrate.ctl_process import start_controller
    from testbed.orchestrate.glue import layout_from_plan, put_layout, wait_synced

    t0 = time.monotonic()
    relay = start_cap_relay(up, workers, run_dir)
    try:
        ctl = launch_controller(up.scenario, run_dir, lambda spec, token: start_controller(
            spec, run_dir / "controller.db", token=token, log_path=run_dir / "controller.log",
            timeout_s=timeout_s, die_with_parent=True, run_state=relay.dir))
    except BaseException:
        stop_cap_relay(relay)
        raise
    try:
        # As on one machine: probe as slowly as we wait (a slow guest answers late).
        probe_ms = max(5000, int(timeout_s * 1000 / 4))
        replies = workers.relay_openflow(ctl.of_port, probe_ms)
        ports = merged_ports(replies)
        layout = layout_from_plan(up.plan, ports, relay.controls())
        try:
            put_layout(ctl, layout, timeout_s=timeout_s)
            wait_synced(ctl, up.plan, timeout_s)
        except RuntimeError as exc:
            raise RuntimeFailure(f"controller: {exc}") from None
        synced_s = time.monotonic() - t0
        plan = setup_plan_lightpaths(ctl, up.plan)
        relay.settle(timeout_s)  # caps the controller stopped waiting for (a slow machine)
    except BaseException:
        ctl.stop()
        stop_cap_relay(relay)
        raise
    moved = [f"{a.dc_a}-{a.dc_b}" for a, b in zip(up.plan.lightpaths, plan.lightpaths,
                                                   strict=True) if a.path != b.path]
    rates = [f"{a.dc_a}-{a.dc_b}" for a, b in zip(up.plan.lightpaths, plan.lightpaths,
                                                   strict=True)
             if abs(a.rate_mbps - b.rate_mbps) > 1e-9]
    record = {"switches": {m: r.get("switches", []) for m, r in sorted(replies.items())},
              "synced_s": round(synced_s, 3),
              "ready_s": round(time.monotonic() - t0, 3),
              "lightpaths": len(plan.lightpaths),
              "rerouted": moved,
              # Lightpaths the controller gave another rate than the plan's: their caps
              # were set to its rate on every machine through the relay (caps below).
              "rate_differs": rates,
              "caps": {**relay.record(), "relay": "one socket per fibre on the driver's "
                       "machine, each request through the agent of the fibre's machine "
                       "(testbed.cluster.caprelay)",
                       "mismatch": caps_mismatch(plan, relay.caps())},
              "relay": "the agents' SSH sessions (testbed.cluster.ofrelay)"}
    return ClusterController(ctl, plan, record, relay, layout, run_dir, timeout_s)
