"""Compiled RMSA-v0 (numba): request draws, departures, the step, the mask and observation.

Every compiled function of the gym envs lives in this one module, with the constants it
bakes in (array layout fields, MT19937's parameters, the byte table): numba's on-disk
cache is invalidated when a function's own source file changes, not when a module it
calls does, so code split over modules could load stale machine code after an edit.
testbed.gym.layout, .mt19937, .bits and .packed hold the Python side.

Arrays are laid out as testbed.gym.layout describes, with the env on the first axis (a
single env is a vector of one); the functions index env e rather than slicing a view of
it: a view costs an atomic reference count, and on several threads those contend.
`step1`/`advance1`/`reset1` run one env and return its step record; `packed_*` do so on
one env's packed buffer (testbed.gym.packed: one argument instead of sixteen);
`step_vec` runs every env of the arrays it is given (the vector env gives each of its
threads a slice; it releases the GIL). A kernel stops with ST_EVENT before a network
event (the env applies it in Python, testbed.gym.events) and with ST_KSP when a pair's k
shortest routes are not computed yet (testbed.gym.routes); the env then calls
`advance1`, which goes on where the kernel stopped. The decisions are those of
testbed.gym.rmsa_reference, in the same order, with the same floating-point sums
(tests/test_gym_fast.py).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from testbed.gym.jit import COMPILED, jit

_A = Any  # an array
Record = tuple[int, int, int, int, int, int, int, int, int, int, float, int]

# ---- layout fields (testbed.gym.layout describes them) -------------------------------
# sta_i header
S_NSP, S_SLOTS, S_K, S_J, S_NN, S_NE, S_NB, S_GUARD, S_ALLOW, S_TRACE = range(10)
S_ROWS, S_V, S_NEV, S_TOTAL, S_END, S_VFS, S_TRID, S_TRSRC, S_TRDST = range(10, 19)
S_LEN = 20
# sta_f header (SF_BR..: offsets of the regions)
SF_RATE, SF_LAMH, SF_BR, SF_EV, SF_TRT, SF_TRH, SF_TRB = range(7)
SF_LEN = 8
# ist header
(I_CAP, I_HAVE, I_RID, I_SRC, I_DST, I_PAIR, I_NREQ, I_NBLK, I_GEN, I_VER, I_EVI,
 I_HSIZE, I_FTOP, I_ARG, I_ENDED, I_STARTED, I_LOST, I_RESTORED, I_ACC, I_PATH, I_FIRST,
 I_ROUTE, I_TRUNC, I_STEPPED) = range(24)
I_CAND = 24  # k candidate route ids follow, then the MT state, then the cap regions
# fst header
F_T, F_HOLD, F_BR, F_BRREQ, F_BRBLK, F_NEXTEV = range(6)
F_POOL = 8  # heap departure times [cap], then pool bit rates [cap]
# kernel status
ST_OK = 0  # the next request's mask and observation are ready
ST_EVENT = 1  # a network event is due before the next arrival: apply it, then advance
ST_KSP = 2  # the k shortest routes of pair ist[I_ARG] are needed: compute, then advance
ST_FULL = 3  # ready, but the heap is full: grow the arenas before the next step
FWD, REV = 1, 2  # flags: how a pair's routes were found
# header of a packed buffer (testbed.gym.packed; offsets in int64 words)
(H_IST, H_ISTN, H_STI, H_STIN, H_FST, H_FSTN, H_STF, H_STFN, H_RG, H_RGN, H_SB, H_SBR,
 H_SBW, H_SP, H_SPW, H_I8, H_I8N, H_FLR, H_FLC, H_MK, H_MKN, H_I32, H_I32N, H_RTR, H_RTC,
 H_KS, H_KSF, H_KSP, H_KSK, H_ND, H_BS, H_BF, H_J, H_F32) = range(34)
HEAD = 36

# ---- MT19937 (testbed.gym.mt19937: Python's random.Random) ---------------------------
N = 624
M = 397
STATE_LEN = N + 1  # the words, then the index
_MASK = 0xFFFFFFFF
_MATRIX_A = 0x9908B0DF
_UPPER = 0x80000000
_LOWER = 0x7FFFFFFF

@jit()
def seed_state(mt: Any, e: int, o: int, key: Any, klen: int) -> None:
    """init_by_array(key[:klen]) into mt[e, o:o+624], the index at mt[e, o+624]."""
    mt[e, o] = 19650218
    for i in range(1, N):
        prev = mt[e, o + i - 1]
        mt[e, o + i] = (1812433253 * (prev ^ (prev >> 30)) + i) & _MASK
    i = 1
    j = 0
    k = N if N > klen else klen
    while k > 0:
        prev = mt[e, o + i - 1]
        mt[e, o + i] = ((mt[e, o + i] ^ (((prev ^ (prev >> 30)) * 1664525) & _MASK))
                        + key[j] + j) & _MASK
        i += 1
        j += 1
        if i >= N:
            mt[e, o] = mt[e, o + N - 1]
            i = 1
        if j >= klen:
            j = 0
        k -= 1
    k = N - 1
    while k > 0:
        prev = mt[e, o + i - 1]
        mt[e, o + i] = ((mt[e, o + i] ^ (((prev ^ (prev >> 30)) * 1566083941) & _MASK))
                        - i) & _MASK
        i += 1
        if i >= N:
            mt[e, o] = mt[e, o + N - 1]
            i = 1
        k -= 1
    mt[e, o] = _UPPER
    mt[e, o + N] = N


@jit()
def genrand(mt: Any, e: int, o: int) -> int:
    """The next 32-bit output (genrand_uint32)."""
    idx = mt[e, o + N]
    if idx >= N:
        for kk in range(N - M):
            y = (mt[e, o + kk] & _UPPER) | (mt[e, o + kk + 1] & _LOWER)
            mt[e, o + kk] = mt[e, o + kk + M] ^ (y >> 1) ^ (_MATRIX_A if y & 1 else 0)
        for kk in range(N - M, N - 1):
            y = (mt[e, o + kk] & _UPPER) | (mt[e, o + kk + 1] & _LOWER)
            mt[e, o + kk] = mt[e, o + kk + M - N] ^ (y >> 1) ^ (_MATRIX_A if y & 1 else 0)
        y = (mt[e, o + N - 1] & _UPPER) | (mt[e, o] & _LOWER)
        mt[e, o + N - 1] = mt[e, o + M - 1] ^ (y >> 1) ^ (_MATRIX_A if y & 1 else 0)
        idx = 0
    y = mt[e, o + idx]
    mt[e, o + N] = idx + 1
    y ^= y >> 11
    y ^= (y << 7) & 0x9D2C5680
    y ^= (y << 15) & 0xEFC60000
    y ^= y >> 18
    return y & _MASK


@jit()
def random53(mt: Any, e: int, o: int) -> float:
    """random.random(): a 53-bit double in [0, 1) (genrand_res53)."""
    a = genrand(mt, e, o) >> 5
    b = genrand(mt, e, o) >> 6
    return (a * 67108864.0 + b) * (1.0 / 9007199254740992.0)



# ---- slot bitmaps (testbed.gym.bits) -------------------------------------------------
ALL = np.uint64(0xFFFFFFFFFFFFFFFF)
ZERO = np.uint64(0)
ONE = np.uint64(1)


def _byte_slots() -> np.ndarray:
    out = np.zeros(256, np.uint64)
    for b in range(256):
        v = 0
        for i in range(8):
            v |= ((b >> i) & 1) << (8 * i)
        out[b] = v
    return out


BYTE_SLOTS = _byte_slots()  # a byte's 8 bits as 8 bytes 0/1 (one store: 8 obs slots)
_ALL_SLOTS = BYTE_SLOTS[255]
_BYTE = np.uint64(0xFF)
_F32_MAX = float(np.finfo(np.float32).max)

if COMPILED:
    from numba.cpython.unsafe.numbers import trailing_zeros

    @jit()
    def ctz(x: Any) -> int:
        """Index of the lowest set bit of a non-zero uint64."""
        return trailing_zeros(x)
else:
    def ctz(x: Any) -> int:
        """Index of the lowest set bit of a non-zero uint64."""
        v = int(x)
        return (v & -v).bit_length() - 1


@jit()
def range_bits(w: int, lo: int, hi: int) -> Any:
    """The bits of slots lo .. hi-1 in word w (a uint64; 0 when they miss it)."""
    a = lo - 64 * w
    b = hi - 64 * w
    if a < 0:
        a = 0
    if b > 64:
        b = 64
    if b <= a:
        return ZERO
    if b - a == 64:
        return ALL
    return ((ONE << np.uint64(b - a)) - ONE) << np.uint64(a)


# ---- the env --------------------------------------------------------------------------
@jit()
def _heap_push(ist: _A, fst: _A, e: int, oh: int, t: float, rid: int, x: int) -> None:
    """Pool entry x departing at t (request rid) onto the heap, ordered by (t, rid) as
    heapq orders the reference's tuples. Position i holds (rid, x) at ist[oh + 2i ..]
    and t at fst[F_POOL + i]."""
    i = ist[e, I_HSIZE]
    ist[e, I_HSIZE] = i + 1
    while i > 0:
        par = (i - 1) // 2
        tp = fst[e, F_POOL + par]
        if tp < t or (tp == t and ist[e, oh + 2 * par] <= rid):
            break
        fst[e, F_POOL + i] = tp
        ist[e, oh + 2 * i] = ist[e, oh + 2 * par]
        ist[e, oh + 2 * i + 1] = ist[e, oh + 2 * par + 1]
        i = par
    fst[e, F_POOL + i] = t
    ist[e, oh + 2 * i] = rid
    ist[e, oh + 2 * i + 1] = x


@jit()
def _heap_pop(ist: _A, fst: _A, e: int, oh: int) -> int:
    """The first departure off the heap: its pool entry."""
    top = ist[e, oh + 1]
    n = ist[e, I_HSIZE] - 1
    ist[e, I_HSIZE] = n
    if n > 0:
        lt = fst[e, F_POOL + n]
        lr = ist[e, oh + 2 * n]
        lx = ist[e, oh + 2 * n + 1]
        i = 0
        while True:
            c = 2 * i + 1
            if c >= n:
                break
            tc = fst[e, F_POOL + c]
            rc = ist[e, oh + 2 * c]
            if c + 1 < n:
                td = fst[e, F_POOL + c + 1]
                rd = ist[e, oh + 2 * c + 2]
                if td < tc or (td == tc and rd < rc):
                    c += 1
                    tc = td
                    rc = rd
            if lt < tc or (lt == tc and lr < rc):
                break
            fst[e, F_POOL + i] = tc
            ist[e, oh + 2 * i] = rc
            ist[e, oh + 2 * i + 1] = ist[e, oh + 2 * c + 1]
            i = c
        fst[e, F_POOL + i] = lt
        ist[e, oh + 2 * i] = lr
        ist[e, oh + 2 * i + 1] = lx
    return top


@jit()
def _draw(ist: _A, fst: _A, e: int, sta_i: _A, sta_f: _A) -> None:
    """The next request of the episode (a trace row, or the Poisson stream's next draws,
    in poisson_requests' order: gap, src, dst, holding, bit rate) as the current one."""
    g = ist[e, I_GEN]
    if sta_i[S_TRACE]:
        t = sta_f[int(sta_f[SF_TRT]) + g]
        hold = sta_f[int(sta_f[SF_TRH]) + g]
        br = sta_f[int(sta_f[SF_TRB]) + g]
        rid = sta_i[sta_i[S_TRID] + g]
        src = sta_i[sta_i[S_TRSRC] + g]
        dst = sta_i[sta_i[S_TRDST] + g]
    else:
        o = I_CAND + sta_i[S_K]
        ne = sta_i[S_NE]
        t = fst[e, F_T] + (-math.log(1.0 - random53(ist, e, o)) / sta_f[SF_RATE])
        i = int(random53(ist, e, o) * ne)
        j = int(random53(ist, e, o) * (ne - 1))
        if j >= i:
            j += 1
        hold = -math.log(1.0 - random53(ist, e, o)) / sta_f[SF_LAMH]
        br = sta_f[int(sta_f[SF_BR]) + int(random53(ist, e, o) * sta_i[S_NB])]
        rid = g
        src = sta_i[sta_i[S_END] + i]
        dst = sta_i[sta_i[S_END] + j]
    ist[e, I_GEN] = g + 1
    ist[e, I_RID] = rid
    ist[e, I_SRC] = src
    ist[e, I_DST] = dst
    ist[e, I_PAIR] = src * sta_i[S_NN] + dst
    fst[e, F_T] = t
    fst[e, F_HOLD] = hold
    fst[e, F_BR] = br


@jit()
def _set_bits(sb: _A, e: int, s: int, lo: int, n: int) -> None:
    """Slots lo .. lo+n-1 of bitmap row s set."""
    for w in range(lo >> 6, ((lo + n - 1) >> 6) + 1):
        sb[e, s, w] |= range_bits(w, lo, lo + n)


@jit()
def _candidates(ist: _A, fst: _A, sb: _A, flags: _A, e: int, sta_i: _A, rt: _A, rg: _A,
                ksp: _A, spec: _A, need: _A, bs: _A, bf: _A, brv: _A, hov: _A,
                mask: _A) -> int:
    """The current request's candidates, blocks, mask and observation (ST_KSP when the
    pair's routes are still to be computed). spec: the observation rows as uint64."""
    k = sta_i[S_K]
    jb = sta_i[S_J]
    slots = sta_i[S_SLOTS]
    nv = sta_i[S_V]
    v = ist[e, I_VER]
    pair = ist[e, I_PAIR]
    fs = sta_i[sta_i[S_VFS] + v]
    fl = flags[e, v, pair]
    if fl == 0:  # first request of the pair at this route version: the network's cache
        if ksp[fs, pair, 0, 0] == -2:
            ist[e, I_ARG] = pair
            return ST_KSP
        nc = flags[e, nv, pair]
        if nc == 0:
            nn = sta_i[S_NN]
            r = flags[e, nv, (pair % nn) * nn + pair // nn]
            nc = 3 - r if r != 0 else 1
            flags[e, nv, pair] = nc
        flags[e, v, pair] = nc
        fl = nc
    br = fst[e, F_BR]
    guard = sta_i[S_GUARD]
    nw = sb.shape[2]
    nbytes = spec.shape[2]
    acc = sb.shape[1] - 2  # scratch rows: the path's busy (then free) slots
    fit = acc + 1  # and where n free slots start
    any_ok = False
    for p in range(k):
        q = ksp[fs, pair, fl - 1, p]
        n = 0
        if q >= 0 and rg[q] > 0.0:  # as slots_for: ceil(rate / per-slot rate) + guard
            x = br / rg[q] - 1e-9
            if x <= slots:  # (else more slots than the grid holds)
                c = math.ceil(x)
                if c < 1:
                    c = 1
                if c + guard <= slots:
                    n = c + guard
        ist[e, I_CAND + p] = q if n > 0 else -1
        need[e, p] = n
        if n == 0:
            for i in range(nbytes):
                spec[e, p, i] = _ALL_SLOTS
            for b in range(jb):
                bs[e, p, b] = 0
                bf[e, p, b] = 0
                mask[e, p * jb + b] = 0
            continue
        s0 = rt[q, 1]
        for w in range(nw):
            sb[e, acc, w] = sb[e, s0, w]
        for y in range(1, rt[q, 0]):
            s = rt[q, 1 + y]
            for w in range(nw):
                sb[e, acc, w] |= sb[e, s, w]
        for i in range(nbytes):
            spec[e, p, i] = BYTE_SLOTS[(sb[e, acc, i >> 3] >> np.uint64(8 * (i & 7))) & _BYTE]
        # free slots (acc <- free), then the starts of n-slot free windows (fit), as
        # testbed.optical.spectrum.fitting_starts; kept where a free run begins
        for w in range(nw):
            sb[e, acc, w] = ~sb[e, acc, w] & range_bits(w, 0, slots)
            sb[e, fit, w] = sb[e, acc, w]
        have = 1
        while have < n:
            sh = min(have, n - have)
            qw, r = sh >> 6, np.uint64(sh & 63)
            for w in range(nw):
                lo = sb[e, fit, w + qw] if w + qw < nw else ZERO
                if r != ZERO:
                    hi = sb[e, fit, w + qw + 1] if w + qw + 1 < nw else ZERO
                    lo = (lo >> r) | (hi << (np.uint64(64) - r))
                sb[e, fit, w] &= lo
            have += sh
        nb = 0
        for w in range(nw):
            prev = sb[e, acc, w - 1] >> np.uint64(63) if w > 0 else ZERO
            x = sb[e, fit, w] & ~((sb[e, acc, w] << np.uint64(1)) | prev)
            while x != ZERO and nb < jb:
                start = 64 * w + ctz(x)
                x &= x - np.uint64(1)
                u_w = start >> 6  # the run's end: the next slot not free
                u = ~sb[e, acc, u_w] & range_bits(u_w, start, 64 * nw)
                while u == ZERO and u_w + 1 < nw:
                    u_w += 1
                    u = ~sb[e, acc, u_w]
                end = slots if u == ZERO else min(64 * u_w + ctz(u), slots)
                bs[e, p, nb] = start
                bf[e, p, nb] = end - start
                mask[e, p * jb + nb] = 1
                nb += 1
            if nb >= jb:
                break
        if nb > 0:
            any_ok = True
        for b in range(nb, jb):
            bs[e, p, b] = 0
            bf[e, p, b] = 0
            mask[e, p * jb + b] = 0
    mask[e, k * jb] = 1 if (sta_i[S_ALLOW] != 0 or not any_ok) else 0
    brv[e, 0] = np.float32(min(br, _F32_MAX))
    hov[e, 0] = np.float32(min(fst[e, F_HOLD], _F32_MAX))
    return ST_OK


@jit()
def _advance(ist: _A, fst: _A, sb: _A, flags: _A, e: int, sta_i: _A, sta_f: _A, rt: _A,
             rg: _A, ksp: _A, spec: _A, need: _A, bs: _A, bf: _A, brv: _A, hov: _A,
             mask: _A) -> int:
    """To the current request (drawn if not yet): departures up to its arrival (before an
    event at the same time), stopping before a due network event; then its candidates."""
    if ist[e, I_HAVE] == 0:
        _draw(ist, fst, e, sta_i, sta_f)
        ist[e, I_HAVE] = 1
    t = fst[e, F_T]
    cap = ist[e, I_CAP]
    oh = I_CAND + sta_i[S_K] + STATE_LEN
    nsp = sta_i[S_NSP]
    while True:
        nev = fst[e, F_NEXTEV]
        if ist[e, I_HSIZE] > 0:
            nd = fst[e, F_POOL]
            if nd <= t and nd <= nev:
                x = _heap_pop(ist, fst, e, oh)
                op = oh + 3 * cap + 3 * x
                q = ist[e, op]
                if q >= 0:  # else lost to a failure earlier: busy = out of service there
                    f = ist[e, op + 1]
                    n = ist[e, op + 2]
                    for y in range(rt[q, 0]):
                        s = rt[q, 1 + y]
                        for w in range(f >> 6, ((f + n - 1) >> 6) + 1):
                            m = range_bits(w, f, f + n)
                            sb[e, s, w] = (sb[e, s, w] & ~m) | (sb[e, nsp + s, w] & m)
                top = ist[e, I_FTOP]
                ist[e, oh + 2 * cap + top] = x
                ist[e, I_FTOP] = top + 1
                continue
        if nev <= t:
            return ST_EVENT
        break
    st = _candidates(ist, fst, sb, flags, e, sta_i, rt, rg, ksp, spec, need, bs, bf, brv,
                     hov, mask)
    if st == ST_OK and ist[e, I_HSIZE] >= cap:
        return ST_FULL
    return st


@jit()
def _apply(ist: _A, fst: _A, sb: _A, e: int, sta_i: _A, rt: _A, need: _A, bs: _A,
           mask: _A, a: int) -> None:
    """The agent's action on the current request: set up its block, or block it."""
    k = sta_i[S_K]
    jb = sta_i[S_J]
    br = fst[e, F_BR]
    if a != k * jb and mask[e, a] != 0:
        p = a // jb
        first = bs[e, p, a - p * jb]
        n = need[e, p]
        q = ist[e, I_CAND + p]
        for y in range(rt[q, 0]):
            _set_bits(sb, e, rt[q, 1 + y], first, n)
        cap = ist[e, I_CAP]
        oh = I_CAND + k + STATE_LEN
        top = ist[e, I_FTOP] - 1
        x = ist[e, oh + 2 * cap + top]
        ist[e, I_FTOP] = top
        op = oh + 3 * cap + 3 * x
        ist[e, op] = q
        ist[e, op + 1] = first
        ist[e, op + 2] = n
        fst[e, F_POOL + cap + x] = br
        _heap_push(ist, fst, e, oh, fst[e, F_T] + fst[e, F_HOLD], ist[e, I_RID], x)
        ist[e, I_ACC] = 1
        ist[e, I_PATH] = p
        ist[e, I_FIRST] = first
        ist[e, I_ROUTE] = q
    else:
        ist[e, I_NBLK] += 1
        fst[e, F_BRBLK] += br
        ist[e, I_ACC] = 0
        ist[e, I_PATH] = -1
        ist[e, I_FIRST] = -1
        ist[e, I_ROUTE] = -1
    ist[e, I_NREQ] += 1
    fst[e, F_BRREQ] += br
    trunc = ist[e, I_NREQ] >= sta_i[S_TOTAL]
    ist[e, I_TRUNC] = 1 if trunc else 0
    if trunc:  # the last observation: the same request on the network it left
        ist[e, I_ENDED] = 1
    else:
        ist[e, I_HAVE] = 0
    ist[e, I_STEPPED] = 1


@jit()
def _reset(ist: _A, fst: _A, sb: _A, flags: _A, e: int, sta_i: _A, sta_f: _A, key: _A,
           klen: int) -> None:
    """An empty network and the request stream of the key's seed. The routes the last
    episode found stay with the base network when it ended before any cut or repair."""
    nv = sta_i[S_V]
    npairs = flags.shape[2]
    if ist[e, I_STARTED] != 0 and ist[e, I_VER] == 0:
        for p in range(npairs):
            if flags[e, nv + 1, p] == 0:
                flags[e, nv + 1, p] = flags[e, nv, p]
    for p in range(npairs):
        flags[e, nv, p] = flags[e, nv + 1, p]
    for r in range(sb.shape[1]):
        for w in range(sb.shape[2]):
            sb[e, r, w] = ZERO
    cap = ist[e, I_CAP]
    for f in (I_HAVE, I_NREQ, I_NBLK, I_GEN, I_VER, I_EVI, I_HSIZE, I_ENDED, I_LOST,
              I_RESTORED, I_ACC, I_TRUNC, I_STEPPED):
        ist[e, f] = 0
    for f in (I_PATH, I_FIRST, I_ROUTE):
        ist[e, f] = -1
    oh = I_CAND + sta_i[S_K] + STATE_LEN
    for i in range(cap):
        ist[e, oh + 2 * cap + i] = cap - 1 - i
    ist[e, I_FTOP] = cap
    fst[e, F_T] = 0.0
    fst[e, F_BRREQ] = 0.0
    fst[e, F_BRBLK] = 0.0
    fst[e, F_NEXTEV] = sta_f[int(sta_f[SF_EV])]
    if sta_i[S_TRACE] == 0:
        seed_state(ist, e, I_CAND + sta_i[S_K], key, klen)
    ist[e, I_STARTED] = 1


# ---- one env -------------------------------------------------------------------------
@jit()
def _record(st: int, ist: _A, fst: _A, e: int) -> Record:
    return (int(st), int(ist[e, I_ACC]), int(ist[e, I_PATH]), int(ist[e, I_FIRST]),
            int(ist[e, I_ROUTE]), int(ist[e, I_RID]), int(ist[e, I_SRC]),
            int(ist[e, I_DST]), int(ist[e, I_NREQ]), int(ist[e, I_NBLK]),
            float(fst[e, F_T]), int(ist[e, I_TRUNC]))


@jit()
def step1(ist: _A, fst: _A, sb: _A, flags: _A, e: int, sta_i: _A, sta_f: _A, rt: _A,
          rg: _A, ksp: _A, spec: _A, need: _A, bs: _A, bf: _A, brv: _A, hov: _A,
          mask: _A, a: int) -> Record:
    """Env e takes action a, then advances to its next request. Returns (status,
    accepted, path index, first slot, route id, request id, src, dst, requests, blocked,
    time_s, truncated)."""
    _apply(ist, fst, sb, e, sta_i, rt, need, bs, mask, a)
    st = _advance(ist, fst, sb, flags, e, sta_i, sta_f, rt, rg, ksp, spec, need, bs, bf,
                  brv, hov, mask)
    return _record(st, ist, fst, e)


@jit()
def advance1(ist: _A, fst: _A, sb: _A, flags: _A, e: int, sta_i: _A, sta_f: _A, rt: _A,
             rg: _A, ksp: _A, spec: _A, need: _A, bs: _A, bf: _A, brv: _A, hov: _A,
             mask: _A) -> Record:
    """Env e goes on after ST_EVENT / ST_KSP (the same record as step1)."""
    st = _advance(ist, fst, sb, flags, e, sta_i, sta_f, rt, rg, ksp, spec, need, bs, bf,
                  brv, hov, mask)
    return _record(st, ist, fst, e)


@jit()
def reset1(ist: _A, fst: _A, sb: _A, flags: _A, e: int, sta_i: _A, sta_f: _A, rt: _A,
           rg: _A, ksp: _A, spec: _A, need: _A, bs: _A, bf: _A, brv: _A, hov: _A,
           mask: _A, key: _A, klen: int) -> Record:
    """Env e starts an episode and advances to its first request (step1's record)."""
    _reset(ist, fst, sb, flags, e, sta_i, sta_f, key, klen)
    st = _advance(ist, fst, sb, flags, e, sta_i, sta_f, rt, rg, ksp, spec, need, bs, bf,
                  brv, hov, mask)
    return _record(st, ist, fst, e)


# ---- a vector of envs ----------------------------------------------------------------
@jit()
def _step_env(ist: _A, fst: _A, sb: _A, flags: _A, e: int, sta_i: _A, sta_f: _A, rt: _A,
              rg: _A, ksp: _A, spec: _A, need: _A, bs: _A, bf: _A, brv: _A, hov: _A,
              mask: _A, actions: _A, modes: _A, keys: _A, klens: _A) -> int:
    """Env e of a vector: modes[e] 0 takes actions[e], 1 resets it (seed words
    keys[e, :klens[e]]), 2 leaves it (ST_OK)."""
    m = modes[e]
    if m == 2:
        return ST_OK
    if m == 1:
        _reset(ist, fst, sb, flags, e, sta_i, sta_f, keys[e], klens[e])
    else:
        _apply(ist, fst, sb, e, sta_i, rt, need, bs, mask, actions[e])
    return _advance(ist, fst, sb, flags, e, sta_i, sta_f, rt, rg, ksp, spec, need, bs, bf,
                    brv, hov, mask)


@jit()
def step_vec(ist: _A, fst: _A, sb: _A, flags: _A, sta_i: _A, sta_f: _A, rt: _A, rg: _A,
             ksp: _A, spec: _A, need: _A, bs: _A, bf: _A, brv: _A, hov: _A, mask: _A,
             actions: _A, modes: _A, keys: _A, klens: _A, status: _A) -> None:
    """Every env of the arrays given: modes[e] 0 takes actions[e], 1 resets env e (seed
    words keys[e, :klens[e]]), 2 leaves it; each env taken or reset then advances to its
    next request. status[e] as advance1's (ST_OK for an env left). Releases the GIL: the
    vector env runs slices of its envs on several threads at once."""
    for e in range(ist.shape[0]):
        status[e] = _step_env(ist, fst, sb, flags, e, sta_i, sta_f, rt, rg, ksp, spec, need,
                              bs, bf, brv, hov, mask, actions, modes, keys, klens)


# ---- one env's packed buffer (testbed.gym.packed) -------------------------------------
@jit()
def packed_views(mem: _A) -> tuple[_A, ...]:
    h = mem
    f64 = mem.view(np.float64)  # the buffer as each dtype once; sections cut from those
    u64 = mem.view(np.uint64)
    i8 = mem.view(np.int8)
    i32 = mem.view(np.int32)
    f32 = mem.view(np.float32)
    ist = mem[h[H_IST]:h[H_IST] + h[H_ISTN]].reshape((1, h[H_ISTN]))
    sta_i = mem[h[H_STI]:h[H_STI] + h[H_STIN]]
    fst = f64[h[H_FST]:h[H_FST] + h[H_FSTN]].reshape((1, h[H_FSTN]))
    sta_f = f64[h[H_STF]:h[H_STF] + h[H_STFN]]
    rg = f64[h[H_RG]:h[H_RG] + h[H_RGN]]
    sb = u64[h[H_SB]:h[H_SB] + h[H_SBR] * h[H_SBW]].reshape((1, h[H_SBR], h[H_SBW]))
    k = h[H_KSK]
    spec = u64[h[H_SP]:h[H_SP] + k * h[H_SPW]].reshape((1, k, h[H_SPW]))
    o8 = 8 * h[H_I8]
    flags = i8[o8:o8 + h[H_FLR] * h[H_FLC]].reshape((1, h[H_FLR], h[H_FLC]))
    mask = i8[o8 + h[H_MK]:o8 + h[H_MK] + h[H_MKN]].reshape((1, h[H_MKN]))
    o32 = 2 * h[H_I32]
    rt = i32[o32:o32 + h[H_RTR] * h[H_RTC]].reshape((h[H_RTR], h[H_RTC]))
    ksp = i32[o32 + h[H_KS]:o32 + h[H_KS] + h[H_KSF] * h[H_KSP] * 2 * k].reshape(
        (h[H_KSF], h[H_KSP], 2, k))
    j = h[H_J]
    need = i32[o32 + h[H_ND]:o32 + h[H_ND] + k].reshape((1, k))
    bs = i32[o32 + h[H_BS]:o32 + h[H_BS] + k * j].reshape((1, k, j))
    bf = i32[o32 + h[H_BF]:o32 + h[H_BF] + k * j].reshape((1, k, j))
    o = 2 * h[H_F32]
    brv = f32[o:o + 1].reshape((1, 1))
    hov = f32[o + 1:o + 2].reshape((1, 1))
    return (ist, fst, sb, flags, sta_i, sta_f, rt, rg, ksp, spec, need, bs, bf, brv, hov,
            mask)


@jit()
def packed_step(mem: _A, a: int) -> Record:
    """step1 on a packed buffer (a vector of one env)."""
    (ist, fst, sb, flags, sta_i, sta_f, rt, rg, ksp, spec, need, bs, bf, brv, hov,
     mask) = packed_views(mem)
    return step1(ist, fst, sb, flags, 0, sta_i, sta_f, rt, rg, ksp, spec, need, bs,
                        bf, brv, hov, mask, a)


@jit()
def packed_advance(mem: _A) -> Record:
    """advance1 on a packed buffer."""
    (ist, fst, sb, flags, sta_i, sta_f, rt, rg, ksp, spec, need, bs, bf, brv, hov,
     mask) = packed_views(mem)
    return advance1(ist, fst, sb, flags, 0, sta_i, sta_f, rt, rg, ksp, spec, need,
                           bs, bf, brv, hov, mask)


@jit()
def packed_reset(mem: _A, key: _A, klen: int) -> Record:
    """reset1 on a packed buffer."""
    (ist, fst, sb, flags, sta_i, sta_f, rt, rg, ksp, spec, need, bs, bf, brv, hov,
     mask) = packed_views(mem)
    return reset1(ist, fst, sb, flags, 0, sta_i, sta_f, rt, rg, ksp, spec, need, bs,
                         bf, brv, hov, mask, key, klen)
