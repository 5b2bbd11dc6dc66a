"""One rank of a ring all-reduce job: `python -m workloads.allreduce --rank R --world N ...`.

Joins the job's gloo process group (gloo's ring all-reduce sends from rank r to rank
r-1, 2(n-1)/n of the buffer per link, as measured on the spine flow counters), runs
one small warm-up all-reduce, then for
each round k waits for the file `<sync>/go-<k>` (the runner creates it for every job
at once, so the jobs' all-reduces overlap) and all-reduces a float32 tensor of
`--buffer-bytes`. Appends one JSON line per event to `--out` (ready, round, done or
error) with wall-clock times, flushed at once.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, TextIO

POLL_S = 0.002


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m workloads.allreduce", description=__doc__)
    ap.add_argument("--rank", required=True, type=int)
    ap.add_argument("--world", required=True, type=int)
    ap.add_argument("--master", required=True, help="ADDR:PORT of rank 0's rendezvous")
    ap.add_argument("--buffer-bytes", required=True, type=int)
    ap.add_argument("--rounds", required=True, type=int)
    ap.add_argument("--sync", required=True, type=Path, help="directory of go-<k> files")
    ap.add_argument("--out", required=True, type=Path, help="JSON-lines record file")
    ap.add_argument("--iface", default=None, help="network interface for gloo")
    ap.add_argument("--timeout-s", type=float, default=300.0)
    return ap.parse_args(argv)


def _emit(fh: TextIO, record: dict[str, Any]) -> None:
    fh.write(json.dumps(record) + "\n")
    fh.flush()


def wait_for(path: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {path.name} within {timeout_s:.0f} s")
        time.sleep(POLL_S)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.iface:
        os.environ["GLOO_SOCKET_IFNAME"] = args.iface
    with open(args.out, "a", encoding="utf-8") as fh:
        try:
            import torch
            import torch.distributed as dist

            torch.set_num_threads(1)
            dist.init_process_group("gloo", init_method=f"tcp://{args.master}",
                                    rank=args.rank, world_size=args.world,
                                    timeout=timedelta(seconds=args.timeout_s))
            small = torch.ones(16)
            dist.all_reduce(small)
            if small[0].item() != args.world:
                raise RuntimeError(f"warm-up all-reduce gave {small[0].item()}")
            tensor = torch.ones(max(1, args.buffer_bytes // 4), dtype=torch.float32)
            _emit(fh, {"event": "ready", "rank": args.rank, "t": time.time()})
            for k in range(args.rounds):
                wait_for(args.sync / f"go-{k}", args.timeout_s)
                tensor.fill_(1.0)
                t0 = time.time()
                dist.all_reduce(tensor)
                t1 = time.time()
                if tensor[0].item() != args.world or tensor[-1].item() != args.world:
                    raise RuntimeError(f"round {k}: wrong sum {tensor[0].item()}")
                _emit(fh, {"event": "round", "rank": args.rank, "round": k, "start": t0,
                           "end": t1})
            dist.destroy_process_group()
            _emit(fh, {"event": "done", "rank": args.rank, "t": time.time()})
            return 0
        except Exception as exc:  # reported to the runner through the record file
            _emit(fh, {"event": "error", "rank": args.rank,
                       "error": f"{type(exc).__name__}: {exc}"[:500]})
            return 1


if __name__ == "__main__":
    sys.exit(main())
