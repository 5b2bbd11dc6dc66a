"""`lightpipe exec HOST -- CMD`: run a command inside a host of a live (--hold) network."""

from __future__ import annotations

import argparse

from testbed.cli.held import add_network_arg, find_network

HELP = "run a command in a host of the live emulated network (see lightpipe emu --hold)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("host", metavar="HOST", help="host name, e.g. dc-a-h0 (network.json)")
    parser.add_argument("cmd", metavar="CMD", nargs=argparse.REMAINDER,
                        help="command and arguments (after --)")
    add_network_arg(parser)


def run(args: argparse.Namespace) -> int:
    import os
    import shutil

    from testbed.emu.state import proc_start_ticks
    from testbed.errors import InputError, RuntimeFailure

    cmd = list(args.cmd)
    # Options given after HOST land in the remainder: take them up to "--".
    while cmd and cmd[0] != "--" and cmd[0].startswith("--network"):
        opt = cmd.pop(0)
        if "=" in opt:
            args.network = opt.split("=", 1)[1]
        elif cmd:
            args.network = cmd.pop(0)
        else:
            raise InputError("--network", "needs a directory")
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise InputError("CMD", "give a command after --, e.g. lightpipe exec dc-a-h0 -- ip addr")
    net = find_network(args.network)
    hosts = net.get("hosts")
    assert isinstance(hosts, list)
    match = [h for h in hosts if h["name"] == args.host or h["node"] == args.host]
    if not match:
        names = ", ".join(h["name"] for h in hosts)
        raise InputError("HOST", f"unknown host {args.host!r} (hosts: {names})")
    pid = int(match[0]["pid"])
    if proc_start_ticks(pid) is None:
        raise RuntimeFailure(f"host {args.host} is gone (pid {pid}); is the network still up?")
    mnexec = shutil.which("mnexec")
    if mnexec is None:
        raise RuntimeFailure("mnexec not found (Debian/Ubuntu package mininet)")
    unshare = shutil.which("unshare")
    if unshare is None:  # util-linux: without it, names do not resolve but the command runs
        os.execv(mnexec, [mnexec, "-a", str(pid), *cmd])
    hosts_file = write_hosts_file(net)
    # A private mount namespace in which the run's hosts file is /etc/hosts, so that
    # `ping dc-d-h0` resolves inside the emulated host; the machine's /etc/hosts is untouched.
    os.execv(mnexec, [mnexec, "-a", str(pid), unshare, "--mount", "--propagation", "private",
                      "--", "/bin/sh", "-c", 'mount --bind "$0" /etc/hosts && exec "$@"',
                      str(hosts_file), *cmd])
    return 0  # not reached


def hosts_text(net: dict[str, object], base: str = "") -> str:
    """/etc/hosts of the emulated network: the machine's entries, then one line per host."""
    hosts = net.get("hosts")
    assert isinstance(hosts, list)
    lines = [base.rstrip("\n"), f"# LightPipe emulated network {net.get('prefix', '')}"]
    lines += [f"{h['ip']}\t{h['name']}" for h in hosts]
    return "\n".join(lines).lstrip("\n") + "\n"


def write_hosts_file(net: dict[str, object]):  # type: ignore[no-untyped-def]
    """The run's hosts file in its state directory (or the temp dir); its path."""
    import tempfile
    from pathlib import Path

    from testbed.emu.state import PREFIX_RE
    from testbed.io.atomic import atomic_write_text

    prefix = str(net.get("prefix", ""))
    state = Path(str(net.get("state_dir") or ""))
    where = state if PREFIX_RE.fullmatch(prefix) and state.is_dir() else \
        Path(tempfile.gettempdir())
    try:
        base = Path("/etc/hosts").read_text()
    except OSError:
        base = "127.0.0.1\tlocalhost\n"
    name = f"hosts-{prefix}" if PREFIX_RE.fullmatch(prefix) else "lightpipe-hosts"
    return atomic_write_text(where / name, hosts_text(net, base))
