"""After a reroute (restoration, re-placement): each moved lightpath's RTT checked against
its new route's plan, corrected on its own new fibres, and recorded.

    rows = check_lightpaths(net, client, [3, 7])   # the controller's lightpath ids

A lightpath that moves leaves the fibres its calibration was measured on; the fibres of
its new route carry no correction for it (each lightpath is corrected on its own,
testbed.emu.calibrate). So right after the move its RTT is pinged (sparse and dense
echoes, first host to first host), its processing on the new route taken off that
lightpath's frames on the new fibres (one calibration of that path alone), and pinged
again. A row per lightpath: route, 2 x the new route's delay, the error before and after
the correction, and whether it is within the band (RTT_TOL_MS, in scenario time).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from testbed.emu.calibrate import CalibrationConfig, PathProbe, calibrate, measure
from testbed.emu.delaycal import RTT_TOL_MS
from testbed.emu.live import LiveNetwork

log = logging.getLogger(__name__)

Client = Callable[[str, str, Any], tuple[int, Any]]
# One round of correction: the check runs beside the workload and should be short.
REROUTE_CONFIG = CalibrationConfig(rounds=2, parallel=1)


def reroute_config(link_mode: str) -> CalibrationConfig:
    """REROUTE_CONFIG with the link mode's echoes: no dense stream on netem links (it is
    about user-space bridges; in a software-emulated VM each of a restored lightpath's
    measurements with it took ~2.5 min beside the workload)."""
    return dataclasses.replace(
        REROUTE_CONFIG, dense_pings=CalibrationConfig.for_link_mode(link_mode).dense_pings)


def route_probe(net: LiveNetwork, pair: str, src_host: str, dst_host: str,
                nodes: Sequence[str], vlan: int) -> PathProbe:
    """How to ping VLAN `vlan`'s lightpath along `nodes` from src_host to dst_host (plan
    host names), labelled `pair`."""
    p = net.plan
    ha, hb = p.host(src_host), p.host(dst_host)
    hops = list(itertools.pairwise(nodes))
    fibres = tuple(p.fibre(u, v).middle for u, v in hops)
    one_way = sum(p.fibre(u, v).delay_ms for u, v in hops)
    return PathProbe(pair, f"/proc/{net.host_pid(ha.name)}/ns/net", hb.ip.split("/")[0],
                     fibres, one_way, int(vlan))


def lightpath_probe(net: LiveNetwork, lp: dict[str, Any]) -> PathProbe:
    """How to ping a controller lightpath (GET /lightpaths/ID) on its current route,
    between the first host of each of its DCs."""
    ha = next(h for h in net.plan.hosts if h.dc == lp["src_dc"])
    hb = next(h for h in net.plan.hosts if h.dc == lp["dst_dc"])
    return route_probe(net, f"{lp['src_dc']}~{lp['dst_dc']}", ha.name, hb.name,
                       lp["nodes"], lp["vid"])


def reroute_row(pair: str, vlan: int | None, fibres: list[str], configured_ms: float,
                rec: dict[str, Any], tol_ms: float, t0: float) -> dict[str, Any]:
    """One checked path's row from its calibration record (one path: its `before` and
    `after` rounds), within the band or not (tol_ms, emulated); t0: when it began."""
    before = rec["before"][0] if rec["before"] else None
    after = rec["after"][0] if rec["after"] else None
    return {
        "pair": pair, "vlan": vlan, "fibres": fibres, "hops": len(fibres),
        "expected_rtt_ms": round(2 * configured_ms, 4), "tolerance_ms": round(tol_ms, 4),
        "before_error_ms": None if before is None else before["error_ms"],
        "after_error_ms": None if after is None else after["error_ms"],
        "after_median_ms": None if after is None else after["median_ms"],
        "spread_ms": None if after is None else after["spread_ms"],
        "corrections_ms": rec["path_corrections_ms"].get(pair, {}),
        "ok": after is not None and abs(after["error_ms"]) <= tol_ms,
        "wall_s": round(time.monotonic() - t0, 3)}


def check_probe(net: LiveNetwork, probe: PathProbe, cfg: CalibrationConfig | None = None,
                label: str = "after reroute") -> dict[str, Any]:
    """Measure one path, correct its lightpath on its own fibres, measure again; its row
    (cfg: default reroute_config of the network's link mode; label: what the log line
    says the check follows)."""
    cfg = cfg or reroute_config(getattr(net, "link_mode", "userspace"))
    t0 = time.monotonic()
    emulators = {f: net.emulators[f] for f in probe.fibres}
    rec = calibrate(emulators, lambda: measure([probe], cfg), cfg)
    tol_ms = net.plan.scale.delay_ms(RTT_TOL_MS)
    row = reroute_row(probe.pair, probe.vlan, list(probe.fibres), probe.configured_ms,
                      rec, tol_ms, t0)
    (log.info if row["ok"] else log.warning)(
        "%s: %s on %d fibre(s): RTT error %s ms before, %s ms after its own "
        "correction (band +-%.2f ms)", label, probe.pair, row["hops"], row["before_error_ms"],
        row["after_error_ms"], tol_ms)
    return row


def fetch_routes(client: Client, ids: Sequence[int]) -> list[tuple[int, Any]]:
    """(id, the controller's record) per lightpath id, or (id, why) where it has none:
    every route first, while the controller that just restored them answers (the
    checks take seconds, and a controller_kill may fall in them)."""
    got: list[tuple[int, Any]] = []
    for i in ids:
        try:
            status, lp = client("GET", f"/lightpaths/{i}", None)
        except OSError as exc:  # urllib's URLError included
            status, lp = str(exc)[:200], None
        got.append((i, lp if status == 200 else f"GET /lightpaths/{i}: {status}"))
    return got


def check_lightpaths(net: LiveNetwork, client: Client, ids: Sequence[int],
                     cfg: CalibrationConfig | None = None) -> list[dict[str, Any]]:
    """A row per controller lightpath id (on its route now); one that is gone says so."""
    rows = []
    for i, lp in fetch_routes(client, ids):
        if isinstance(lp, str):
            rows.append({"id": i, "ok": False, "error": lp})
            continue
        try:
            row = check_probe(net, lightpath_probe(net, lp), cfg)
        except (OSError, RuntimeError, ValueError, KeyError, StopIteration) as exc:
            row = {"ok": False, "error": str(exc)[:300]}
        rows.append({"id": i, "route": list(lp["nodes"]), **row})
    return rows


def moved_lightpaths(net: LiveNetwork, client: Client) -> list[int]:
    """Controller lightpaths whose route is not the one the plan (calibration) knew."""
    return moved_from_plan(net.plan, client)


def moved_from_plan(plan: Any, client: Client) -> list[int]:
    """moved_lightpaths against a plan (an EmuPlan: its lightpaths' VLANs and routes)."""
    planned = {lp.vlan: tuple(lp.path) for lp in plan.lightpaths}
    status, body = client("GET", "/lightpaths", None)
    if status != 200:
        return []
    return [lp["id"] for lp in body["lightpaths"]
            if planned.get(lp["vid"]) not in (None, tuple(lp["nodes"]))]
