"""One pipeline stage process: `python -m workloads.worker --plan P --rank R --master A:P`.

Joins the job's gloo process group, serves its Prometheus metrics, runs the plan's
iterations (barrier, then the stage's action list) and appends one JSON line per
event to `--out` (start, iteration, done or error), flushed at once, so the launcher
keeps every completed iteration even if this or another worker dies later.
"""

from __future__ import annotations

import time

T_IMPORT0 = time.monotonic()

import argparse  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
from datetime import timedelta  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, TextIO  # noqa: E402

from workloads.faultargs import ON_FAULT  # noqa: E402  (torch-free)

log = logging.getLogger("workloads.worker")
# --go-on-until: at most this many iterations beyond the plan's (the spec's own maximum).
MAX_EXTRA_ITERATIONS = 10_000


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from testbed.emu.cpuset import cpu_list

    ap = argparse.ArgumentParser(prog="python -m workloads.worker", description=__doc__)
    ap.add_argument("--plan", required=True, type=Path, help="job plan JSON")
    ap.add_argument("--rank", required=True, type=int, help="pipeline stage of this worker")
    ap.add_argument("--master", required=True,
                    help="ADDR:PORT of stage 0's rendezvous (PORT 0 with --rendezvous-file: "
                    "stage 0 binds any free port and publishes it there)")
    ap.add_argument("--rendezvous-file", type=Path, default=None,
                    help="where stage 0 writes the port it bound, and the others read it")
    ap.add_argument("--out", required=True, type=Path, help="JSON-lines record file")
    ap.add_argument("--iface", default=None, help="network interface for gloo")
    ap.add_argument("--metrics-fd", type=int, default=None,
                    help="inherited listening socket for /metrics")
    ap.add_argument("--metrics-port", type=int, default=None,
                    help="serve /metrics on this port (0: any) when no fd is given")
    ap.add_argument("--metrics-linger-s", type=float, default=0.0,
                    help="after the last iteration, wait up to this long for a scrape of "
                    "/metrics (a monitor is scraping), so the final values are collected; "
                    "0: exit at once")
    ap.add_argument("--timeout-s", type=float, default=120.0,
                    help="start-up time-out: the rendezvous and the process group's creation "
                    "(every stage must have imported torch by then); also the collective/p2p "
                    "time-out unless --collective-timeout-s is given (a dead peer is "
                    "reported sooner)")
    ap.add_argument("--collective-timeout-s", type=_positive, default=None,
                    help="training's collective/p2p time-out, wall seconds: a send, receive "
                    "or collective waiting longer raises gloo's 'Timed out waiting Nms' "
                    "(policy.workers.collective_timeout_s x time_factor)")
    ap.add_argument("--on-fault", choices=ON_FAULT, default="fail",
                    help="after a collective's error: fail (the worker ends with it) or retry "
                    "(restart the process group, redo the interrupted iteration)")
    ap.add_argument("--max-restarts", type=int, default=3,
                    help="retry: restarts of the group at most, then the error ends the worker")
    ap.add_argument("--restart-s", type=_non_negative, default=0.0,
                    help="retry: wall seconds a restarted stage waits after meeting the "
                    "others again before it goes on (a stand-in for reloading a checkpoint)")
    ap.add_argument("--duty", type=float, default=1.0,
                    help="share of an op's time spent in tensor work (rest: short pauses; "
                    "the plan's compute cpu only)")
    ap.add_argument("--nice", type=int, default=0, help="raise niceness (leave CPU to links)")
    ap.add_argument("--cpus", type=cpu_list, default=None,
                    help="run on these CPUs, comma-separated (a CPU worker's cores: "
                    "testbed.emu.cpuset)")
    ap.add_argument("--go-on-until", type=Path, default=None,
                    help="after the plan's iterations, go on iterating until this file "
                    "exists (the run's events have all run); every stage of a job must be "
                    "given it: the stages agree on each further iteration")
    return ap.parse_args(argv)


def _positive(text: str) -> float:
    v = float(text)
    if not v > 0 or v == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0 (got {text})")
    return v


def _non_negative(text: str) -> float:
    v = float(text)
    if not v >= 0 or v == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0 (got {text})")
    return v


def rendezvous_store(master: str, rank: int, world_size: int, port_file: Path,
                     timeout_s: float) -> Any:
    """The job's TCPStore. Stage 0 binds the port itself (any free one when the given
    port is 0: never picked by another process and released first, so no EADDRINUSE
    race) and publishes it in `port_file`; the other stages wait for that file."""
    import torch.distributed as dist

    host, _, port_text = master.rpartition(":")
    port = int(port_text)
    timeout = timedelta(seconds=timeout_s)
    if rank == 0:
        store = dist.TCPStore(host, port, world_size, is_master=True, timeout=timeout,
                              wait_for_workers=False)
        tmp = port_file.with_name(port_file.name + ".tmp")
        tmp.write_text(json.dumps({"host": host, "port": int(store.port)}))
        os.replace(tmp, port_file)
        return store
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            port = int(json.loads(port_file.read_text())["port"])
            break
        except (OSError, ValueError, KeyError):
            if time.monotonic() > deadline:
                raise TimeoutError(f"stage 0 did not publish its rendezvous port in "
                                   f"{port_file} within {timeout_s:.0f} s") from None
            time.sleep(0.05)
    return dist.TCPStore(host, port, world_size, is_master=False, timeout=timeout)


def _emit(fh: TextIO, record: dict[str, Any]) -> None:
    fh.write(json.dumps(record) + "\n")
    fh.flush()


def check_self_reach(ip: str, timeout_s: float = 3.0) -> None:
    """Fail clearly unless this host can open a TCP connection to its own address `ip`.

    Stage 0 hosts the rendezvous store and connects to it itself, and two stages on
    one host connect to each other: both go through the host's loopback device even
    when addressed to the interface's IP. A Mininet host whose `lo` is down (the cause
    of the first cross-DC rendezvous failures) drops those packets and torch reports
    only a client time-out after the full gloo timeout.
    """
    import socket

    with socket.socket() as lsock, socket.socket() as csock:
        lsock.bind((ip, 0))
        lsock.listen(1)
        csock.settimeout(timeout_s)
        try:
            csock.connect(lsock.getsockname())
        except OSError as exc:
            raise RuntimeError(f"cannot open TCP to this host's own address {ip} ({exc}); "
                               "is the host's loopback device 'lo' up?") from exc


def iface_ipv4(iface: str) -> str | None:
    """IPv4 address of `iface` in this network namespace (None if it has none)."""
    import fcntl
    import socket
    import struct

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            res = fcntl.ioctl(s.fileno(), 0x8915,  # SIOCGIFADDR
                              struct.pack("256s", iface.encode()[:15]))
        except OSError:
            return None
    return socket.inet_ntoa(res[20:24])


def _stage_priority(plan_path: Path, nice: int) -> dict[str, Any]:
    """A shadow stage's scheduling (testbed.emu.priority.raise_worker_priority), set before
    the worker starts a thread (gloo's inherit it). On a stand-in accelerator (compute
    device) it is emulated hardware, as the fibre forwarders and the switch are: the
    real-time class below theirs, so that its wake-ups at op deadlines and its transfers
    do not queue behind the machine's ordinary processes; it asks for almost no CPU (it
    sleeps through its ops), so it cannot starve them. A CPU worker (compute cpu) goes
    ahead of ordinary processes in their own class (nice, a short slice), its duty
    bounding what it takes, unless the launcher asked it to yield (`--nice` > 0). {} for
    a model-mode worker. Read from the plan; JobPlan.load reports a bad one."""
    try:
        data = json.loads(Path(plan_path).read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("mode") != "shadow":
        return {}
    compute = data.get("compute", "cpu")
    if compute not in ("cpu", "device") or (compute == "cpu" and nice > 0):
        return {}
    from testbed.emu import priority
    return priority.raise_worker_priority(compute)


def run(args: argparse.Namespace, fh: TextIO) -> None:
    if args.iface:
        os.environ["GLOO_SOCKET_IFNAME"] = args.iface
    if args.nice:
        os.nice(args.nice)
    stage_priority = _stage_priority(args.plan, args.nice)
    if args.cpus:  # before any thread: gloo's inherit it
        from testbed.emu.cpuset import pin
        if not pin(0, args.cpus):
            raise ValueError(f"--cpus {','.join(map(str, args.cpus))}: not CPUs this "
                             "process may run on")
        stage_priority["cpus"] = list(args.cpus)
    import torch
    import torch.distributed as dist

    from testbed.emu.procstat import own_usage_since
    from workloads.compute import make_compute
    from workloads.executor import Executor
    from workloads.faulttol import StageGroup, netns_id, tcp_segments
    from workloads.metrics import Scrapes, WorkerMetrics, serve
    from workloads.plan import JobPlan

    torch.set_num_threads(1)
    t_imported = time.monotonic()
    plan = JobPlan.load(args.plan)
    if not 0 <= args.rank < plan.stages:
        raise ValueError(f"rank {args.rank} outside 0..{plan.stages - 1}")
    metrics = WorkerMetrics(plan.job, args.rank)
    metrics_port = None
    scrapes = Scrapes()
    if args.metrics_fd is not None or args.metrics_port is not None:
        _, metrics_port = serve(metrics.registry, fd=args.metrics_fd,
                                port=args.metrics_port or 0, scrapes=scrapes)
    program: Any
    calibration: dict[str, float | str] = {}
    if plan.mode == "shadow":
        from workloads.shadow import ShadowProgram
        compute = make_compute(plan.compute, args.duty)
        calibration = compute.as_dict()
        program = ShadowProgram(plan, args.rank, compute)
    else:
        from workloads.model import ModelProgram
        program = ModelProgram(plan, args.rank)
    own_ip = iface_ipv4(args.iface) if args.iface else None
    if own_ip is None and args.rank == 0:
        own_ip = args.master.rsplit(":", 1)[0]
    if own_ip is not None:
        check_self_reach(own_ip)
    if args.rendezvous_file is None:
        host, _, port = args.master.rpartition(":")
        store = dist.TCPStore(host, int(port), plan.stages, is_master=args.rank == 0,
                              timeout=timedelta(seconds=args.timeout_s))
    else:
        store = rendezvous_store(args.master, args.rank, plan.stages, args.rendezvous_file,
                                 args.timeout_s)
    group = StageGroup(store, args.rank, plan.stages, startup_timeout_s=args.timeout_s,
                       collective_timeout_s=args.collective_timeout_s)
    group.join()
    group.train()
    t_ready = time.monotonic()
    at_ready, _ = own_usage_since(None)  # its iterations' CPU, read by itself (fidelity)
    _emit(fh, {"type": "start", "job": plan.job, "stage": args.rank, "pid": os.getpid(),
               "import_start_s": T_IMPORT0, "imported_s": t_imported, "ready_s": t_ready,
               "calibration": {**calibration, **stage_priority},
               "collective": {**group.describe(), "on_fault": args.on_fault,
                              "max_restarts": args.max_restarts,
                              "restart_s": args.restart_s},
               "metrics_port": metrics_port, "netns": netns_id(),
               "tcp_segs": tcp_segments()})
    ex = Executor(plan.sched(), args.rank, plan.microbatches, program, metrics,
                  timeout_s=args.collective_timeout_s)
    final = train(args, fh, plan, ex, group, metrics, scrapes)
    _, used = own_usage_since(at_ready)
    _emit(fh, {"type": "done", "end_s": time.monotonic(), "usage": used,
               "restarts": group.attempt, "tcp_segs": tcp_segments()})
    dist.destroy_process_group()
    if metrics_port is not None and args.metrics_linger_s > 0:
        t0 = time.monotonic()
        got = scrapes.wait_after(final, args.metrics_linger_s)
        log.info("stage %d: final metrics %s after %.1f s", args.rank,
                 "scraped" if got else f"not scraped within {args.metrics_linger_s:.0f} s",
                 time.monotonic() - t0)


def train(args: argparse.Namespace, fh: TextIO, plan: Any, ex: Any, group: Any,
          metrics: Any, scrapes: Any) -> float:
    """The plan's iterations (and, with --go-on-until, more until the file exists), then
    the final barrier; with --on-fault retry a collective's error restarts the group
    (workloads.faulttol) and the interrupted iteration is run again. Returns the scrape
    count at the end (every metric holds its final value from then on)."""
    import torch.distributed as dist

    from workloads.faulttol import is_comm_error, tcp_segments, wait_until

    total = plan.warmup_iterations + plan.iterations
    cap = total + MAX_EXTRA_ITERATIONS
    it = 0
    started = False  # iteration it's ops have begun on this stage
    redo: int | None = None  # the iteration being run again after a restart
    while True:
        try:
            if it >= total:
                final = scrapes.started  # every metric holds its final value from here on
                dist.barrier()
                return int(final)
            if args.go_on_until is not None and it + 1 == total < cap:
                # The last iteration so far: the stages agree whether another follows
                # (before it runs, as its receives for the next one are posted during it).
                if go_on(args.go_on_until):
                    total += 1
            else:
                dist.barrier()
            started = True
            rec = ex.run_iteration(it, total)
            # the host's TCP counters at the iteration's end (the fidelity verdict's
            # fault windows); read after it, off its clock
            _emit(fh, {"type": "iteration", "warmup": it < plan.warmup_iterations,
                       "attempt": group.attempt, "redone": it == redo, **rec.as_dict(),
                       "tcp_segs": tcp_segments()})
            it += 1
            started = False
        except Exception as exc:
            t_fault = time.monotonic()
            error = f"{type(exc).__name__}: {exc}"
            if (args.on_fault != "retry" or not is_comm_error(exc)
                    or group.attempt >= args.max_restarts):
                raise
            _emit(fh, {"type": "fault", "iteration": it, "started": started,
                       "t_s": t_fault, "attempt": group.attempt, "error": error})
            log.warning("stage %d: iteration %d: %s; restarting the group (attempt %d)",
                        args.rank, it, error, group.attempt + 1)
            try:
                resume, begun, total = group.rejoin(it, started, total)
            except Exception as again:
                raise RuntimeError(f"the process group did not meet again after a fault "
                                   f"({type(again).__name__}: {again}); the fault: "
                                   f"{error}") from again
            t_met = time.monotonic()
            ex.reset()
            if metrics is not None:
                metrics.restarts.inc()
            wait_until(t_met + args.restart_s)  # the stand-in reload
            _emit(fh, {"type": "restart", "iteration": resume, "redo": begun,
                       "attempt": group.attempt, "fault_s": t_fault, "met_s": t_met,
                       "t_s": time.monotonic(), "error": error})
            it, started = resume, False
            redo = resume if begun else None


def go_on(stop_file: Path) -> bool:
    """One collective (a barrier too): True on every stage when none of them sees
    stop_file yet, False on every stage once one does."""
    import torch
    import torch.distributed as dist

    seen = torch.tensor([1 if stop_file.exists() else 0], dtype=torch.int32)
    dist.all_reduce(seen, op=dist.ReduceOp.MAX)
    return int(seen.item()) == 0


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s worker %(message)s")
    args = parse_args(argv)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "a") as fh:
        try:
            run(args, fh)
        except Exception as exc:  # record why, for the launcher's failure report
            _emit(fh, {"type": "error", "error": f"{type(exc).__name__}: {exc}",
                       "t_s": time.monotonic()})
            log.error("stage %s failed: %s: %s", args.rank, type(exc).__name__, exc)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
