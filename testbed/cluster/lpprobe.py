"""Lightpath probes across machines: a one-machine run's probe rows, from every share.

A one-machine verification sends one scapy frame per lightpath direction and follows it
(testbed.emu.verify.run_probe): tagged with the lightpath's VLAN on every fibre of its
route, in order, each fibre holding it for its emulated delay, and delivered to the far
host in time. Across machines the driver asks the share holders (testbed.cluster.lpwatch,
over `hold correct` and each holder's control socket) to watch every fibre and far host
of every probe, then the source machines to send, then every machine for what it saw;
probes that failed go round again under fresh tokens (up to CLUSTER_TRIES rounds; a
one-machine probe is retried PROBE_TRIES times, each try a frame, where a round here costs
two SSH steps per machine). The rows have the one-machine shape, plus where each end ran:

- a fibre's delay (entry -> exit stamps in its middle node) is taken on one machine, on
  one clock, for every fibre, crossing or not;
- the route (every fibre seen with the lightpath's tag) is checked everywhere; the order
  is checked among the fibres of each machine (stamps of one clock), and across machines
  by the route's order;
- the end-to-end one-way time needs the two ends' clocks, so it is measured and checked
  only where both hosts are on one machine (`one_way_checked`); elsewhere the DC pair's
  RTT check stands for it.
"""

from __future__ import annotations

import itertools
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from testbed.cluster.lpwatch import GAP_MS_MAX, WAIT_S_MAX
from testbed.emu.plan import EmuPlan
from testbed.emu.probes import ProbeResult
from testbed.emu.verify import (
    ProbeJob,
    fibres_in_time,
    path_in_time,
    path_tolerance_ms,
    probe_jobs,
)

GAP_MS = 5.0          # between two probes sent from one machine
WATCH_TIMEOUT_S = 120.0
CLUSTER_TRIES = 3     # rounds at most (each costs two SSH steps per machine)
assert GAP_MS <= GAP_MS_MAX


@dataclass(frozen=True)
class PlacedProbe:
    """One lightpath direction, where its parts run, and its token."""

    job: ProbeJob
    token: str
    src_host: str
    dst_host: str
    src_machine: str
    dst_machine: str
    middles: tuple[str, ...]          # the route's fibres' middle nodes, in order
    middle_machine: tuple[str, ...]   # the machine of each
    froms: tuple[str, ...]            # the optical node each fibre is entered from


def place_probes(plan: EmuPlan, placement: Any,
                 token: Callable[[], str] = lambda: secrets.token_hex(8)
                 ) -> list[PlacedProbe]:
    """Both directions of every lightpath, each with its machines and a fresh token."""
    first = {}
    for h in plan.hosts:
        first.setdefault(h.dc, h.name)
    out = []
    for job in probe_jobs(plan):
        fibres = [plan.fibre(u, v) for u, v in itertools.pairwise(job.path)]
        out.append(PlacedProbe(
            job, token(), first[job.src_dc], first[job.dst_dc],
            placement.dc_machine[job.src_dc], placement.dc_machine[job.dst_dc],
            tuple(f.middle for f in fibres),
            tuple(placement.node_machine[f.middle] for f in fibres),
            tuple(job.path[:-1])))
    return out


def requests(probes: Sequence[PlacedProbe]) -> tuple[dict[str, dict[str, Any]],
                                                     dict[str, dict[str, Any]]]:
    """(watch body per machine, send body per machine) for one round of probes."""
    watch: dict[str, list[dict[str, Any]]] = {}
    send: dict[str, list[dict[str, Any]]] = {}
    for p in probes:
        vlan = p.job.lp.vlan
        here: dict[str, list[dict[str, str]]] = {}
        for mid, mach, frm in zip(p.middles, p.middle_machine, p.froms, strict=True):
            here.setdefault(mach, []).append({"middle": mid, "from": frm})
        here.setdefault(p.dst_machine, [])
        for mach, fibres in here.items():
            watch.setdefault(mach, []).append(
                {"token": p.token, "vlan": vlan, "fibres": fibres,
                 "dst_host": p.dst_host if mach == p.dst_machine else None})
        send.setdefault(p.src_machine, []).append(
            {"token": p.token, "vlan": vlan, "src_host": p.src_host, "dst_host": p.dst_host})
    return ({m: {"probes": w, "timeout_s": WATCH_TIMEOUT_S} for m, w in watch.items()},
            {m: {"probes": s, "gap_ms": GAP_MS} for m, s in send.items()})


def collect_wait_s(probes: Sequence[PlacedProbe]) -> float:
    """How long a machine waits for the probes it watches: twice the longest one-way
    delay plus 2 s, within the holder's bound."""
    longest = max((p.job.lp.delay_ms for p in probes), default=0.0)
    return min(WAIT_S_MAX, 2.0 + 2 * longest / 1000.0)


def compose(plan: EmuPlan, p: PlacedProbe, sent: Mapping[str, float],
            got: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """One probe's row (the one-machine shape, testbed.emu.verify.run_probe) from the
    source machine's send times and every machine's collect reply (by machine)."""
    tok, vlan = p.token, p.job.lp.vlan
    entry: dict[str, float] = {}
    exits: dict[str, float] = {}
    emulated: dict[str, float] = {}
    tags_ok = True
    for mid, mach in zip(p.middles, p.middle_machine, strict=True):
        reply = got.get(mach) or {}
        seen = (reply.get("seen") or {}).get(tok) or {}
        try:
            if mid in seen:
                stamp, tag = seen[mid]
                entry[mid] = float(stamp)
                tags_ok = tags_ok and tag == vlan
            left = (reply.get("left") or {}).get(tok) or {}
            if mid in left:
                exits[mid] = float(left[mid])
        except (TypeError, ValueError):  # a malformed reply reads as not seen there
            entry.pop(mid, None)
        em = ((reply.get("emulated_ms") or {}).get(tok) or {}).get(mid)
        if isinstance(em, int | float):
            emulated[mid] = float(em)
    arrived_at = ((got.get(p.dst_machine) or {}).get("arrived") or {}).get(tok)
    t_send = sent.get(tok)
    delivered = arrived_at is not None
    # Order: the fibres seen on one machine must have been entered in the route's order
    # (stamps of one clock). hops_seen keeps each machine's slots of the route and fills
    # them in that machine's stamp order, so a swap shows where it happened.
    hops_seen = [m for m in p.middles if m in entry]
    where = dict(zip(p.middles, p.middle_machine, strict=True))
    by_stamp = {mach: iter(sorted((m for m in hops_seen if where[m] == mach),
                                  key=lambda m: entry[m])) for mach in set(where.values())}
    seen_order = [next(by_stamp[where[m]]) for m in hops_seen]
    in_order = seen_order == hops_seen
    same_clock = p.src_machine == p.dst_machine
    one_way = ((float(arrived_at) - t_send) * 1000.0
               if same_clock and delivered and t_send is not None else None)
    hop_ms = ([round((entry[m] - t_send) * 1000.0, 3) for m in hops_seen]
              if t_send is not None and all(mm == p.src_machine for m, mm in
                                            zip(p.middles, p.middle_machine, strict=True)
                                            if m in entry) else None)
    fibre_ms = {m: round((exits[m] - entry[m]) * 1000.0, 3) for m in hops_seen if m in exits}
    hs, hd = plan.host(p.src_host), plan.host(p.dst_host)
    res = ProbeResult(vlan, hs.ip.split("/")[0], hd.ip.split("/")[0], delivered, one_way,
                      p.job.lp.delay_ms, seen_order, list(p.middles), tags_ok, hop_ms,
                      fibre_ms)
    route_ok = res.ok and in_order
    in_time = (fibres_in_time(res, plan, p.job.path, emulated)
               and (not same_clock or path_in_time(res, plan, p.job.path, emulated)))
    return {**asdict(res), "src_host": p.src_host, "dst_host": p.dst_host,
            "src_machine": p.src_machine, "dst_machine": p.dst_machine,
            "fibre_machines": where,
            "one_way_checked": same_clock,
            "tolerance_ms": round(path_tolerance_ms(p.job.lp.delay_ms, len(p.middles)), 3),
            "route_ok": route_ok, "delay_ok": in_time, "ok": route_ok and in_time}


Step = Callable[[str, dict[str, Any]], dict[str, Any]]  # (machine, request) -> reply


def one_round(batch: Sequence[PlacedProbe], step: Step,
              side_by_side: Callable[[Sequence[str], Callable[[str], Any]], list[Any]]
              ) -> tuple[dict[str, float], dict[str, dict[str, Any]]]:
    """Watch on every machine concerned, send from the sources, collect everywhere: (send
    times by token, collect replies by machine)."""
    watch, send = requests(batch)
    side_by_side(sorted(watch), lambda m: _ok(m, step(m, {"probe_watch": watch[m]})))
    # Every machine watches now: each sends its own probes and collects what it saw.
    wait_s = collect_wait_s(batch)
    ms = sorted(set(watch) | set(send))
    got = dict(zip(ms, side_by_side(ms, lambda m: _ok(m, step(m, {"probe_run": {
        "probes": send.get(m, {}).get("probes", []), "gap_ms": GAP_MS, "wait_s": wait_s}}))),
        strict=True))
    sent: dict[str, float] = {}
    for reply in got.values():
        sent.update(reply.get("sent") or {})
    return sent, got


def run_probes(plan: EmuPlan, placement: Any, step: Step,
               side_by_side: Callable[[Sequence[str], Callable[[str], Any]], list[Any]],
               tries: int = CLUSTER_TRIES) -> dict[str, Any]:
    """Every lightpath direction probed across the machines (rounds until each is ok, at
    most `tries`); the record: rows in plan order, routes_ok, delays_ok, rounds, took_s.

    step(machine, request) relays one request to that machine's holder and returns its
    reply (RuntimeFailure naming the machine when it cannot); side_by_side(machines, fn)
    runs fn on each machine at once and returns the results in order."""
    t0 = time.monotonic()
    probes = place_probes(plan, placement)
    rows: dict[int, dict[str, Any]] = {}
    todo = list(range(len(probes)))
    rounds = 0
    while todo and rounds < tries:
        rounds += 1
        batch = [probes[i] for i in todo]
        sent, got = one_round(batch, step, side_by_side)
        for i, p in zip(todo, batch, strict=True):
            rows[i] = compose(plan, p, sent, got) | {"rounds": rounds}
        todo = [i for i in todo if not rows[i]["ok"]]
        if todo:  # a fresh token for each retried probe (nothing of the last round counts)
            probes = [replace(p, token=secrets.token_hex(8)) if i in todo else p
                      for i, p in enumerate(probes)]
    out = [rows[i] for i in range(len(probes))]
    return {"probes": out, "routes_ok": all(r["route_ok"] for r in out),
            "delays_ok": all(r["delay_ok"] for r in out), "rounds": rounds,
            "took_s": round(time.monotonic() - t0, 3),
            "one_way_checked": sum(1 for r in out if r["one_way_checked"])}


def _ok(machine: str, reply: dict[str, Any]) -> dict[str, Any]:
    from testbed.errors import RuntimeFailure

    if not reply.get("ok"):
        raise RuntimeFailure(f"machine {machine}: lightpath probes: "
                             f"{str(reply.get('error', 'refused'))[:300]}")
    return reply


def probe_words(row: Mapping[str, Any]) -> str:
    """A probe row as one line for the console."""
    d = row.get("fibre_delay_ms") or {}
    where = f"{row['src_machine']} -> {row['dst_machine']}"
    if not row["route_ok"]:
        return (f"lightpath VLAN {row['vlan']} {row['src_host']} -> {row['dst_host']} "
                f"({where}): OFF ITS ROUTE (seen on {len(row['hops_seen'])}/"
                f"{len(row['hops_expected'])} fibres, delivered {row['delivered']}, tags "
                f"{'right' if row['tag_ok'] else 'wrong'})")
    one_way = (f"; one way {row['one_way_ms']:.2f} ms" if row.get("one_way_ms") is not None
               else "")
    return (f"lightpath VLAN {row['vlan']} {row['src_host']} -> {row['dst_host']} ({where}): "
            f"{len(d)} fibre(s) {'within' if row['delay_ok'] else 'OUTSIDE'} their delays"
            f"{one_way}")
