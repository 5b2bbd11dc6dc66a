"""Array layout of RMSA-v0's compiled state: field offsets, a scenario's static arrays, arenas.

One env's state is four arrays (a vector env stacks them on a first axis of num_envs):

* ``ist`` int64: the header fields ``I_*``, then the k candidate routes of the current
  request, the MT19937 state of the request stream (625 words), then for ``cap``
  lightpaths: the departure heap (per position: request id, pool entry), the pool's
  free stack, and per pool entry its route (-1: lost to a failure), first slot and slots
  side by side (each entry's words together: one cache line, not one per field);
* ``fst`` float64: the header fields ``F_*``, then the heap's departure times (per
  position) and each pool entry's bit rate;
* ``sb`` uint64 ``[3 * spectra + 2, words]``: slot bitmaps (testbed.gym.bits) per
  spectrum: busy (held or out of service: what allocation sees), out of service (cut,
  lost slots), lost slots (wavelength loss); the last two rows are the kernel's scratch;
* ``flags`` int8 ``[versions + 2, nodes * nodes]``: how each ordered pair's candidate
  routes were found, per route version (the env's own table, kept across episodes), in
  the episode's network cache (row ``versions``) and in the base network's cache (row
  ``versions + 1``): 0 not yet, 1 the k shortest src -> dst, 2 those of dst -> src reversed.

The static arrays ``sta_i`` (int64) and ``sta_f`` (float64) hold the scenario's sizes
(``S_*``), endpoints, bit rates, event times, the version -> failure-set map and a
request trace's columns; they are shared by every env of a vector.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from testbed.gym.bits import words

# the fields and statuses are the kernel's (compiled code bakes them in: testbed.gym.kernel)
from testbed.gym.kernel import (
    F_BR,
    F_BRBLK,
    F_BRREQ,
    F_HOLD,
    F_NEXTEV,
    F_POOL,
    F_T,
    FWD,
    I_ACC,
    I_ARG,
    I_CAND,
    I_CAP,
    I_DST,
    I_ENDED,
    I_EVI,
    I_FIRST,
    I_FTOP,
    I_GEN,
    I_HAVE,
    I_HSIZE,
    I_LOST,
    I_NBLK,
    I_NREQ,
    I_PAIR,
    I_PATH,
    I_RESTORED,
    I_RID,
    I_ROUTE,
    I_SRC,
    I_STARTED,
    I_STEPPED,
    I_TRUNC,
    I_VER,
    REV,
    S_ALLOW,
    S_END,
    S_GUARD,
    S_J,
    S_K,
    S_LEN,
    S_NB,
    S_NE,
    S_NEV,
    S_NN,
    S_NSP,
    S_ROWS,
    S_SLOTS,
    S_TOTAL,
    S_TRACE,
    S_TRDST,
    S_TRID,
    S_TRSRC,
    S_V,
    S_VFS,
    SF_BR,
    SF_EV,
    SF_LAMH,
    SF_LEN,
    SF_RATE,
    SF_TRB,
    SF_TRH,
    SF_TRT,
    ST_EVENT,
    ST_FULL,
    ST_KSP,
    ST_OK,
    STATE_LEN,
)

__all__ = [
    "FWD",
    "F_BR",
    "F_BRBLK",
    "F_BRREQ",
    "F_HOLD",
    "F_NEXTEV",
    "F_POOL",
    "F_T",
    "INITIAL_CAP",
    "I_ACC",
    "I_ARG",
    "I_CAND",
    "I_CAP",
    "I_DST",
    "I_ENDED",
    "I_EVI",
    "I_FIRST",
    "I_FTOP",
    "I_GEN",
    "I_HAVE",
    "I_HSIZE",
    "I_LOST",
    "I_NBLK",
    "I_NREQ",
    "I_PAIR",
    "I_PATH",
    "I_RESTORED",
    "I_RID",
    "I_ROUTE",
    "I_SRC",
    "I_STARTED",
    "I_STEPPED",
    "I_TRUNC",
    "I_VER",
    "REV",
    "SF_BR",
    "SF_EV",
    "SF_LAMH",
    "SF_LEN",
    "SF_RATE",
    "SF_TRB",
    "SF_TRH",
    "SF_TRT",
    "STATE_LEN",
    "ST_EVENT",
    "ST_FULL",
    "ST_KSP",
    "ST_OK",
    "S_ALLOW",
    "S_END",
    "S_GUARD",
    "S_J",
    "S_K",
    "S_LEN",
    "S_NB",
    "S_NE",
    "S_NEV",
    "S_NN",
    "S_NSP",
    "S_ROWS",
    "S_SLOTS",
    "S_TOTAL",
    "S_TRACE",
    "S_TRDST",
    "S_TRID",
    "S_TRSRC",
    "S_V",
    "S_VFS",
    "Arenas",
    "Static",
    "build_static",
    "fst_len",
    "grown",
    "heap_offset",
    "ist_len",
    "mt_offset",
    "new_arenas",
]

INITIAL_CAP = 64  # heap/pool entries at first; doubled when full


def mt_offset(k: int) -> int:
    """Offset of the MT19937 state in ist."""
    return I_CAND + k


def heap_offset(k: int) -> int:
    """Offset of the heap in ist: 2 cap words, then the free stack (cap), then the pool
    (3 cap: route, first slot, slots per entry)."""
    return I_CAND + k + STATE_LEN


def ist_len(k: int, cap: int) -> int:
    return heap_offset(k) + 6 * cap


def fst_len(cap: int) -> int:
    return F_POOL + 2 * cap


@dataclass
class Static:
    """The static arrays of one env configuration and its sizes."""

    sta_i: np.ndarray
    sta_f: np.ndarray
    n_spectra: int
    slots: int
    k: int
    j: int
    n_nodes: int
    versions: int

    @property
    def n_actions(self) -> int:
        return self.k * self.j + 1


def build_static(*, n_spectra: int, slots: int, k: int, j: int, n_nodes: int,
                 endpoints: list[int], bitrates: list[float], guard: int,
                 allow_reject: bool, total: int, event_times: list[float],
                 version_fs: list[int], rate: float, lam_hold: float,
                 trace: tuple[np.ndarray, np.ndarray] | None) -> Static:
    """sta_i / sta_f for the sizes given; trace: (float columns [rows, 3]: arrival, holding,
    bit rate; int columns [rows, 3]: request id, src node, dst node), or None (Poisson)."""
    rows = 0 if trace is None else len(trace[0])
    ne, nb, nev, nv = len(endpoints), len(bitrates), len(event_times), len(version_fs)
    hi = [0] * S_LEN
    hi[S_NSP], hi[S_SLOTS], hi[S_K], hi[S_J], hi[S_NN] = n_spectra, slots, k, j, n_nodes
    hi[S_NE], hi[S_NB], hi[S_GUARD], hi[S_ALLOW] = ne, nb, guard, int(allow_reject)
    hi[S_TRACE], hi[S_ROWS], hi[S_V], hi[S_NEV] = int(trace is not None), rows, nv, nev
    hi[S_TOTAL] = total
    hi[S_END] = S_LEN
    hi[S_VFS] = S_LEN + ne
    hi[S_TRID] = S_LEN + ne + nv
    hi[S_TRSRC] = hi[S_TRID] + rows
    hi[S_TRDST] = hi[S_TRSRC] + rows
    sta_i = np.zeros(hi[S_TRDST] + rows, np.int64)
    sta_i[:S_LEN] = hi
    sta_i[hi[S_END]:hi[S_END] + ne] = endpoints
    sta_i[hi[S_VFS]:hi[S_VFS] + nv] = version_fs
    hf = [0.0] * SF_LEN
    hf[SF_RATE], hf[SF_LAMH] = rate, lam_hold
    hf[SF_BR] = SF_LEN
    hf[SF_EV] = SF_LEN + nb
    hf[SF_TRT] = SF_LEN + nb + nev + 1  # event times end with +inf
    hf[SF_TRH] = hf[SF_TRT] + rows
    hf[SF_TRB] = hf[SF_TRH] + rows
    sta_f = np.zeros(int(hf[SF_TRB]) + rows, np.float64)
    sta_f[:SF_LEN] = hf
    sta_f[SF_LEN:SF_LEN + nb] = bitrates
    ev = int(hf[SF_EV])
    sta_f[ev:ev + nev] = event_times
    sta_f[ev + nev] = np.inf
    if trace is not None:
        tf, ti = trace
        for c, off in enumerate((int(hf[SF_TRT]), int(hf[SF_TRH]), int(hf[SF_TRB]))):
            sta_f[off:off + rows] = tf[:, c]
        for c, off in enumerate((hi[S_TRID], hi[S_TRSRC], hi[S_TRDST])):
            sta_i[off:off + rows] = ti[:, c]
    return Static(sta_i, sta_f, n_spectra, slots, k, j, n_nodes, nv)


@dataclass
class Arenas:
    """The per-env state arrays of num_envs envs and their output buffers (first axis:
    the env; a single env uses row 0 through views). `spectrum` is uint8 [k, slots
    rounded up to 8] (the observation is its first `slots` columns); the kernel writes it
    through `spectrum64`, the same bytes as uint64."""

    ist: np.ndarray
    fst: np.ndarray
    sb: np.ndarray
    flags: np.ndarray
    spectrum: np.ndarray
    spectrum64: np.ndarray
    slots_needed: np.ndarray
    block_start: np.ndarray
    block_free: np.ndarray
    bitrate: np.ndarray
    holding: np.ndarray
    mask: np.ndarray


def new_arenas(st: Static, num_envs: int, cap: int = INITIAL_CAP) -> Arenas:
    """Fresh (never reset) state for num_envs envs."""
    n, k, j, s = num_envs, st.k, st.j, st.slots
    ist = np.zeros((n, ist_len(k, cap)), np.int64)
    ist[:, I_CAP] = cap
    spectrum = np.zeros((n, k, 8 * ((s + 7) // 8)), np.uint8)
    return Arenas(
        ist=ist, fst=np.zeros((n, fst_len(cap)), np.float64),
        sb=np.zeros((n, 3 * st.n_spectra + 2, words(s)), np.uint64),
        flags=np.zeros((n, st.versions + 2, st.n_nodes * st.n_nodes), np.int8),
        spectrum=spectrum, spectrum64=spectrum.view(np.uint64),
        slots_needed=np.zeros((n, k), np.int32),
        block_start=np.zeros((n, k, j), np.int32), block_free=np.zeros((n, k, j), np.int32),
        bitrate=np.zeros((n, 1), np.float32), holding=np.zeros((n, 1), np.float32),
        mask=np.zeros((n, st.n_actions), np.int8))


def grown(ist: np.ndarray, fst: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """ist and fst (first axis: envs) with twice the heap/pool capacity, entries kept."""
    cap = int(ist[0, I_CAP])
    new_cap = 2 * cap
    h = heap_offset(k)
    n = ist.shape[0]
    ni = np.zeros((n, ist_len(k, new_cap)), np.int64)
    ni[:, :h] = ist[:, :h]
    ni[:, I_CAP] = new_cap
    ni[:, h:h + 2 * cap] = ist[:, h:h + 2 * cap]  # heap positions
    ni[:, h + 3 * new_cap:h + 3 * new_cap + 3 * cap] = ist[:, h + 3 * cap:h + 6 * cap]  # pool
    # the free stack: the new entries cap..2cap-1 go below the old ones
    free, old_free = h + 2 * new_cap, h + 2 * cap
    top = ist[:, I_FTOP]
    for e in range(n):
        t = int(top[e])
        old = ist[e, old_free:old_free + t].copy()
        ni[e, free:free + cap] = np.arange(new_cap - 1, cap - 1, -1)
        ni[e, free + cap:free + cap + t] = old
        ni[e, I_FTOP] = cap + t
    nf = np.zeros((n, fst_len(new_cap)), np.float64)
    nf[:, :F_POOL] = fst[:, :F_POOL]
    nf[:, F_POOL:F_POOL + cap] = fst[:, F_POOL:F_POOL + cap]
    nf[:, F_POOL + new_cap:F_POOL + new_cap + cap] = fst[:, F_POOL + cap:F_POOL + 2 * cap]
    return ni, nf
