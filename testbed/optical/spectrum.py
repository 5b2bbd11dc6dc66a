"""Spectrum bitmaps as Python ints (bit i set = slot i busy) and the fit policies on them."""

from __future__ import annotations

import random
from functools import cache

POLICIES = ("first_fit", "last_fit", "random_fit", "best_fit")


def full_mask(slots: int) -> int:
    """All `slots` bits set."""
    return (1 << slots) - 1


def block_mask(first_slot: int, n_slots: int) -> int:
    """Bits first_slot .. first_slot + n_slots - 1 set."""
    return ((1 << n_slots) - 1) << first_slot


@cache
def shift_plan(n_slots: int) -> tuple[int, ...]:
    """Shifts that turn a free mask into a mask of starts of n-slot free runs (log2 n steps).

    After `x &= x >> s` for each s, bit i of x is set iff bits i .. i+n-1 of the free
    mask are all set: each step doubles (at most) the run length already verified.
    """
    shifts = []
    have = 1
    while have < n_slots:
        s = min(have, n_slots - have)
        shifts.append(s)
        have += s
    return tuple(shifts)


def fitting_starts(free: int, n_slots: int) -> int:
    """Mask of every slot index where an n-slot contiguous free block starts."""
    x = free
    for s in shift_plan(n_slots):
        x &= x >> s
    return x


def free_runs(free: int) -> list[tuple[int, int]]:
    """Maximal runs of free slots as (first_slot, length), lowest first."""
    runs = []
    pos = 0
    while free:
        low = (free & -free).bit_length() - 1  # start of the next run
        free >>= low
        pos += low
        length = (~free & (free + 1)).bit_length() - 1  # trailing ones
        runs.append((pos, length))
        free >>= length
        pos += length
    return runs


def nth_set_bit(x: int, n: int) -> int:
    """Index of the n-th (0-based) set bit of x, counting from the lowest."""
    for _ in range(n):
        x &= x - 1
    return (x & -x).bit_length() - 1


def choose_start(free: int, n_slots: int, policy: str,
                 rng: random.Random | None = None) -> int | None:
    """First slot of the block `policy` picks in the free mask, or None if nothing fits.

    first_fit: lowest start; last_fit: highest start; random_fit: uniform over all
    fitting starts; best_fit: the smallest free run that fits (lowest such run on
    ties), block placed at the run's low end.
    """
    starts = fitting_starts(free, n_slots)
    if not starts:
        return None
    if policy == "first_fit":
        return (starts & -starts).bit_length() - 1
    if policy == "last_fit":
        return starts.bit_length() - 1
    if policy == "random_fit":
        if rng is None:
            raise ValueError("random_fit needs an rng")
        return nth_set_bit(starts, rng.randrange(starts.bit_count()))
    if policy == "best_fit":
        best: tuple[int, int] | None = None
        for first, length in free_runs(free):
            if length >= n_slots and (best is None or length < best[1]):
                best = (first, length)
        assert best is not None
        return best[0]
    raise ValueError(f"unknown spectrum policy {policy!r} (known: {', '.join(POLICIES)})")


def bits(mask: int) -> list[int]:
    """Indices of the set bits of mask, lowest first."""
    out = []
    while mask:
        low = mask & -mask
        out.append(low.bit_length() - 1)
        mask ^= low
    return out
