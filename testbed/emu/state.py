"""Run state on disk (PIDs, namespaces, sockets) and the exact cleanup `lightpipe clean` does.

Every emulation run owns a state directory /run/lightpipe/<prefix>/ (or
/tmp/lightpipe/<prefix>/ where /run is not writable, or $LIGHTPIPE_STATE_DIR/<prefix>/),
private to the user running it (0700), with state.json rewritten atomically each time
something is created. Cleanup kills only recorded processes whose identity (PID + start
time) still matches, and processes inside the namespaces the run holds by bind mounts
under its state directory (testbed.emu.nsref); it deletes a named namespace only when it
is one of those. A state root that others can write, or that is owned by another user,
is refused.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from testbed.io.atomic import atomic_write_json

if TYPE_CHECKING:
    from testbed.emu.nsref import Ident

log = logging.getLogger(__name__)

PREFIX_RE = re.compile(r"^lp[0-9a-f]{4}$")
STATE_FILE = "state.json"


STATE_CAP_BYTES = 4 << 20


def state_root() -> Path:
    """/run/lightpipe if usable, else /tmp/lightpipe (LIGHTPIPE_STATE_DIR overrides)."""
    env = os.environ.get("LIGHTPIPE_STATE_DIR")
    if env:
        return Path(env)
    run = Path("/run")
    if run.is_dir() and os.access(run, os.W_OK):
        return run / "lightpipe"
    return Path("/tmp/lightpipe")


def root_field() -> str:
    """What to name in an error about the state root."""
    return "LIGHTPIPE_STATE_DIR" if os.environ.get("LIGHTPIPE_STATE_DIR") else "state dir"


def check_state_root(root: Path) -> None:
    """InputError unless the state root is a directory that only its owner (the running
    user or root) can write: anyone else could plant runs there for `clean` to act on."""
    from testbed.io.trusted import check_given_dir

    check_given_dir(root, root_field(), allow_sticky=False)


@dataclass(frozen=True)
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
    # Written by versions before held references; never used to find processes: a
    # bare inode number may name another user's namespace once the run's is gone.
    ns_inodes: list[int] = field(default_factory=list)
    held: dict[str, list[int]] = field(default_factory=dict)  # label -> [dev, inode]
    out_dir: str | None = None        # where network.json lives (for --hold)
    phase: str = "building"

    def save(self) -> None:
        atomic_write_json(Path(self.state_dir) / STATE_FILE, asdict(self), mode=0o600)

    def add_proc(self, pid: int, role: str, name: str = "") -> None:
        ticks = proc_start_ticks(pid)
        if ticks is None:
            return
        self.procs.append(ProcRecord(pid, ticks, role, name))
        self.save()

    def hold_netns(self, label: str, ns_path: str) -> None:
        """Hold the namespace at ns_path for the run's life (testbed.emu.nsref)."""
        from testbed.emu.nsref import hold

        self.held[label] = list(hold(Path(self.state_dir), label, ns_path))
        self.save()

    @classmethod
    def load(cls, state_dir: Path) -> RunState:
        """The state of a run directory: state.json must be a regular file owned by the
        running user (never followed through a link, never a FIFO), at most 4 MiB."""
        from testbed.io.trusted import read_regular

        raw = read_regular(Path(state_dir) / STATE_FILE, STATE_CAP_BYTES,
                           owner_uid=os.geteuid())
        data = json.loads(raw)
        if not isinstance(data, dict):
            raise ValueError("state.json is not an object")
        procs = [ProcRecord(**p) for p in data.pop("procs", [])]
        return cls(procs=procs, **data)


_STATE_TMP_RE = re.compile(r"^\.state\.json\.([0-9]{1,10})\.[A-Za-z0-9_]+\.tmp$")


def state_writers(state_dir: Path) -> list[int]:
    """PIDs that were writing the run's state (`.state.json.PID.XXXX.tmp`, testbed.io.atomic):
    a run killed in its first write leaves only such a file, perhaps empty."""
    pids = []
    try:
        names = [e.name for e in os.scandir(state_dir)]
    except OSError:
        return []
    for name in names:
        m = _STATE_TMP_RE.fullmatch(name)
        if m:
            pids.append(int(m.group(1)))
    return sorted(set(pids))


def proc_start_ticks(pid: int) -> int | None:
    """Start time of a process in clock ticks since boot, or None if it is gone: exited,
    a zombie its parent has not reaped yet included (killed with -9 from a Python parent,
    it stays one until waited for, and its run is dead all the same)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces; fields after ')' are fixed.
    rest = stat.rsplit(")", 1)[1].split()
    if rest[0] in ("Z", "X"):
        return None
    return int(rest[19])


def descendants(pid: int) -> list[int]:
    """pid and every process below it (by parent PID, from /proc), parents first."""
    kids: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            kids.setdefault(ppid, []).append(int(d.name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop(0)
        out.append(p)
        todo.extend(kids.get(p, []))
    return out


def alive(rec: ProcRecord) -> bool:
    return proc_start_ticks(rec.pid) == rec.start_ticks


def signal_if(pid: int, sig: int, still_ours: Callable[[int], bool]) -> bool:
    """Send `sig` to `pid` only while still_ours(pid) holds, through a pidfd opened first:
    a PID reused between the check and the signal gets nothing. True when sent."""
    try:
        pfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return False
    except (AttributeError, OSError):  # no pidfds (kernel < 5.3): check, then kill
        if not still_ours(pid):
            return False
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return False
        return True
    try:
        if not still_ours(pid):
            return False
        signal.pidfd_send_signal(pfd, sig)
        return True
    except ProcessLookupError:
        return False
    finally:
        os.close(pfd)


def new_state(prefix: str) -> RunState:
    from testbed.io.trusted import make_private_dir

    if not PREFIX_RE.fullmatch(prefix):
        raise ValueError(f"bad run prefix {prefix!r}")
    root = make_private_dir(state_root(), root_field(), 0o700)
    d = root / prefix
    d.mkdir(mode=0o700, exist_ok=False)
    os.chmod(d, 0o700)
    me = os.getpid()
    st = RunState(prefix, str(d), me, proc_start_ticks(me) or 0)
    st.save()
    start_guardian(d)  # cleans the run if this process dies without taking it down
    return st


def guardian_enabled() -> bool:
    """Whether runs start a guardian (LIGHTPIPE_GUARDIAN=0: none)."""
    return os.environ.get("LIGHTPIPE_GUARDIAN", "1") != "0"


def start_guardian(state_dir: Path) -> bool:
    """Start the guardian (testbed.emu.guardian) of the run at state_dir (its state.json
    written, naming the owner). It is not the caller's child: a shell starts it in the
    background and exits (waited for here, a few milliseconds), so nothing is left to
    reap, and the guardian is in a session of its own (a terminal's Ctrl-C does not
    reach it). False when disabled or when it could not start (logged)."""
    if not guardian_enabled():
        return False
    try:
        rc = subprocess.run(
            ["/bin/sh", "-c", '"$0" -m testbed.emu.guardian "$1" "$2" </dev/null '
             '>/dev/null 2>&1 &', sys.executable, str(state_dir), _dir_ident(state_dir)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            close_fds=True, start_new_session=True, timeout=10, check=False).returncode
    except (OSError, subprocess.TimeoutExpired) as exc:
        rc, why = -1, str(exc)
    else:
        why = f"the shell exited {rc}"
    if rc != 0:
        log.warning("no guardian for %s (%s): after a crash, `lightpipe clean` removes "
                    "what the run left", state_dir, why)
        return False
    return True


def _dir_ident(path: Path) -> str:
    st = os.lstat(path)
    return f"{st.st_dev}:{st.st_ino}"


def list_runs() -> list[Path]:
    """Run directories in the state root (InputError when the root is not trusted)."""
    root = state_root()
    if not root.is_dir():
        return []
    check_state_root(root)
    return sorted(p for p in root.iterdir()
                  if PREFIX_RE.fullmatch(p.name) and p.is_dir() and not p.is_symlink())


def run_is_live(st: RunState) -> bool:
    return proc_start_ticks(st.owner_pid) == st.owner_start_ticks


def kill_procs(procs: list[ProcRecord], grace_s: float = 2.0) -> int:
    """SIGTERM, then SIGKILL after grace_s, the recorded processes that are still them
    (PID and start time; signalled through a pidfd)."""
    victims = [p for p in procs if alive(p)]

    def ours(rec: ProcRecord) -> Callable[[int], bool]:
        return lambda _pid: alive(rec)

    for p in victims:
        signal_if(p.pid, signal.SIGTERM, ours(p))
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(alive(p) for p in victims):
        time.sleep(0.05)
    for p in victims:
        signal_if(p.pid, signal.SIGKILL, ours(p))
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(alive(p) for p in victims):
        time.sleep(0.05)
    return len(victims)


def kill_in_held(state_dir: Path) -> int:
    """SIGKILL every process inside the namespaces the run holds (testbed.emu.nsref)."""
    from testbed.emu.nsref import held

    return kill_in(set(held(state_dir).values()))


def kill_in(idents: set[Ident]) -> int:
    """SIGKILL every process inside the namespaces of these identities (nsref.Ident):
    each is checked against them again through a pidfd."""
    from testbed.emu.nsref import guarded, ns_ident, pids_in

    idents = guarded(idents)
    if not idents:
        return 0

    def inside(pid: int) -> bool:
        try:
            return ns_ident(f"/proc/{pid}/ns/net") in idents
        except OSError:
            return False

    return sum(signal_if(pid, signal.SIGKILL, inside) for pid in pids_in(idents))


def netns_exists(name: str) -> bool:
    return Path("/run/netns", name).exists()


def delete_netns(name: str) -> None:
    """Delete a named namespace this process made (callers prove it is the run's)."""
    import subprocess

    if PREFIX_RE.fullmatch(name) and netns_exists(name):
        subprocess.run(["ip", "netns", "del", name], check=False,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def named_is_held(state_dir: Path, name: str) -> bool:
    """True when /run/netns/<name> is a namespace the run in state_dir holds."""
    from testbed.emu.nsref import held, ns_ident

    try:
        ident = ns_ident(Path("/run/netns", name))
    except OSError:
        return False
    return ident in held(Path(state_dir)).values()


def release_held(state_dir: Path) -> bool:
    from testbed.emu.nsref import release_all

    return release_all(Path(state_dir))
