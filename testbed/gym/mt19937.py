"""Python's random.Random (MT19937) over an int64 array: int seeding, random() (compiled).

The state is 624 words and an index, as CPython's _randommodule.c keeps them; seeding an
int follows random.seed(n) (init_by_array over the 32-bit words of abs(n)), and random()
is genrand_res53, so a stream drawn here equals random.Random(n)'s bit for bit
(tests/test_gym_fast.py). Words are kept in int64 and masked to 32 bits, in row e of a
2-D array from column o (the envs of a vector each have a row; indexing, not slicing,
keeps threads from contending on an array's reference count). The compiled functions
are testbed.gym.kernel's (seed_state, genrand, random53); this module seeds them.
"""

from __future__ import annotations

import numpy as np

from testbed.gym.kernel import STATE_LEN, random53, seed_state

__all__ = ["MAX_KEY_WORDS", "STATE_LEN", "new_state", "random53", "seed_key", "seed_state"]

MAX_KEY_WORDS = 32  # seeds below 2**1024
_MASK = 0xFFFFFFFF


def seed_key(seed: int) -> list[int]:
    """The 32-bit words random.seed(seed) feeds init_by_array (abs(seed), low word first)."""
    n = abs(int(seed))
    words = [(n >> (32 * i)) & _MASK for i in range(max(1, (n.bit_length() + 31) // 32))]
    if len(words) > MAX_KEY_WORDS:
        raise ValueError(f"seed {seed} is too large (at most {32 * MAX_KEY_WORDS} bits)")
    return words


def new_state(seed: int) -> np.ndarray:
    """A fresh state [1, 625] seeded as random.Random(seed) (for tests and Python)."""
    mt = np.zeros((1, STATE_LEN), np.int64)
    key = np.array(seed_key(seed), np.int64)
    seed_state(mt, 0, 0, key, len(key))
    return mt
