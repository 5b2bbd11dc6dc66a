"""`lightpipe fault KIND [U V] [options]`: inject a fault into a held emulation now."""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path
from typing import Any

from testbed.cli.held import add_network_arg, find_network
from testbed.emu.scale import Scale

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
            req[key] = check_option(key, value)
    return req


def check_option(key: str, value: float) -> float:
    """The value of an event field given on the command line, within the bounds of
    testbed.spec.models.EventSpec (checked here before anything is sent; the run checks
    them again); InputError naming the option."""
    from testbed.cli.common import bounded_number
    from testbed.spec.models import MAX_FAULT_S

    day = " (one day on the scenario clock)"
    bounds: dict[str, tuple[float, float, bool, str]] = {
        "period_s": (0.0, MAX_FAULT_S, True, day), "down_s": (0.0, MAX_FAULT_S, True, day),
        "count": (1, 1000, False, ""), "first_slot": (0, 4095, False, ""),
        "slots": (1, 4096, False, "")}
    low, high, low_open, what = bounds[key]
    return bounded_number(OPTIONS[key], value, low, high, low_open=low_open, what=what)


def socket_of(net: dict[str, object]) -> str:
    """The held run's fault channel: `faults.sock` in its own state directory (checked
    against network.json's prefix, this LightPipe's state root, the directory's owner
    and mode, and the run's state), RuntimeFailure when it is gone or not trusted."""

    from testbed.emu.state import PREFIX_RE, RunState, run_is_live, state_root
    from testbed.errors import RuntimeFailure
    from testbed.orchestrate.faultctl import SOCKET_NAME

    prefix = str(net.get("prefix", ""))
    state_dir = Path(str(net.get("state_dir") or ""))
    if not PREFIX_RE.fullmatch(prefix) or state_dir.name != prefix:
        raise RuntimeFailure("network.json names no LightPipe run state directory")
    root = state_root()
    if os.path.abspath(state_dir) != os.path.abspath(root / prefix):
        raise RuntimeFailure(f"network.json's state directory {state_dir} is not in this "
                             f"LightPipe's state root {root} (a run held with another "
                             "LIGHTPIPE_STATE_DIR, or not a LightPipe run): refused")
    check_state_dir(state_dir)
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


def check_state_dir(state_dir: Path) -> None:
    """RuntimeFailure unless the run's state directory is a directory itself (no link),
    owned by root or this user and writable by no one else: its socket and state files
    are then theirs."""
    import stat

    from testbed.errors import RuntimeFailure
    from testbed.orchestrate.faultctl import trusted_uids

    try:
        st = os.lstat(state_dir)
    except FileNotFoundError:
        raise RuntimeFailure(f"the held run {state_dir.name} is gone (its network was "
                             "torn down)") from None
    except OSError as exc:
        raise RuntimeFailure(f"cannot use {state_dir}: {exc.strerror}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise RuntimeFailure(f"{state_dir} is not a directory (a link?): refused")
    if st.st_uid not in trusted_uids():
        raise RuntimeFailure(f"{state_dir} is owned by uid {st.st_uid}, not by root or "
                             "you: refused")
    if st.st_mode & 0o022:
        raise RuntimeFailure(f"{state_dir} is writable by other users "
                             f"(mode {stat.S_IMODE(st.st_mode):04o}): refused")


def answer_timeout_s(req: dict[str, Any], scale: Scale) -> float:
    """How long to wait for the answer: the fault's own span on the wall clock (at most
    the run's MAX_FAULT_WALL_S: it refuses longer ones) and a margin."""
    from testbed.orchestrate.faultctl import MAX_FAULT_WALL_S

    span = req.get("down_s", 0.0) + req.get("period_s", 0.0) * req.get("count", 0)
    wall_s = scale.emulated_s(span)
    if not (math.isfinite(wall_s) and wall_s <= MAX_FAULT_WALL_S):
        wall_s = MAX_FAULT_WALL_S
    return wall_s + ANSWER_MARGIN_S


def describe_row(row: dict[str, Any]) -> str:
    """One line: kind, target, applied or not, and what the row measured."""
    done = "applied" if row.get("applied") else "not applied"
    parts = [f"{k} {row[k]}" for k in SHOWN if row.get(k) is not None]
    return f"fault: {row.get('kind')} {row.get('target')}: {done}" + (
        "; " + ", ".join(parts) if parts else "")


def run(args: argparse.Namespace) -> int:
    import json

    from testbed.cli.common import emit
    from testbed.errors import InputError
    from testbed.orchestrate.faultctl import request_fault

    req = build_request(args)
    net = find_network(args.network)
    path = socket_of(net)
    scale = Scale.of_record(net, "network.json")
    try:
        row = request_fault(path, req, answer_timeout_s(req, scale))
    except InputError as exc:  # the run's field names -> this command's options
        base = exc.path.split("[", 1)[0]  # link[0] -> link
        raise InputError(OPTIONS.get(base, exc.path), exc.message) from None
    emit(json.dumps(row, sort_keys=True) if args.json else describe_row(row))
    return 0 if row.get("applied") else 1
