"""On one machine (root): remove the runs' VXLAN tunnel devices left in its root namespace.

A tunnel end is made in the root namespace (`ip link add ... type vxlan`) and then moved
into the run's namespace, where it goes when the namespace goes. A run killed between the
two leaves the device in the root namespace, where no namespace's removal takes it: this
module finds such devices by name, kind, VNI, local address and UDP port
(testbed.cluster.tunnel.run_devices) and deletes them, after checking each once more just
before. Which runs: the prefixes given (skipped while that run is live here, unless
--force), or without any, every dead run in this machine's state root (testbed.emu.state).

Run by `lightpipe clean --cluster` on each machine, before that machine's own `lightpipe
clean` (which removes the run's state and with it the proof of which runs are dead):

    python -m testbed.cluster.roottunnels --local-ip IP --udp-port N [--dry-run] [--force]
        [lpXXXX ...]

Prints one `tunnel: ...` line per device (removed, would remove, failed) or one saying
none was found; exit 0, 1 when a device could not be removed or the devices could not be
listed, 2 on bad arguments (one line naming the argument).
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

from testbed.cluster.tunnel import RunDevice, run_devices
from testbed.emu.state import PREFIX_RE, RunState, list_runs, run_is_live

IP_TIMEOUT_S = 10


class Usage(Exception):
    """Bad arguments: one line naming the argument, exit 2."""


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="roottunnels", add_help=False)
    p.add_argument("--local-ip", required=True)
    p.add_argument("--udp-port", required=True, type=int)
    p.add_argument("--dry-run", action="store_true")
    p.add_argument("--force", action="store_true")
    p.add_argument("prefix", nargs="*")
    args, extra = p.parse_known_args(list(argv))
    if extra:
        raise Usage(f"unknown arguments: {' '.join(extra)}")
    try:
        args.local_ip = str(ipaddress.ip_address(args.local_ip))
    except ValueError:
        raise Usage(f"--local-ip: not an IP address: {args.local_ip!r}") from None
    if not 1 <= args.udp_port <= 65535:
        raise Usage(f"--udp-port: {args.udp_port} is not a UDP port")
    for prefix in args.prefix:
        if not PREFIX_RE.fullmatch(prefix):
            raise Usage(f"RUN: not a LightPipe run prefix: {prefix!r}")
    return args


def runs_here() -> dict[str, bool]:
    """Run prefix -> live, for every run in this machine's state root that loads."""
    out = {}
    for d in list_runs():
        try:
            st = RunState.load(d)
        except (OSError, ValueError, TypeError):
            continue  # not provable: `lightpipe clean` reports it
        out[d.name] = run_is_live(st)
    return out


def chosen_runs(given: Sequence[str], live: dict[str, bool], force: bool
                ) -> tuple[list[str], list[str]]:
    """(prefixes whose devices may go, lines for the ones kept because they are live)."""
    notes = []
    if given:
        want = list(dict.fromkeys(given))
    else:
        want = sorted(p for p, is_live in live.items() if force or not is_live)
    keep = [p for p in want if live.get(p) and not force]
    for p in keep:
        notes.append(f"tunnel: kept the devices of {p}: run is live here (use --force)")
    return [p for p in want if p not in keep], notes


def list_vxlan(dev: str | None = None) -> list[dict[str, Any]]:
    """`ip -j -d link show type vxlan` (or one device) in this namespace, parsed."""
    argv = ["ip", "-j", "-d", "link", "show"] + (["dev", dev] if dev else ["type", "vxlan"])
    res = subprocess.run(argv, capture_output=True, text=True, timeout=IP_TIMEOUT_S,
                         check=False)
    if res.returncode != 0:
        if dev is not None:
            return []  # gone meanwhile
        raise RuntimeError(f"ip link show failed: {res.stderr.strip() or res.returncode}")
    data = json.loads(res.stdout or "[]")
    return data if isinstance(data, list) else []


def remove(found: list[RunDevice], local_ip: str, udp_port: int, dry_run: bool
           ) -> tuple[list[str], bool]:
    """Delete (or list) each device, re-proved just before; (lines, all went well)."""
    lines, ok = [], True
    for d in found:
        what = f"{d.name} (vxlan vni {d.vni}, run {d.prefix})"
        if dry_run:
            lines.append(f"tunnel: would remove {what}")
            continue
        if d not in run_devices(list_vxlan(d.name), [d.prefix], local_ip, udp_port):
            lines.append(f"tunnel: left {d.name} alone: changed since it was listed")
            continue
        res = subprocess.run(["ip", "link", "del", "dev", d.name], capture_output=True,
                             text=True, timeout=IP_TIMEOUT_S, check=False)
        if res.returncode == 0:
            lines.append(f"tunnel: removed {what}")
        else:
            ok = False
            lines.append(f"tunnel: could not remove {what}: {res.stderr.strip()}")
    return lines, ok


def main(argv: Sequence[str] | None = None) -> int:
    out = sys.stdout
    try:
        args = parse_args(sys.argv[1:] if argv is None else argv)
    except Usage as exc:
        sys.stderr.write(f"roottunnels: error: {exc}\n")
        return 2
    try:
        prefixes, notes = chosen_runs(args.prefix, runs_here(), args.force)
        found = run_devices(list_vxlan(), prefixes, args.local_ip, args.udp_port) \
            if prefixes else []
        lines, ok = remove(found, args.local_ip, args.udp_port, args.dry_run)
    except Exception as exc:  # one line, whatever went wrong (the driver reports it)
        sys.stderr.write(f"roottunnels: error: {type(exc).__name__}: {exc}\n")
        return 1
    if not found:
        runs = ", ".join(prefixes) if prefixes else "no dead run here"
        lines.append(f"tunnel: no tunnel device left in the root namespace ({runs})")
    for line in notes + lines:
        out.write(line + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
