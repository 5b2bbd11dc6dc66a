"""Compiled first/last-fit request loop for dynamic RMSA runs without network events.

The loop of engine._loop_plain for the first_fit and last_fit policies, compiled by numba:

- spectrum as bit words, busy[spectrum, word] (uint64, slot j in bit j % 64 of word j // 64);
  a route's free slots are the complement of the OR of its spectra's words, and the
  lowest (highest) start of an n-slot block is found run by run with count-trailing-
  (leading-) zeros, not slot by slot;
- the live lightpaths in an array heap keyed by departure time (route, first slot and
  block size packed in one int64 beside it);
- the seeded Poisson stream drawn inside the loop: the MT19937 of random.Random(seed)
  (the same 32-bit outputs and 53-bit doubles as random.random and numpy's MT19937),
  -log(1 - u) with libm's log as random.expovariate takes it, the same sequential sums
  and truncations as requests.poisson_columns; a trace's requests come in as columns.

It makes the same choice for every request (the lowest, or highest, start of an n-slot
block free on every fibre of the first candidate that has one) and the same sums in the
same order, so records and summaries equal the pure-Python loop's and the earlier
uint8 kernel's (tests/test_rmsa_kernel.py, tests/data/rmsa_kernel_recorded.json).

How it is loaded (`load()`): numba's own start-up (importing it, then setting up its
target on the first call of a cached function) costs ~0.3 s of CPU per process, as much
as 1,000,000 requests take in the loop. So the loop is compiled ahead of time (numba.pycc)
into a small extension module, kept on disk like numba's cache (NUMBA_CACHE_DIR, else
testbed/sim/__pycache__, else ~/.cache/lightpipe) under a name that hashes the Python
build and numpy's version, then this file; later processes import it without importing
numba. The first run on a machine builds it (~5 s of CPU, half of it in the C compiler;
one process at a time under a lock); the same Python build's modules of older versions of
this file in testbed/sim/__pycache__ are removed then, another Python's are kept (venvs of
one checkout under two Pythons run side by side). If that build fails (no C compiler),
numba's JIT runs the same functions (njit(cache=True), compiled in the process, ~3 s the
first time). numba is optional: without it (or with LIGHTPIPE_RMSA_KERNEL=0) `load()`
returns None and the engine runs the Python loop; LIGHTPIPE_RMSA_KERNEL=jit skips the
ahead-of-time module.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.machinery
import importlib.util
import logging
import math
import os
import platform
import re
import stat
import sys
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

_F = Any  # a function, compiled or not

# st_i (int64 state) fields
# (MT_POS: the generator's next double in dbuf, see mt_state)
HSIZE, USED, NREQ, NBLOCKED, REASON0, BIDX, BLEFT, BBLOCKED, MT_POS = 0, 1, 2, 3, 4, 7, 8, 9, 10
ST_I_LEN = 11
# st_f (float64 state) fields
AREA, LAST_T, BR_REQ, BR_BLOCKED, GEN_T, GEN_RATE, GEN_LAM_HOLD = 0, 1, 2, 3, 4, 5, 6
ST_F_LEN = 7

MT_N = 624  # MT19937 state words
WORD_BITS = 64
_ONES = np.uint64(0xFFFFFFFFFFFFFFFF)
_ZERO = np.uint64(0)

_logged = False


def _tz_py(x: Any) -> int:
    """Trailing zeros of a nonzero uint64 (the compiled build uses LLVM's cttz)."""
    v = int(x)
    return (v & -v).bit_length() - 1


def _lz_py(x: Any) -> int:
    """Leading zeros of a nonzero uint64 (the compiled build uses LLVM's ctlz)."""
    return 64 - int(x).bit_length()


# Module globals the compiled functions call; _compile_namespace() swaps in numba's
# versions (intrinsics, dispatchers) before anything is compiled.
_tz: _F = _tz_py
_lz: _F = _lz_py


# ---- spectrum: bit words --------------------------------------------------------------

def _union(busy: Any, sp: Any, s0: int, s1: int, n_words: int, uni: Any) -> None:
    """uni[w] = OR of busy[sp[q], w] over q in s0 .. s1-1."""
    for w in range(n_words):
        u = _ZERO
        for q in range(s0, s1):
            u |= busy[sp[q], w]
        uni[w] = u


def _first_start(uni: Any, n_words: int, n: int, slots: int) -> int:
    """Lowest i with bits i .. i+n-1 clear in uni and i + n <= slots, or -1: the start of
    the first free run of at least n slots (the lowest fitting start always begins a run)."""
    pos = 0
    while True:
        w = pos >> 6
        if w >= n_words:
            return -1
        x = ~uni[w] & (_ONES << np.uint64(pos & 63))  # free slots from pos on
        while x == _ZERO:
            w += 1
            if w >= n_words:
                return -1
            x = ~uni[w]
        a = (w << 6) + np.int64(_tz(x))
        if a + n > slots:
            return -1
        w = a >> 6
        x = uni[w] & (_ONES << np.uint64(a & 63))  # busy slots from a on
        while x == _ZERO:
            w += 1
            if w >= n_words:
                return a  # free up to the top (bits above slots are never set)
            x = uni[w]
        b = (w << 6) + np.int64(_tz(x))
        if b - a >= n:
            return a
        pos = b + 1


def _last_start(uni: Any, n_words: int, n: int, slots: int) -> int:
    """Highest i with bits i .. i+n-1 clear in uni and i + n <= slots, or -1: the end of
    the highest free run of at least n slots, less n - 1."""
    top = slots - 1
    while top >= n - 1:
        w = top >> 6
        x = ~uni[w] & (_ONES >> np.uint64(63 - (top & 63)))  # free slots up to top
        while x == _ZERO:
            w -= 1
            if w < 0:
                return -1
            x = ~uni[w]
        e = (w << 6) + 63 - np.int64(_lz(x))
        if e < n - 1:
            return -1
        w = e >> 6
        x = uni[w] & (_ONES >> np.uint64(63 - (e & 63)))  # busy slots up to e
        c = -1
        while True:
            if x != _ZERO:
                c = (w << 6) + 63 - np.int64(_lz(x))
                break
            w -= 1
            if w < 0:
                break
            x = uni[w]
        if e - c >= n:
            return e - n + 1
        top = c - 1
    return -1


def _set_block(busy: Any, sp: Any, s0: int, s1: int, f: int, n: int, on: bool) -> None:
    """Set (on) or clear slots f .. f+n-1 on the spectra sp[s0:s1]."""
    end = f + n
    for w in range(f >> 6, ((end - 1) >> 6) + 1):
        lo = max(f, w << 6) - (w << 6)
        hi = min(end, (w << 6) + 64) - (w << 6)
        m = (_ONES >> np.uint64(64 - (hi - lo))) << np.uint64(lo)
        if on:
            for q in range(s0, s1):
                busy[sp[q], w] |= m
        else:
            m = ~m
            for q in range(s0, s1):
                busy[sp[q], w] &= m


# ---- the request stream: MT19937 ------------------------------------------------------

def _mt_refill(mt: Any) -> None:
    """The next 624 words of the Mersenne Twister state (genrand_uint32's refill)."""
    for i in range(MT_N - 397):
        y = (mt[i] & 0x80000000) | (mt[i + 1] & 0x7FFFFFFF)
        mt[i] = mt[i + 397] ^ (y >> 1) ^ (-(y & 1) & 0x9908B0DF)  # (branch-free)
    for i in range(MT_N - 397, MT_N - 1):
        y = (mt[i] & 0x80000000) | (mt[i + 1] & 0x7FFFFFFF)
        mt[i] = mt[i + 397 - MT_N] ^ (y >> 1) ^ (-(y & 1) & 0x9908B0DF)
    y = (mt[MT_N - 1] & 0x80000000) | (mt[0] & 0x7FFFFFFF)
    mt[MT_N - 1] = mt[396] ^ (y >> 1) ^ (-(y & 1) & 0x9908B0DF)


def _mt_doubles(mt: Any, dbuf: Any) -> None:
    """dbuf[j] = random.random() from state words 2j and 2j + 1: each tempered as
    genrand_uint32, then (a >> 5) * 2**26 + (b >> 6) over 2**53."""
    for j in range(MT_N // 2):
        a = mt[2 * j]
        a ^= a >> 11
        a ^= (a << 7) & 0x9D2C5680
        a ^= (a << 15) & 0xEFC60000
        a ^= a >> 18
        b = mt[2 * j + 1]
        b ^= b >> 11
        b ^= (b << 7) & 0x9D2C5680
        b ^= (b << 15) & 0xEFC60000
        b ^= b >> 18
        dbuf[j] = ((a >> 5) * 67108864.0 + (b >> 6)) / 9007199254740992.0


def _mt_double(mt: Any, dbuf: Any, di: int) -> tuple[float, int]:
    """(next random.random(), new index into dbuf): the doubles of the state are made
    312 at a time, after each refill."""
    if di >= MT_N // 2:
        _mt_refill(mt)
        _mt_doubles(mt, dbuf)
        di = 0
    return dbuf[di], di + 1


def _pair_order(mt: Any, dbuf: Any, pos: int, n_requests: int, n_end: int, seen: Any,
                order: Any) -> int:
    """The (src x n_end + dst) pair keys of the first n_requests requests of the stream
    whose generator state is (mt, dbuf, pos), in the order of their first request, into
    order; returns how many. Stops once every ordered pair has come. mt and dbuf are
    advanced (give copies)."""
    n_pairs = n_end * (n_end - 1)
    count = 0
    for _ in range(n_requests):
        _, pos = _mt_double(mt, dbuf, pos)  # gap
        u1, pos = _mt_double(mt, dbuf, pos)
        u2, pos = _mt_double(mt, dbuf, pos)
        _, pos = _mt_double(mt, dbuf, pos)  # holding
        _, pos = _mt_double(mt, dbuf, pos)  # bitrate
        i = np.int64(u1 * n_end)
        j = np.int64(u2 * (n_end - 1))
        if j >= i:
            j += 1
        key = i * n_end + j
        if not seen[key]:
            seen[key] = True
            order[count] = key
            count += 1
            if count == n_pairs:
                break
    return count


# ---- the loop -------------------------------------------------------------------------

def _run(gen: bool, m: int, t_col: Any, hold_col: Any, pid_col: Any, bri_col: Any,
         br_col: Any, mt: Any, dbuf: Any, n_end: int, lut: Any, pick_bri: Any, br_vals: Any,
         pair_start: Any, pair_len: Any, pair_reason: Any, route_fmt: Any, route_s0: Any,
         route_s1: Any, sp: Any, need: Any, busy: Any, slots: int, last_fit: bool,
         uni: Any, heap_t: Any, heap_v: Any, st_i: Any, st_f: Any, sizes: Any,
         batch_blocked: Any, keep: bool, out_route: Any, out_first: Any, out_n: Any,
         out_t: Any, out_hold: Any, out_src: Any, out_dst: Any, out_pick: Any) -> int:
    """Run m requests in order; return 0, or -1 if the heap is full (cannot happen: it
    holds slots x spectra entries).

    gen: the requests are drawn here from the Poisson stream whose MT19937 state is
    (mt, dbuf, st_i[MT_POS]: see mt_state) and whose clock is st_f[GEN_T] (rate
    st_f[GEN_RATE], holding 1 / st_f[GEN_LAM_HOLD]): per request 5 doubles (gap, src,
    dst, holding, bitrate), pair table lut[src x n_end + dst], bitrate br_vals[pick] of
    table column pick_bri[pick]; with keep, the drawn columns go to out_t, out_hold,
    out_src, out_dst, out_pick. Else request r is (t_col[r], hold_col[r], pid_col[r], bri_col[r],
    br_col[r]).

    Pair table p lists routes pair_start[p] .. + pair_len[p]; route q is on the spectra
    sp[route_s0[q]:route_s1[q]] and needs need[route_fmt[q], bitrate index] slots
    (route_fmt -1, or need 0: not a candidate). out_route[r] is the route taken
    (-1: blocked), out_first[r] and out_n[r] its block."""
    hsize = st_i[HSIZE]
    used = st_i[USED]
    n_req = st_i[NREQ]
    n_blocked = st_i[NBLOCKED]
    b_idx = st_i[BIDX]
    b_left = st_i[BLEFT]
    b_blocked = st_i[BBLOCKED]
    pos = st_i[MT_POS]
    area = st_f[AREA]
    last_t = st_f[LAST_T]
    br_req = st_f[BR_REQ]
    br_blocked = st_f[BR_BLOCKED]
    gen_t = st_f[GEN_T]
    rate = st_f[GEN_RATE]
    lam_hold = st_f[GEN_LAM_HOLD]
    n_sizes = sizes.shape[0]
    n_words = busy.shape[1]
    cap = heap_t.shape[0]
    status = 0
    for r in range(m):
        if gen:
            u, pos = _mt_double(mt, dbuf, pos)
            gen_t += -math.log(1.0 - u) / rate
            tr = gen_t
            u, pos = _mt_double(mt, dbuf, pos)
            src = np.int64(u * n_end)
            u, pos = _mt_double(mt, dbuf, pos)
            dst = np.int64(u * (n_end - 1))
            if dst >= src:
                dst += 1
            u, pos = _mt_double(mt, dbuf, pos)
            hold = -math.log(1.0 - u) / lam_hold
            u, pos = _mt_double(mt, dbuf, pos)
            pick = np.int64(u * br_vals.shape[0])
            p = lut[src * n_end + dst]
            bi = pick_bri[pick]
            b = br_vals[pick]
            if keep:
                out_t[r] = tr
                out_hold[r] = hold
                out_src[r] = src
                out_dst[r] = dst
                out_pick[r] = pick
        else:
            tr = t_col[r]
            hold = hold_col[r]
            p = pid_col[r]
            bi = bri_col[r]
            b = br_col[r]
        # departures up to this arrival, in time order (ties in any order: a second
        # departure at the same time adds used x 0.0 to the area)
        while hsize > 0 and heap_t[0] <= tr:
            d = heap_t[0]
            v = heap_v[0]
            q = v >> 32
            f = (v >> 16) & 0xFFFF
            n = v & 0xFFFF
            area += used * (d - last_t)
            last_t = d
            _set_block(busy, sp, route_s0[q], route_s1[q], f, n, False)
            used -= n * (route_s1[q] - route_s0[q])
            hsize -= 1
            if hsize > 0:
                # the root's hole down to a leaf along the smaller children, then the
                # last entry into it and up (Floyd's pop: one comparison per level)
                lt, lv = heap_t[hsize], heap_v[hsize]
                i = 0
                k = 1
                while k + 1 < hsize:
                    k += heap_t[k + 1] < heap_t[k]
                    heap_t[i], heap_v[i] = heap_t[k], heap_v[k]
                    i = k
                    k = 2 * i + 1
                if k < hsize:  # one child left
                    heap_t[i], heap_v[i] = heap_t[k], heap_v[k]
                    i = k
                while i > 0:
                    par = (i - 1) >> 1
                    if heap_t[par] <= lt:
                        break
                    heap_t[i], heap_v[i] = heap_t[par], heap_v[par]
                    i = par
                heap_t[i], heap_v[i] = lt, lv
        area += used * (tr - last_t)
        last_t = tr
        n_req += 1
        br_req += b
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
            _union(busy, sp, route_s0[q], route_s1[q], n_words, uni)
            if last_fit:
                first = _last_start(uni, n_words, n, slots)
            else:
                first = _first_start(uni, n_words, n, slots)
            if first >= 0:
                chosen = q
                break
        if chosen >= 0:
            q = chosen
            _set_block(busy, sp, route_s0[q], route_s1[q], first, n, True)
            used += n * (route_s1[q] - route_s0[q])
            if hsize == cap:
                status = -1
                break
            dep = tr + hold
            val = (np.int64(q) << 32) | (np.int64(first) << 16) | np.int64(n)
            i = hsize  # sift up
            hsize += 1
            while i > 0:
                par = (i - 1) // 2
                if heap_t[par] <= dep:
                    break
                heap_t[i], heap_v[i] = heap_t[par], heap_v[par]
                i = par
            heap_t[i], heap_v[i] = dep, val
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
    st_i[MT_POS] = pos
    st_f[AREA] = area
    st_f[LAST_T] = last_t
    st_f[BR_REQ] = br_req
    st_f[BR_BLOCKED] = br_blocked
    st_f[GEN_T] = gen_t
    return status


def _neg_log1m_loop(u: Any, out: Any) -> None:
    for i in range(u.shape[0]):
        out[i] = -math.log(1.0 - u[i])


# ---- compiling and loading ------------------------------------------------------------

# The functions compiled, helpers first; the entry points and their signatures (numba
# types) for the ahead-of-time module.
_HELPERS = ("_union", "_first_start", "_last_start", "_set_block", "_mt_refill",
            "_mt_doubles", "_mt_double")
_ENTRIES = {
    "_run": "i8(b1, i8, f8[::1], f8[::1], i4[::1], i4[::1], f8[::1], i8[::1], f8[::1], i8, "
            "i4[::1], "
            "i4[::1], f8[::1], i4[::1], i4[::1], i4[::1], i4[::1], i4[::1], i4[::1], "
            "i4[::1], i4[:, ::1], u8[:, ::1], i8, b1, u8[::1], f8[::1], i8[::1], i8[::1], "
            "f8[::1], i8[::1], i8[::1], b1, i4[::1], i4[::1], i4[::1], f8[::1], f8[::1], "
            "i4[::1], i4[::1], i4[::1])",
    "_pair_order": "i8(i8[::1], f8[::1], i8, i8, i8, b1[::1], i8[::1])",
    "_neg_log1m_loop": "void(f8[::1], f8[::1])",
}
_PY = {name: globals()[name] for name in (*_HELPERS, *_ENTRIES)}  # the Python originals

_kernel: Kernel | None = None
_compiled_ns = False


class Kernel:
    """The compiled entry points (from the ahead-of-time module or numba's JIT)."""

    def __init__(self, run: _F, pair_order: _F, neg_log1m: _F, how: str) -> None:
        self.run = run
        self.pair_order = pair_order
        self.neg_log1m = neg_log1m
        self.how = how  # "aot" or "jit"


def enabled() -> bool:
    """False when LIGHTPIPE_RMSA_KERNEL=0 (the pure-Python loop is used)."""
    return os.environ.get("LIGHTPIPE_RMSA_KERNEL", "1") != "0"


def _numba_installed() -> bool:
    return importlib.util.find_spec("numba") is not None


def _compile_namespace() -> None:
    """Swap numba's versions into this module's globals: the bit-count intrinsics and the
    helpers as dispatchers, so that the entry points compile against them (numba reads
    a function's globals when it compiles it)."""
    global _compiled_ns
    if _compiled_ns:
        return
    import numba
    from llvmlite import ir
    from numba.core import types
    from numba.extending import intrinsic

    @intrinsic
    def tz(typingctx: Any, src: Any) -> Any:
        if not isinstance(src, types.Integer):
            return None

        def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
            return builder.cttz(args[0], ir.Constant(ir.IntType(1), 0))
        return src(src), codegen

    @intrinsic
    def lz(typingctx: Any, src: Any) -> Any:
        if not isinstance(src, types.Integer):
            return None

        def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
            return builder.ctlz(args[0], ir.Constant(ir.IntType(1), 0))
        return src(src), codegen

    g = globals()
    g["_tz"], g["_lz"] = tz, lz
    for name in _HELPERS:  # inlined into the callers: no call, no array reference counts
        g[name] = numba.njit(nogil=True, inline="never" if name in ("_mt_refill", "_mt_doubles")
                             else "always")(_PY[name])
    _compiled_ns = True


def _jit_kernel() -> Kernel:
    """The entry points under numba's JIT, cached on disk where numba can write."""
    import numba

    _compile_namespace()
    fns = []
    for name in _ENTRIES:
        try:
            fns.append(numba.njit(cache=True, nogil=True)(_PY[name]))
        except RuntimeError as exc:  # numba: "cannot cache function ...: no locator"
            log.info("rmsa kernel: no numba cache (%s); compiling in this process", exc)
            fns.append(numba.njit(nogil=True)(_PY[name]))
    return Kernel(*fns, how="jit")


def build_key() -> str:
    """What the ahead-of-time module depends on besides this file: the Python build and
    numpy's version (two venvs of one checkout differ here, and keep a module each)."""
    h = hashlib.sha256()
    for part in (sys.version, sys.implementation.cache_tag or "", platform.machine(),
                 np.__version__, str(importlib.machinery.EXTENSION_SUFFIXES)):
        h.update(b"\0" + part.encode())
    return h.hexdigest()[:12]


def source_key() -> str:
    """The hash of this file (the compiled functions' source)."""
    return hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:12]


def aot_key() -> str:
    """What the ahead-of-time module depends on: the Python build and numpy, this file."""
    return f"{build_key()}_{source_key()}"


def _cache_dirs() -> Iterator[Path]:
    env = os.environ.get("NUMBA_CACHE_DIR")
    if env:
        yield Path(env)
        return
    yield _tree_cache_dir()
    yield Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "lightpipe"


def _tree_cache_dir() -> Path:
    return Path(__file__).resolve().parent / "__pycache__"


def _module_name() -> str:
    return f"_rmsa_kernel_{aot_key()}"


def _import_aot(path: Path, name: str) -> ModuleType:
    loader = importlib.machinery.ExtensionFileLoader(name, str(path))
    spec = importlib.util.spec_from_file_location(name, str(path), loader=loader)
    assert spec is not None
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def _trusted_module(d: Path, p: Path) -> bool:
    """Whether the built module at p (in d) may be loaded: a regular file (not a link)
    owned by this user or root, and neither it nor its directory writable by others (the
    module is native code, loaded by a process that may run as root)."""
    from testbed.io.trusted import dir_problem, trusted_owner

    try:
        st, dst = os.lstat(p), os.lstat(d)
    except OSError:
        return False
    ok = (stat.S_ISREG(st.st_mode) and trusted_owner(st.st_uid)
          and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
          and dir_problem(dst, allow_sticky=False) is None)
    if not ok:
        log.warning("rmsa kernel: not loading %s (not a private regular file of this user)",
                    p)
    return ok


def _find_aot(name: str) -> Path | None:
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    for d in _cache_dirs():
        p = d / f"{name}{suffix}"
        if os.path.lexists(p):
            return p if _trusted_module(d, p) else None
    return None


@contextlib.contextmanager
def _build_lock(d: Path, name: str) -> Iterator[None]:
    """One builder per machine at a time (others wait, then find the module)."""
    import fcntl

    with open(d / f"{name}.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


_LEGACY = re.compile(r"_rmsa_kernel_[0-9a-f]{16}\.")


def _remove_older_builds(d: Path, name: str) -> list[Path]:
    """Remove from d the modules (and their lock and failure files) that this Python build
    made from older versions of this file, and the single-key modules of this extension
    suffix from before the key was split; return what was removed. Another Python's or
    numpy's module is kept: a second venv of the checkout (another Python) runs beside this
    one, and removing its module would make each rebuild the other's on every run."""
    own = f"_rmsa_kernel_{build_key()}_"
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    gone = []
    for old in sorted(d.glob("_rmsa_kernel_*")):
        if old.name.startswith(name + ".") or old.is_dir():
            continue
        if old.name.startswith(own) or (_LEGACY.match(old.name)
                                        and old.name.endswith(suffix)):
            with contextlib.suppress(OSError):
                old.unlink()
                gone.append(old)
    return gone


def build_aot() -> Path:
    """Compile the entry points ahead of time (numba.pycc) into the first writable cache
    directory; return the module's path. Raises when no directory is writable or the
    build fails (no C compiler)."""
    name = _module_name()
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    errors = []
    for d in _cache_dirs():
        try:
            d.mkdir(parents=True, exist_ok=True)
            with _build_lock(d, name):
                target = d / f"{name}{suffix}"
                if target.is_file():  # another process built it meanwhile
                    return target
                _compile_namespace()
                with tempfile.TemporaryDirectory(dir=d) as tmp, warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # pycc's pending-deprecation notice
                    from numba.pycc import CC

                    cc = CC(name)
                    cc.output_dir = tmp
                    cc.verbose = False
                    cc.use_nrt = False  # (nothing is allocated: no reference counts)
                    for entry, sig in _ENTRIES.items():
                        cc.export(entry, sig)(_PY[entry])
                    cc.compile()
                    built = Path(tmp) / f"{name}{suffix}"
                    os.replace(built, target)
                if d == _tree_cache_dir():  # this checkout's own: older builds go
                    _remove_older_builds(d, name)
                return target
        except OSError as exc:
            errors.append(f"{d}: {exc}")
    raise OSError("rmsa kernel: no writable cache directory (" + "; ".join(errors) + ")")


def _aot_kernel() -> Kernel | None:
    """The ahead-of-time module's entry points, built first if missing; None when it
    cannot be built here (then numba's JIT runs: a failed build is remembered per key,
    so that later processes do not try again)."""
    name = _module_name()
    path = _find_aot(name)
    if path is None:
        if not _numba_installed() or any((d / f"{name}.failed").is_file()
                                         for d in _cache_dirs()):
            return None
        log.info("rmsa kernel: compiling the request loop ahead of time (once per "
                 "machine and version of this file, ~5 s of CPU)")
        try:
            path = build_aot()
        except Exception as exc:  # (no C compiler, no setuptools, no disk space...)
            log.info("rmsa kernel: ahead-of-time build failed (%s); using numba's JIT",
                     exc)
            for d in _cache_dirs():
                with contextlib.suppress(OSError):
                    (d / f"{name}.failed").write_text(f"{exc}\n")
                    break
            return None
    try:
        mod = _import_aot(path, name)
    except (ImportError, OSError) as exc:
        log.info("rmsa kernel: cannot load %s (%s); using numba's JIT", path, exc)
        return None
    return Kernel(mod._run, mod._pair_order, mod._neg_log1m_loop, how="aot")


def load() -> Kernel | None:
    """The compiled loop, or None without numba (said once in the log) or when disabled
    by LIGHTPIPE_RMSA_KERNEL=0; LIGHTPIPE_RMSA_KERNEL=jit uses numba's JIT only."""
    global _logged, _kernel
    if not enabled():
        return None
    mode = os.environ.get("LIGHTPIPE_RMSA_KERNEL", "1")
    if _kernel is not None and (mode != "jit" or _kernel.how == "jit"):
        return _kernel
    got = None if mode == "jit" else _aot_kernel()
    if got is None:
        if not _numba_installed():
            if not _logged:
                _logged = True
                log.info("numba is not installed: dynamic RMSA runs use the pure-Python loop")
            return None
        got = _jit_kernel()
    _kernel = got
    return got


def neg_log1m(u: np.ndarray) -> np.ndarray:
    """-log(1 - u) per element with libm's log, as random.expovariate takes it (the
    compiled math.log calls libm's log; numpy's np.log may differ in the last bit)."""
    out = np.empty(len(u), np.float64)
    k = load()
    if k is None:
        out[:] = [-math.log(1.0 - x) for x in np.asarray(u, np.float64).tolist()]
        return out
    k.neg_log1m(np.ascontiguousarray(u, dtype=np.float64), out)
    return out


def new_state() -> tuple[np.ndarray, np.ndarray]:
    """Fresh (st_i, st_f) state arrays."""
    return np.zeros(ST_I_LEN, np.int64), np.zeros(ST_F_LEN, np.float64)


def mt_state(words: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray, int]:
    """The kernel's generator state from random.Random.getstate()[1] (624 words and the
    position): the words as int64, the doubles of the words not yet drawn, and the index
    of the next double (312: refill first). The position must be even (a double takes
    two words; random.Random(seed) starts at 624)."""
    pos = int(words[-1])
    if pos % 2:
        raise ValueError(f"MT19937 position {pos} is odd")
    mt = np.array(words[:-1], np.int64)
    y = mt.astype(np.uint64)  # tempered as genrand_uint32 (the kernel's _mt_doubles)
    y ^= y >> np.uint64(11)
    y ^= (y << np.uint64(7)) & np.uint64(0x9D2C5680)
    y ^= (y << np.uint64(15)) & np.uint64(0xEFC60000)
    y ^= y >> np.uint64(18)
    a = (y[0::2] >> np.uint64(5)).astype(np.float64)
    b = (y[1::2] >> np.uint64(6)).astype(np.float64)
    return mt, (a * 67108864.0 + b) / 9007199254740992.0, pos // 2


def main(argv: list[str] | None = None) -> int:
    """python -m testbed.sim.rmsa_kernel --build: compile the ahead-of-time module now
    (as the first dynamic RMSA run would), print its path."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m testbed.sim.rmsa_kernel",
                                 description=main.__doc__)
    ap.add_argument("--build", action="store_true", help="build the module if missing")
    args = ap.parse_args(argv)
    path = _find_aot(_module_name())
    if path is None and args.build:
        path = build_aot()
    sys.stdout.write(f"{path if path is not None else 'not built'}\n")
    return 0 if path is not None else 1


if __name__ == "__main__":
    raise SystemExit(main())
