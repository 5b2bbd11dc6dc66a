"""Network events on one compiled RMSA-v0 env's arrays, in Python between kernel calls.

What `OpticalNetwork.apply_event` and the reference env's restoration do, on the layout's
arrays: a cut or repair changes the route version (the network's route cache starts
again), takes the fibre's spectra out of (or back into) service; a wavelength loss or
repair does so for a block of slots; the live lightpaths an event hits are released, then
each, in request order, is set up again on the network's candidate routes with the
scenario's spectrum policy (`choose_start`, the same code) or lost. Events are rare (a
few per episode), so this runs in Python.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import numpy as np

from testbed.gym.bits import int_to_row, row_to_int
from testbed.gym.layout import (
    F_NEXTEV,
    F_POOL,
    FWD,
    I_CAP,
    I_EVI,
    I_HSIZE,
    I_LOST,
    I_RESTORED,
    I_VER,
    S_V,
    S_VFS,
    SF_EV,
    Static,
    heap_offset,
)
from testbed.gym.routes import RouteBook
from testbed.optical.modulation import slots_for
from testbed.optical.spectrum import choose_start
from testbed.spec.models import EventSpec


def apply_event(ev: EventSpec, ist: np.ndarray, fst: np.ndarray, sb: np.ndarray,
                flags: np.ndarray, st: Static, book: RouteBook, *, per_direction: bool,
                guard: int, policy: str, rng: Callable[[], random.Random]) -> None:
    """Apply the env's next network event (ist[I_EVI]) and restore what it hits."""
    assert ev.link is not None
    nsp, slots, k = st.n_spectra, st.slots, st.k
    nw = sb.shape[1]
    nv = int(st.sta_i[S_V])
    full = (1 << slots) - 1
    link = book.net.link_id(*ev.link)
    specs = (2 * link, 2 * link + 1) if per_direction else (link,)
    cap = int(ist[I_CAP])
    oh = heap_offset(k)
    heap = ist[oh:oh + 2 * int(ist[I_HSIZE])]
    entries = [int(x) for x in heap[1::2]]
    rid_of = dict(zip(entries, (int(r) for r in heap[0::2]), strict=True))
    pool = ist[oh + 3 * cap:oh + 6 * cap]  # views: writes go to ist
    route, first_of, n_of = pool[0::3], pool[1::3], pool[2::3]

    def get(row: int) -> int:
        return row_to_int(sb[row])

    def put(row: int, x: int) -> None:
        sb[row] = int_to_row(x, nw)

    hit: list[int] = []
    if ev.kind in ("fiber_cut", "fiber_repair"):
        ist[I_VER] += 1
        flags[nv, :] = 0  # the network's route cache starts again
        for s in specs:
            if ev.kind == "fiber_cut":
                put(nsp + s, full)
                put(s, full)
            else:  # blocked = lost slots; busy = held | blocked
                occ = get(s) & ~get(nsp + s)
                put(nsp + s, get(2 * nsp + s))
                put(s, occ | get(nsp + s))
        if ev.kind == "fiber_cut":
            hit = [e for e in entries if route[e] >= 0 and link in book.links[route[e]]]
    else:
        assert ev.first_slot is not None and ev.slots is not None
        block = (((1 << ev.slots) - 1) << ev.first_slot) & full
        failed = link in book.fail_sets[int(st.sta_i[int(st.sta_i[S_VFS]) + ist[I_VER]])]
        for s in specs:
            if ev.kind == "wavelength_loss":
                put(2 * nsp + s, get(2 * nsp + s) | block)
                put(nsp + s, get(nsp + s) | block)
                put(s, get(s) | block)
            else:  # wavelength_repair
                put(2 * nsp + s, get(2 * nsp + s) & ~block)
                if not failed:
                    occ = get(s) & ~get(nsp + s)
                    put(nsp + s, get(2 * nsp + s))
                    put(s, occ | get(nsp + s))
        if ev.kind == "wavelength_loss":
            hit = [e for e in entries if route[e] >= 0 and link in book.links[route[e]]
                   and (((1 << int(n_of[e])) - 1) << int(first_of[e])) & block]
    for e in hit:  # released first, all of them: busy = out of service there
        lp = ((1 << int(n_of[e])) - 1) << int(first_of[e])
        for s in book.paths[route[e]].spectra:
            put(s, (get(s) & ~lp) | (get(nsp + s) & lp))
    fs = int(st.sta_i[int(st.sta_i[S_VFS]) + ist[I_VER]])
    for e in sorted(hit, key=lambda x: rid_of[x]):
        old = book.paths[route[e]]
        br = float(fst[F_POOL + cap + e])
        pair = book.pair(old.nodes[0], old.nodes[-1])
        how = int(flags[nv, pair])
        if how == 0:  # candidate_paths: cached, the reverse's reversed, or computed
            s_i, d_i = divmod(pair, book.n)
            back = int(flags[nv, d_i * book.n + s_i])
            how = 3 - back if back else FWD
            flags[nv, pair] = how
        got = None
        for q in book.routes(fs, pair, how):
            p = book.paths[q]
            if p.modulation is None:
                continue
            n = slots_for(br, p.gbps_per_slot, guard)
            if n > slots:
                continue
            busy = 0
            for s in p.spectra:
                busy |= get(s)
            start = choose_start(full & ~busy, n, policy,
                                 rng() if policy == "random_fit" else None)
            if start is not None:
                got = (q, start, n)
                break
        if got is None:
            route[e] = -1
            ist[I_LOST] += 1
        else:
            q, start, n = got
            for s in book.paths[q].spectra:
                put(s, get(s) | (((1 << n) - 1) << start))
            route[e], first_of[e], n_of[e] = q, start, n
            ist[I_RESTORED] += 1
    ist[I_EVI] += 1
    fst[F_NEXTEV] = st.sta_f[int(st.sta_f[SF_EV]) + ist[I_EVI]]
