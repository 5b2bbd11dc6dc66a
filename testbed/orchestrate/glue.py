"""Glue between the emulated network (testbed.emu) and the controller.

`layout_from_emu(net)` turns a live `EmuNetwork` (its plan and OpenFlow port map)
into the controller's `Layout`. `attach_controller(net, ...)` starts the controller
with its OpenFlow listener inside the run's network namespace (where the switches
are) and its REST API on the host's loopback, then hands it the layout.

Typical use (what `lightpipe emu` does when a controller is wanted):

    ctl = start_for_emu(scenario_path, out_dir)          # before the network
    with EmuNetwork(plan, controller=ctl.openflow) as net:
        attach_layout(ctl, net)                          # rules go in, lightpaths next
        ...
    ctl.stop()
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from controllers.layout import HostSpec, Layout, LinkSpec, SwitchSpec
from testbed.emu.live import LiveNetwork
from testbed.emu.plan import EmuPlan
from testbed.orchestrate.ctl_process import ControllerProcess, start_controller


def layout_from_emu(net: LiveNetwork) -> Layout:
    """Layout of a started EmuNetwork (plan + `net.ports` + forwarder control sockets)."""
    controls = {middle: emu.control_address() for middle, emu in net.emulators.items()}
    return layout_from_plan(net.plan, net.ports, controls)


def layout_from_plan(plan: EmuPlan, ports: Mapping[tuple[str, str], int],
                     controls: Mapping[str, str | None]) -> Layout:
    """The controller's Layout of a plan whose switches have these OpenFlow ports
    ((switch, neighbour) -> port), with each fibre's capacity control (by middle node;
    a fibre without one keeps the caps its emulator was started with)."""
    kind = {s.node: s.kind for s in plan.switches}
    switches = [SwitchSpec(name=s.node, dpid=int(s.dpid, 16),
                           kind="roadm" if s.kind == "roadm" else "dc",
                           node=s.label if s.kind == "roadm" else None,
                           dc=None if s.kind == "roadm" else s.label)
                for s in plan.switches]
    links: list[LinkSpec] = []
    hosts: list[HostSpec] = []
    host_nodes = {h.node: h for h in plan.hosts}
    for lk in plan.links:
        a, b = lk.a, lk.b
        if a in host_nodes or b in host_nodes:
            h = host_nodes[a] if a in host_nodes else host_nodes[b]
            hosts.append(HostSpec(name=h.name, dc=h.dc, ip=h.ip.split("/")[0], mac=h.mac,
                                  switch=h.switch, port=ports[(h.switch, h.node)]))
            continue
        roadm = {kind[a], kind[b]} & {"roadm"}
        links.append(LinkSpec(a=a, a_port=ports[(a, b)], b=b, b_port=ports[(b, a)],
                              kind="uplink" if roadm else "fabric"))
    for f in plan.fibres:
        links.append(LinkSpec(a=f.roadm_u, a_port=ports[(f.roadm_u, f.middle)],
                              b=f.roadm_v, b_port=ports[(f.roadm_v, f.middle)],
                              kind="fibre", control=controls.get(f.middle)))
    return Layout(switches=switches, links=links, hosts=hosts,
                  mbps_per_gbps=plan.scale.mbps_per_gbps)


def start_for_emu(spec: str | Path, run_dir: str | Path, netns: str | None = None,
                  token: str | None = None, rest_port: int | None = None) -> ControllerProcess:
    """Start the controller for an emulation run (state and log under run_dir)."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    return start_controller(spec, run_dir / "controller.db",
                            rest_port=rest_port, token=token, netns=netns,
                            log_path=run_dir / "controller.log")


def attach_layout(ctl: ControllerProcess, net: LiveNetwork,
                  timeout_s: float = 30.0) -> dict[str, Any]:
    """PUT the network's layout to the controller (it programs every switch)."""
    return put_layout(ctl, layout_from_emu(net), timeout_s)


def put_layout(ctl: ControllerProcess, layout: Layout, timeout_s: float = 30.0
               ) -> dict[str, Any]:
    """PUT a layout to the controller (it programs every switch)."""
    status, body = ctl.request("PUT", "/layout", layout.model_dump(), timeout_s=timeout_s)
    if status != 200:
        raise RuntimeError(f"controller refused the layout: {status} {body}")
    return dict(body)


def attach_controller(net: LiveNetwork, spec: str | Path, run_dir: str | Path, *,
                      token: str | None = None, rest_port: int | None = None,
                      of_port: int | None = None,
                      timeout_s: float = 30.0) -> ControllerProcess:
    """Start the controller for a started EmuNetwork and program it (returns when every
    switch is connected and holds its rules).

    The network must have been built with `controller=controller_address()` (its
    switches wait for a controller) or a `tcp:127.0.0.1:PORT` address (the listener's
    port). The OpenFlow listener lives in the run's namespace, on `of_port` or the
    network's port if given, else on any free port the controller binds itself; the
    REST API on the host's loopback. The switches are pointed at the bound port.
    """
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    if of_port is None and str(net.controller).startswith("tcp:"):
        of_port = int(str(net.controller).rsplit(":", 1)[1])
    home = net.home_netns_path
    ctl = start_controller(spec, run_dir / "controller.db", of_port=of_port,
                           rest_port=rest_port, token=token,
                           netns=f"/run/netns/{net.plan.prefix}", home_netns=home,
                           log_path=run_dir / "controller.log", timeout_s=timeout_s,
                           run_state=net.state_dir if net.state is not None else None)
    try:
        # Switches back off (1, 2, 4 .. s) while nobody listens: re-point them now.
        if net.ovs is not None:
            # issue 14: on a slow machine (a software-emulated VM) the controller may not
            # answer OVS's 5 s echo probe: switches would flap; probe as slowly as we wait.
            probe_ms = max(5000, int(timeout_s * 1000 / 4))
            for s in net.plan.switches:
                net.ovs.vsctl("set-controller", s.node, ctl.openflow)
                net.ovs.vsctl("set", "controller", s.node, f"inactivity_probe={probe_ms}")
        attach_layout(ctl, net, timeout_s=timeout_s)
        wait_synced(ctl, net.plan, timeout_s)
        return ctl
    except BaseException:
        ctl.stop()
        raise


def wait_synced(ctl: ControllerProcess, plan: EmuPlan, timeout_s: float) -> None:
    """Wait until every switch of the plan is connected and holds the controller's rules
    (RuntimeError naming those that are not)."""
    import time

    want = {int(s.dpid, 16) for s in plan.switches}
    deadline = time.monotonic() + timeout_s
    body: Any = {}
    while time.monotonic() < deadline:
        status, body = ctl.request("GET", "/health")
        if status == 200 and want <= set(body["synced"]):
            return
        time.sleep(0.05)
    names = {int(s.dpid, 16): s.node for s in plan.switches}

    def named(dpids: set[int]) -> str:
        return ", ".join(sorted(names[d] for d in dpids)) or "none"

    if not isinstance(body, dict):  # the last answer was not JSON (an error page)
        body = {}
    connected = set(body.get("switches", ()))
    raise RuntimeError(f"switches did not all connect to the controller within "
                       f"{timeout_s:.0f} s: not connected: {named(want - connected)}; "
                       f"connected but not synced: "
                       f"{named((want & connected) - set(body.get('synced', ())))} "
                       f"(see {ctl.log_path})")


def controller_address() -> str:
    """EmuNetwork(controller=...) for a network whose switches wait for a controller
    that `attach_controller` starts later (it binds a free port and points them at it)."""
    from testbed.emu.network import CONTROLLER_LATER

    return CONTROLLER_LATER
