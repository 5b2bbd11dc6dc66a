"""What the machine holds that emulation runs create: namespaces, veths, OVS bridges,
processes, open files, memory (a soak compares these before and after each run)."""

from __future__ import annotations

import os
import subprocess
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from testbed.emu.state import state_root

# Counts that must come back exactly to where they were once a run has ended.
EXACT = ("netns", "ns_processes", "veths", "ovs_bridges", "state_dirs")


@dataclass(frozen=True)
class Census:
    """One look at the machine (root namespace view)."""

    netns: int            # network namespaces other than this one's (processes + named)
    ns_processes: int     # processes living in such a namespace (emulated hosts, nodes)
    processes: int        # user-space processes on the machine
    veths: int            # veth interfaces in this namespace
    ovs_bridges: int      # Open vSwitch bridges (0 where OVS is not running)
    state_dirs: int       # LightPipe run state directories (testbed.emu.state)
    open_files: int       # file handles allocated machine-wide (/proc/sys/fs/file-nr)
    mem_used_mb: float    # MemTotal - MemAvailable

    def as_row(self) -> dict[str, float]:
        return asdict(self)


def _net_ns(pid: str) -> int | None:
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino
    except OSError:
        return None


def _user_process(pid: str) -> bool:
    try:
        return bool(Path(f"/proc/{pid}/cmdline").read_bytes())  # kernel threads have none
    except OSError:
        return False


def _named_netns() -> set[int]:
    d = Path("/run/netns")
    out = set()
    if d.is_dir():
        for f in d.iterdir():
            try:
                out.add(f.stat().st_ino)
            except OSError:
                continue
    return out


def _veths() -> int:
    from pyroute2 import IPRoute

    n = 0
    with IPRoute() as ipr:
        for link in ipr.get_links():
            info = link.get_attr("IFLA_LINKINFO")
            n += info is not None and info.get_attr("IFLA_INFO_KIND") == "veth"
    return n


def _ovs_bridges() -> int:
    try:
        r = subprocess.run(["ovs-vsctl", "--timeout=5", "list-br"], capture_output=True,
                           text=True, check=False, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return len(r.stdout.split()) if r.returncode == 0 else 0


def _mem_used_mb() -> float:
    info = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        key, _, rest = line.partition(":")
        info[key] = int(rest.split()[0])  # kB
    return round((info["MemTotal"] - info["MemAvailable"]) / 1024, 1)


def take() -> Census:
    """Count now."""
    own = _net_ns("self")
    spaces: set[int] = set()
    in_ns = procs = 0
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or not _user_process(d.name):
            continue
        procs += 1
        ino = _net_ns(d.name)
        if ino is not None and ino != own:
            spaces.add(ino)
            in_ns += 1
    spaces |= _named_netns() - {own}
    root = state_root()
    dirs = sum(1 for p in root.iterdir() if p.is_dir()) if root.is_dir() else 0
    return Census(netns=len(spaces), ns_processes=in_ns, processes=procs, veths=_veths(),
                  ovs_bridges=_ovs_bridges(), state_dirs=dirs,
                  open_files=int(Path("/proc/sys/fs/file-nr").read_text().split()[0]),
                  mem_used_mb=_mem_used_mb())


def growth(before: Census, after: Census) -> dict[str, float]:
    """after - before, per field."""
    return {f.name: round(getattr(after, f.name) - getattr(before, f.name), 1)
            for f in fields(Census)}


def leaks(before: Census, after: Census) -> dict[str, float]:
    """The EXACT counts that did not come back (field -> how many more)."""
    g = growth(before, after)
    return {k: g[k] for k in EXACT if g[k] != 0}
