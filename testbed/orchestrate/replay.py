"""Replay a scenario's lightpath requests (and fibre events) through the controller's REST API.

`lightpipe emu` on a `lightpath_requests` scenario takes the first
`emulation.max_requests` requests of the SAME stream as the simulator
(`testbed.sim.engine.request_stream`: seeded Poisson generator or trace), plays them on a
clock scaled so the sample lasts about `emulation.replay_s` seconds (set up at arrival
with `POST /lightpaths`, torn down at departure with `DELETE`), applies the spec's fibre
and slot-block events in between, writes `requests.csv` in the simulator's exact format,
and compares every decision with `lightpipe sim` run on the same sample (route, modulation, slots,
accept/reason): `agreement`.

Ties are broken as in the simulator: departures, then events, then the arrival. A
request between optical nodes without a DC uses the end name `node:<id>` (ROADM
cross-connects only). The clock, the sleep and the REST client are injected, so the
replay is tested without root against an in-process controller.
"""

from __future__ import annotations

import csv
import heapq
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import islice, pairwise
from pathlib import Path
from typing import Any

from controllers.rules import NODE_END
from testbed.errors import RuntimeFailure
from testbed.sim.engine import REQUESTS_COLUMNS, request_stream, simulate_lightpaths
from testbed.sim.requests import Request
from testbed.spec.faults import network_events
from testbed.spec.models import EventSpec, LightpathRequestsWorkload, Scenario

log = logging.getLogger("lightpipe.controller.replay")

Client = Callable[[str, str, Any], tuple[int, Any]]
# Data-plane fibre switch: (u, v, up) -> None; with it a cut is a port-down the
# controller must notice; without it the replay injects it with POST /failures.
LinkSwitch = Callable[[str, str, bool], None]

DEPART, EVENT, ARRIVE = 0, 1, 2
SLOT_EVENTS = ("wavelength_loss", "wavelength_repair")  # always through POST /failures|repairs
COMPARED = ("path", "modulation", "first_slot", "slots", "accepted", "reason")


@dataclass
class ReplayResult:
    rows: list[dict[str, Any]]
    summary: dict[str, Any]
    events: list[dict[str, Any]] = field(default_factory=list)


def sample_requests(scenario: Scenario, n: int) -> list[Request]:
    """The first n requests of the scenario's stream (what the simulator sees first)."""
    from testbed.optical import OpticalNetwork

    stream, _total = request_stream(scenario, OpticalNetwork.from_scenario(scenario))
    return list(islice(stream, n))


def sample_scenario(scenario: Scenario, sample: Sequence[Request], work_dir: Path) -> Scenario:
    """The scenario restricted to `sample` (Poisson: fewer requests, same seed; trace: the
    sample's rows written to work_dir/sample-trace.csv)."""
    wl = scenario.workload
    assert isinstance(wl, LightpathRequestsWorkload)
    if wl.trace is None:
        new_wl = wl.model_copy(update={"requests": len(sample)})
    else:
        path = work_dir / "sample-trace.csv"
        with open(path, "w", encoding="utf-8", newline="") as fh:
            w = csv.writer(fh, lineterminator="\n")
            w.writerow(("id", "arrival_s", "holding_s", "src", "dst", "bitrate_gbps"))
            for rid, t, hold, src, dst, br in sample:
                w.writerow((rid, repr(t), repr(hold), src, dst, repr(br)))
        new_wl = wl.model_copy(update={"trace": str(path)})
    return scenario.model_copy(update={"workload": new_wl})


def reference(scenario: Scenario, sample: Sequence[Request], work_dir: Path
              ) -> tuple[dict[str, Any], list[dict[str, str]]]:
    """`lightpipe sim` on the sample: its summary and requests.csv rows."""
    work_dir.mkdir(parents=True, exist_ok=True)
    sc = sample_scenario(scenario, sample, work_dir)
    out = work_dir / "sim-requests.csv"
    summary = simulate_lightpaths(sc, requests_csv=out, quiet=True)
    with open(out, encoding="utf-8", newline="") as fh:
        return summary, list(csv.DictReader(fh))


def endpoint_names(scenario: Scenario) -> dict[str, str]:
    """Optical node -> controller end name (its first DC, else node:<id>)."""
    names: dict[str, str] = {}
    for d in scenario.dcs:
        names.setdefault(d.node, d.name)
    return names


def replay(scenario: Scenario, sample: Sequence[Request], client: Client, *,
           replay_s: float, set_link: LinkSwitch | None = None,
           clock: Callable[[], float] = time.monotonic,
           sleep: Callable[[float], None] = time.sleep,
           settle_timeout_s: float = 5.0,
           on_row: Callable[[dict[str, Any]], None] | None = None) -> ReplayResult:
    """Play the sample (and the spec's fibre events before its last arrival) through the
    controller on a clock scaled to ~replay_s seconds. `on_row(row)` is called with each
    request's row as soon as the controller answered it (requests.csv, streamed)."""
    ends = endpoint_names(scenario)
    last_t = max((r[1] for r in sample), default=0.0)
    scale = replay_s / last_t if last_t > 0 else 0.0
    events = network_events(scenario.events)  # flaps as cuts and repairs
    heap = _queue(sample, events, last_t)
    rows: list[dict[str, Any]] = []
    ev_log: list[dict[str, Any]] = []
    live: dict[int, int] = {}  # request id -> controller lightpath id
    reasons = {"no_path": 0, "no_reach": 0, "no_spectrum": 0}
    stats = {"blocked": 0, "br_req": 0.0, "br_blocked": 0.0, "lost": 0, "restored": 0,
             "late_s": 0.0}
    t0 = clock()
    while heap:
        t, kind, _seq, item = heapq.heappop(heap)
        due = t0 + t * scale
        now = clock()
        if due > now:
            sleep(due - now)
        else:
            stats["late_s"] = max(stats["late_s"], now - due)
        if kind == DEPART:
            lp_id = live.pop(item, None)
            if lp_id is not None:
                status, body = client("DELETE", f"/lightpaths/{lp_id}", None)
                if status not in (200, 404):
                    raise RuntimeFailure(f"controller: DELETE lightpath {lp_id}: {status} {body}")
            continue
        if kind == EVENT:
            rec = apply_event(item, client, live, set_link, clock, sleep, settle_timeout_s)
            rec["at_s"] = item.at_s
            ev_log.append(rec)
            stats["lost"] += len(rec.get("lost", []))
            stats["restored"] += len(rec.get("restored", []))
            continue
        rows.append(_arrive(item, client, ends, live, heap, reasons, stats))
        if on_row is not None:
            on_row(rows[-1])
        if kind == ARRIVE and item[0] == sample[-1][0]:
            break  # the simulator stops at the last arrival
    wall = clock() - t0
    for lp_id in live.values():  # what is still up at the end goes (not timed)
        client("DELETE", f"/lightpaths/{lp_id}", None)
    summary = _summary(rows, reasons, stats, ev_log, events, last_t, wall, scale)
    return ReplayResult(rows, summary, ev_log)


def _queue(sample: Sequence[Request], events: Sequence[EventSpec], last_t: float
           ) -> list[tuple[float, int, int, Any]]:
    """The time-ordered heap of arrivals and the events up to the last arrival."""
    heap: list[tuple[float, int, int, Any]] = []
    for i, r in enumerate(sample):
        heapq.heappush(heap, (r[1], ARRIVE, i, r))
    for j, ev in enumerate(events):
        if ev.at_s <= last_t:
            heapq.heappush(heap, (ev.at_s, EVENT, j, ev))
    return heap


def _summary(rows: list[dict[str, Any]], reasons: dict[str, int], stats: dict[str, Any],
             ev_log: list[dict[str, Any]], events: Sequence[EventSpec], last_t: float,
             wall: float, scale: float) -> dict[str, Any]:
    """The summary keys of a replay (the simulator's, plus the replay's timing)."""
    n = len(rows)
    return {
        "requests": n, "accepted": n - stats["blocked"], "blocked": stats["blocked"],
        "blocking_ratio": stats["blocked"] / n if n else 0.0,
        "blocked_by_reason": reasons,
        "bitrate_requested_gbps": round(stats["br_req"], 6),
        "bitrate_blocked_gbps": round(stats["br_blocked"], 6),
        "bitrate_blocking_ratio": stats["br_blocked"] / stats["br_req"] if stats["br_req"]
        else 0.0,
        "lightpaths_lost": stats["lost"], "lightpaths_restored": stats["restored"],
        "events_applied": len(ev_log),
        "events_after_last_arrival": sum(1 for e in events if e.at_s > last_t),
        "sim_time_s": round(last_t, 6),
        "replay_wall_s": round(wall, 3),
        "replay_time_scale": scale,
        "replay_max_late_s": round(stats["late_s"], 4),
    }


def _arrive(item: Request, client: Client, ends: dict[str, str], live: dict[int, int],
            heap: list[tuple[float, int, int, Any]], reasons: dict[str, int],
            stats: dict[str, Any]) -> dict[str, Any]:
    """POST one arriving request; its requests.csv row (its departure queued if set up)."""
    rid, arr, hold, src, dst, br = item
    status, body = client("POST", "/lightpaths", {"src_dc": ends.get(src, f"{NODE_END}{src}"),
                                                  "dst_dc": ends.get(dst, f"{NODE_END}{dst}"),
                                                  "bitrate_gbps": br})
    stats["br_req"] += br
    row = {"id": rid, "src": src, "dst": dst, "bitrate": f"{br:g}", "path": "",
           "modulation": "", "first_slot": "", "slots": "", "accepted": 0, "reason": "",
           "arrival_s": f"{arr:.6f}", "holding_s": f"{hold:.6f}"}
    if status == 201:
        row.update(path="-".join(body["nodes"]), modulation=body["modulation"],
                   first_slot=body["first_slot"], slots=body["n_slots"], accepted=1)
        live[rid] = body["id"]
        heapq.heappush(heap, (arr + hold, DEPART, rid, rid))
    elif status == 409 and isinstance(body, dict) and body.get("reason") in reasons:
        row["reason"] = body["reason"]
        reasons[body["reason"]] += 1
        stats["blocked"] += 1
        stats["br_blocked"] += br
    else:
        raise RuntimeFailure(f"controller: request {rid} {src}->{dst}: {status} {body}")
    return row


def apply_event(ev: EventSpec, client: Client, live: dict[int, int],
                set_link: LinkSwitch | None, clock: Callable[[], float],
                sleep: Callable[[float], None], timeout_s: float) -> dict[str, Any]:
    """Apply one network event through the controller; its record (timings, lost and
    restored controller lightpath ids). A cut/repair with set_link is a data-plane
    port change the controller must notice; without it, and for slot blocks (which have
    no data-plane signal), POST /failures or /repairs."""
    if ev.kind in SLOT_EVENTS:
        return _slot_event(ev, client, live, clock)
    u, v = ev.link
    rec: dict[str, Any] = {"kind": ev.kind, "link": [u, v]}
    cut = ev.kind == "fiber_cut"
    before = _lightpaths(client)
    t_start = clock()
    if set_link is None:
        path = "/failures" if cut else "/repairs"
        status, body = client("POST", path, {"link": [u, v]})
        if status != 200:
            raise RuntimeFailure(f"controller: POST {path} {u}-{v}: {status} {body}")
        rec["via"] = "rest"
        if cut:
            rec["controller_restoration_s"] = body["restoration_s"]
    else:
        rec["link_set_monotonic_s"] = round(t_start, 6)  # the data plane's cut, clock()
        set_link(u, v, not cut)
        rec["via"] = "port_status"
        while True:  # /topology takes the core's lock: failed shows once restoration is done
            status, body = client("GET", "/topology", None)
            failed = next((f["failed"] for f in body["fibres"]
                           if {f["u"], f["v"]} == {u, v}), None)
            if failed is cut:
                break
            if clock() - t_start > timeout_s:
                raise RuntimeFailure(f"controller did not see fibre {u}-{v} "
                                     f"{'go down' if cut else 'come back'} within {timeout_s} s")
            sleep(0.002)
    rec["cut_to_restored_s" if cut else "repair_seen_s"] = round(clock() - t_start, 6)
    if cut:
        after = _lightpaths(client)
        hit = [i for i, lp in before.items() if _uses(lp["nodes"], u, v)]
        rec["lost"] = sorted(i for i in hit if i not in after)
        rec["restored"] = sorted(i for i in hit if i in after)
        for rid, lp_id in list(live.items()):
            if lp_id in rec["lost"]:
                del live[rid]
    return rec


def _slot_event(ev: EventSpec, client: Client, live: dict[int, int],
                clock: Callable[[], float]) -> dict[str, Any]:
    """wavelength_loss / wavelength_repair through POST /failures or /repairs with the
    slot block; a loss records the controller's restoration time and where each hit
    lightpath went (`moved`: route:first_slot+n_slots before and after)."""
    assert ev.link is not None and ev.first_slot is not None and ev.slots is not None
    u, v = ev.link
    loss = ev.kind == "wavelength_loss"
    rec: dict[str, Any] = {"kind": ev.kind, "link": [u, v], "first_slot": ev.first_slot,
                           "slots": ev.slots, "via": "rest"}
    before = _lightpaths(client) if loss else {}
    path = "/failures" if loss else "/repairs"
    t_start = clock()
    status, body = client("POST", path, {"link": [u, v], "first_slot": ev.first_slot,
                                         "slots": ev.slots})
    if status != 200:
        raise RuntimeFailure(f"controller: POST {path} {u}-{v} slots {ev.first_slot}"
                             f"+{ev.slots}: {status} {body}")
    rec["loss_to_restored_s" if loss else "repair_seen_s"] = round(clock() - t_start, 6)
    if not loss:
        rec["lost_slots"] = body.get("lost_slots", [])
        return rec
    rec["controller_restoration_s"] = body["restoration_s"]
    rec["lost"], rec["restored"] = sorted(body["lost"]), sorted(body["restored"])
    after = _lightpaths(client)
    rec["moved"] = [{"id": i, "from": _lp_text(before[i]), "to": _lp_text(after[i])}
                    for i in rec["restored"] if i in before and i in after]
    for rid, lp_id in list(live.items()):
        if lp_id in rec["lost"]:
            del live[rid]
    return rec


def _lp_text(lp: dict[str, Any]) -> str:
    return f"{'-'.join(lp['nodes'])}:{lp['first_slot']}+{lp['n_slots']}"


def _uses(nodes: list[str], u: str, v: str) -> bool:
    return any({a, b} == {u, v} for a, b in pairwise(nodes))


def _lightpaths(client: Client) -> dict[int, dict[str, Any]]:
    status, body = client("GET", "/lightpaths", None)
    if status != 200:
        raise RuntimeFailure(f"controller: GET /lightpaths: {status} {body}")
    return {lp["id"]: lp for lp in body["lightpaths"]}


def agreement(emu_rows: Sequence[dict[str, Any]], sim_rows: Sequence[dict[str, str]]
              ) -> dict[str, Any]:
    """Per request: same route, modulation, slots, accept and reason as the simulator?"""
    sim = {int(r["id"]): r for r in sim_rows}
    same, diff = 0, []
    for r in emu_rows:
        s = sim.get(int(r["id"]))
        if s is not None and all(str(r[k]) == str(s[k]) for k in COMPARED):
            same += 1
        else:
            diff.append(int(r["id"]))
    n = len(emu_rows)
    return {"requests": n, "same": same, "ratio": same / n if n else 1.0,
            "compared": list(COMPARED), "first_mismatches": diff[:10],
            "sim_requests": len(sim_rows)}


def requests_csv(rows: Sequence[dict[str, Any]]) -> str:
    """requests.csv text in the simulator's exact column order and number formats."""
    return ",".join(REQUESTS_COLUMNS) + "\n" + "".join(request_line(r) for r in rows)


def request_line(row: dict[str, Any]) -> str:
    """One requests.csv line (with its newline) of a replayed request."""
    return ",".join(str(row[c]) for c in REQUESTS_COLUMNS) + "\n"
