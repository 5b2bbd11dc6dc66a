"""One compiled env's arrays packed into one buffer: a cheaper kernel call.

A call into numba costs about 50 ns per array argument; RMSA-v0's step takes sixteen
arrays. Here they live in one int64 buffer, in sections of each dtype (int64, float64,
uint64, int8, int32, float32 reinterpreted in place), with a header of offsets (in
int64 words) and shapes at its start. The header fields (H_*) and the entry points that
cut the buffer back into the kernel's arrays (views, no copies: `packed_step`,
`packed_advance`, `packed_reset`) are testbed.gym.kernel's. `Packed` builds the buffer,
copies the scenario's static arrays and the route book in (again after the book
changes), and exposes the same arrays to Python as numpy views, for the observation
copies and the event handling.
"""

from __future__ import annotations

import numpy as np

from testbed.gym.bits import words
from testbed.gym.kernel import (
    H_BF,
    H_BS,
    H_F32,
    H_FLC,
    H_FLR,
    H_FST,
    H_FSTN,
    H_I8,
    H_I8N,
    H_I32,
    H_I32N,
    H_IST,
    H_ISTN,
    H_J,
    H_KS,
    H_KSF,
    H_KSK,
    H_KSP,
    H_MK,
    H_MKN,
    H_ND,
    H_RG,
    H_RGN,
    H_RTC,
    H_RTR,
    H_SB,
    H_SBR,
    H_SBW,
    H_SP,
    H_SPW,
    H_STF,
    H_STFN,
    H_STI,
    H_STIN,
    HEAD,
)
from testbed.gym.layout import I_CAP, Static, fst_len, grown, ist_len
from testbed.gym.routes import RouteBook


def _words(n_bytes: int) -> int:
    return (n_bytes + 7) // 8


class Packed:
    """The buffer of one env and numpy views of its arrays (attributes as the kernel
    names them: ist, fst, sb, flags, spec (uint8 observation rows, slots rounded up to
    8), need, bs, bf, brv, hov, mask)."""

    def __init__(self, st: Static, book: RouteBook, cap: int) -> None:
        self.st = st
        self.book = book
        self._build(cap, None)

    def _build(self, cap: int, old: Packed | None) -> None:
        st, book = self.st, self.book
        k, j, slots = st.k, st.j, st.slots
        w8 = (slots + 7) // 8
        sbr, sbw = 3 * st.n_spectra + 2, words(slots)
        flr, flc = st.versions + 2, st.n_nodes * st.n_nodes
        rtr, rtc = book.rt.shape
        h = np.zeros(HEAD, np.int64)
        at = HEAD

        def take(n: int) -> int:
            nonlocal at
            at += n
            return at - n

        h[H_ISTN] = ist_len(k, cap)
        h[H_IST] = take(h[H_ISTN])
        h[H_STIN] = len(st.sta_i)
        h[H_STI] = take(h[H_STIN])
        h[H_FSTN] = fst_len(cap)
        h[H_FST] = take(h[H_FSTN])
        h[H_STFN] = len(st.sta_f)
        h[H_STF] = take(h[H_STFN])
        h[H_RGN] = len(book.rg)
        h[H_RG] = take(h[H_RGN])
        h[H_SBR], h[H_SBW] = sbr, sbw
        h[H_SB] = take(sbr * sbw)
        h[H_SPW] = w8
        h[H_SP] = take(k * w8)
        h[H_FLR], h[H_FLC], h[H_MK], h[H_MKN] = flr, flc, flr * flc, st.n_actions
        h[H_I8N] = _words(flr * flc + st.n_actions)
        h[H_I8] = take(h[H_I8N])
        h[H_RTR], h[H_RTC] = rtr, rtc
        h[H_KS], h[H_KSF], h[H_KSP], h[H_KSK] = rtr * rtc, book.ksp.shape[0], flc, k
        h[H_ND] = h[H_KS] + book.ksp.size
        h[H_BS] = h[H_ND] + k
        h[H_BF] = h[H_BS] + k * j
        h[H_J] = j
        h[H_I32N] = _words(4 * (h[H_BF] + k * j))
        h[H_I32] = take(h[H_I32N])
        h[H_F32] = take(1)
        self.mem = np.zeros(at, np.int64)
        mem = self.mem
        mem[:HEAD] = h
        self.h = h

        def sec(off: int, n: int) -> np.ndarray:
            return mem[off:off + n]

        self.ist = sec(h[H_IST], h[H_ISTN])
        self.fst = sec(h[H_FST], h[H_FSTN]).view(np.float64)
        self.rg = sec(h[H_RG], h[H_RGN]).view(np.float64)
        self.sb = sec(h[H_SB], sbr * sbw).view(np.uint64).reshape(sbr, sbw)
        self.spec = sec(h[H_SP], k * w8).view(np.uint8).reshape(k, 8 * w8)
        i8 = sec(h[H_I8], h[H_I8N]).view(np.int8)
        self.flags = i8[:flr * flc].reshape(flr, flc)
        self.mask = i8[flr * flc:flr * flc + st.n_actions]
        self.i32 = sec(h[H_I32], h[H_I32N]).view(np.int32)
        self.need = self.i32[h[H_ND]:h[H_ND] + k]
        self.bs = self.i32[h[H_BS]:h[H_BS] + k * j].reshape(k, j)
        self.bf = self.i32[h[H_BF]:h[H_BF] + k * j].reshape(k, j)
        self.f32 = sec(h[H_F32], 1).view(np.float32)
        self.brv = self.f32[0:1]
        self.hov = self.f32[1:2]
        sec(h[H_STI], h[H_STIN])[:] = st.sta_i
        sec(h[H_STF], h[H_STFN]).view(np.float64)[:] = st.sta_f
        self.ist[I_CAP] = cap
        if old is not None:  # the state carried over
            n = min(len(old.ist), len(self.ist))
            self.ist[:n] = old.ist[:n]
            self.ist[I_CAP] = old.ist[I_CAP]
            self.fst[:len(old.fst)] = old.fst
            self.sb[:] = old.sb
            self.spec[:] = old.spec
            self.flags[:] = old.flags
            self.mask[:] = old.mask
            self.need[:] = old.need
            self.bs[:] = old.bs
            self.bf[:] = old.bf
            self.f32[:] = old.f32
        self._copy_book()
        self.args = (self.mem,)

    def _copy_book(self) -> None:
        h, book = self.h, self.book
        self.rg[:] = book.rg
        self.i32[:book.rt.size] = book.rt.ravel()
        self.i32[h[H_KS]:h[H_KS] + book.ksp.size] = book.ksp.ravel()
        self.book_version = book.version

    def sync_book(self) -> None:
        """Copy the route book in again after it changed (rebuilt when it grew)."""
        if self.book_version == self.book.version:
            return
        if (self.book.rt.shape[0] != self.h[H_RTR]) or len(self.book.rg) != self.h[H_RGN]:
            self._rebuild(int(self.ist[I_CAP]))
        else:
            self._copy_book()

    def grow(self) -> None:
        """Twice the departure heap's capacity, the state kept."""
        k = self.st.k
        ni, nf = grown(self.ist[None, :].copy(), self.fst[None, :].copy(), k)
        self._rebuild(int(ni[0, I_CAP]))
        self.ist[:] = ni[0]
        self.fst[:] = nf[0]

    def _rebuild(self, cap: int) -> None:
        old = _Snapshot(self)
        self._build(cap, old)  # type: ignore[arg-type]


class _Snapshot:
    """A copy of a Packed's arrays (what _build carries over)."""

    def __init__(self, p: Packed) -> None:
        for name in ("ist", "fst", "sb", "spec", "flags", "mask", "need", "bs", "bf", "f32"):
            setattr(self, name, getattr(p, name).copy())
