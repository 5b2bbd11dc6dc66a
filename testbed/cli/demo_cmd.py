"""`lightpipe demo [SPEC]`: what LightPipe is for, in numbers, in seconds (`make demo`).

Simulated, side by side: the spectrum policies on the default scenario (blocking with its
95 % interval over seeds) and the pipeline schedules on one cross-DC pipeline (iteration
time, bubble ratio). Then the next commands: the emulated check with real packets (and
whether this machine can run it), the VM, the report.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from testbed.cli.common import STAGED, add_out_arg, add_quiet_arg, emit

HELP = "the headline in seconds: spectrum policies and pipeline schedules side by side"
DEFAULT_SPEC = "scenarios/quickstart.yaml"
POLICIES = ("first_fit", "best_fit", "last_fit", "random_fit")
SCHEDULES = ("gpipe", "1f1b", "zb-h1", "crosspipe-greedy")
# The README's pipeline: 4 stages over 3 hops, the middle one a 20 ms / 100 Gb/s WAN link.
PIPELINE = ("--stages", "4", "--microbatches", "8", "--forward-ms", "10", "--backward-ms",
            "20", "--activation-mb", "50", "--latency-ms", "0,20,0", "--bandwidth-gbps",
            "400,100,400")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("spec", metavar="SPEC", nargs="?", default=DEFAULT_SPEC,
                        help=f"a lightpath_requests scenario (default {DEFAULT_SPEC})")
    parser.add_argument("--seeds", type=int, default=3,
                        help="seeds per spectrum policy (default 3)")
    add_out_arg(parser, required=False, written=STAGED)
    parser.set_defaults(out="runs/demo")
    add_quiet_arg(parser)


def run(args: argparse.Namespace) -> int:
    from testbed.cli.common import check_out
    from testbed.errors import InputError
    from testbed.spec import load_scenario

    if not 1 <= args.seeds <= 20:
        raise InputError("--seeds", f"must be 1..20, got {args.seeds}")
    base = load_scenario(args.spec)
    if base.workload.kind != "lightpath_requests":
        raise InputError("SPEC", f"{args.spec}: the demo compares spectrum policies on a "
                         f"lightpath_requests workload, this one is {base.workload.kind}")
    check_out(args.out, args.force)
    wl = base.workload
    emit("lightpipe demo: what LightPipe is for, in numbers (simulated)\n\n" + _wrap(
        f"1. Spectrum policies on {args.spec} ({base.name}: {_topology(base)}, "
        f"{len(base.dcs)} DCs, {wl.requests:,} lightpath requests at {wl.load_erlang:g} "
        f"Erlang, {base.optical.grid} grid; {args.seeds} seeds each)", "   ") + "\n")
    policies = _policies(base, args.seeds, args.quiet)
    table1 = _policy_table(policies)
    emit(table1)
    worst = max(policies, key=lambda r: r["blocking_ratio"])
    best = min(policies, key=lambda r: r["blocking_ratio"])
    read1 = (f"   read: blocking = share of requests refused (no contiguous free slots on "
             f"any of the {base.optical.k_paths} shortest routes); lower is better. "
             f"{best['policy']} blocks {best['blocking_ratio']:.2%}, {worst['policy']} "
             f"{worst['blocking_ratio']:.2%} of the same requests.")
    read1 = _wrap(read1)
    emit(read1)
    emit("\n" + _wrap("2. Pipeline schedules across DCs (4 stages, 8 micro-batches, forward "
                      "10 ms / backward 20 ms per stage, 50 MB activations; the middle hop "
                      "is a WAN link of 20 ms and 100 Gb/s)", "   ") + "\n")
    schedules = _schedules()
    table2 = _schedule_table(schedules)
    emit(table2)
    fastest = min(schedules, key=lambda r: r["iteration_time_ms"])
    slowest = max(schedules, key=lambda r: r["iteration_time_ms"])
    read2 = (f"   read: the same work, ordered differently: {fastest['schedule']} finishes "
             f"an iteration in {fastest['iteration_time_ms']:.0f} ms (holding "
             f"{fastest['peak_inflight_microbatches']} micro-batches' activations at once), "
             f"{slowest['schedule']} in {slowest['iteration_time_ms']:.0f} ms (holding "
             f"{slowest['peak_inflight_microbatches']}); the bubble ratio is the idle share "
             "of the GPUs' time. `lightpipe schedule --help` sets a memory cap, latency and "
             "bandwidth per hop.")
    read2 = _wrap(read2)
    emit(read2)
    _write(Path(args.out), base, policies, schedules, "\n\n".join(
        [table1, read1, table2, read2]))
    shown = args.out.rstrip("/")
    emit(f"\nrecords: {shown}/ (demo.md, policies.csv, schedules.csv, manifest.json)")
    _next_steps(args.spec)
    return 0


def _wrap(text: str, indent: str = "         ") -> str:
    """A `read:` paragraph for an 80-100 column terminal."""
    import textwrap

    return textwrap.fill(text, width=92, subsequent_indent=indent, break_on_hyphens=False)


def _topology(base: Any) -> str:
    lib = getattr(base.topology, "library", None)
    return f"{lib} topology" if lib else "own topology"


def _policies(base: Any, seeds: int, quiet: bool) -> list[dict[str, Any]]:
    """One row per spectrum policy: blocking mean and 95 % half-width over the seeds."""
    from testbed.analysis.stats import mean_ci95
    from testbed.experiments import sweep
    from testbed.progress import progress

    points = sweep.grid_points(base, [("policy.spectrum", list(POLICIES))], seeds)
    with progress(len(points), "simulating the policies", quiet) as bar:
        rows = sweep.run_sweep(points, 2, None, on_done=bar.advance)
    out = []
    for policy in POLICIES:
        mine = [r for r in rows if r["policy.spectrum"] == policy]
        row: dict[str, Any] = {"policy": policy, "seeds": len(mine)}
        for key in ("blocking_ratio", "bitrate_blocking_ratio", "mean_spectrum_utilization"):
            mean, half = mean_ci95([float(r[key]) for r in mine])
            row[key], row[f"{key}_ci95_half"] = mean, half
        out.append(row)
    return sorted(out, key=lambda r: r["blocking_ratio"])


def _schedules() -> list[dict[str, Any]]:
    """One row per schedule of the README's cross-DC pipeline (the schedule engine)."""
    from testbed.cli import schedule_cmd
    from testbed.schedule import build_schedule, time_schedule

    parser = argparse.ArgumentParser()
    schedule_cmd.add_arguments(parser)
    problem = schedule_cmd.problem_from_args(parser.parse_args(list(PIPELINE)))
    out = []
    for name in SCHEDULES:
        timing = time_schedule(problem, build_schedule(name, problem))
        out.append({"schedule": name, "iteration_time_ms": timing.iteration_time_ms,
                    "bubble_ratio": timing.bubble_ratio,
                    "peak_inflight_microbatches": max(timing.peak_inflight)})
    return out


def _policy_table(rows: list[dict[str, Any]]) -> str:
    lines = ["   policy       blocking (95 % CI)    bit-rate blocking   spectrum in use",
             "   ----------   -------------------   -----------------   ---------------"]
    for r in rows:
        half = r["blocking_ratio_ci95_half"]
        ci = f" ± {half:.2%}" if half == half else ""  # (nan with one seed)
        lines.append(f"   {r['policy']:<12} {r['blocking_ratio']:>7.2%}{ci:<12}  "
                     f"{r['bitrate_blocking_ratio']:>17.2%}   "
                     f"{r['mean_spectrum_utilization']:>15.1%}")
    return "\n".join(lines)


def _schedule_table(rows: list[dict[str, Any]]) -> str:
    lines = ["   schedule           iteration time   bubble ratio   activations held",
             "   ----------------   --------------   ------------   ----------------"]
    lines += [f"   {r['schedule']:<18} {r['iteration_time_ms']:>11.1f} ms   "
              f"{r['bubble_ratio']:>12.1%}   {r['peak_inflight_microbatches']:>3d} micro-batches"
              for r in rows]
    return "\n".join(lines)


def _write(out: Path, base: Any, policies: list[dict[str, Any]],
           schedules: list[dict[str, Any]], text: str) -> None:
    from testbed.analysis.tables import rows_to_csv
    from testbed.io.atomic import atomic_write_text, staged_dir
    from testbed.runs.records import write_manifest

    with staged_dir(out) as stage:
        atomic_write_text(stage / "policies.csv", rows_to_csv(policies))
        atomic_write_text(stage / "schedules.csv", rows_to_csv(schedules))
        atomic_write_text(stage / "demo.md", f"# LightPipe demo\n\n```\n{text}\n```\n")
        write_manifest(stage, base, "sim", demo={"policies": list(POLICIES),
                                                 "schedules": list(SCHEDULES)})


def _next_steps(spec: str) -> None:
    """The emulated check (and whether this machine can run it), the VM, more."""
    import shutil

    from testbed.envprobe import probe

    if shutil.which("lightpipe") is None:
        emit("\n(`lightpipe` is not on PATH here: `source .venv/bin/activate`, or `make setup` "
             "as root links /usr/local/bin/lightpipe)")
    rep = probe()
    sudo = "" if rep.root else "sudo "  # (the README's way: sudo where root is needed)
    where = ("this machine can run it" if rep.emulation_possible else
             f"this machine cannot ({'; '.join(rep.reasons)}): use the VM below")
    emit(f"""
next:
  3. the emulated check, with real packets (Mininet hosts, the SDN controller, emulated
     fibres; about 2 minutes; {where}):
       {sudo}lightpipe run {spec} --backend both --out runs/quickstart
     shows `agreement with sim: N/N request decisions identical` (the controller on real
     switches decides as the simulator did) and iperf3 goodput per lightpath against its
     configured rate. It replays only the first requests in real time, so its blocking is
     not comparable with the table above: the simulator's run beside it is.
  4. the VM (netem, the Open vSwitch kernel datapath, Prometheus and Grafana as services):
       cd vagrant && vagrant up      (README.md, "The user's path")
  5. more: `lightpipe sweep {spec} --set workload.load_erlang=10,20,40 --set
     policy.spectrum=first_fit,best_fit --seeds 5 --out runs/sweep`, `lightpipe reproduce
     cba --quick --out runs/cba-quick --report` (a paper's experiment, one HTML page)""")
