"""Peer runner: optical-rl-gym's RMSA env under its own kSP-FF heuristic, timed.

Runs in the peer's venv (bench/peer/install_orlg.sh), never in LightPipe's:

    /var/tmp/orlg-venv/bin/python bench/peer/orlg_rmsa.py --k 5 --requests 5000 --seed 1

Setting (optical-rl-gym's defaults unless given): NSFNET from its own
examples/topologies/nsfnet_chen_5-paths_6-modulations.h5 (22 fibres, 5 shortest paths per
pair, 6 modulation formats), RMSAEnv with num_spectrum_resources=80, continuous bit rates
(uniform integers 25..100 Gb/s), load 40 Erlang, mean holding time 10800 s, no proactive
rejection. k=1 keeps the first of the 5 paths (what create_topology.py -k 1 lists).
The policy is optical-rl-gym's shortest_available_path_first_fit (kSP-FF). Only the
request loop (heuristic + env.step) is timed; building the env is not.

Prints one JSON line: {requests, seconds (wall), cpu_seconds (this process), blocking,
batch_blocking, k, load, seed, slots}.
"""

from __future__ import annotations

import argparse
import copy
import json
import pickle
import time
from pathlib import Path

import optical_rl_gym
from optical_rl_gym.envs.rmsa_env import RMSAEnv, shortest_available_path_first_fit

TOPOLOGY = "examples/topologies/nsfnet_chen_5-paths_6-modulations.h5"


def load_topology(k: int):
    root = Path(optical_rl_gym.__file__).resolve().parents[1]
    with open(root / TOPOLOGY, "rb") as fh:
        topology = pickle.load(fh)  # the peer's own file, from its own checkout
    if k > topology.graph["k_paths"]:
        raise SystemExit(f"orlg_rmsa: k={k} > the file's {topology.graph['k_paths']} paths")
    topology = copy.deepcopy(topology)
    topology.graph["ksp"] = {pair: paths[:k] for pair, paths in topology.graph["ksp"].items()}
    topology.graph["k_paths"] = k
    return topology


def write_trace(path: str, services) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        fh.write("arrival_s,holding_s,src,dst,bitrate_gbps,id,accepted,path,first_slot\n")
        for sv in services:
            route = "-".join(sv.path.node_list) if sv.accepted else ""
            first = sv.initial_slot if sv.accepted else ""
            fh.write(f"{sv.arrival_time!r},{sv.holding_time!r},{sv.source},{sv.destination},"
                     f"{sv.bit_rate},{sv.service_id},{int(sv.accepted)},{route},{first}\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--k", type=int, default=5)
    ap.add_argument("--requests", type=int, default=5000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--load", type=float, default=40.0)
    ap.add_argument("--slots", type=int, default=80)
    ap.add_argument("--batches", type=int, default=20)
    ap.add_argument("--trace-out", help="also write the requests and the peer's decisions "
                    "as a LightPipe trace CSV (arrival_s,holding_s,src,dst,bitrate_gbps,id,"
                    "accepted,path,first_slot); not timed")
    ap.add_argument("--ksp-out", help="also write the candidate paths it used, as JSON "
                    '{"src,dst": [[node, ...], ...]}')
    args = ap.parse_args()
    n = args.requests
    env = RMSAEnv(topology=load_topology(args.k), episode_length=n + 10, load=args.load,
                  mean_service_holding_time=10800.0, num_spectrum_resources=args.slots,
                  bit_rate_selection="continuous", seed=args.seed, allow_rejection=False)
    env.reset()
    size = max(1, n // args.batches)
    accepted_flags = bytearray(n)
    t0, c0 = time.perf_counter(), time.process_time()
    for i in range(n):
        action = shortest_available_path_first_fit(env)
        _, reward, _, _ = env.step(action)
        accepted_flags[i] = reward
    seconds, cpu_seconds = time.perf_counter() - t0, time.process_time() - c0
    blocked = n - sum(accepted_flags)
    batches = [1.0 - sum(accepted_flags[b:b + size]) / len(accepted_flags[b:b + size])
               for b in range(0, n - n % size if n >= size else n, size)]
    if args.trace_out:
        write_trace(args.trace_out, env.topology.graph["services"][:n])
    if args.ksp_out:
        with open(args.ksp_out, "w", encoding="utf-8") as fh:
            json.dump({f"{a},{b}": [list(p.node_list) for p in paths]
                       for (a, b), paths in env.k_shortest_paths.items()}, fh)
    print(json.dumps({"requests": n, "seconds": seconds, "cpu_seconds": cpu_seconds,
                      "blocking": blocked / n,
                      "batch_blocking": batches, "k": args.k, "load": args.load,
                      "seed": args.seed, "slots": args.slots}))


if __name__ == "__main__":
    main()
