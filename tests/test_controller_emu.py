"""`lightpipe emu` with the controller (root): request replay + a fibre cut as a port-down.

The run's lightpath requests go through the real os-ken controller and real OVS; the
decisions must equal `lightpipe sim` on the same sample, the cut must be seen by the
controller through OpenFlow PortStatus and its lightpaths restored, and nothing of the
run (controller included) may be left.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from testbed.sim.engine import REQUESTS_COLUMNS
from testbed.spec import parse_scenario
from tests.ctl_ring import why_skip as _why_skip

pytestmark = [pytest.mark.root, pytest.mark.slow]


def test_emu_replays_requests_and_restores_a_cut(tmp_path: Path) -> None:
    why = _why_skip()
    if why:
        pytest.skip(why)
    from testbed.backends.emu import EmuBackend

    sc = parse_scenario({
        "name": "ctl-emu-ring",
        "topology": {"links": [{"u": "A", "v": "B", "length_km": 100},
                               {"u": "B", "v": "C", "length_km": 100},
                               {"u": "C", "v": "D", "length_km": 150},
                               {"u": "D", "v": "A", "length_km": 150}]},
        "dcs": [{"name": "dc-a", "node": "A", "gpus": 8},
                {"name": "dc-c", "node": "C", "gpus": 8}],
        "optical": {"slots": 40, "k_paths": 2},
        "workload": {"kind": "lightpath_requests", "endpoints": "dcs", "load_erlang": 6,
                     "mean_holding_s": 1.0, "requests": 1000, "bitrate_gbps": [100],
                     "seed": 3},
        "events": [{"at_s": 2.0, "kind": "fiber_cut", "link": ["A", "B"]}],
        "emulation": {"bandwidth_divisor": 10000, "hosts_per_dc": 1, "link_mode": "userspace",
                      "datapath": "user", "max_requests": 25, "replay_s": 4.0},
    })
    out = tmp_path / "run"
    summary = EmuBackend().run(sc, out, quiet=True, probe_seconds=1.0)
    assert summary["verified"] and summary["forwarding"] == "controller"
    assert summary["requests"] == 25
    assert summary["agreement"]["ratio"] == 1.0, summary["agreement"]
    assert summary["blocking_ratio"] == summary["sim_blocking_ratio"]
    (cut,) = summary["events"]
    assert cut["via"] == "port_status" and cut["kind"] == "fiber_cut"
    assert len(cut["restored"]) >= 1, cut  # live lightpaths on A-B moved to A-D-C
    assert summary["cut_to_restored_s"] == [cut["cut_to_restored_s"]]
    assert summary["lightpaths_restored"] == len(cut["restored"])
    (row,) = summary["faults"]  # the cut's row (docs/faults.md)
    assert row["kind"] == "fiber_cut" and row["applied"] and row["target"] == "A-B"
    assert row["recovery_s"] == cut["cut_to_restored_s"]
    assert row["lost"]["restored"] == cut["restored"]
    with open(out / "requests.csv", newline="") as fh:
        rows = list(csv.reader(fh))
    assert rows[0] == list(REQUESTS_COLUMNS) and len(rows) == 26
    after = [r for r in rows[1:] if float(r[10]) > 2.0 and r[8] == "1"]
    assert after and all(r[4] in ("A-D-C", "C-D-A") for r in after)  # A-B is down
    net = json.loads((out / "network.json").read_text())
    assert not Path(f"/proc/{net['controller']['pid']}").exists()
    assert (out / "controller" / "controller.log").is_file()
