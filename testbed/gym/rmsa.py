"""LightPipe/RMSA-v0: DeepRMSA-style dynamic RMSA as a Gymnasium environment (compiled).

One step = one lightpath request. The agent picks one of the k candidate paths
(`OpticalNetwork.candidate_paths`, k shortest by length, modulation by reach) and one of
the first J free spectrum blocks that fit on it (DeepRMSA: the free runs of at least the
slots needed, the block at the low end of the run), or rejects. Requests arrive and
leave as in `lightpipe sim` (`poisson_requests`, or the scenario's trace), and fibre
cuts, repairs and wavelength loss/repair of the scenario's `events` hit live lightpaths,
which are restored with the scenario's spectrum policy or lost (as the simulator does).

Reward +1 when the request is accepted, -1 when it is blocked (a forbidden action or a
reject). `info["action_mask"]` (np.int8) marks the actions that set a lightpath up; the
reject action is allowed only when nothing else is (unless allow_reject=True).

The step, the mask and the observation run in a compiled kernel over arrays
(testbed.gym.kernel, testbed.gym.layout); network events drop into Python between kernel
calls (testbed.gym.events). Observations, rewards, infos and masks equal those of the
first implementation, kept as `testbed.gym.rmsa_reference.ReferenceRMSAEnv`, on the same
seed and actions (tests/test_gym_fast.py). Every array handed out is a fresh copy.
docs/gym.md describes the spaces, the seeding and the assumptions.
"""

from __future__ import annotations

import math
import random
from typing import Any

import numpy as np

from testbed.errors import InputError
from testbed.gym import kernel
from testbed.gym.events import apply_event
from testbed.gym.kernel import packed_step as _step
from testbed.gym.layout import (
    F_BRBLK,
    F_BRREQ,
    I_ARG,
    I_CAND,
    I_EVI,
    I_LOST,
    I_NBLK,
    I_NREQ,
    I_RESTORED,
    I_VER,
    INITIAL_CAP,
    ST_EVENT,
    ST_FULL,
    ST_KSP,
)
from testbed.gym.mt19937 import seed_key
from testbed.gym.packed import Packed
from testbed.gym.rmsa_setup import DEFAULT_BLOCKS, RMSABase

__all__ = ["DEFAULT_BLOCKS", "RMSAEnv", "first_fit_action"]

Record = tuple[int, int, int, int, int, int, int, int, int, int, float, int]


def first_fit_action(mask: np.ndarray) -> int:
    """The k-shortest-path first-fit action: the lowest allowed (path, block) action.

    Actions are path-major and block 0 of a path is its lowest fitting start, so this is
    the first path with a fitting block at its first-fit slot, the choice `lightpipe sim`
    makes under policy first_fit; the reject action when nothing fits.
    """
    n = mask.shape[0] - 1
    allowed = mask[:n].nonzero()[0]
    return int(allowed[0]) if len(allowed) else n


class RMSAEnv(RMSABase):
    """Dynamic RMSA on LightPipe's optical model, compiled (module docstring, docs/gym.md)."""

    _pk: Packed | None = None  # the packed buffers, from the first reset on
    _restore: random.Random | None = None  # the episode's restoration stream, when needed

    # ---- state ------------------------------------------------------------------------
    def _bind(self, pk: Packed) -> None:
        """The packed buffers' arrays as this env's."""
        self._pk = pk
        self._ist, self._fst, self._sb, self._flags = pk.ist, pk.fst, pk.sb, pk.flags
        self._need, self._bs, self._bf = pk.need, pk.bs, pk.bf
        self._brv, self._hov, self._mask = pk.brv, pk.hov, pk.mask
        # the observation's slots (the buffer rounds them up to whole words of 8)
        self._spec_obs = pk.spec[:, :self.n_slots]
        self._args = pk.args
        self._mem = pk.mem
        self._names = self.setup.book.names  # route names by id (the list grows in place)

    # ---- episode ---------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None
              ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Start an episode: an empty network and the request stream of the episode seed
        (`start_episode` says which seed)."""
        ep = self.start_episode(seed)
        st = self.setup.static()
        if self._pk is None:
            self._bind(Packed(st, self.setup.book, INITIAL_CAP))
        if self.setup.total() < 1:
            raise InputError("workload", "the workload has no requests")
        self._restore = None
        key = np.array(seed_key(ep) if self.workload.trace is None else [0], np.int64)
        rec = self._settle(kernel.packed_reset(*self._args, key, len(key)))
        self._ended = False
        return self._obs(rec), self._info(rec)

    def step(self, action: Any) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        a = self.step_action(action)
        rec = _step(self._mem, a)
        if rec[0]:  # not ST_OK: events, routes or a full heap to see to
            rec = self._settle(rec)
        accepted = rec[1] != 0
        truncated = rec[11] != 0
        if truncated:
            self._ended = True
        # (written out, not through _obs/_info: this is the hot path)
        return {
            "spectrum": self._spec_obs.copy(),
            "slots_needed": self._need.copy(),
            "block_start": self._bs.copy(),
            "block_free": self._bf.copy(),
            "source": rec[6],
            "destination": rec[7],
            "bitrate_gbps": self._brv.copy(),
            "holding_s": self._hov.copy(),
        }, 1.0 if accepted else -1.0, False, truncated, {
            "action_mask": self._mask.copy(), "request_id": rec[5], "time_s": rec[10],
            "requests": rec[8], "blocked": rec[9], "accepted": accepted,
            "path_index": rec[2], "first_slot": rec[3],
            "route": self._names[rec[4]] if accepted else ""}

    def _settle(self, rec: Record) -> Record:
        """Apply due network events and compute missing routes until the kernel is ready;
        grow the arenas when the departure heap is full."""
        while rec[0] == ST_EVENT or rec[0] == ST_KSP:
            if rec[0] == ST_EVENT:
                self._event()
            else:
                self._ksp()
            pk = self._pk
            assert pk is not None
            pk.sync_book()  # the routes found, into the buffers
            self._bind(pk)
            rec = kernel.packed_advance(*self._args)
        if rec[0] == ST_FULL:
            assert self._pk is not None
            self._pk.grow()
            self._bind(self._pk)
        return rec

    def _event(self) -> None:
        su = self.setup
        apply_event(self.events[int(self._ist[I_EVI])], self._ist, self._fst, self._sb,
                    self._flags, su.static(), su.book, per_direction=su.net.per_direction,
                    guard=su.net.guard_slots, policy=su.policy, rng=self._restore_rng)

    def _ksp(self) -> None:
        su = self.setup
        su.book.fill(su.version_fs[int(self._ist[I_VER])], int(self._ist[I_ARG]))

    def _restore_rng(self) -> random.Random:
        if self._restore is None:
            assert self._episode_seed is not None
            self._restore = self.setup.restore_rng(self._episode_seed)
        return self._restore

    # ---- what the agent sees -----------------------------------------------------------
    def _obs(self, rec: Record) -> dict[str, Any]:
        return {
            "spectrum": self._spec_obs.copy(),
            "slots_needed": self._need.copy(),
            "block_start": self._bs.copy(),
            "block_free": self._bf.copy(),
            "source": rec[6],
            "destination": rec[7],
            "bitrate_gbps": self._brv.copy(),
            "holding_s": self._hov.copy(),
        }

    def _info(self, rec: Record) -> dict[str, Any]:
        return {"action_mask": self._mask.copy(), "request_id": rec[5], "time_s": rec[10],
                "requests": rec[8], "blocked": rec[9]}

    # ---- counters and state ----------------------------------------------------------
    def _count(self, i: int) -> int:
        """Integer state i of the episode (0 before the first reset)."""
        return int(self._ist[i]) if self._pk is not None else 0

    def _sum(self, i: int) -> float:
        """Float state i of the episode (0 before the first reset)."""
        return float(self._fst[i]) if self._pk is not None else 0.0

    def decided(self) -> int:
        return self.requests

    @property
    def requests(self) -> int:
        return self._count(I_NREQ)

    @property
    def blocked(self) -> int:  # type: ignore[override]
        return self._count(I_NBLK)

    @property
    def lost(self) -> int:
        """Live lightpaths lost to network events in the episode (not restored)."""
        return self._count(I_LOST)

    @property
    def restored(self) -> int:
        """Live lightpaths hit by network events and set up again."""
        return self._count(I_RESTORED)

    @property
    def bitrate_requested_gbps(self) -> float:
        return self._sum(F_BRREQ)

    @property
    def bitrate_blocked_gbps(self) -> float:
        return self._sum(F_BRBLK)

    def candidate_lengths_km(self) -> list[float]:
        """Length of each candidate path of the current request (inf: none there)."""
        paths = self.setup.book.paths
        return [paths[q].length_km if q >= 0 else math.inf
                for q in self._ist[I_CAND:I_CAND + self.k].tolist()]

    def occupied(self) -> np.ndarray:
        """Slots held by lightpaths, uint8 [spectrum, slot] (1: held): a fresh array."""
        s = self.setup.net.n_spectra
        held = self._sb[:s] & ~self._sb[s:2 * s]
        return np.unpackbits(held.view(np.uint8), axis=1, bitorder="little")[:, :self.n_slots]
