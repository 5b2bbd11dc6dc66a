"""Slot bitmaps as rows of uint64 words (bit i of word w: slot 64 w + i), Python side.

The compiled helpers (ctz, range_bits, BYTE_SLOTS: a byte's 8 bits as 8 observation
slots) are testbed.gym.kernel's; here: row sizes and the conversions between a row of
words and an int bitmap (what testbed.optical.spectrum works on).
"""

from __future__ import annotations

import numpy as np


def words(slots: int) -> int:
    """uint64 words per row of `slots` slots."""
    return max(1, (slots + 63) // 64)


def row_to_int(row: np.ndarray) -> int:
    """A row of words as an int bitmap."""
    return int.from_bytes(np.ascontiguousarray(row, np.uint64).tobytes(), "little")


def int_to_row(x: int, n_words: int) -> np.ndarray:
    """An int bitmap (below 2**(64 n_words)) as a row of words."""
    return np.frombuffer(x.to_bytes(8 * n_words, "little"), np.uint64).copy()
