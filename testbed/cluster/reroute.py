"""After a reroute across machines: each moved lightpath's RTT checked against its new
route's plan, corrected on its own new fibres wherever they are emulated, and recorded.

The one-machine check (testbed.emu.reroute) with the cluster's pieces: the lightpath is
pinged from the machine of its first DC (`hold ping`, kernel stamps there: no shared
clock), and its processing on the new route is taken off that lightpath's frames on each
new fibre by the machine emulating it (`hold correct`), one calibration of that path
alone (testbed.cluster.calib.calibrate_cluster); the rows have the one-machine shape,
with the machines the path crosses.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

from testbed.cluster.calib import Apply, Ping, calibrate_cluster
from testbed.cluster.sharedoc import PairProbe
from testbed.emu.calibrate import CalibrationConfig
from testbed.emu.delaycal import RTT_TOL_MS
from testbed.emu.plan import EmuPlan
from testbed.emu.reroute import Client, fetch_routes, reroute_config, reroute_row

log = logging.getLogger(__name__)


def lightpath_probe(plan: EmuPlan, dc_machine: Mapping[str, str], lp: Mapping[str, Any]
                    ) -> PairProbe:
    """How to ping a controller lightpath (GET /lightpaths/ID) on its current route, from
    the first host of its first DC on that DC's machine."""
    ha = next(h for h in plan.hosts if h.dc == lp["src_dc"])
    hb = next(h for h in plan.hosts if h.dc == lp["dst_dc"])
    nodes = [str(n) for n in lp["nodes"]]
    hops = list(itertools.pairwise(nodes))
    one_way = sum(plan.fibre(u, v).delay_ms for u, v in hops)
    labels = tuple(f"{f.u}-{f.v}" for f in (plan.fibre(u, v) for u, v in hops))
    return PairProbe(f"{lp['src_dc']}~{lp['dst_dc']}", dc_machine[str(lp["src_dc"])],
                     dc_machine[str(lp["dst_dc"])], ha.node, hb.ip.split("/")[0], labels,
                     one_way, int(lp["vid"]))


def check_probe(plan: EmuPlan, fibre_machine: Mapping[str, str], probe: PairProbe,
                apply: Apply, ping: Ping, cfg: CalibrationConfig) -> dict[str, Any]:
    """Measure one path, correct its lightpath on its own fibres (on their machines),
    measure again; its row."""
    t0 = time.monotonic()
    middle = {f"{f.u}-{f.v}": f.middle for f in plan.fibres}
    mine = {middle[f]: fibre_machine[middle[f]] for f in probe.fibres}
    rec = calibrate_cluster(plan, mine, [probe], apply, ping, cfg)
    tol_ms = plan.scale.delay_ms(RTT_TOL_MS)
    row = reroute_row(probe.pair, probe.vlan, [middle[f] for f in probe.fibres],
                      probe.configured_ms, rec, tol_ms, t0)
    row["machines"] = sorted(set(mine.values()) | {probe.src_machine, probe.dst_machine})
    (log.info if row["ok"] else log.warning)(
        "after reroute: %s on %d fibre(s) across %s: RTT error %s ms before, %s ms after "
        "its own correction (band +-%.2f ms)", probe.pair, row["hops"],
        "+".join(row["machines"]), row["before_error_ms"], row["after_error_ms"], tol_ms)
    return row


def check_lightpaths(plan: EmuPlan, dc_machine: Mapping[str, str],
                     fibre_machine: Mapping[str, str], client: Client, ids: Sequence[int],
                     apply: Apply, ping: Ping, link_mode: str = "userspace"
                     ) -> list[dict[str, Any]]:
    """A row per controller lightpath id (on its route now); one that is gone, or whose
    check failed, says so (`error`)."""
    cfg = reroute_config(link_mode)
    rows = []
    for i, lp in fetch_routes(client, ids):
        if isinstance(lp, str):
            rows.append({"id": i, "ok": False, "error": lp})
            continue
        try:
            row = check_probe(plan, fibre_machine, lightpath_probe(plan, dc_machine, lp),
                              apply, ping, cfg)
        except (OSError, RuntimeError, ValueError, KeyError, StopIteration) as exc:
            row = {"ok": False, "error": str(exc)[:300]}
        rows.append({"id": i, "route": list(lp["nodes"]), **row})
    return rows
