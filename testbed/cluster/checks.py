"""Checks of a network up across machines: DC pairs pinged, lightpaths probed, SSH steps."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from testbed.cluster.calib import Apply, Ping
from testbed.cluster.drive import ShareResult, ping_pairs, run_step
from testbed.cluster.lpprobe import Step, probe_words, run_probes
from testbed.cluster.place import Placement
from testbed.cluster.sharedoc import PairProbe
from testbed.cluster.spec import ClusterSpec
from testbed.emu.delaycal import RTT_TOL_MS, rtt_ok
from testbed.emu.plan import EmuPlan
from testbed.errors import RuntimeFailure
from testbed.io.atomic import atomic_write_json

log = logging.getLogger(__name__)
# Where a cluster run's lines go: the CLI gives its stdout; by default the log.
Echo = Callable[[str], None]


def log_line(text: str) -> None:
    """The default Echo: the line at INFO in the log (the run's lightpipe.log too)."""
    log.info("%s", text)


def probe_step(cluster: ClusterSpec, prefix: str) -> Step:
    """(machine, request) -> the holder's reply, over SSH (`hold correct`); RuntimeFailure
    naming the machine when the step fails."""
    machines = {m.name: m for m in cluster.machines}

    def step(machine: str, req: dict[str, Any]) -> dict[str, Any]:
        r = run_step(cluster, machines[machine], "correct", prefix,
                     stdin=json.dumps(req).encode(), timeout_s=90.0)
        if not r.ok or not r.rows:
            raise RuntimeFailure(f"machine {r.machine} ({r.address}): "
                                 f"{r.problem or 'no reply from its holder'}")
        return r.rows[-1]

    return step


def machine_steps(cluster: ClusterSpec, prefix: str) -> tuple[Apply, Ping]:
    """(apply, ping) of testbed.cluster.calib over SSH: a correction request to one
    machine's share holder (`hold correct`: its fibres' states back), and probes pinged
    from the machines of their first DCs (their rtt rows); RuntimeFailure naming the
    machine."""
    machines = {m.name: m for m in cluster.machines}

    def apply(machine: str, req: dict[str, Any]) -> dict[str, Any]:
        r = run_step(cluster, machines[machine], "correct", prefix,
                     stdin=json.dumps(req).encode(), timeout_s=120.0)
        if not r.ok or r.fibres is None:
            raise RuntimeFailure(f"machine {r.machine} ({r.address}): "
                                 f"{r.problem or 'no fibre states'}")
        return r.fibres

    def ping(asked: Sequence[PairProbe]) -> list[dict[str, Any]]:
        results = ping_pairs(cluster, prefix, asked)
        bad = [r for r in results if not r.ok and not r.rows]
        if bad:
            raise RuntimeFailure(f"machine {bad[0].machine} ({bad[0].address}): "
                                 f"{bad[0].problem}")
        return [row for r in results for row in r.rows]

    return apply, ping


def probe_lightpaths(cluster: ClusterSpec, plan: EmuPlan, placement: Placement, out: Path,
                     name: str = "cluster_probes.json", echo: Echo = log_line
                     ) -> tuple[str, dict[str, Any] | None]:
    """Every lightpath direction probed across the machines (testbed.cluster.lpprobe),
    as a one-machine verification probes them; DIR/NAME written; (a probe off its route:
    its line, else '', the record or None). One outside its fibres' delays is recorded
    and warned about."""
    step = probe_step(cluster, plan.prefix)

    def side_by_side(ms: Sequence[str], fn: Callable[[str], Any]) -> list[Any]:
        with ThreadPoolExecutor(max_workers=max(1, min(8, len(ms)))) as pool:
            return list(pool.map(fn, ms))

    try:
        rec = run_probes(plan, placement, step, side_by_side)
    except RuntimeFailure as exc:
        return f"lightpath probes: {exc}", None
    rec["note"] = ("each fibre's delay from kernel stamps in its middle node (one machine's "
                   "clock); the route on every machine; the one-way time only where both "
                   "hosts share a machine (one_way_checked)")
    atomic_write_json(out / name, rec)
    rows = rec["probes"]
    for row in rows:
        if not row["ok"]:
            echo(f"  {'warning: ' if row['route_ok'] else ''}{probe_words(row)}")
    echo(f"cluster check: {sum(r['route_ok'] for r in rows)}/{len(rows)} lightpath probes "
         f"on their routes, {sum(r['delay_ok'] for r in rows)} within their fibres' delays "
         f"(one way checked on {rec['one_way_checked']}; {rec['rounds']} round(s), "
         f"{rec['took_s']:.1f} s); {out}/{name} written")
    off = [r for r in rows if not r["route_ok"]]
    if off:
        return f"lightpath probe(s) off their route: {probe_words(off[0])}", rec
    return "", rec


def check_pairs(cluster: ClusterSpec, prefix: str, probes: Sequence[PairProbe], out: Path,
                calibration: dict[str, Any] | None = None,
                rechecks: list[dict[str, Any]] | None = None,
                name: str = "cluster_rtt.json", tol_ms: float | None = None,
                echo: Echo = log_line) -> tuple[str, dict[str, Any]]:
    """Ping every DC pair; write DIR/NAME; (the first failure's line or '', the record
    written). tol_ms: the band (emulated ms; default RTT_TOL_MS): the plan's
    `scale.delay_ms(RTT_TOL_MS)`, so that it is +-1 ms in scenario time as on one machine."""
    tol = RTT_TOL_MS if tol_ms is None else tol_ms
    t0 = time.monotonic()
    results = ping_pairs(cluster, prefix, probes)
    rows = pair_rows(results, probes, tol)
    answered = [row for row in rows if row.get("pings")]
    calibrated = bool(calibration and calibration.get("enabled"))
    doc = {"prefix": prefix, "tolerance_ms": round(tol, 4), "pairs_planned": len(probes),
           "pairs_answered": len(answered),
           "pairs_within_band": sum(1 for row in answered if row.get("within_band")),
           "took_s": round(time.monotonic() - t0, 3),
           "calibrated": calibrated,
           "calibration_settled": bool(calibration.get("settled")) if calibrated
           and calibration else None,
           "note": ("RTT against the plan's 2 x one-way delay, after the delay calibration "
                    "across machines (cluster_calibration.json)" if calibrated else
                    "RTT against the plan's 2 x one-way delay; not calibrated "
                    "(--no-calibrate: the network between the machines adds)"),
           "rtt_rechecks": list(rechecks or []),
           "pairs": rows}
    atomic_write_json(out / name, doc)
    for row in rows:
        med = row.get("median_ms")
        echo(f"  {row['pair']:<20} {row['src_machine']} -> {row['dst_machine']}: "
             + (f"rtt median {med:.3f} ms vs plan {row['expected_rtt_ms']:.3f} ms "
                f"({row['pings']}/{row['pings_sent']} replies"
                f"{', within band' if row.get('within_band') else ''})"
                if med is not None else "no reply"))
    echo(f"cluster check: {len(answered)}/{len(probes)} DC pairs answered, "
         f"{doc['pairs_within_band']} within the band; {out}/{name} written")
    bad = [r for r in results if not r.ok]
    if bad:
        return f"machine {bad[0].machine} ({bad[0].address}): check: {bad[0].problem}", doc
    if len(answered) != len(probes):
        missing = sorted({p.pair for p in probes} - {str(r["pair"]) for r in answered})
        return f"DC pair(s) without a reply: {', '.join(missing)}", doc
    return "", doc


def pair_rows(results: Sequence[ShareResult], probes: Sequence[PairProbe], tol_ms: float
              ) -> list[dict[str, Any]]:
    """Every machine's ping rows in the probes' order, each with `crosses`, its echoes
    (`samples_ms`, `replies`) and `within_band` judged at tol_ms (the machines judge at
    RTT_TOL_MS emulated; the driver knows the run's scale)."""
    rows = [row | {"crosses": row["src_machine"] != row["dst_machine"]}
            for r in results for row in r.rows]
    order = {p.pair: i for i, p in enumerate(probes)}
    rows.sort(key=lambda row: order.get(str(row.get("pair")), len(order)))
    for row in rows:  # each echo is the calibration's input; the record keeps the sparse
        # pings' echoes as a one-machine verification row does (the fidelity verdict's p99)
        row["samples_ms"] = row.pop("rtts_ms", None) or []
        row["replies"] = len(row["samples_ms"])
        row.pop("dense_rtts_ms", None)
        if row.get("median_ms") is not None:
            row["within_band"] = rtt_ok(row["median_ms"], row["expected_rtt_ms"] / 2, tol_ms)
    return rows


def final_rtt_rows(stage: Path) -> list[dict[str, Any]]:
    """The DC pairs' rows of the run's last pair check: on the controller's rules
    (cluster_rtt_controller.json) where it ran, else cluster_rtt.json's; [] if none."""
    from testbed.io.trusted import read_regular

    for name in ("cluster_rtt_controller.json", "cluster_rtt.json"):
        try:
            doc = json.loads(read_regular(stage / name, 16 << 20))
        except FileNotFoundError:
            continue
        return [r for r in doc.get("pairs", []) if isinstance(r, dict)]
    return []
