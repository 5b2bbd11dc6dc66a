"""`lightpipe schedule`: build and time one pipeline schedule under WAN latency/bandwidth."""

from __future__ import annotations

import argparse
import math

from testbed.cli.common import emit, emit_json

HELP = "time a pipeline schedule (gpipe, 1f1b, ..., crosspipe-opt, geopipe) across WAN hops"

# CLI flag (dest) -> schedule option name
_OPTIONS = {"virtual_stages": "virtual_stages", "time_limit_s": "time_limit_s",
            "buffer_microbatches": "buffer_microbatches", "split_backward": "split_backward"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--stages", "-p", metavar="P", required=True, help="pipeline stages")
    parser.add_argument("--microbatches", "-m", metavar="M", required=True, help="micro-batches")
    parser.add_argument("--forward-ms", metavar="F", required=True,
                        help="forward time per micro-batch: one value or P comma-separated")
    parser.add_argument("--backward-ms", metavar="B", required=True,
                        help="backward time per micro-batch: one value or P comma-separated")
    parser.add_argument("--activation-mb", metavar="A", default="0",
                        help="activation (=gradient) size in MB (1e6 B): one value or P-1")
    parser.add_argument("--latency-ms", metavar="L", default="0",
                        help="one-way latency per hop: one value or P-1 comma-separated")
    parser.add_argument("--bandwidth-gbps", metavar="G", default="inf",
                        help="bandwidth per hop direction: one value or P-1 ('inf' = ideal)")
    parser.add_argument("--schedule", "-s", metavar="NAME", default="1f1b",
                        help="gpipe, 1f1b, interleaved-1f1b, zb-h1, crosspipe-greedy, "
                        "crosspipe-opt, geopipe")
    parser.add_argument("--memory-cap", metavar="K", default=None,
                        help="max micro-batches of activations held per stage (one or P values)")
    parser.add_argument("--weight-grad-fraction", metavar="X", default="0.5",
                        help="share of backward that is weight gradient (split backward)")
    parser.add_argument("--virtual-stages", metavar="V", default=None,
                        help="interleaved-1f1b: model chunks per device (default 2)")
    parser.add_argument("--time-limit-s", metavar="S", default=None,
                        help="crosspipe-opt: solver time limit (default 30)")
    parser.add_argument("--buffer-microbatches", metavar="K", default=None,
                        help="geopipe: in-flight activation buffer per stage")
    parser.add_argument("--split-backward", action="store_true", default=None,
                        help="crosspipe-greedy/opt: split backward into I and W")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.add_argument("--actions", action="store_true", help="also print the action lists")
    parser.add_argument("--trace", metavar="FILE.json", help="write a Chrome trace")
    parser.add_argument("--gantt", metavar="FILE.png", help="draw the timeline")


def _int(flag: str, text: str, minimum: int = 1) -> int:
    from testbed.errors import InputError
    try:
        value = int(str(text).strip())
    except ValueError:
        raise InputError(flag, f"must be an integer, got {text!r}") from None
    if value < minimum:
        raise InputError(flag, f"must be >= {minimum}, got {value}")
    return value


def _floats(flag: str, text: str, n: int, *, positive: bool = False,
            allow_inf: bool = False) -> list[float]:
    from testbed.errors import InputError
    parts = [x.strip() for x in str(text).split(",")]
    out = []
    for x in parts:
        try:
            v = float(x)
        except ValueError:
            raise InputError(flag, f"not a number: {x!r}") from None
        if math.isnan(v) or (math.isinf(v) and not allow_inf) or v < 0 or (positive and v == 0):
            raise InputError(flag, f"must be {'> 0' if positive else '>= 0'}"
                             f"{'' if allow_inf else ' and finite'}, got {x!r}")
        out.append(v)
    if len(out) == 1:
        return out * n
    if len(out) != n:
        raise InputError(flag, f"needs 1 or {n} comma-separated values, got {len(out)}")
    return out


def problem_from_args(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    from testbed.errors import InputError
    from testbed.schedule import Hop, PipelineProblem

    p = _int("--stages", args.stages)
    m = _int("--microbatches", args.microbatches)
    fwd = _floats("--forward-ms", args.forward_ms, p, positive=True)
    bwd = _floats("--backward-ms", args.backward_ms, p, positive=True)
    hops_n = p - 1
    lat = _floats("--latency-ms", args.latency_ms, hops_n)
    bw = _floats("--bandwidth-gbps", args.bandwidth_gbps, hops_n, positive=True, allow_inf=True)
    act = _floats("--activation-mb", args.activation_mb, max(hops_n, 1))
    if p == 1 and len(str(args.latency_ms).split(",")) > 1:
        raise InputError("--latency-ms", "a single stage has no hops")
    cap = None
    if args.memory_cap is not None:
        caps = [_int("--memory-cap", x) for x in str(args.memory_cap).split(",")]
        if len(caps) not in (1, p):
            raise InputError("--memory-cap", f"needs 1 or {p} values, got {len(caps)}")
        cap = caps[0] if len(caps) == 1 else tuple(caps)
    try:
        wgf = float(args.weight_grad_fraction)
    except ValueError:
        raise InputError("--weight-grad-fraction", f"not a number: {args.weight_grad_fraction!r}"
                         ) from None
    activation = act[0] if len(set(act)) == 1 else tuple(act[:hops_n])
    return PipelineProblem(tuple(fwd), tuple(bwd),
                           tuple(Hop(lat[h], bw[h]) for h in range(hops_n)),
                           activation, m, cap, wgf)


def _schedule_opts(args: argparse.Namespace) -> dict:
    opts: dict = {}
    if args.virtual_stages is not None:
        opts["virtual_stages"] = _int("--virtual-stages", args.virtual_stages)
    if args.time_limit_s is not None:
        try:
            opts["time_limit_s"] = float(args.time_limit_s)
        except ValueError:
            from testbed.errors import InputError
            raise InputError("--time-limit-s", f"not a number: {args.time_limit_s!r}") from None
    if args.buffer_microbatches is not None:
        opts["buffer_microbatches"] = _int("--buffer-microbatches", args.buffer_microbatches)
    if args.split_backward:
        opts["split_backward"] = True
    return opts


def run(args: argparse.Namespace) -> int:
    from testbed.errors import InputError
    from testbed.schedule import build_schedule, get_schedule, lower_bound_ms, time_schedule
    from testbed.schedule.export import write_chrome_trace, write_gantt

    problem = problem_from_args(args)
    kind = get_schedule(args.schedule)
    opts = _schedule_opts(args)
    try:
        sched = build_schedule(kind.name, problem, **opts)
    except InputError as exc:
        if exc.path in _OPTIONS:
            raise InputError(f"--{exc.path.replace('_', '-')}", exc.message) from None
        raise
    timing = time_schedule(problem, sched)
    split = sched.split_backward
    v = sched.virtual_stages
    out = {
        "schedule": kind.name,
        "stages": problem.stages,
        "microbatches": problem.microbatches,
        "iteration_time_ms": timing.iteration_time_ms,
        "bubble_ratio": timing.bubble_ratio,
        "peak_inflight": timing.peak_inflight,
        "lower_bound_ms": lower_bound_ms(problem, split_backward=split, virtual_stages=v),
        "no_delay_ideal_ms": lower_bound_ms(problem.no_delay(), split_backward=split,
                                            virtual_stages=v),
        "busy_ms": timing.busy_ms,
        "virtual_stages": v,
        "split_backward": split,
    }
    for key in ("solver_status", "gap", "objective_ms", "bound_ms", "solve_s", "warmup", "rule"):
        if key in sched.info:
            out[key] = sched.info[key]
    out["actions"] = sched.as_strings()
    if args.trace:
        write_chrome_trace(timing, args.trace)
    if args.gantt:
        write_gantt(timing, args.gantt)
    if args.json:
        emit_json(out)
        return 0
    lines = [f"schedule          {kind.name}",
             f"iteration time    {timing.iteration_time_ms:.3f} ms "
             f"(lower bound {out['lower_bound_ms']:.3f}, no-delay ideal "
             f"{out['no_delay_ideal_ms']:.3f})",
             f"bubble ratio      {timing.bubble_ratio:.4f}",
             f"peak in-flight    {', '.join(map(str, timing.peak_inflight))}"]
    if "solver_status" in out:
        gap = out.get("gap")
        lines.append(f"solver            {out['solver_status']}, gap "
                     f"{'n/a' if gap is None else f'{gap:.2%}'}, {out['solve_s']:.2f} s")
    if args.actions:
        lines += [f"stage {s}: {' '.join(row)}" for s, row in enumerate(out["actions"])]
    if args.trace:
        lines.append(f"trace             {args.trace}")
    if args.gantt:
        lines.append(f"gantt             {args.gantt}")
    emit("\n".join(lines))
    return 0
