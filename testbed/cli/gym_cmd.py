"""`lightpipe gym baselines`: each RMSA-v0 baseline's blocking with its 95 % interval."""

from __future__ import annotations

import argparse
import json
from typing import Any

HELP = "Gymnasium environments: the RMSA-v0 baselines' blocking (docs/gym.md)"

MAX_EPISODES = 10_000
MAX_REQUESTS = 100_000_000


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True,
                           parser_class=type(p))
    b = sub.add_parser(
        "baselines", help="blocking of each RMSA-v0 baseline policy over several episodes",
        description="Run each RMSA-v0 baseline policy (kSP-FF, first fit over the paths "
        "sorted by length, least-loaded path, most used, lowest spectrum, random) for "
        "--episodes episodes, reset(seed=SEED + e) each, the same episodes for every "
        "policy; print each one's request blocking with its 95 % Student-t interval over "
        "the episodes, and its bit-rate blocking.")
    b.add_argument("--scenario", metavar="FILE", default=None,
                   help="scenario file (default: the bundled quickstart scenario)")
    b.add_argument("--episodes", type=int, default=5, metavar="N",
                   help="episodes per policy, at least 2 (default 5)")
    b.add_argument("--requests", type=int, default=None, metavar="N",
                   help="requests per episode (default: the scenario's workload)")
    b.add_argument("--seed", type=int, default=1, help="first episode seed (default 1)")
    b.add_argument("--policies", default=None, metavar="A,B",
                   help="comma-separated baselines (default: all)")
    b.add_argument("--blocks", type=int, default=None, metavar="J",
                   help="candidate blocks per path (default 5)")
    b.add_argument("--json", action="store_true", help="print JSON instead of a table")
    b.add_argument("--out", metavar="FILE", default=None,
                   help="also write the output (table or JSON) to FILE, atomically")


def table(doc: dict[str, Any]) -> str:
    lines = [f"RMSA-v0 baselines on {doc['scenario']}: {doc['episodes']} episodes of "
             f"{doc['requests']} requests (seeds {doc['seeds'][0]}..{doc['seeds'][-1]}), "
             f"k={doc['k']}, J={doc['j']}; blocking mean with its 95 % t-interval over "
             "episodes", "",
             "| policy | blocking | 95 % CI | episodes min..max | bit-rate blocking | "
             "what it does |", "|---|---|---|---|---|---|"]
    for r in doc["results"]:
        ci = ("n/a" if r["ci95"] is None
              else f"{r['ci95'][0]:.4f}..{r['ci95'][1]:.4f}")
        lines.append(f"| {r['policy']} | {r['blocking']:.4f} | {ci} | {r['min']:.4f}.."
                     f"{r['max']:.4f} | {r['bitrate_blocking']:.4f} | {r['description']} |")
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> int:
    from testbed.cli.common import bounded_number, emit
    from testbed.errors import InputError
    from testbed.gym.baselines import BASELINES, evaluate
    from testbed.gym.rmsa import RMSAEnv
    from testbed.io.atomic import atomic_write_text

    bounded_number("--episodes", args.episodes, 2, MAX_EPISODES)
    if args.requests is not None:
        bounded_number("--requests", args.requests, 1, MAX_REQUESTS)
    bounded_number("--seed", args.seed, 0, 2**31 - 1 - MAX_EPISODES)
    names = list(BASELINES) if args.policies is None else [
        n.strip() for n in args.policies.split(",") if n.strip()]
    unknown = [n for n in names if n not in BASELINES]
    if unknown or not names:
        raise InputError("--policies", f"unknown baseline(s) {', '.join(unknown) or '(none)'}"
                         f" (known: {', '.join(BASELINES)})")
    kwargs: dict[str, Any] = {"episode_requests": args.requests}
    if args.blocks is not None:
        kwargs["blocks"] = args.blocks
    try:
        env = RMSAEnv(args.scenario, **kwargs)
    except InputError as exc:
        if exc.path in ("blocks", "episode_requests"):
            raise InputError(f"--{exc.path.split('_')[-1]}", exc.message) from None
        raise
    results = [evaluate(n, env, args.episodes, args.seed).summary() for n in names]
    doc = {"scenario": env.scenario.name, "episodes": args.episodes,
           "requests": env.setup.total(), "k": env.k, "j": env.j,
           "seeds": [args.seed + e for e in range(args.episodes)], "results": results}
    text = json.dumps(doc, indent=2) + "\n" if args.json else table(doc)
    if args.out:
        atomic_write_text(args.out, text)
    emit(text)
    return 0
