"""One RMSA-v0 configuration for every RMSA-v0 env: scenario, spaces, routes, static arrays.

Shared by the single env (`testbed.gym.rmsa.RMSAEnv`), the vector env
(`testbed.gym.rmsa_vec.RMSAVectorEnv`) and the reference env
(`testbed.gym.rmsa_reference.ReferenceRMSAEnv`): the keyword arguments are checked in one
place (same fields, same order), the spaces are one, and for the compiled envs the route
book and the static arrays (testbed.gym.layout) hold the workload: Poisson parameters, or
a request trace read once, at the first reset. `RMSABase` is the single envs' common
constructor.
"""

from __future__ import annotations

import random
from itertools import islice

import numpy as np
from gymnasium import spaces

from testbed.errors import InputError
from testbed.gym.base import LightPipeEnv
from testbed.gym.layout import S_TOTAL, Static, build_static
from testbed.gym.routes import RouteBook, version_fail_sets
from testbed.gym.scenario import ScenarioLike, check_count, load, with_lightpath_requests
from testbed.optical.network import OpticalNetwork
from testbed.sim.requests import count_trace_rows, read_request_trace
from testbed.spec.faults import network_events
from testbed.spec.models import EventSpec, LightpathRequestsWorkload, Scenario

DEFAULT_BLOCKS = 5  # J: candidate blocks per path (DeepRMSA's J)
_F32_MAX = float(np.finfo(np.float32).max)
_I32_MAX = int(np.iinfo(np.int32).max)


class RMSASetup:
    """The scenario (with its default workload), sizes, spaces, route book and statics."""

    def __init__(self, scenario: ScenarioLike | None, *, blocks: int,
                 k_paths: int | None, episode_requests: int | None,
                 allow_reject: bool) -> None:
        check_count("blocks", blocks, 1, 64)
        if episode_requests is not None:
            check_count("episode_requests", episode_requests, 1, 100_000_000)
        sc = with_lightpath_requests(load(scenario))
        if k_paths is not None:
            check_count("k_paths", k_paths, 1, 32)  # the spec's own bounds
            sc = sc.model_copy(update={"optical": sc.optical.model_copy(
                update={"k_paths": k_paths})})
        wl = sc.workload
        assert isinstance(wl, LightpathRequestsWorkload)
        self.scenario: Scenario = sc
        self.workload = wl
        self.allow_reject = allow_reject
        self.episode_requests = episode_requests
        self.net = OpticalNetwork.from_scenario(sc)
        net = self.net
        self.k = net.k_paths
        self.j = blocks
        self.n_slots = net.slots
        self.nodes: tuple[str, ...] = tuple(net.topology.nodes)
        self.node_index = {n: i for i, n in enumerate(self.nodes)}
        self.endpoints = ([dc.node for dc in sc.dcs] if wl.endpoints == "dcs"
                          else list(self.nodes))
        if wl.trace is None and len(self.endpoints) < 2:
            raise InputError("workload.endpoints", "requests need at least two endpoints, "
                             f"got {len(self.endpoints)}")
        self.events: list[EventSpec] = network_events(sc.events)
        self.policy = sc.policy.spectrum
        self.reject_action = self.k * self.j
        self.action_space = spaces.Discrete(self.reject_action + 1)
        n_nodes = len(self.nodes)
        k, j, s = self.k, self.j, self.n_slots
        self.observation_space = spaces.Dict({
            "spectrum": spaces.Box(0, 1, (k, s), np.uint8),
            "slots_needed": spaces.Box(0, _I32_MAX, (k,), np.int32),
            "block_start": spaces.Box(0, max(0, s - 1), (k, j), np.int32),
            "block_free": spaces.Box(0, s, (k, j), np.int32),
            "source": spaces.Discrete(n_nodes),
            "destination": spaces.Discrete(n_nodes),
            "bitrate_gbps": spaces.Box(0.0, _F32_MAX, (1,), np.float32),
            "holding_s": spaces.Box(0.0, _F32_MAX, (1,), np.float32),
        })
        self.version_fs, fail_sets = version_fail_sets(net, list(self.events))
        self.book = RouteBook(net, self.k, fail_sets)
        self._static: Static | None = None

    def static(self) -> Static:
        """The static arrays (a trace is read here, once: at the first reset)."""
        if self._static is None:
            self._static = self._build()
        return self._static

    def _build(self) -> Static:
        wl, net = self.workload, self.net
        trace: tuple[np.ndarray, np.ndarray] | None = None
        if wl.trace is not None:  # a trace: its rows, cut at episode_requests
            rows = count_trace_rows(wl.trace)
            total = rows if self.episode_requests is None else min(rows, self.episode_requests)
            got = list(islice(read_request_trace(wl.trace, set(self.nodes)), total))
            total = len(got)
            tf = np.array([(r[1], r[2], r[5]) for r in got], np.float64).reshape(-1, 3)
            ti = np.array([(r[0], self.node_index[r[3]], self.node_index[r[4]]) for r in got],
                          np.int64).reshape(-1, 3)
            trace = (tf, ti)
        else:
            total = self.episode_requests or wl.requests
        return build_static(
            n_spectra=net.n_spectra, slots=net.slots, k=self.k, j=self.j,
            n_nodes=len(self.nodes), endpoints=[self.node_index[n] for n in self.endpoints],
            bitrates=[float(b) for b in wl.bitrate_gbps], guard=net.guard_slots,
            allow_reject=self.allow_reject, total=total,
            event_times=[ev.at_s for ev in self.events], version_fs=self.version_fs,
            rate=wl.load_erlang / wl.mean_holding_s, lam_hold=1.0 / wl.mean_holding_s,
            trace=trace)

    def total(self) -> int:
        return int(self.static().sta_i[S_TOTAL])

    def restore_rng(self, episode_seed: int) -> random.Random:
        """The restoration stream of an episode (the simulator's router's)."""
        return random.Random(f"{episode_seed}:spectrum")


class RMSABase(LightPipeEnv):
    """A single RMSA-v0 env's configuration, from its RMSASetup: the scenario, sizes and
    spaces that the compiled env and the reference env share."""

    def __init__(self, scenario: ScenarioLike | None = None, *, blocks: int = DEFAULT_BLOCKS,
                 k_paths: int | None = None, episode_requests: int | None = None,
                 allow_reject: bool = False, render_mode: str | None = None) -> None:
        self.check_render_mode("RMSA-v0", render_mode)
        su = RMSASetup(scenario, blocks=blocks, k_paths=k_paths,
                       episode_requests=episode_requests, allow_reject=allow_reject)
        self.setup = su
        self.scenario = su.scenario
        self.workload = su.workload
        self.allow_reject = allow_reject
        self.episode_requests = episode_requests
        self.k, self.j, self.n_slots = su.k, su.j, su.n_slots
        self.nodes = su.nodes
        self.endpoints = su.endpoints
        self.events = su.events
        self.reject_action = su.reject_action
        self.action_space = su.action_space
        self.observation_space = su.observation_space
        self._ended = True
