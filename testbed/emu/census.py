"""What the machine holds that emulation runs create: namespaces, veths, OVS bridges,
processes, open files, memory (a soak compares these before and after each run).

With a `Scope`, only what a given set of runs can have made is counted: processes that
carry the scope's tag in their environment (every process a run starts inherits it),
the namespaces those processes live in, names under the runs' own prefixes, and the
file descriptors and resident memory those processes hold (instead of the machine's file
handles and memory in use). Other users' emulations on a shared machine, or other test
lanes beside a soak, then do not move the counts.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from testbed.emu.state import state_root

TAG_VAR = "LIGHTPIPE_CENSUS_TAG"
ENVIRON_MAX_BYTES = 1 << 20  # /proc/PID/environ is bounded by the kernel's ARG_MAX anyway

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
    open_files: int       # file handles allocated machine-wide (/proc/sys/fs/file-nr);
    #                       with a scope: file descriptors its processes hold
    mem_used_mb: float    # MemTotal - MemAvailable; with a scope: its processes' RSS

    def as_row(self) -> dict[str, float]:
        return asdict(self)


@dataclass(frozen=True)
class Scope:
    """What counts: processes tagged `tag` (env TAG_VAR), names under `prefixes`, and the
    run state directories under `state_dir`."""

    tag: str
    prefixes: frozenset[str]
    state_dir: Path

    def named(self, name: str) -> bool:
        return any(name.startswith(p) for p in self.prefixes)


def _tagged(pid: str, tag: str) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:  # procfs: a bounded read
            env = fh.read(ENVIRON_MAX_BYTES)
    except OSError:
        return False
    return f"{TAG_VAR}={tag}".encode() in env.split(b"\0")


def _fds_and_rss_mb(pid: str) -> tuple[int, float]:
    """Open file descriptors and resident memory (MB) of one process (0 once it is gone)."""
    try:
        fds = len(os.listdir(f"/proc/{pid}/fd"))
        with open(f"/proc/{pid}/statm", "rb") as fh:
            rss_pages = int(fh.read(256).split()[1])
    except (OSError, IndexError, ValueError):
        return 0, 0.0
    return fds, rss_pages * os.sysconf("SC_PAGE_SIZE") / 2**20


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


def _named_netns(scope: Scope | None) -> set[int]:
    d = Path("/run/netns")
    out = set()
    if d.is_dir():
        for f in d.iterdir():
            if scope is not None and not scope.named(f.name):
                continue
            try:
                out.add(f.stat().st_ino)
            except OSError:
                continue
    return out


def _veths(scope: Scope | None) -> int:
    from pyroute2 import IPRoute

    n = 0
    with IPRoute() as ipr:
        for link in ipr.get_links():
            info = link.get_attr("IFLA_LINKINFO")
            if info is None or info.get_attr("IFLA_INFO_KIND") != "veth":
                continue
            n += scope is None or scope.named(link.get_attr("IFLA_IFNAME") or "")
    return n


def _ovs_bridges(scope: Scope | None) -> int:
    try:
        r = subprocess.run(["ovs-vsctl", "--timeout=5", "list-br"], capture_output=True,
                           text=True, check=False, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    if r.returncode != 0:
        return 0
    return sum(scope is None or scope.named(b) for b in r.stdout.split())


def _mem_used_mb() -> float:
    info = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        key, _, rest = line.partition(":")
        info[key] = int(rest.split()[0])  # kB
    return round((info["MemTotal"] - info["MemAvailable"]) / 1024, 1)


def take(scope: Scope | None = None) -> Census:
    """Count now: everything on the machine, or only what `scope` covers."""
    own = _net_ns("self")
    spaces: set[int] = set()
    in_ns = procs = scoped_fds = 0
    scoped_rss_mb = 0.0
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or not _user_process(d.name):
            continue
        if scope is not None:
            if not _tagged(d.name, scope.tag):
                continue
            fds, rss_mb = _fds_and_rss_mb(d.name)
            scoped_fds += fds
            scoped_rss_mb += rss_mb
        procs += 1
        ino = _net_ns(d.name)
        if ino is not None and ino != own:
            spaces.add(ino)
            in_ns += 1
    spaces |= _named_netns(scope) - {own}
    root = state_root() if scope is None else scope.state_dir
    dirs = sum(1 for p in root.iterdir() if p.is_dir()) if root.is_dir() else 0
    return Census(netns=len(spaces), ns_processes=in_ns, processes=procs,
                  veths=_veths(scope), ovs_bridges=_ovs_bridges(scope), state_dirs=dirs,
                  open_files=(scoped_fds if scope is not None else
                              int(Path("/proc/sys/fs/file-nr").read_text().split()[0])),
                  mem_used_mb=(round(scoped_rss_mb, 1) if scope is not None else
                               _mem_used_mb()))


def growth(before: Census, after: Census) -> dict[str, float]:
    """after - before, per field."""
    return {f.name: round(getattr(after, f.name) - getattr(before, f.name), 1)
            for f in fields(Census)}


def leaks(before: Census, after: Census) -> dict[str, float]:
    """The EXACT counts that did not come back (field -> how many more)."""
    g = growth(before, after)
    return {k: g[k] for k in EXACT if g[k] != 0}
