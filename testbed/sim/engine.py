"""Event loop for dynamic lightpath traffic: arrivals, departures, fibre/slot events.

Requests stream in (Poisson or a trace); each is routed on the first of its k
candidate paths with a fitting block under the spectrum policy, held for its
holding time, then released. Network events cut or repair fibres and slot blocks;
lightpaths they hit are re-routed (restored) or lost. The hot loop works directly on
the OpticalNetwork's int bitmaps and keeps nothing per finished request in memory:
one requests.csv row is streamed per request. Runs without network events under first
or last fit take the compiled loop of testbed.sim.rmsa_kernel (numba) when numba is
installed, with the same records; the Python loops stay the reference and the fallback.
"""

from __future__ import annotations

import heapq
import logging
import math
import random
import time
from collections.abc import Callable, Iterator
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np

from testbed.errors import InputError
from testbed.optical.modulation import slots_for
from testbed.optical.network import NO_PATH, NO_REACH, NO_SPECTRUM, OpticalNetwork, PathInfo
from testbed.optical.spectrum import choose_start, shift_plan
from testbed.progress import progress
from testbed.runs.rundir import RecordStream
from testbed.sim.requests import (
    BATCH_REQUESTS,
    Request,
    count_trace_rows,
    poisson_requests,
    read_request_trace,
)
from testbed.sim.stats import batch_means_ci95, batch_sizes
from testbed.spec.faults import network_events, sim_fault_rows
from testbed.spec.models import EventSpec, LightpathRequestsWorkload, Scenario

log = logging.getLogger(__name__)

REQUESTS_COLUMNS = ("id", "src", "dst", "bitrate", "path", "modulation", "first_slot",
                    "slots", "accepted", "reason", "arrival_s", "holding_s")
DEFAULT_BATCHES = 20
FLUSH_S = 0.5  # requests.csv reaches the OS at least this often (the loop runs ~1e5/s)

# A candidate: (spectra, n_slots, shifts, path, "a-b-c", modulation)
_Cand = tuple[tuple[int, ...], int, tuple[int, ...], PathInfo, str, str]


class _Router:
    """Per (src, dst, bitrate) candidate tables over an OpticalNetwork, rebuilt on cuts."""

    def __init__(self, net: OpticalNetwork, policy: str, rng: random.Random) -> None:
        self.net = net
        self.policy = policy
        self.rng = rng
        self.version = net.paths_version
        self.tables: dict[tuple[str, str, float], tuple[list[_Cand], str]] = {}
        # per (src, dst): (path, up, "a-b-c"); per (bitrate, gbps_per_slot): slots needed;
        # per (src, dst, slots needed on each route): the table, shared by the bitrates
        # that need the same slots (76 bitrates x 182 pairs: 13,832 keys, 1,274 tables)
        self.routes: dict[tuple[str, str], list[tuple[PathInfo, bool, str]]] = {}
        self.slots_memo: dict[tuple[float, float], int] = {}
        self.shared: dict[tuple[str, str, tuple[int, ...]], tuple[list[_Cand], str]] = {}

    def table(self, src: str, dst: str, bitrate: float) -> tuple[list[_Cand], str]:
        if self.version != self.net.paths_version:
            self.tables.clear()
            self.routes.clear()
            self.shared.clear()
            self.version = self.net.paths_version
        key = (src, dst, bitrate)
        got = self.tables.get(key)
        if got is None:
            got = self.tables[key] = self._build(src, dst, bitrate)
        return got

    def _build(self, src: str, dst: str, bitrate: float) -> tuple[list[_Cand], str]:
        net = self.net
        routes = self.routes.get((src, dst))
        if routes is None:
            routes = self.routes[(src, dst)] = [(p, net.path_up(p), "-".join(p.nodes))
                                                for p in net.candidate_paths(src, dst)]
        memo = self.slots_memo
        needs: list[int] = []
        for p, up, _ in routes:
            if not up or p.modulation is None:  # (slots_needed is None: out of reach)
                needs.append(0)
                continue
            n = memo.get((bitrate, p.gbps_per_slot))
            if n is None:
                n = net.slots_needed(bitrate, p)
                assert n is not None
                memo[(bitrate, p.gbps_per_slot)] = n
            needs.append(n)
        key = (src, dst, tuple(needs))
        got = self.shared.get(key)
        if got is None:
            got = self.shared[key] = self._candidates(routes, needs)
        return got

    def _candidates(self, routes: list[tuple[PathInfo, bool, str]], needs: list[int]
                    ) -> tuple[list[_Cand], str]:
        cands: list[_Cand] = []
        reason = NO_PATH
        for (p, up, label), n in zip(routes, needs, strict=True):
            if not up:
                continue
            if p.modulation is None:
                reason = NO_REACH if reason == NO_PATH else reason
                continue
            reason = NO_SPECTRUM
            if n <= self.net.slots:
                cands.append((p.spectra, n, shift_plan(n), p, label, p.modulation))
        return cands, reason

    def place(self, src: str, dst: str, bitrate: float) -> tuple[_Cand, int] | str:
        """Find (candidate, first_slot) without holding it, or the block reason."""
        cands, reason = self.table(src, dst, bitrate)
        busy, full = self.net.slot_masks()[1], self.net.full
        for cand in cands:
            b = 0
            for s in cand[0]:
                b |= busy[s]
            first = choose_start(full & ~b, cand[1], self.policy, self.rng)
            if first is not None:
                return cand, first
        return reason


def _endpoints(scenario: Scenario, net: OpticalNetwork) -> list[str]:
    wl = scenario.workload
    assert isinstance(wl, LightpathRequestsWorkload)
    if wl.endpoints == "dcs":
        return [dc.node for dc in scenario.dcs]
    return list(net.topology.nodes)


def request_stream(scenario: Scenario, net: OpticalNetwork) -> tuple[Iterator[Request], int]:
    """The scenario's requests (trace file or seeded Poisson) and how many there are."""
    wl = scenario.workload
    if not isinstance(wl, LightpathRequestsWorkload):
        raise InputError("workload.kind", f"the lightpath simulator needs lightpath_requests, "
                         f"got {wl.kind}")
    if wl.trace is not None:
        return read_request_trace(wl.trace, set(net.topology.nodes)), count_trace_rows(wl.trace)
    # (no rng: the stream draws from its own random.Random(wl.seed), in numpy batches)
    return poisson_requests(wl, _endpoints(scenario, net)), wl.requests


def simulate_lightpaths(scenario: Scenario, requests_csv: Path | RecordStream | None = None,
                        quiet: bool = True, batches: int = DEFAULT_BATCHES) -> dict[str, Any]:
    """Run the scenario's lightpath traffic; stream requests.csv (a path, or an open
    RecordStream of a run directory, handed to the OS every half second); return the
    summary dict."""
    wall0 = time.perf_counter()
    net = OpticalNetwork.from_scenario(scenario)
    stream, total = request_stream(scenario, net)
    wl = scenario.workload
    assert isinstance(wl, LightpathRequestsWorkload)
    policy = scenario.policy.spectrum
    router = _Router(net, policy, random.Random(f"{wl.seed}:spectrum"))
    out: RecordStream | None = None
    if isinstance(requests_csv, RecordStream):
        out = requests_csv
    elif requests_csv is not None:
        out = RecordStream(Path(requests_csv), REQUESTS_COLUMNS, flush_s=FLUSH_S,
                           buffer_bytes=1 << 20)
    events = network_events(scenario.events)
    kernel = None
    if not events and policy in ("first_fit", "last_fit"):
        import testbed.sim.rmsa_kernel as rk  # (numba only if its module must be built)

        kernel = rk.load()
    try:
        with progress(total, "simulating requests", quiet) as bar:
            if kernel is not None:
                tables, source = _sources(scenario, net, stream)
                stats = _loop_compiled(net, tables, source, total, policy == "last_fit",
                                       out, bar, batches)
            else:
                stats = _loop(net, router, stream, total, events, out, bar, batches)
    finally:
        if out is not None and out is not requests_csv:
            out.close()
    wall = time.perf_counter() - wall0
    return _summary(scenario, net, stats, wall)


TICK = 4096  # requests between progress-bar advances (and requests.csv flush checks)


class _Marks:
    """What the Python loops do only now and then, at marks of the request count: a
    batch's end (its blocking ratio, for the batch-means interval) and every TICK
    requests (the progress bar, requests.csv's flush). A loop calls `mark` when its
    count reaches `due` (one comparison per request) and `finish` after its last."""

    def __init__(self, total: int, n_batches: int, bar: Any, out: RecordStream | None
                 ) -> None:
        self.total = total
        self.sizes = batch_sizes(total, n_batches) if total else []
        self.ratios: list[float] = []  # blocking ratio per batch, in order
        self._bar, self._out = bar, out
        self._b = 0  # the current batch
        self._b_start = 0  # requests before it
        self._b_end = self.sizes[0] if self.sizes else -1  # requests at its end (-1: none)
        self._b_blocked = 0  # requests blocked before it
        self._ticked = 0  # requests the bar has been told of
        self.due = self._next()

    def _next(self) -> int:
        tick = self._ticked + TICK
        return tick if self._b_end < 0 else min(tick, self._b_end)

    def mark(self, n_req: int, n_blocked: int) -> int:
        """At request count `due`: close the batch or advance the bar; the next `due`."""
        if n_req == self._b_end:
            self.ratios.append((n_blocked - self._b_blocked) / self.sizes[self._b])
            self._b += 1
            self._b_start, self._b_blocked = n_req, n_blocked
            self._b_end = n_req + self.sizes[self._b] if self._b < len(self.sizes) else -1
        if n_req == self._ticked + TICK:
            self._bar.advance(TICK)
            self._ticked = n_req
            if self._out is not None:
                self._out.tick()  # complete lines reach the file every FLUSH_S
        self.due = self._next()
        return self.due

    def finish(self, n_req: int, n_blocked: int) -> list[float]:
        """After the last request: the bar told, a batch cut short kept; the ratios."""
        self._bar.advance(n_req - self._ticked)
        if n_req != self.total:  # a trace whose row count changed under us; keep what ran
            log.warning("expected %d requests, simulated %d", self.total, n_req)
        if self._b_end > 0 and n_req > self._b_start:
            self.ratios.append((n_blocked - self._b_blocked) / (n_req - self._b_start))
        return self.ratios


def _loop(net: OpticalNetwork, router: _Router, stream: Iterator[Request], total: int,
          events: list[EventSpec], out: RecordStream | None, bar: Any, n_batches: int
          ) -> dict[str, Any]:
    if not events:
        return _loop_plain(net, router, stream, total, out, bar, n_batches)
    occ, busy, blocked_m = net.slot_masks()
    full = net.full
    first_fit = router.policy == "first_fit"
    last_fit = router.policy == "last_fit"
    table = router.table
    write = out.fh.write if out is not None else None  # (RecordStream.write_line, unwrapped)
    push, pop = heapq.heappush, heapq.heappop
    heap: list[tuple[float, int, list[Any]]] = []  # (departure_s, id, live entry)
    inf = math.inf
    ev_i, next_ev = 0, (events[0].at_s if events else inf)
    marks = _Marks(total, n_batches, bar, out)
    due = marks.due
    used = 0  # sum over live lightpaths of slots x spectra
    area = 0.0  # time integral of used
    last_t = 0.0
    n_req = n_blocked = 0
    br_req = br_blocked = 0.0
    reasons = {NO_PATH: 0, NO_REACH: 0, NO_SPECTRUM: 0}
    lost = restored = applied = 0
    brs: dict[float, str] = {}
    t = 0.0

    for rid, t, hold, src, dst, br in stream:
        # Departures and network events up to this arrival, in time order.
        while True:
            nd = heap[0][0] if heap else inf
            if nd <= t and nd <= next_ev:
                _, _, e = pop(heap)
                if e[0] is None:  # lost to a failure earlier
                    continue
                area += used * (nd - last_t)
                last_t = nd
                m = e[1]
                for s in e[0]:
                    o = occ[s] & ~m
                    occ[s] = o
                    busy[s] = o | blocked_m[s]
                used -= e[2]
            elif next_ev <= t:
                area += used * (next_ev - last_t)
                last_t = next_ev
                d_used, d_lost, d_rest = _apply_event(net, router, heap, events[ev_i])
                used += d_used
                lost += d_lost
                restored += d_rest
                applied += 1
                ev_i += 1
                next_ev = events[ev_i].at_s if ev_i < len(events) else inf
            else:
                break
        area += used * (t - last_t)
        last_t = t

        # Route and assign spectrum.
        key = (src, dst, br)
        got = router.tables.get(key) if router.version == net.paths_version else None
        if got is None:
            got = table(src, dst, br)
        cands, reason = got
        chosen = None
        for cand in cands:
            b = 0
            for s in cand[0]:
                b |= busy[s]
            x = full & ~b
            if first_fit or last_fit:
                for sh in cand[2]:
                    x &= x >> sh
                if not x:
                    continue
                first = (x & -x).bit_length() - 1 if first_fit else x.bit_length() - 1
            else:
                f = choose_start(x, cand[1], router.policy, router.rng)
                if f is None:
                    continue
                first = f
            chosen = cand
            break
        brs_s = brs.get(br)
        if brs_s is None:
            brs_s = brs[br] = f"{br:g}"
        n_req += 1
        br_req += br
        if chosen is not None:
            spectra, n = chosen[0], chosen[1]
            m = ((1 << n) - 1) << first
            for s in spectra:
                occ[s] |= m
                busy[s] |= m
            cost = n * len(spectra)
            used += cost
            push(heap, (t + hold, rid, [spectra, m, cost, src, dst, br, chosen[3]]))
            if write is not None:
                write(f"{rid},{src},{dst},{brs_s},{chosen[4]},{chosen[5]},{first},{n},1,,"
                      f"{t:.6f},{hold:.6f}\n")
        else:
            n_blocked += 1
            br_blocked += br
            reasons[reason] += 1
            if write is not None:
                write(f"{rid},{src},{dst},{brs_s},,,,,0,{reason},{t:.6f},{hold:.6f}\n")
        if n_req == due:
            due = marks.mark(n_req, n_blocked)
    batch_ratios = marks.finish(n_req, n_blocked)
    return {"requests": n_req, "blocked": n_blocked, "bitrate_requested_gbps": br_req,
            "bitrate_blocked_gbps": br_blocked, "reasons": reasons, "batch_ratios": batch_ratios,
            "slot_time_area": area, "end_s": last_t, "lost": lost, "restored": restored,
            "events_applied": applied, "events_total": len(events), "live_at_end": len(
                [1 for e in heap if e[2][0] is not None])}


def _loop_plain(net: OpticalNetwork, router: _Router, stream: Iterator[Request], total: int,
                out: RecordStream | None, bar: Any, n_batches: int) -> dict[str, Any]:
    """_loop for a run without network events, the same results (requests.csv, summary)
    with less work per request: no slot is ever out of service, so only the busy bitmaps
    are kept (the occupied ones are set equal at the end), departures are immutable
    tuples (nothing re-routes them) and the next departure time is held in a local."""
    occ, busy, _ = net.slot_masks()
    full = net.full
    policy = router.policy
    first_fit = policy == "first_fit"
    last_fit = policy == "last_fit"
    tables, table = router.tables, router.table  # paths_version never changes here
    write = out.fh.write if out is not None else None  # (RecordStream.write_line, unwrapped)
    push, pop = heapq.heappush, heapq.heappop
    heap: list[tuple[float, int, tuple[int, ...], int, int]] = []  # (departure_s, id, spectra,
    inf = math.inf                                                  # slot mask, slot-fibres)
    next_dep = inf  # heap[0][0], or inf when empty
    marks = _Marks(total, n_batches, bar, out)
    due = marks.due
    used = 0  # sum over live lightpaths of slots x spectra
    area = 0.0  # time integral of used
    last_t = 0.0
    n_req = n_blocked = 0
    br_req = br_blocked = 0.0
    reasons = {NO_PATH: 0, NO_REACH: 0, NO_SPECTRUM: 0}
    brs: dict[float, str] = {}
    first = 0

    for rid, t, hold, src, dst, br in stream:
        if next_dep <= t:  # departures up to this arrival, in time order
            while True:
                _, _, spectra, m, cost = pop(heap)
                area += used * (next_dep - last_t)
                last_t = next_dep
                m = ~m
                for s in spectra:
                    busy[s] &= m
                used -= cost
                next_dep = heap[0][0] if heap else inf
                if next_dep > t:
                    break
        area += used * (t - last_t)
        last_t = t

        got = tables.get((src, dst, br))
        if got is None:
            got = table(src, dst, br)
        n_req += 1
        br_req += br
        for cand in got[0]:
            b = 0
            for s in cand[0]:
                b |= busy[s]
            x = full & ~b
            if first_fit or last_fit:
                for sh in cand[2]:
                    x &= x >> sh
                if not x:
                    continue
                first = (x & -x).bit_length() - 1 if first_fit else x.bit_length() - 1
            else:
                f = choose_start(x, cand[1], policy, router.rng)
                if f is None:
                    continue
                first = f
            spectra, n = cand[0], cand[1]  # accepted on this candidate
            m = ((1 << n) - 1) << first
            for s in spectra:
                busy[s] |= m
            cost = n * len(spectra)
            used += cost
            dep = t + hold
            push(heap, (dep, rid, spectra, m, cost))
            if dep < next_dep:
                next_dep = dep
            if write is not None:
                brs_s = brs.get(br)
                if brs_s is None:
                    brs_s = brs[br] = f"{br:g}"
                write(f"{rid},{src},{dst},{brs_s},{cand[4]},{cand[5]},{first},{n},1,,"
                      f"{t:.6f},{hold:.6f}\n")
            break
        else:  # blocked
            reason = got[1]
            n_blocked += 1
            br_blocked += br
            reasons[reason] += 1
            if write is not None:
                brs_s = brs.get(br)
                if brs_s is None:
                    brs_s = brs[br] = f"{br:g}"
                write(f"{rid},{src},{dst},{brs_s},,,,,0,{reason},{t:.6f},{hold:.6f}\n")
        if n_req == due:
            due = marks.mark(n_req, n_blocked)
    batch_ratios = marks.finish(n_req, n_blocked)
    occ[:] = busy  # nothing out of service: occupied == busy
    return {"requests": n_req, "blocked": n_blocked, "bitrate_requested_gbps": br_req,
            "bitrate_blocked_gbps": br_blocked, "reasons": reasons, "batch_ratios": batch_ratios,
            "slot_time_area": area, "end_s": last_t, "lost": 0, "restored": 0,
            "events_applied": 0, "events_total": 0, "live_at_end": len(heap)}


class _PairTables:
    """Candidate routes per (src, dst) pair as flat arrays for the compiled loop: pair p
    lists routes pair_start[p] .. + pair_len[p] (the network's candidate paths, in its
    order); route q is on the spectra sp[route_s0[q]:route_s1[q]] with format route_fmt[q]
    (-1: cut, or out of every format's reach), and a bitrate of index b needs
    need[route_fmt[q], b] slots there (0: more than the grid has). The same candidates,
    slots and block reason as _Router's tables; pairs are added as requests first need
    them (their order matters: a pair's routes are its reverse's reversed when that one
    came first, and equal-length routes keep that order) and bitrates as they appear."""

    REASONS = (NO_PATH, NO_REACH, NO_SPECTRUM)

    def __init__(self, net: OpticalNetwork, bitrates: list[float]) -> None:
        self.net = net
        self.bitrates: list[float] = []
        self.br_index: dict[float, int] = {}
        self.formats: dict[float, int] = {}  # gbps_per_slot -> format index
        self.pid_of: dict[tuple[str, str], int] = {}
        self.routes: list[tuple[str, str | None]] = []  # ("a-b-c", modulation) per route
        self.reasons: list[str] = []
        self._start: list[int] = []
        self._len: list[int] = []
        self._reason: list[int] = []
        self._fmt: list[int] = []
        self._s0: list[int] = []
        self._s1: list[int] = []
        self._sp: list[int] = []
        self._arrays: tuple[np.ndarray, ...] | None = None
        # need[format, bitrate index], grown by doubling: a trace may bring a new
        # bitrate on every row, and each costs one column, not a new array
        self._need = np.zeros((4, 64), np.int32)
        for br in bitrates:
            self.bri(br)

    def _slots(self, bitrate: float, gbps_per_slot: float) -> int:
        n = slots_for(bitrate, gbps_per_slot, self.net.guard_slots)
        return n if n <= self.net.slots else 0  # (0: not a candidate, as _candidates)

    def bri(self, bitrate: float) -> int:
        got = self.br_index.get(bitrate)
        if got is None:
            got = self.br_index[bitrate] = len(self.bitrates)
            self.bitrates.append(bitrate)
            rows, cols = self._need.shape
            if got >= cols:
                self._need = np.concatenate([self._need, np.zeros((rows, cols), np.int32)],
                                            axis=1)
                self._arrays = None
            for g, f in self.formats.items():
                self._need[f, got] = self._slots(bitrate, g)
        return got

    def _format(self, gbps_per_slot: float) -> int:
        got = self.formats.get(gbps_per_slot)
        if got is None:
            got = self.formats[gbps_per_slot] = len(self.formats)
            rows, cols = self._need.shape
            if got >= rows:
                self._need = np.concatenate([self._need, np.zeros((rows, cols), np.int32)])
            for b, br in enumerate(self.bitrates):
                self._need[got, b] = self._slots(br, gbps_per_slot)
            self._arrays = None
        return got

    def pid(self, src: str, dst: str) -> int:
        got = self.pid_of.get((src, dst))
        if got is not None:
            return got
        net = self.net
        got = self.pid_of[(src, dst)] = len(self._start)
        paths = net.candidate_paths(src, dst)
        self._start.append(len(self.routes))
        self._len.append(len(paths))
        reason = NO_PATH  # as _Router._candidates: it does not depend on the bitrate
        for p in paths:
            self.routes.append(("-".join(p.nodes), p.modulation))
            fmt = -1
            if net.path_up(p):
                if p.modulation is None:
                    reason = NO_REACH if reason == NO_PATH else reason
                else:
                    reason = NO_SPECTRUM
                    fmt = self._format(p.gbps_per_slot)
            self._fmt.append(fmt)
            self._s0.append(len(self._sp))
            self._sp.extend(p.spectra)
            self._s1.append(len(self._sp))
        self._reason.append(self.REASONS.index(reason))
        self.reasons.append(reason)
        self._arrays = None
        return got

    def arrays(self) -> tuple[np.ndarray, ...]:
        if self._arrays is None:
            i32 = np.int32
            self._arrays = (np.array(self._start, i32), np.array(self._len, i32),
                            np.array(self._reason, i32), np.array(self._fmt, i32),
                            np.array(self._s0, i32), np.array(self._s1, i32),
                            np.array(self._sp or [0], i32), self._need)
        return self._arrays


# A trace's chunk of requests: (ids, arrival_s, holding_s, src names, dst names, bitrates)
# as lists, called only when rows are written, and the kernel's columns (arrival_s,
# holding_s, pair id, bitrate index, bitrate_gbps)
_Chunk = tuple[Callable[[], tuple[list[Any], ...]], np.ndarray, np.ndarray, np.ndarray,
               np.ndarray, np.ndarray]

GEN_CHUNK = 1 << 16  # Poisson requests drawn and run per kernel call


class _PoissonSource:
    """The scenario's seeded Poisson stream, drawn inside the compiled loop: the
    generator state of random.Random(seed), the endpoints and the bitrates."""

    def __init__(self, wl: LightpathRequestsWorkload, ends: list[str]) -> None:
        self.wl = wl
        self.ends = ends
        self.total = wl.requests


def _sources(scenario: Scenario, net: OpticalNetwork, stream: Iterator[Request]
             ) -> tuple[_PairTables, _PoissonSource | Iterator[_Chunk]]:
    """The pair tables and the scenario's requests for the compiled loop: the seeded
    Poisson stream as its generator state (`stream`, the same draws, is left unread), a
    trace in chunks of its rows."""
    wl = scenario.workload
    assert isinstance(wl, LightpathRequestsWorkload)
    if wl.trace is not None:
        tables = _PairTables(net, [])
        return tables, _trace_chunks(stream, tables)
    return _PairTables(net, list(wl.bitrate_gbps)), _PoissonSource(wl, _endpoints(scenario,
                                                                                   net))


def _trace_chunks(stream: Iterator[Request], tables: _PairTables) -> Iterator[_Chunk]:
    pid, bri = tables.pid, tables.bri
    while True:
        rows = list(islice(stream, BATCH_REQUESTS))
        if not rows:
            return
        cols = tuple(list(c) for c in zip(*rows, strict=True))
        pids = [pid(a, b) for a, b in zip(cols[3], cols[4], strict=True)]
        bris = [bri(br) for br in cols[5]]
        yield ((lambda cols=cols: cols), np.array(cols[1], np.float64),
               np.array(cols[2], np.float64), np.array(pids, np.int32),
               np.array(bris, np.int32), np.array(cols[5], np.float64))


def _loop_compiled(net: OpticalNetwork, tables: _PairTables,
                   source: _PoissonSource | Iterator[_Chunk], total: int, last_fit: bool,
                   out: RecordStream | None, bar: Any, n_batches: int) -> dict[str, Any]:
    """_loop_plain for first_fit / last_fit with the request loop compiled
    (testbed.sim.rmsa_kernel): the same records and summary. A Poisson stream is drawn in
    the kernel (its pair tables built first, in the order the stream first needs them);
    requests.csv rows are written here, from the columns and choices the kernel hands
    back for each chunk."""
    import testbed.sim.rmsa_kernel as rk

    kernel = rk.load()
    assert kernel is not None
    run = kernel.run
    occ, busy_bits, _ = net.slot_masks()
    slots, n_spectra = net.slots, net.n_spectra
    n_words = max(1, -(-slots // rk.WORD_BITS))
    word = (1 << rk.WORD_BITS) - 1
    busy = np.array([[m >> (rk.WORD_BITS * w) & word for w in range(n_words)]
                     for m in busy_bits], np.uint64).reshape(n_spectra, n_words)
    uni = np.zeros(n_words, np.uint64)
    cap = slots * n_spectra + 1  # a live lightpath holds >= 1 slot of >= 1 spectrum
    heap_t = np.empty(cap, np.float64)
    heap_v = np.empty(cap, np.int64)
    st_i, st_f = rk.new_state()
    sizes = np.array(batch_sizes(total, n_batches) if total else [], np.int64)
    batch_blocked = np.zeros(max(1, len(sizes)), np.int64)
    st_i[rk.BLEFT] = sizes[0] if len(sizes) else -1
    write = out.fh.write if out is not None else None
    keep = write is not None
    f8, i4, i8 = np.float64, np.int32, np.int64
    none_f, none_i, none_i8 = np.empty(0, f8), np.empty(0, i4), np.empty(0, i8)
    brs: dict[float, str] = {}
    routes, reasons = tables.routes, tables.reasons

    def write_rows(rows: tuple[list[Any], ...], pids: list[int], m: int) -> None:
        assert write is not None and out is not None
        rids, ts, hs, srcs, dsts, bitrates = rows
        for rid, t, hold, src, dst, br, q, first, n, p in zip(
                rids, ts, hs, srcs, dsts, bitrates, out_route[:m].tolist(),
                out_first[:m].tolist(), out_n[:m].tolist(), pids, strict=False):
            brs_s = brs.get(br)
            if brs_s is None:
                brs_s = brs[br] = f"{br:g}"
            if q >= 0:
                label, mod = routes[q]
                write(f"{rid},{src},{dst},{brs_s},{label},{mod},{first},{n},1,,"
                      f"{t:.6f},{hold:.6f}\n")
            else:
                write(f"{rid},{src},{dst},{brs_s},,,,,0,{reasons[p]},{t:.6f},{hold:.6f}\n")
        out.tick()

    if isinstance(source, _PoissonSource):
        wl, ends = source.wl, source.ends
        n_end = len(ends)
        mt, dbuf, pos = rk.mt_state(random.Random(wl.seed).getstate()[1])
        order = np.empty(n_end * n_end, np.int64)
        n_new = kernel.pair_order(mt.copy(), dbuf.copy(), pos, source.total, n_end,
                                  np.zeros(n_end * n_end, np.bool_), order)
        lut = np.full(n_end * n_end, -1, np.int32)  # src x n + dst -> pair id
        for key in order[:n_new].tolist():  # pairs added in the order first needed
            lut[key] = tables.pid(ends[key // n_end], ends[key % n_end])
        bitrates = list(wl.bitrate_gbps)
        pick_bri = np.array([tables.bri(b) for b in bitrates], np.int32)
        br_vals = np.array(bitrates, np.float64)
        st_i[rk.MT_POS] = pos
        st_f[rk.GEN_RATE] = wl.load_erlang / wl.mean_holding_s
        st_f[rk.GEN_LAM_HOLD] = 1.0 / wl.mean_holding_s  # expovariate(1 / hold) divides by it
        arrays = tables.arrays()
        ends_arr = np.empty(n_end, dtype=object)
        ends_arr[:] = ends
        brs_obj = np.empty(len(bitrates), dtype=object)
        brs_obj[:] = bitrates
        m_max = min(GEN_CHUNK, max(1, source.total))
        out_route, out_first, out_n, out_src, out_dst, out_pick = (
            np.empty(m_max, i4) for _ in range(6))
        out_t, out_hold = np.empty(m_max, f8), np.empty(m_max, f8)
        for first_id in range(0, source.total, m_max):
            m = min(m_max, source.total - first_id)
            status = run(True, m, none_f, none_f, none_i, none_i, none_f, mt, dbuf, n_end, lut,
                         pick_bri, br_vals, *arrays, busy, slots, last_fit, uni, heap_t,
                         heap_v, st_i, st_f, sizes, batch_blocked, keep, out_route,
                         out_first, out_n, out_t, out_hold, out_src, out_dst, out_pick)
            if status != 0:
                raise RuntimeError("rmsa kernel: live lightpath heap overflow")
            if keep:
                src_i, dst_i = out_src[:m], out_dst[:m]
                write_rows((list(range(first_id, first_id + m)), out_t[:m].tolist(),
                            out_hold[:m].tolist(), ends_arr[src_i].tolist(),
                            ends_arr[dst_i].tolist(), brs_obj[out_pick[:m]].tolist()),
                           lut[src_i * n_end + dst_i].tolist(), m)
            bar.advance(m)
    else:
        out_route, out_first, out_n = (np.empty(BATCH_REQUESTS, i4) for _ in range(3))
        for rows, arrivals, holds, pids, bris, brv in source:
            m = len(arrivals)
            if m > len(out_route):
                out_route, out_first, out_n = (np.empty(m, i4) for _ in range(3))
            status = run(False, m, arrivals, holds, pids, bris, brv, none_i8, none_f, 0, none_i,
                         none_i, none_f, *tables.arrays(), busy, slots, last_fit, uni,
                         heap_t, heap_v, st_i, st_f, sizes, batch_blocked, False, out_route,
                         out_first, out_n, none_f, none_f, none_i, none_i, none_i)
            if status != 0:
                raise RuntimeError("rmsa kernel: live lightpath heap overflow")
            if keep:
                write_rows(rows(), pids.tolist(), m)
            bar.advance(m)
    for s in range(n_spectra):  # back to the network's int bitmaps
        v = 0
        for w in range(n_words - 1, -1, -1):
            v = v << rk.WORD_BITS | int(busy[s, w])
        busy_bits[s] = v
    occ[:] = busy_bits  # nothing out of service: occupied == busy
    n_req = int(st_i[rk.NREQ])
    b_idx, b_left = int(st_i[rk.BIDX]), int(st_i[rk.BLEFT])
    batch_ratios = [int(batch_blocked[i]) / int(sizes[i]) for i in range(b_idx)]
    if n_req != total:  # a trace whose row count changed under us; keep what ran
        log.warning("expected %d requests, simulated %d", total, n_req)
    if b_left > 0 and b_idx < len(sizes) and sizes[b_idx] != b_left:
        batch_ratios.append(int(st_i[rk.BBLOCKED]) / int(sizes[b_idx] - b_left))
    return {"requests": n_req, "blocked": int(st_i[rk.NBLOCKED]),
            "bitrate_requested_gbps": float(st_f[rk.BR_REQ]),
            "bitrate_blocked_gbps": float(st_f[rk.BR_BLOCKED]),
            "reasons": {r: int(st_i[rk.REASON0 + i]) for i, r in enumerate(
                _PairTables.REASONS)},
            "batch_ratios": batch_ratios, "slot_time_area": float(st_f[rk.AREA]),
            "end_s": float(st_f[rk.LAST_T]), "lost": 0, "restored": 0,
            "events_applied": 0, "events_total": 0, "live_at_end": int(st_i[rk.HSIZE])}


def _apply_event(net: OpticalNetwork, router: _Router, heap: list[tuple[float, int, list[Any]]],
                 ev: EventSpec) -> tuple[int, int, int]:
    """Apply one network event; re-route or drop the live lightpaths it hits.

    Returns (change in used slot-fibres, lightpaths lost, lightpaths restored).
    """
    link = net.link_id(*ev.link)
    net.apply_event(ev)  # (the live lightpaths are this loop's own: found below)
    if ev.kind in ("fiber_repair", "wavelength_repair"):
        return 0, 0, 0
    if ev.kind == "fiber_cut":
        hit_mask = -1
    else:
        assert ev.first_slot is not None and ev.slots is not None
        hit_mask = ((1 << ev.slots) - 1) << ev.first_slot
    occ, busy, blocked_m = net.slot_masks()
    hit = sorted((item for item in heap if item[2][0] is not None
                  and link in item[2][6].links and item[2][1] & hit_mask),
                 key=lambda item: item[1])
    d_used = 0
    for _, _, e in hit:  # release all first, so restorations see the freed spectrum
        for s in e[0]:
            occ[s] &= ~e[1]
            busy[s] = occ[s] | blocked_m[s]
        d_used -= e[2]
    lost = restored = 0
    for _, _, e in hit:
        got = router.place(e[3], e[4], e[5])
        if isinstance(got, str):
            e[0] = None
            lost += 1
            continue
        cand, first = got
        m = ((1 << cand[1]) - 1) << first
        for s in cand[0]:
            occ[s] |= m
            busy[s] |= m
        e[0], e[1], e[2], e[6] = cand[0], m, cand[1] * len(cand[0]), cand[3]
        d_used += e[2]
        restored += 1
    return d_used, lost, restored


def _num(x: float) -> float | None:
    return None if math.isnan(x) else round(x, 9)


def _summary(scenario: Scenario, net: OpticalNetwork, st: dict[str, Any],
             wall_s: float) -> dict[str, Any]:
    wl = scenario.workload
    assert isinstance(wl, LightpathRequestsWorkload)
    n, blocked = st["requests"], st["blocked"]
    _, lo, hi = batch_means_ci95(st["batch_ratios"])
    capacity = net.slots * net.n_spectra
    util = st["slot_time_area"] / (st["end_s"] * capacity) if st["end_s"] > 0 else 0.0
    faults = {"faults": sim_fault_rows(scenario.events)} if scenario.events else {}
    return {
        "scenario": scenario.name,
        "backend": "sim",
        "workload": "lightpath_requests",
        "topology": net.topology.name,
        "policy": scenario.policy.spectrum,
        "grid": scenario.optical.grid,
        "slots": net.slots,
        "k_paths": net.k_paths,
        "load_erlang": None if wl.trace else wl.load_erlang,
        "seed": wl.seed,
        "requests": n,
        "accepted": n - blocked,
        "blocked": blocked,
        "blocking_ratio": blocked / n if n else 0.0,
        "blocking_ci95": [_num(max(0.0, lo)), _num(hi)] if not math.isnan(lo) else None,
        "batches": len(st["batch_ratios"]),
        "blocked_by_reason": st["reasons"],
        "bitrate_requested_gbps": round(st["bitrate_requested_gbps"], 6),
        "bitrate_blocked_gbps": round(st["bitrate_blocked_gbps"], 6),
        "bitrate_blocking_ratio": (st["bitrate_blocked_gbps"] / st["bitrate_requested_gbps"]
                                   if st["bitrate_requested_gbps"] else 0.0),
        "mean_spectrum_utilization": round(util, 9),
        "lightpaths_lost": st["lost"],
        "lightpaths_restored": st["restored"],
        "events_applied": st["events_applied"],
        "events_after_last_arrival": st["events_total"] - st["events_applied"],
        "sim_time_s": round(st["end_s"], 6),
        "wall_s": round(wall_s, 4),
        "requests_per_s": round(n / wall_s, 1) if wall_s > 0 else None,
        **faults,
    }
