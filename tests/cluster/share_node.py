"""One stand-in machine's share of a small emulation, for test_cluster_share.py (root).

    python tests/cluster/share_node.py CONFIG.json MACHINE|all

CONFIG holds the run prefix and the cluster file's content. A ring of 4 optical nodes
with a DC of one host on n1 (placed on `ma`) and one on n3 (on `mb`) is planned, placed
and split as on every machine; this machine's share is built (ShareNetwork, user-space
fibre emulators; `all`: the whole plan on this machine, EmuNetwork), one JSON line says
what is up (its hosts' shell PIDs and addresses, the state directory), and the network is
torn down when stdin reaches a line or its end.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from testbed.cluster.place import place
from testbed.cluster.share import split
from testbed.cluster.sharenet import ShareNetwork
from testbed.cluster.spec import parse_cluster
from testbed.cluster.tunnel import plan_tunnels
from testbed.emu.network import EmuNetwork
from testbed.emu.plan import build_plan
from tests.test_cluster import ring


def main() -> int:
    cfg = json.loads(Path(sys.argv[1]).read_text())
    machine = sys.argv[2]
    sc = ring(4, [("a", "n1", 1), ("b", "n3", 1)])
    plan = build_plan(sc, cfg["prefix"])
    cluster = parse_cluster(cfg["cluster"])
    placement = place(sc, plan, cluster.machine_names, {"a": "ma", "b": "mb"})
    roadm = {s.label: s.node for s in plan.switches if s.kind == "roadm"}
    shares = split(plan, placement, plan_tunnels(plan.prefix, placement, cluster, roadm))
    lp = plan.lightpaths[0]
    rtt_ms = 2 * sum(plan.fibre(u, v).delay_ms for u, v in zip(lp.path, lp.path[1:],
                                                               strict=False))
    kw = {"link_mode": "userspace", "datapath": "user"}
    net = EmuNetwork(plan, **kw) if machine == "all" else \
        ShareNetwork(plan, shares[machine], **kw)
    share = shares[machine] if machine != "all" else None
    with net:
        hosts = share.hosts if share else plan.hosts
        up = {"hosts": {h.node: [int(net.nodes[h.node].pid), h.ip.split("/")[0]]
                        for h in hosts},
              "tunnels": [e.device for _, e in share.tunnel_ends] if share else [],
              "lightpath_rtt_ms": rtt_ms,
              "procs": [r.pid for r in net.state.procs] if net.state else [],
              "state_dir": str(net.state_dir), "up_s": net.timings_s.get("up")}
        print(json.dumps(up), flush=True)
        sys.stdin.readline()
    print(json.dumps({"down_s": net.timings_s.get("down")}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
