"""LightPipe/RMSA-v0's reference implementation: the same environment on OpticalNetwork.

The first implementation of RMSA-v0 (Python int bitmaps of `testbed.optical.OpticalNetwork`,
one Python object per lightpath), kept as the reference the compiled env
(`testbed.gym.rmsa.RMSAEnv`) is checked against: on the same scenario, seed and actions
both give the same observations, rewards, infos and masks (tests/test_gym_fast.py). Its
arguments, checks and spaces are the compiled envs' own (`testbed.gym.rmsa_setup.RMSABase`).
bench/bench_gym.py runs it beside the compiled one. docs/gym.md describes the env.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Iterator
from typing import Any

import numpy as np

from testbed.errors import InputError
from testbed.gym.rmsa_setup import DEFAULT_BLOCKS, RMSABase
from testbed.gym.scenario import ScenarioLike
from testbed.optical.network import Lightpath, OpticalNetwork, PathInfo
from testbed.optical.spectrum import shift_plan
from testbed.sim.requests import Request, count_trace_rows, poisson_requests, read_request_trace
from testbed.spec.models import EventSpec

__all__ = ["DEFAULT_BLOCKS", "ReferenceRMSAEnv"]

_F32_MAX = float(np.finfo(np.float32).max)

# A usable candidate: (path, spectra, slots needed, shift plan); None: no route there
# (fewer than k paths, beyond every format's reach, or more slots than the grid has).
_Cand = tuple[PathInfo, tuple[int, ...], int, tuple[int, ...]] | None


class ReferenceRMSAEnv(RMSABase):
    """Dynamic RMSA on OpticalNetwork (RMSA-v0 as first written; module docstring)."""

    def __init__(self, scenario: ScenarioLike | None = None, *, blocks: int = DEFAULT_BLOCKS,
                 k_paths: int | None = None, episode_requests: int | None = None,
                 allow_reject: bool = False, render_mode: str | None = None) -> None:
        super().__init__(scenario, blocks=blocks, k_paths=k_paths,
                         episode_requests=episode_requests, allow_reject=allow_reject,
                         render_mode=render_mode)
        self._base = self.setup.net
        self._node_index = self.setup.node_index
        self._nbytes = (self.n_slots + 7) // 8
        self._tables: dict[tuple[int, str, str, float], list[_Cand]] = {}
        self._routes: dict[tuple[int, str, str], list[PathInfo | None]] = {}
        self._slots: dict[tuple[float, float], int] = {}  # (Gb/s, Gb/s per slot) -> slots
        self.net: OpticalNetwork = self._base
        self.requests = self.blocked = self.lost = self.restored = 0

    # ---- episode ---------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None
              ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Start an episode: an empty network and the request stream of the episode seed
        (`start_episode` says which seed)."""
        ep = self.start_episode(seed)
        if self.net is not self._base:
            self._base.keep_paths(self.net)  # keep the routes found (same cuts: same routes)
        self.net = self._base.copy()
        self._restore_rng = self.setup.restore_rng(ep)  # as the simulator's router
        self._stream, self._total = self._requests(ep)
        self._heap: list[tuple[float, int]] = []  # (departure_s, request id)
        self._live: dict[int, Lightpath] = {}  # request id -> its lightpath
        self._rid_of: dict[int, int] = {}  # lightpath id -> request id
        self._ev_i = 0
        self._next_ev = self.events[0].at_s if self.events else math.inf
        self.requests = self.blocked = self.lost = self.restored = 0
        self.bitrate_requested_gbps = self.bitrate_blocked_gbps = 0.0
        self._ended = False
        req = next(self._stream, None)
        if req is None:
            raise InputError("workload", "the workload has no requests")
        self._begin(req)
        return self._obs(), self._info()

    def _requests(self, ep_seed: int) -> tuple[Iterator[Request], int]:
        wl = self.workload
        n = self.episode_requests
        if wl.trace is not None:  # a trace: its rows, cut at episode_requests
            total = count_trace_rows(wl.trace)
            stream: Iterator[Request] = read_request_trace(wl.trace, set(self.nodes))
            return stream, total if n is None else min(total, n)
        if n is not None:  # generated: episode_requests of the same Poisson process
            wl = wl.model_copy(update={"requests": n})
        return poisson_requests(wl, self.endpoints, random.Random(ep_seed)), wl.requests

    def step(self, action: Any) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        a = self.step_action(action)
        rid, t, hold, _, _, br = self._req
        accepted = False
        path_index = first_slot = -1
        route = ""
        if a != self.reject_action and self._mask[a]:
            path_index, block = divmod(a, self.j)
            cand = self._cands[path_index]
            assert cand is not None
            first_slot = self._starts[path_index][block]
            lp = self.net.assign(cand[0], first_slot, cand[2], bitrate_gbps=br)
            self._live[rid] = lp
            self._rid_of[lp.id] = rid
            heapq.heappush(self._heap, (t + hold, rid))
            accepted = True
            route = "-".join(cand[0].nodes)
        else:
            self.blocked += 1
            self.bitrate_blocked_gbps += br
        self.requests += 1
        self.bitrate_requested_gbps += br
        truncated = False
        if self.requests >= self._total:
            truncated = True
        else:
            req = next(self._stream, None)
            if req is None:
                truncated = True
            else:
                self._begin(req)
        if truncated:  # the last observation: the same request on the network it left
            self._ended = True
            self._begin(self._req)
        info = self._info()
        info["accepted"] = accepted
        info["path_index"] = path_index
        info["first_slot"] = first_slot
        info["route"] = route
        return self._obs(), 1.0 if accepted else -1.0, False, truncated, info

    def decided(self) -> int:
        return self.requests

    def candidate_lengths_km(self) -> list[float]:
        """Length of each candidate path of the current request (inf: none there)."""
        return [math.inf if c is None else c[0].length_km for c in self._cands]

    def occupied(self) -> np.ndarray:
        """Slots held by lightpaths, uint8 [spectrum, slot] (1: held): a fresh array."""
        occ = self.net.slot_masks()[0]
        raw = b"".join(m.to_bytes(self._nbytes, "little") for m in occ)
        bits = np.unpackbits(np.frombuffer(raw, np.uint8), bitorder="little")
        return bits.reshape(len(occ), self._nbytes * 8)[:, :self.n_slots]

    # ---- time: departures and network events up to the next arrival ------------------
    def _begin(self, req: Request) -> None:
        """Advance to the request's arrival and compute its candidates and mask."""
        t = req[1]
        heap, live, net = self._heap, self._live, self.net
        while True:
            nd = heap[0][0] if heap else math.inf
            if nd <= t and nd <= self._next_ev:  # departures first on ties, as the sim
                rid = heapq.heappop(heap)[1]
                lp = live.pop(rid, None)
                if lp is not None:  # None: lost to a failure earlier
                    net.release(lp)
                    del self._rid_of[lp.id]
            elif self._next_ev <= t:
                self._apply_event(self.events[self._ev_i])
                self._ev_i += 1
                self._next_ev = (self.events[self._ev_i].at_s if self._ev_i < len(self.events)
                                 else math.inf)
            else:
                break
        self._req = req
        self._candidates(req[3], req[4], req[5])

    def _apply_event(self, ev: EventSpec) -> None:
        """A cut or slot loss releases the lightpaths it hits, then each (in request order)
        is re-routed with the scenario's spectrum policy or lost, as `lightpipe sim`."""
        net = self.net
        hit = net.apply_event(ev)
        rids = sorted(self._rid_of.pop(lp.id) for lp in hit)
        policy = self.scenario.policy.spectrum
        for rid in rids:
            old = self._live[rid]
            assert old.bitrate_gbps is not None
            got = net.allocate_or_reason(old.src, old.dst, bitrate_gbps=old.bitrate_gbps,
                                         policy=policy, rng=self._restore_rng)
            if isinstance(got, Lightpath):
                self._live[rid] = got
                self._rid_of[got.id] = rid
                self.restored += 1
            else:
                del self._live[rid]
                self.lost += 1

    # ---- candidates, mask, observation ----------------------------------------------
    def _table(self, src: str, dst: str, bitrate: float) -> list[_Cand]:
        """The k candidates of a (src, dst, bitrate), cached per route version (the same
        cut fibres give the same routes, in every episode)."""
        net = self.net
        version = net.paths_version
        key = (version, src, dst, bitrate)
        got = self._tables.get(key)
        if got is not None:
            return got
        routes = self._routes.get((version, src, dst))
        if routes is None:  # usable routes: up and within some format's reach
            routes = self._routes[(version, src, dst)] = [
                p if net.path_up(p) and p.modulation is not None else None
                for p in net.candidate_paths(src, dst)[:self.k]]
        got = []
        for p in routes:
            if p is None:
                got.append(None)
                continue
            n = self._slots.get((bitrate, p.gbps_per_slot))
            if n is None:
                n = self._slots[(bitrate, p.gbps_per_slot)] = net.slots_needed(bitrate, p) or 0
            got.append(None if n > net.slots else (p, p.spectra, n, shift_plan(n)))
        got += [None] * (self.k - len(got))
        if len(self._tables) > 200_000:
            self._tables.clear()
        self._tables[key] = got
        return got

    def _candidates(self, src: str, dst: str, bitrate: float) -> None:
        cands = self._table(src, dst, bitrate)
        busy_all = self.net.slot_masks()[1]
        full = self.net.full
        j = self.j
        zeros = [0] * j
        mask: list[int] = []
        starts_all: list[list[int]] = []
        frees: list[list[int]] = []
        busys: list[int] = []
        for cand in cands:
            starts: list[int] = []
            runs: list[int] = []
            if cand is None:
                busys.append(full)
            else:
                b = 0
                for s in cand[1]:
                    b |= busy_all[s]
                busys.append(b)
                free = full & ~b
                x = free
                for sh in cand[3]:
                    x &= x >> sh
                x &= ~(free << 1)  # fitting starts that begin a free run (DeepRMSA blocks)
                while x and len(starts) < j:
                    low = x & -x
                    first = low.bit_length() - 1
                    y = free >> first
                    runs.append((~y & (y + 1)).bit_length() - 1)
                    starts.append(first)
                    x ^= low
            n = len(starts)
            mask += [1] * n
            if n < j:
                mask += zeros[n:]
                starts += zeros[n:]
                runs += zeros[n:]
            starts_all.append(starts)
            frees.append(runs)
        mask.append(1 if self.allow_reject or 1 not in mask else 0)
        self._cands = cands
        self._starts = starts_all
        self._frees = frees
        self._busys = busys
        self._mask = np.array(mask, np.int8)  # a fresh array every step: safe to hand out

    def _obs(self) -> dict[str, Any]:
        nb = self._nbytes
        raw = b"".join(b.to_bytes(nb, "little") for b in self._busys)
        spectrum = np.unpackbits(np.frombuffer(raw, np.uint8), bitorder="little")
        spectrum = spectrum.reshape(self.k, nb * 8)[:, :self.n_slots]
        if nb * 8 != self.n_slots:
            spectrum = np.ascontiguousarray(spectrum)
        _, _, hold, src, dst, br = self._req
        return {
            "spectrum": spectrum,
            "slots_needed": np.array([0 if c is None else c[2] for c in self._cands], np.int32),
            "block_start": np.array(self._starts, np.int32),
            "block_free": np.array(self._frees, np.int32),
            "source": self._node_index[src],
            "destination": self._node_index[dst],
            "bitrate_gbps": np.array([min(br, _F32_MAX)], np.float32),
            "holding_s": np.array([min(hold, _F32_MAX)], np.float32),
        }

    def _info(self) -> dict[str, Any]:
        return {"action_mask": self._mask, "request_id": self._req[0],
                "time_s": self._req[1], "requests": self.requests, "blocked": self.blocked}
