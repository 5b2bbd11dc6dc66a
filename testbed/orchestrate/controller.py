"""The controller inside one `lightpipe emu` run: start, default lightpaths, describe, stop.

`lightpipe emu` (testbed.backends.emu) builds the network with
`EmuNetwork(plan, controller=controller_address())` when `emulation.forwarding` is
`controller`, then calls `start_run_controller(net, scenario, run_dir)`: the controller
starts (OpenFlow listener in the run's namespace, REST on the host's loopback, a fresh
bearer token), is recorded in the run state (so `lightpipe clean` kills a leftover one),
gets the layout, and sets up the plan's DC-pair lightpaths through `POST /lightpaths`
(same VLAN ids as the static plan). The plan's lightpaths are replaced by what the
controller answered (its route, slots and capacity), so verification and the iperf3
probes check the controller's decisions.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
import secrets
from collections.abc import Callable
from itertools import pairwise
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from testbed.emu.live import LiveNetwork
from testbed.emu.plan import EmuPlan
from testbed.errors import RuntimeFailure
from testbed.orchestrate.ctl_process import ControllerProcess
from testbed.spec import Scenario

if TYPE_CHECKING:
    from testbed.orchestrate.replay import LinkSwitch

log = logging.getLogger(__name__)


def controller_available() -> tuple[bool, str]:
    """Whether the os-ken controller can run here (os-ken importable)."""
    if importlib.util.find_spec("os_ken") is None and importlib.util.find_spec("ryu") is None:
        return False, ("emulation.forwarding is 'controller' but os-ken is not installed "
                       "(pip install os-ken, or set emulation.forwarding: static)")
    return True, ""


def write_spec(scenario: Scenario, path: Path) -> Path:
    """The scenario as a YAML file the controller process can load (paths absolute)."""
    data = scenario.model_dump(mode="json", exclude_none=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def plan_lightpaths_refused(scenario: Scenario, plan: EmuPlan) -> str | None:
    """Why the controller would refuse one of the plan's DC-pair lightpaths (None if it
    sets them all up). Exact: the same core, same order, on an empty network. (The static
    plan assumes regeneration beyond the modulation reach; the controller does not.)"""
    import tempfile

    from controllers.core import ControllerCore, RequestError
    from controllers.store import Store

    with tempfile.TemporaryDirectory() as tmp:
        core = ControllerCore(scenario, Store(Path(tmp) / "check.db"))
        try:
            for lp in plan.lightpaths:
                try:
                    core.request(lp.dc_a, lp.dc_b, slots=lp.slots, vid=lp.vlan)
                except RequestError as exc:
                    return f"{lp.dc_a}-{lp.dc_b} ({lp.slots} slots): {exc.message}"
        finally:
            core.store.close()
    return None


def launch_controller(scenario: Scenario, run_dir: Path,
                      start: Callable[[Path, str], ControllerProcess],
                      token: str | None = None) -> ControllerProcess:
    """What every run does to start its controller: check os-ken is there, write the
    scenario it serves into run_dir, and call start(spec, token) with a fresh token
    (unless one is given); RuntimeFailure naming what failed."""
    ok, why = controller_available()
    if not ok:
        raise RuntimeFailure(why)
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    spec = write_spec(scenario, run_dir / "controller-scenario.yaml")
    try:
        return start(spec, token or secrets.token_urlsafe(18))
    except RuntimeError as exc:
        raise RuntimeFailure(f"controller start-up failed: {exc}") from None


def start_run_controller(net: LiveNetwork, scenario: Scenario, run_dir: Path,
                         token: str | None = None) -> ControllerProcess:
    """Start and attach the controller for a started EmuNetwork; set up its lightpaths."""
    from testbed.orchestrate.glue import attach_controller

    # issue 14: scaled with the machine (or the scenario's startup_timeout_s)
    ctl = launch_controller(scenario, run_dir, lambda spec, tok: attach_controller(
        net, spec, Path(run_dir), token=tok, timeout_s=net.startup_timeout_s), token)
    if net.state is not None:
        net.state.add_proc(ctl.proc.pid, "controller", "os-ken")
    net.attach_controller_client(ctl)  # for workload steps that call the REST API
    try:
        net.adopt_lightpaths(setup_plan_lightpaths(ctl, net.plan).lightpaths)
    except BaseException:
        ctl.stop()
        raise
    return ctl


class ControllerRestarter:
    """Kills a run's controller (SIGKILL, by its PID) and starts it again on the same
    database, OpenFlow and REST ports and token: the new process rebuilds its state from
    SQLite and re-syncs the switches. The ControllerProcess object is updated in place,
    so every client holding it talks to the new process."""

    def __init__(self, ctl: ControllerProcess, net: LiveNetwork, run_dir: Path) -> None:
        self.ctl = ctl
        self.net = net
        self.run_dir = Path(run_dir)

    def lightpaths(self) -> dict[int, list[str]] | None:
        """id -> route of the controller's lightpaths (None if it does not answer)."""
        try:
            status, body = self.ctl.request("GET", "/lightpaths", timeout_s=5.0)
        except OSError:
            return None
        if status != 200:
            return None
        return {lp["id"]: list(lp["nodes"]) for lp in body["lightpaths"]}

    def kill(self) -> int | None:
        """SIGKILL the controller; its PID (None if it was not running)."""
        if self.ctl.proc.poll() is not None:
            return None
        pid = self.ctl.proc.pid
        self.ctl.stop(kill=True)
        return pid

    def restart(self) -> int:
        """Start it again (returns once every switch is connected and holds its rules)."""
        from urllib.parse import urlsplit

        from testbed.orchestrate.glue import attach_controller

        port = urlsplit(self.ctl.rest_url).port
        new = attach_controller(self.net, self.run_dir / "controller-scenario.yaml",
                                self.run_dir, token=self.ctl.token, rest_port=port,
                                of_port=self.ctl.of_port, timeout_s=self.net.startup_timeout_s)
        if self.net.state is not None:
            self.net.state.add_proc(new.proc.pid, "controller", "os-ken")
        split = getattr(self.net, "cpu_split", None)
        if split is not None:  # back on the network's CPUs, as the first one was
            from testbed.emu.cpuset import pin

            pin(new.proc.pid, split.network)
        for f in dataclasses.fields(new):
            setattr(self.ctl, f.name, getattr(new, f.name))
        return new.proc.pid


def setup_plan_lightpaths(ctl: ControllerProcess, plan: EmuPlan) -> EmuPlan:
    """POST one lightpath per plan DC pair (slots and VLAN id of the plan); return the
    plan with its lightpaths replaced by the controller's answers."""
    lps = []
    delay = {frozenset((f.u, f.v)): f.delay_ms for f in plan.fibres}
    for lp in plan.lightpaths:
        status, body = ctl.request("POST", "/lightpaths", {
            "src_dc": lp.dc_a, "dst_dc": lp.dc_b, "slots": lp.slots, "vid": lp.vlan})
        if status != 201:
            msg = body.get("error", body) if isinstance(body, dict) else body
            raise RuntimeFailure(f"controller refused the {lp.dc_a}-{lp.dc_b} lightpath "
                                 f"({lp.slots} slots): {status} {msg}; lower "
                                 "emulation.lightpath_gbps or use emulation.forwarding: static")
        nodes = tuple(body["nodes"])
        if nodes != lp.path:
            log.info("controller routed %s-%s on %s (plan: %s)", lp.dc_a, lp.dc_b,
                     "-".join(nodes), "-".join(lp.path))
        lps.append(dataclasses.replace(
            lp, path=nodes, real_gbps=body["capacity_gbps"], slots=body["n_slots"],
            rate_mbps=plan.scale.rate_mbps(body["capacity_gbps"]),
            delay_ms=round(sum(delay[frozenset(e)] for e in pairwise(nodes)), 6)))
    return dataclasses.replace(plan, lightpaths=tuple(lps))


def describe(ctl: ControllerProcess | None, with_token: bool = True) -> dict[str, Any] | None:
    """network.json / summary / manifest record of the run's controller."""
    if ctl is None:
        return None
    d = ctl.describe()
    log_path = Path(d["log"])
    d["log"] = f"{log_path.parent.name}/{log_path.name}"  # relative to the run's out dir
    if not with_token:
        d.pop("token", None)
    return d


def release_all(ctl: ControllerProcess) -> int:
    """Tear down every live lightpath (the DC-pair ones once the probes are done)."""
    status, body = ctl.request("GET", "/lightpaths")
    if status != 200:
        raise RuntimeFailure(f"controller: GET /lightpaths: {status} {body}")
    for lp in body["lightpaths"]:
        ctl.request("DELETE", f"/lightpaths/{lp['id']}")
    return len(body["lightpaths"])


def run_replay(ctl: ControllerProcess, set_link: LinkSwitch | None, scenario: Scenario,
               out_dir: Path) -> dict[str, Any]:
    """lightpath_requests in emulation: replay a bounded, time-scaled sample of the
    scenario's requests and its fibre events through the controller (fibre cuts as real
    port-downs through `set_link`: testbed.emu.events.link_switch on one machine); write
    requests.csv (simulator format); return the summary keys, the events with their
    cut-to-restored times, and the agreement with `lightpipe sim`."""
    from testbed.io.atomic import atomic_write_text
    from testbed.orchestrate.replay import (
        agreement,
        reference,
        replay,
        request_line,
        requests_csv,
        sample_requests,
    )
    from testbed.runs.rundir import RecordStream
    from testbed.sim.engine import REQUESTS_COLUMNS

    emu = scenario.emulation
    released = release_all(ctl)
    sample = sample_requests(scenario, emu.max_requests)
    sim_summary, sim_rows = reference(scenario, sample, out_dir / "sim-reference")
    log.info("replaying %d requests through the controller in ~%g s", len(sample),
             emu.replay_s)
    stream = RecordStream(out_dir / "requests.csv", REQUESTS_COLUMNS)  # rows as they come

    def on_row(row: dict[str, Any]) -> None:
        stream.write_line(request_line(row))
        stream.tick()

    try:
        res = replay(scenario, sample, lambda m, p, b: ctl.request(m, p, b),
                     replay_s=emu.replay_s, set_link=set_link, on_row=on_row)
    finally:
        stream.close()
    atomic_write_text(out_dir / "requests.csv", requests_csv(res.rows))  # the same, whole
    out = dict(res.summary)
    out["workload"] = "lightpath_requests"
    out["policy"] = scenario.policy.spectrum
    out["default_lightpaths_released"] = released
    out["events"] = res.events
    out["cut_to_restored_s"] = [e["cut_to_restored_s"] for e in res.events
                                if "cut_to_restored_s" in e]
    out["agreement"] = agreement(res.rows, sim_rows)
    out["sim_blocking_ratio"] = sim_summary["blocking_ratio"]
    return out
