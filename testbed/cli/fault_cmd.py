"""`lightpipe fault KIND [U V] [options]`: inject a fault into a held emulation now."""

from __future__ import annotations

import argparse
from typing import Any

from testbed.cli.held import add_network_arg, find_network

HELP = ("inject a fault into the live emulated network now (fibre cut/repair, link flap, "
        "controller or Prometheus killed and restarted; see lightpipe emu --hold)")

# Event fields (testbed.spec.models.EventSpec) -> the option that sets them here.
OPTIONS = {"link": "U V", "period_s": "--period-s", "count": "--count", "down_s": "--down-s",
           "first_slot": "--first-slot", "slots": "--slots", "kind": "KIND"}
DEFAULT_DOWN_S = 1.0  # controller_kill / prometheus_kill without --down-s
ANSWER_MARGIN_S = 300.0  # beyond the fault's own span: the run answers well within this
SHOWN = ("note", "skipped", "error", "via", "run_s", "detection_s", "recovery_s",
         "cut_to_restored_s", "down_s", "down_wall_s", "pid_killed", "pid_restarted",
         "lightpaths_before", "lightpaths_after", "lightpaths_kept", "lost")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("kind", metavar="KIND",
                        help="fiber_cut, fiber_repair, link_flap, wavelength_loss, "
                        "wavelength_repair (these take the fibre U V), controller_kill, "
                        "prometheus_kill")
    parser.add_argument("ends", metavar="U V", nargs="*", help="the fibre's two nodes")
    parser.add_argument("--period-s", type=float, default=None,
                        help="link_flap: one down/up cycle, scenario seconds (x time_factor)")
    parser.add_argument("--count", type=int, default=None, help="link_flap: cycles")
    parser.add_argument("--down-s", type=float, default=None,
                        help="controller_kill / prometheus_kill: scenario seconds until "
                        f"the restart (x time_factor; default {DEFAULT_DOWN_S:g})")
    parser.add_argument("--first-slot", type=int, default=None,
                        help="wavelength_loss / wavelength_repair: first slot of the block")
    parser.add_argument("--slots", type=int, default=None,
                        help="wavelength_loss / wavelength_repair: slots in the block")
    parser.add_argument("--json", action="store_true", help="print the row as JSON")
    add_network_arg(parser)


def build_request(args: argparse.Namespace) -> dict[str, Any]:
    """The event fields of the request (the run validates them like a scenario event)."""
    from testbed.errors import InputError
    from testbed.spec.models import EVENT_FIELDS

    if args.kind not in EVENT_FIELDS:
        raise InputError("KIND", f"unknown fault kind {args.kind!r} (one of: "
                         f"{', '.join(k for k in EVENT_FIELDS if k != 'worker_kill')})")
    req: dict[str, Any] = {"kind": args.kind}
    if args.ends:
        if len(args.ends) != 2:
            raise InputError("U V", f"give the fibre's two nodes, e.g. lightpipe fault "
                             f"{args.kind} 1 3 (got {len(args.ends)})")
        req["link"] = list(args.ends)
    down_s = args.down_s
    if down_s is None and args.kind in ("controller_kill", "prometheus_kill"):
        down_s = DEFAULT_DOWN_S
    for key, value in (("period_s", args.period_s), ("count", args.count),
                       ("down_s", down_s), ("first_slot", args.first_slot),
                       ("slots", args.slots)):
        if value is not None:
            req[key] = value
    return req


def socket_of(net: dict[str, object]) -> str:
    """The held run's fault channel: `faults.sock` in its own state directory (checked
    against network.json's prefix and the run's state), RuntimeFailure when it is gone."""
    from pathlib import Path

    from testbed.emu.state import PREFIX_RE, RunState, run_is_live
    from testbed.errors import RuntimeFailure
    from testbed.orchestrate.faultctl import SOCKET_NAME

    prefix = str(net.get("prefix", ""))
    state_dir = Path(str(net.get("state_dir") or ""))
    if not PREFIX_RE.fullmatch(prefix) or state_dir.name != prefix:
        raise RuntimeFailure("network.json names no LightPipe run state directory")
    try:
        live = run_is_live(RunState.load(state_dir))
    except (OSError, ValueError, TypeError):
        live = False
    if not live:
        raise RuntimeFailure(f"the held run {prefix} is gone (its network was torn down)")
    path = state_dir / SOCKET_NAME
    if net.get("fault_socket") != str(path):
        raise RuntimeFailure(f"run {prefix} serves no fault channel (a run held by an "
                             "older LightPipe, or one that is not holding)")
    return str(path)


def answer_timeout_s(req: dict[str, Any], time_factor: float) -> float:
    span = req.get("down_s", 0.0) + req.get("period_s", 0.0) * req.get("count", 0)
    return span * time_factor + ANSWER_MARGIN_S


def describe_row(row: dict[str, Any]) -> str:
    """One line: kind, target, applied or not, and what the row measured."""
    done = "applied" if row.get("applied") else "not applied"
    parts = [f"{k} {row[k]}" for k in SHOWN if row.get(k) is not None]
    return f"fault: {row.get('kind')} {row.get('target')}: {done}" + (
        "; " + ", ".join(parts) if parts else "")


def run(args: argparse.Namespace) -> int:
    import json
    import math

    from testbed.cli.common import emit
    from testbed.errors import InputError
    from testbed.orchestrate.faultctl import request_fault

    req = build_request(args)
    for key in ("period_s", "down_s"):
        if key in req and not math.isfinite(req[key]):
            raise InputError(OPTIONS[key], f"must be a finite number, got {req[key]}")
    net = find_network(args.network)
    path = socket_of(net)
    factor = net.get("time_factor")
    scale = float(factor) if isinstance(factor, (int, float)) else 1.0
    try:
        row = request_fault(path, req, answer_timeout_s(req, scale))
    except InputError as exc:  # the run's field names -> this command's options
        base = exc.path.split("[", 1)[0]  # link[0] -> link
        raise InputError(OPTIONS.get(base, exc.path), exc.message) from None
    emit(json.dumps(row, sort_keys=True) if args.json else describe_row(row))
    return 0 if row.get("applied") else 1
