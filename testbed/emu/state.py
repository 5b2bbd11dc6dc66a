"""Run state on disk (PIDs, namespaces, sockets) and the exact cleanup `lightpipe clean` does.

Every emulation run owns a state directory /run/lightpipe/<prefix>/ (or
/tmp/lightpipe/<prefix>/ where /run is not writable) with state.json, rewritten
atomically each time something is created. Cleanup kills only recorded processes whose
identity (start time + command line) still matches, and deletes only the recorded
named network namespace; everything else of the run lives inside namespaces that die
with their processes.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from testbed.atomicio import atomic_write_json

log = logging.getLogger(__name__)

PREFIX_RE = re.compile(r"^lp[0-9a-f]{4}$")
STATE_FILE = "state.json"


def state_root() -> Path:
    """/run/lightpipe if usable, else /tmp/lightpipe (LIGHTPIPE_STATE_DIR overrides)."""
    env = os.environ.get("LIGHTPIPE_STATE_DIR")
    if env:
        return Path(env)
    run = Path("/run")
    if run.is_dir() and os.access(run, os.W_OK):
        return run / "lightpipe"
    return Path("/tmp/lightpipe")


@dataclass
class ProcRecord:
    pid: int
    start_ticks: int   # /proc/PID/stat field 22: tells a reused PID apart
    role: str          # "ovsdb-server", "forwarder", "host-shell", ...
    name: str = ""


@dataclass
class RunState:
    """What one run created; written to state.json after every change."""

    prefix: str
    state_dir: str
    owner_pid: int
    owner_start_ticks: int
    netns: str | None = None          # the run's named namespace (switches, OVS)
    procs: list[ProcRecord] = field(default_factory=list)
    ns_inodes: list[int] = field(default_factory=list)  # every namespace of the run
    out_dir: str | None = None        # where network.json lives (for --hold)
    phase: str = "building"

    def save(self) -> None:
        atomic_write_json(Path(self.state_dir) / STATE_FILE, asdict(self))

    def add_proc(self, pid: int, role: str, name: str = "") -> None:
        ticks = proc_start_ticks(pid)
        if ticks is None:
            return
        self.procs.append(ProcRecord(pid, ticks, role, name))
        self.save()

    @classmethod
    def load(cls, state_dir: Path) -> RunState:
        data = json.loads((state_dir / STATE_FILE).read_text())
        procs = [ProcRecord(**p) for p in data.pop("procs", [])]
        return cls(procs=procs, **data)


def proc_start_ticks(pid: int) -> int | None:
    """Start time of a process in clock ticks since boot, or None if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces; fields after ')' are fixed.
    rest = stat.rsplit(")", 1)[1].split()
    return int(rest[19])


def alive(rec: ProcRecord) -> bool:
    return proc_start_ticks(rec.pid) == rec.start_ticks


def new_state(prefix: str) -> RunState:
    if not PREFIX_RE.fullmatch(prefix):
        raise ValueError(f"bad run prefix {prefix!r}")
    d = state_root() / prefix
    d.mkdir(parents=True, exist_ok=False)
    os.chmod(d, 0o755)
    me = os.getpid()
    st = RunState(prefix, str(d), me, proc_start_ticks(me) or 0)
    st.save()
    return st


def list_runs() -> list[Path]:
    root = state_root()
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and PREFIX_RE.fullmatch(p.name))


def run_is_live(st: RunState) -> bool:
    return proc_start_ticks(st.owner_pid) == st.owner_start_ticks


def kill_procs(procs: list[ProcRecord], grace_s: float = 2.0) -> int:
    """SIGTERM, then SIGKILL after grace_s, the recorded processes that are still them."""
    victims = [p for p in procs if alive(p)]
    for p in victims:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(alive(p) for p in victims):
        time.sleep(0.05)
    for p in victims:
        if alive(p):
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGKILL)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(alive(p) for p in victims):
        time.sleep(0.05)
    return len(victims)


def netns_exists(name: str) -> bool:
    return Path("/run/netns", name).exists()


def delete_netns(name: str) -> None:
    if PREFIX_RE.fullmatch(name) and netns_exists(name):
        subprocess.run(["ip", "netns", "del", name], check=False,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def netns_pids(name: str) -> list[int]:
    """PIDs of processes inside a named namespace (ip netns pids)."""
    if not netns_exists(name):
        return []
    r = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True,
                       check=False)
    return [int(x) for x in r.stdout.split() if x.isdigit()]


def clean_run(state_dir: Path, force: bool = False) -> dict[str, Any]:
    """Remove one run's leftovers. Refuses a live run unless force (returns a report)."""
    try:
        st = RunState.load(state_dir)
    except (OSError, ValueError, TypeError) as exc:
        # No readable state: only the prefix-named namespace can be ours.
        name = state_dir.name
        report: dict[str, Any] = {"prefix": name, "state": f"unreadable ({exc})"}
        if PREFIX_RE.fullmatch(name):
            pids = netns_pids(name)
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            delete_netns(name)
            report["killed"] = len(pids)
        shutil.rmtree(state_dir, ignore_errors=True)
        return report
    if run_is_live(st) and not force:
        return {"prefix": st.prefix, "skipped": f"run is live (pid {st.owner_pid})"}
    killed = kill_procs(list(reversed(st.procs)))
    # Anything else still inside the run's namespaces (iperf3, workers) is the run's too.
    if st.ns_inodes:
        from testbed.emu.netns import pids_in_netns

        me = os.getpid()
        ours = set(st.ns_inodes) - {os.stat("/proc/self/ns/net").st_ino}
        for pid in pids_in_netns(ours):
            if pid != me:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                    killed += 1
    # Processes left inside the run namespace (e.g. started by hand) go with it.
    if st.netns:
        for pid in netns_pids(st.netns):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                killed += 1
        delete_netns(st.netns)
    shutil.rmtree(state_dir, ignore_errors=True)
    return {"prefix": st.prefix, "killed": killed, "netns": st.netns}


def all_state_roots() -> list[Path]:
    roots = [state_root(), Path("/run/lightpipe"), Path("/tmp/lightpipe")]
    return list(dict.fromkeys(roots))


def orphan_namespaces() -> list[str]:
    """LightPipe-prefixed named namespaces with no state directory in any state root."""
    known = {p.name for root in all_state_roots() if root.is_dir()
             for p in root.iterdir() if p.is_dir()}
    ns_dir = Path("/run/netns")
    if not ns_dir.is_dir():
        return []
    return sorted(n.name for n in ns_dir.iterdir()
                  if PREFIX_RE.fullmatch(n.name) and n.name not in known)
