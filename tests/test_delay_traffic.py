"""Root: time_factor auto chosen and applied by the run path; on the hidden ring, each
lightpath calibrated on its own and its RTT checked and corrected after a reroute."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from testbed.spec import parse_scenario
from tests.emu_skip import need_root

pytestmark = [pytest.mark.root]

LIGHTPIPE = [str(Path(sys.executable).parent / "lightpipe")]

# One 10 km fibre: 0.05 ms one way, while a path's processing here is ~1 ms per round
# trip; at factor 1 the RTT cannot come within 0.8 ms of 2 x delay.
SHORT = """
version: 1
name: tf-short
topology:
  links:
    - {u: A, v: B, length_km: 10}
dcs:
  - {name: dc-a, node: A, gpus: 8}
  - {name: dc-b, node: B, gpus: 8}
workload: {kind: lightpath_requests}
emulation: {hosts_per_dc: 1, bandwidth_divisor: 10000, forwarding: static, max_requests: 1}
"""

RING: dict[str, Any] = {
    "name": "ring-xyz", "topology": {"links": [
        {"u": "X", "v": "Y", "length_km": 300}, {"u": "X", "v": "Z", "length_km": 300},
        {"u": "Z", "v": "Y", "length_km": 300}]},
    "dcs": [{"name": "dc-x", "node": "X", "gpus": 8}, {"name": "dc-y", "node": "Y", "gpus": 8}],
    "optical": {"slots": 16, "k_paths": 2},
    "workload": {"kind": "lightpath_requests"},
    "emulation": {"bandwidth_divisor": 1000, "hosts_per_dc": 1, "link_mode": "userspace",
                  "datapath": "user", "time_factor": 1}}


@need_root
def test_auto_time_factor_is_chosen_applied_and_recorded(tmp_path: Path) -> None:
    """A fibre shorter than its path's processing: the run picks the factor its own
    measurement asks for, says why, runs every fibre at real delay x that factor, and every
    record carries it (summary, network.json, manifest). Whether 1 fits depends on the
    machine's speed and load (a quiet fast machine may fit at 1): the choice's arithmetic
    is tested on given costs in tests/test_timefactor.py."""
    spec = tmp_path / "short.yaml"
    spec.write_text(SHORT)
    out = tmp_path / "run"
    r = subprocess.run([*LIGHTPIPE, "run", str(spec), "--out", str(out), "--backend", "emu"],
                       capture_output=True, text=True, timeout=600, check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    network = json.loads((out / "network.json").read_text())
    manifest = json.loads((out / "manifest.json").read_text())
    choice = summary["time_factor_choice"]
    factor = choice["factor"]
    assert choice["mode"] == "auto" and factor >= 1
    if choice["fits"]:  # the smallest factor meeting every constraint
        assert factor == max(choice["network_factor"], choice["compute_factor"],
                             choice.get("slack_factor") or 0.0)
    else:  # even the bound did not fit: run at the bound, and say so
        assert factor == choice["bound"] and "does NOT fit" in r.stderr
    assert summary["time_factor"] == network["time_factor"] == manifest["time_factor"] == factor
    (fibre,) = network["fibres"]
    assert fibre["delay_ms"] == pytest.approx(0.05 * factor)
    assert network["delay_calibration"]["time_factor_choice"]["factor"] == factor
    # One line per reason on the console: network, compute, the choice.
    assert f"time factor {factor:g} (auto)" in r.stderr
    assert "network: 1 DC pair(s); dc-a~dc-b binds" in r.stderr
    assert f"chosen {factor:g}" in r.stderr or not choice["fits"]
    # The verification's band is +-1 ms in scenario time.
    (rtt,) = json.loads((out / "verification.json").read_text())["rtts"]
    assert rtt["tolerance_ms"] == pytest.approx(factor)


@need_root
def test_each_lightpath_is_calibrated_on_its_own_and_checked_after_a_reroute(
        tmp_path: Path) -> None:
    """Calibrated on x-y, the unused detour's fibres keep their delay and no correction;
    after a cut of x-y the lightpath's RTT on x-z-y is measured against the detour's plan,
    corrected on the detour's own fibres, and recorded in the band."""
    from testbed.emu.calibrate import calibrate_network
    from testbed.emu.network import EmuNetwork
    from testbed.emu.plan import build_plan
    from testbed.emu.reroute import check_lightpaths, moved_lightpaths
    from testbed.orchestrate.controller import start_run_controller
    from testbed.orchestrate.glue import controller_address
    from tests.waiting import wait_until

    scenario = parse_scenario(RING)
    with EmuNetwork(build_plan(scenario), link_mode="userspace", datapath="user",
                    controller=controller_address()) as net:
        ctl = start_run_controller(net, scenario, tmp_path / "ctl")
        try:
            rec = calibrate_network(net)
            assert rec["mode"] == "per_lightpath"
            xy = net.plan.fibre("X", "Y").middle
            detour = {net.plan.fibre("X", "Z").middle, net.plan.fibre("Z", "Y").middle}
            for f in rec["fibres"]:
                assert f["correction_ms"] == 0.0
            for m in detour:
                assert net.emulators[m].vlan_corrections_ms == {}
            assert set(rec["path_corrections_ms"]["dc-x~dc-y"]) == {xy}

            def client(m: str, path: str, body: Any) -> Any:
                return ctl.request(m, path, body)

            emu = net.emulators[xy]
            subprocess.run(["mnexec", "-a", str(emu.ns_pid), "ip", "link", "set",
                            emu.intf_u, "down"], check=True)
            wait_until(lambda: moved_lightpaths(net, client), timeout_s=15,
                       what="the lightpath restored on x-z-y")
            (row,) = check_lightpaths(net, client, moved_lightpaths(net, client))
            assert row["route"] == ["X", "Z", "Y"] and row["expected_rtt_ms"] == 6.0
            assert set(row["corrections_ms"]) == detour  # its own, on its new fibres
            # Uncorrected on the detour it runs slow by its processing; corrected, in band.
            assert row["before_error_ms"] > 0.3
            assert row["ok"] and abs(row["after_error_ms"]) <= 1.0
        finally:
            ctl.stop()
