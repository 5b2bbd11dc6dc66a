"""`lightpipe route`: route concurrent all-reduce jobs over a Clos/fat-tree by a policy."""

from __future__ import annotations

import argparse

from testbed.cli.common import emit, emit_json

HELP = "route ML jobs' flows over a leaf-spine/fat-tree fabric by a policy (docs/routing.md)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("spec", metavar="SPEC", nargs="?",
                        help="scenario whose emulation.leaf_spine fabric (and policy.routing) "
                        "to use instead of --clos")
    parser.add_argument("--clos", metavar="SxL", help="2-layer Clos: S spines x L leaves")
    parser.add_argument("--fat-tree", metavar="K", type=int, help="k-ary fat-tree instead")
    parser.add_argument("--hosts-per-leaf", type=int, default=8, metavar="N")
    parser.add_argument("--host-gbps", type=float, default=100.0, help="host link rate")
    parser.add_argument("--spine-gbps", type=float, default=None,
                        help="leaf-spine link rate (default: the host rate)")
    parser.add_argument("--oversubscription", type=float, default=None,
                        help="leaf oversubscription instead of --spine-gbps")
    parser.add_argument("--jobs", type=int, default=4, metavar="N")
    parser.add_argument("--ring-size", type=int, default=8, metavar="N",
                        help="hosts per job (ring all-reduce members)")
    parser.add_argument("--pattern", default="ring", choices=("ring", "pipeline", "all_to_all"))
    parser.add_argument("--placement", default="random", choices=("random", "packed"))
    parser.add_argument("--buffer-mb", type=float, default=1000.0,
                        help="all-reduce buffer per job (MB)")
    parser.add_argument("--compute-s", type=float, default=0.2,
                        help="compute time per iteration per job (s), for GPU utilisation")
    parser.add_argument("--seed", type=int, default=1, help="placement and ECMP/SA seed")
    parser.add_argument("--policy", default=None,
                        help="ecmp, shortest, edge-coloring, greedy, greedy-ls, sa, ilp "
                        "(default: the scenario's policy.routing, else greedy)")
    parser.add_argument("--fail", metavar="U-V", action="append", default=[],
                        help="remove this link (both directions) before routing; repeatable")
    parser.add_argument("--time-budget-s", type=float, default=None,
                        help="bound for sa/greedy-ls/ilp")
    parser.add_argument("--max-moves", type=int, default=None, help="bound for sa/greedy-ls")
    parser.add_argument("--json", action="store_true", help="print the routing as JSON")


def _fabric(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    from testbed.errors import InputError
    from testbed.routing.topology import clos, fat_tree, from_scenario

    given = [x for x in (args.spec, args.clos, args.fat_tree) if x is not None]
    if len(given) != 1:
        raise InputError("--clos", "give exactly one of --clos SxL, --fat-tree K or SPEC")
    if args.spec is not None:
        from testbed.spec import load_scenario
        sc = load_scenario(args.spec)
        return from_scenario(sc), sc.policy.routing
    if args.fat_tree is not None:
        return fat_tree(args.fat_tree, args.host_gbps), None
    s, sep, leaf = args.clos.lower().partition("x")
    if not sep or not s.isdigit() or not leaf.isdigit() or int(s) < 1 or int(leaf) < 1:
        raise InputError("--clos", f"expected SPINESxLEAVES (e.g. 32x64), got {args.clos!r}")
    if args.hosts_per_leaf < 1:
        raise InputError("--hosts-per-leaf", f"must be >= 1, got {args.hosts_per_leaf}")
    return clos(int(s), int(leaf), args.hosts_per_leaf, args.host_gbps, args.spine_gbps,
                args.oversubscription), None


# Fabric sizes, job counts and search bounds reach loops and timers: each is bounded
# (far beyond what docs/routing.md runs) so that a typo cannot hang the machine.
MAX_FABRIC_NODES = 1024      # --clos S and L, --hosts-per-leaf, --fat-tree K
MAX_JOBS = 100_000           # --jobs, --ring-size
MAX_TIME_BUDGET_S = 86_400.0
MAX_MOVES = 10**9


def check_bounds(args: argparse.Namespace) -> None:
    """InputError naming the first option out of its bounds."""
    from testbed.cli.common import bounded_number
    from testbed.errors import InputError

    if args.fat_tree is not None:
        bounded_number("--fat-tree", args.fat_tree, 2, 64)
    if args.clos is not None:
        s, _, leaf = args.clos.lower().partition("x")
        if s.isdigit() and leaf.isdigit() and max(int(s), int(leaf)) > MAX_FABRIC_NODES:
            raise InputError("--clos", f"at most {MAX_FABRIC_NODES} spines and leaves, got "
                             f"{args.clos!r}")
    bounded_number("--hosts-per-leaf", args.hosts_per_leaf, 1, MAX_FABRIC_NODES)
    bounded_number("--jobs", args.jobs, 1, MAX_JOBS)
    bounded_number("--ring-size", args.ring_size, 2, MAX_JOBS)
    if args.time_budget_s is not None:
        bounded_number("--time-budget-s", args.time_budget_s, 0.0, MAX_TIME_BUDGET_S,
                       low_open=True)
    if args.max_moves is not None:
        bounded_number("--max-moves", args.max_moves, 0, MAX_MOVES)


def run(args: argparse.Namespace) -> int:
    import math

    from testbed.errors import InputError
    from testbed.routing.flows import flows_of, jobs_on_clos
    from testbed.routing.metric import evaluate
    from testbed.routing.policies import get_policy, route
    from testbed.routing.topology import parse_link, remove_links

    for name in ("host_gbps", "buffer_mb", "compute_s"):
        value = getattr(args, name)
        if not (value > 0 and math.isfinite(value)):
            raise InputError(f"--{name.replace('_', '-')}", f"must be > 0, got {value}")
    check_bounds(args)
    policy = args.policy
    if policy is not None:
        get_policy(policy)  # unknown names fail before any work
    graph, spec_policy = _fabric(args)
    policy = policy or spec_policy or "greedy"
    get_policy(policy)
    jobs = jobs_on_clos(graph, args.jobs, args.ring_size, seed=args.seed,
                        buffer_bytes=args.buffer_mb * 1e6, compute_s=args.compute_s,
                        pattern=args.pattern, placement=args.placement)
    if args.fail:
        graph = remove_links(graph, [parse_link(x) for x in args.fail])
    flows = flows_of(jobs)
    routing = route(policy, graph, flows, seed=args.seed, time_budget_s=args.time_budget_s,
                    max_moves=args.max_moves)
    ev = evaluate(graph, flows, routing.paths, jobs)
    out = {
        "links": [{"u": u, "v": v, "capacity_gbps": d["capacity_gbps"]}
                  for u, v, d in graph.edges(data=True)],
        "flows": [{"id": f.id, "job": f.job, "src": f.src, "dst": f.dst,
                   "path": list(routing.paths[f.id]), "rate_gbps": ev.rates_gbps[f.id]}
                  for f in flows],
        "jobs": [{"job": r.job, "bottleneck_gbps": r.bottleneck_gbps,
                  "allreduce_time_s": r.allreduce_time_s} for r in ev.jobs],
        "metric": ev.metric,
        "policy": routing.policy,
        "wall_s": routing.wall_s,
    }
    if args.json:
        emit_json(out)
        return 0
    emit(f"route: policy {routing.policy}, {len(jobs)} jobs, {len(flows)} flows, "
         f"{graph.number_of_edges()} links, computed in {routing.wall_s * 1000:.1f} ms")
    emit(f"  slowest job bottleneck: {ev.bottleneck_gbps:g} Gb/s; all-reduce time mean "
         f"{ev.mean_allreduce_time_s:.4f} s, max {ev.max_allreduce_time_s:.4f} s; "
         f"effective GPU utilisation {ev.effective_gpu_utilization:.3f}")
    for key, value in routing.info.items():
        emit(f"  {key}: {value}")
    return 0
