"""Compiled (numba) first/last-fit request loop for dynamic RMSA runs without network events.

The loop of engine._loop_plain for the first_fit and last_fit policies, over columns of
requests (arrival, holding, candidate table, bitrate) instead of tuples, on a slot array
busy[spectrum, slot] (uint8) instead of int bitmaps, with the live lightpaths in an array
heap keyed by departure time. It makes the same choice for every request (the lowest, or
highest, start of an n-slot block free on every fibre of the first candidate that has one)
and the same sums in the same order, so records and summaries equal the pure-Python loop's
(tests/test_rmsa_kernel.py). numba is optional: without it (or with
LIGHTPIPE_RMSA_KERNEL=0) `load()` returns None and the engine runs the Python loop.
Compiled code is cached on disk (njit cache=True): the first run on a machine compiles
(~2-4 s), later runs load it.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable
from typing import Any

import numpy as np

try:
    import numba
except ImportError:  # optional: the engine falls back to its pure-Python loop
    numba = None

log = logging.getLogger(__name__)

_F = Any  # a function, compiled or not


def _jit(fn: _F) -> _F:
    """numba.njit(cache=True) when numba is installed, else the Python function itself;
    without a writable cache directory, compiled in each process instead."""
    if numba is None:
        return fn
    try:
        return numba.njit(cache=True, nogil=True)(fn)
    except RuntimeError as exc:  # numba: "cannot cache function ...: no locator available"
        log.info("rmsa kernel: no numba cache (%s); compiling in this process", exc)
        return numba.njit(nogil=True)(fn)


# st_i (int64 state) fields
HSIZE, USED, NREQ, NBLOCKED, REASON0, BIDX, BLEFT, BBLOCKED = 0, 1, 2, 3, 4, 7, 8, 9
ST_I_LEN = 10
# st_f (float64 state) fields
AREA, LAST_T, BR_REQ, BR_BLOCKED = 0, 1, 2, 3
ST_F_LEN = 4

_logged = False


@_jit
def _first_start(busy: Any, sp: Any, s0: int, s1: int, n: int, slots: int) -> int:
    """Lowest i with slots i .. i+n-1 free on every spectrum sp[s0:s1], or -1.
    Each window is checked from its top slot down; a busy slot j moves the window past j."""
    i = 0
    while i + n <= slots:
        j = i + n - 1
        while j >= i:
            hit = False
            for q in range(s0, s1):
                if busy[sp[q], j]:
                    hit = True
                    break
            if hit:
                break
            j -= 1
        if j < i:
            return i
        i = j + 1
    return -1


@_jit
def _last_start(busy: Any, sp: Any, s0: int, s1: int, n: int, slots: int) -> int:
    """Highest i with slots i .. i+n-1 free on every spectrum sp[s0:s1], or -1."""
    i = slots - n
    while i >= 0:
        j = i
        end = i + n
        while j < end:
            hit = False
            for q in range(s0, s1):
                if busy[sp[q], j]:
                    hit = True
                    break
            if hit:
                break
            j += 1
        if j == end:
            return i
        i = j - n
    return -1


@_jit
def _run(t: Any, hold: Any, pid: Any, bri: Any, br: Any, pair_start: Any, pair_len: Any,
         pair_reason: Any, route_fmt: Any, route_s0: Any, route_s1: Any, sp: Any, need: Any,
         busy: Any, slots: int, last_fit: bool, heap_t: Any, heap_r: Any, heap_f: Any,
         heap_n: Any, st_i: Any, st_f: Any, sizes: Any, batch_blocked: Any, out_route: Any,
         out_first: Any, out_n: Any) -> int:
    """Run the requests (arrival t[r], holding hold[r], pair table pid[r], bitrate index
    bri[r], bitrate br[r]) in order; return 0, or -1 if the heap is full (cannot happen:
    it holds slots x spectra entries). Pair table p lists routes pair_start[p] .. +
    pair_len[p]; route q is on the spectra sp[route_s0[q]:route_s1[q]] and needs
    need[route_fmt[q], bitrate index] slots (route_fmt -1, or need 0: not a candidate).
    out_route[r] is the route taken (-1: blocked), out_first[r] and out_n[r] its block."""
    hsize = st_i[HSIZE]
    used = st_i[USED]
    n_req = st_i[NREQ]
    n_blocked = st_i[NBLOCKED]
    b_idx = st_i[BIDX]
    b_left = st_i[BLEFT]
    b_blocked = st_i[BBLOCKED]
    area = st_f[AREA]
    last_t = st_f[LAST_T]
    br_req = st_f[BR_REQ]
    br_blocked = st_f[BR_BLOCKED]
    n_sizes = sizes.shape[0]
    cap = heap_t.shape[0]
    status = 0
    for r in range(t.shape[0]):
        tr = t[r]
        # departures up to this arrival, in time order (ties in any order: a second
        # departure at the same time adds used x 0.0 to the area)
        while hsize > 0 and heap_t[0] <= tr:
            d = heap_t[0]
            q = heap_r[0]
            f = heap_f[0]
            n = heap_n[0]
            area += used * (d - last_t)
            last_t = d
            for x in range(route_s0[q], route_s1[q]):
                s = sp[x]
                for j in range(f, f + n):
                    busy[s, j] = 0
            used -= n * (route_s1[q] - route_s0[q])
            hsize -= 1
            if hsize > 0:  # sift the last entry down from the root
                lt, lq, lf, ln = heap_t[hsize], heap_r[hsize], heap_f[hsize], heap_n[hsize]
                i = 0
                while True:
                    k = 2 * i + 1
                    if k >= hsize:
                        break
                    if k + 1 < hsize and heap_t[k + 1] < heap_t[k]:
                        k += 1
                    if heap_t[k] >= lt:
                        break
                    heap_t[i], heap_r[i] = heap_t[k], heap_r[k]
                    heap_f[i], heap_n[i] = heap_f[k], heap_n[k]
                    i = k
                heap_t[i], heap_r[i], heap_f[i], heap_n[i] = lt, lq, lf, ln
        area += used * (tr - last_t)
        last_t = tr
        n_req += 1
        b = br[r]
        br_req += b
        p = pid[r]
        bi = bri[r]
        chosen = -1
        first = -1
        n = 0
        for q in range(pair_start[p], pair_start[p] + pair_len[p]):
            fmt = route_fmt[q]
            if fmt < 0:
                continue
            n = need[fmt, bi]
            if n == 0:
                continue
            if last_fit:
                first = _last_start(busy, sp, route_s0[q], route_s1[q], n, slots)
            else:
                first = _first_start(busy, sp, route_s0[q], route_s1[q], n, slots)
            if first >= 0:
                chosen = q
                break
        if chosen >= 0:
            q = chosen
            for x in range(route_s0[q], route_s1[q]):
                s = sp[x]
                for j in range(first, first + n):
                    busy[s, j] = 1
            used += n * (route_s1[q] - route_s0[q])
            if hsize == cap:
                status = -1
                break
            dep = tr + hold[r]
            i = hsize  # sift up
            hsize += 1
            while i > 0:
                par = (i - 1) // 2
                if heap_t[par] <= dep:
                    break
                heap_t[i], heap_r[i] = heap_t[par], heap_r[par]
                heap_f[i], heap_n[i] = heap_f[par], heap_n[par]
                i = par
            heap_t[i], heap_r[i], heap_f[i], heap_n[i] = dep, q, first, n
            out_route[r] = q
            out_first[r] = first
            out_n[r] = n
        else:
            n_blocked += 1
            b_blocked += 1
            br_blocked += b
            st_i[REASON0 + pair_reason[p]] += 1
            out_route[r] = -1
        b_left -= 1
        if b_left == 0:
            batch_blocked[b_idx] = b_blocked
            b_idx += 1
            b_blocked = 0
            b_left = sizes[b_idx] if b_idx < n_sizes else -1
    st_i[HSIZE] = hsize
    st_i[USED] = used
    st_i[NREQ] = n_req
    st_i[NBLOCKED] = n_blocked
    st_i[BIDX] = b_idx
    st_i[BLEFT] = b_left
    st_i[BBLOCKED] = b_blocked
    st_f[AREA] = area
    st_f[LAST_T] = last_t
    st_f[BR_REQ] = br_req
    st_f[BR_BLOCKED] = br_blocked
    return status


@_jit
def _neg_log1m(u: Any, out: Any) -> None:
    for i in range(u.shape[0]):
        out[i] = -math.log(1.0 - u[i])


def neg_log1m(u: np.ndarray) -> np.ndarray:
    """-log(1 - u) per element with libm's log, as random.expovariate takes it (numba's
    math.log calls libm's log; numpy's np.log may differ in the last bit)."""
    out = np.empty(len(u), np.float64)
    _neg_log1m(np.ascontiguousarray(u, dtype=np.float64), out)
    return out


def enabled() -> bool:
    """False when LIGHTPIPE_RMSA_KERNEL=0 (the pure-Python loop is used)."""
    return os.environ.get("LIGHTPIPE_RMSA_KERNEL", "1") != "0"


def load() -> Callable[..., int] | None:
    """The compiled loop, or None without numba (said once in the log) or when disabled
    by LIGHTPIPE_RMSA_KERNEL=0."""
    global _logged
    if not enabled():
        return None
    if numba is None:
        if not _logged:
            _logged = True
            log.info("numba is not installed: dynamic RMSA runs use the pure-Python loop")
        return None
    return _run


def new_state() -> tuple[np.ndarray, np.ndarray]:
    """Fresh (st_i, st_f) state arrays."""
    return np.zeros(ST_I_LEN, np.int64), np.zeros(ST_F_LEN, np.float64)
