"""A private Open vSwitch instance per run: its own ovsdb-server and ovs-vswitchd.

The daemons run inside the run's network namespace with OVS_RUNDIR/OVS_DBDIR/
OVS_LOGDIR/OVS_SYSCONFDIR in the run's state directory, so they never see or touch the
machine's own OVS bridges, and their PIDs are recorded for `lightpipe clean`.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import time
from pathlib import Path

from testbed.emu import priority
from testbed.errors import RuntimeFailure

log = logging.getLogger(__name__)

SCHEMA_PATHS = ("/usr/share/openvswitch/vswitch.ovsschema",
                "/usr/local/share/openvswitch/vswitch.ovsschema")
OVS_ENV_KEYS = ("OVS_RUNDIR", "OVS_DBDIR", "OVS_LOGDIR", "OVS_SYSCONFDIR", "OVS_PKGDATADIR")


def _bin(name: str) -> str:
    path = shutil.which(name) or next((p for p in (f"/usr/sbin/{name}", f"/usr/local/sbin/{name}")
                                       if os.path.exists(p)), None)
    if path is None:
        raise RuntimeFailure(f"{name} not found (install openvswitch-switch)")
    return path


class PrivateOVS:
    """Start/stop ovsdb-server + ovs-vswitchd with all their files under one directory."""

    def __init__(self, base_dir: Path, userspace_tso: bool = True,
                 timeout_s: float = 20.0) -> None:
        self.dir = base_dir / "ovs"
        self.userspace_tso = userspace_tso
        self.timeout_s = timeout_s
        self.pids: dict[str, int] = {}

    @property
    def env(self) -> dict[str, str]:
        d = str(self.dir)
        return {"OVS_RUNDIR": d, "OVS_DBDIR": d, "OVS_LOGDIR": d, "OVS_SYSCONFDIR": d}

    @property
    def db_sock(self) -> str:
        return str(self.dir / "db.sock")

    def _run(self, *cmd: str, timeout_s: float | None = None) -> str:
        env = {**os.environ, **self.env}
        timeout_s = timeout_s or self.timeout_s
        try:
            r = subprocess.run(list(cmd), env=env, capture_output=True, text=True,
                               timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired:
            raise RuntimeFailure(f"Open vSwitch did not come up: {' '.join(cmd[:3])} took "
                                 f"more than {timeout_s:.0f} s (logs in {self.dir})") from None
        if r.returncode != 0:
            raise RuntimeFailure(f"{' '.join(cmd[:3])} failed: {r.stderr.strip()[:300]}")
        return r.stdout

    def vsctl(self, *args: str) -> str:
        return self._run("ovs-vsctl", f"--db=unix:{self.db_sock}",
                         f"--timeout={max(1, round(self.timeout_s))}", *args)

    def start(self) -> None:
        schema = next((p for p in SCHEMA_PATHS if os.path.exists(p)), None)
        if schema is None:
            raise RuntimeFailure("vswitch.ovsschema not found (install openvswitch-common)")
        self.dir.mkdir(parents=True, exist_ok=True)
        db = self.dir / "conf.db"
        self._run(_bin("ovsdb-tool"), "create", str(db), schema)
        self._run(_bin("ovsdb-server"), str(db), f"--remote=punix:{self.db_sock}",
                  f"--pidfile={self.dir}/ovsdb-server.pid", "--detach", "--no-chdir",
                  f"--log-file={self.dir}/ovsdb-server.log", f"--unixctl={self.dir}/ovsdb.ctl")
        self.pids["ovsdb-server"] = self._pid("ovsdb-server")
        self.vsctl("--no-wait", "init")
        if self.userspace_tso:
            # Before any bridge exists: TCP through the userspace datapath needs it.
            self.vsctl("--no-wait", "set", "Open_vSwitch", ".",
                       "other_config:userspace-tso-enable=true")
        self._run(_bin("ovs-vswitchd"), f"unix:{self.db_sock}",
                  f"--pidfile={self.dir}/ovs-vswitchd.pid", "--detach", "--no-chdir",
                  f"--log-file={self.dir}/ovs-vswitchd.log",
                  f"--unixctl={self.dir}/ovs-vswitchd.ctl")
        self.pids["ovs-vswitchd"] = self._pid("ovs-vswitchd")
        # the switches are part of the emulated network: ahead of the workload
        priority.raise_priority(self.pids["ovs-vswitchd"], 5)
        self.vsctl("show")  # waits until vswitchd answers through the db
        log.info("private OVS up in %s (pids %s)", self.dir, self.pids)

    def _pid(self, name: str) -> int:
        path = self.dir / f"{name}.pid"
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            if path.exists() and path.read_text().strip():
                return int(path.read_text().strip())
            time.sleep(0.01)
        raise RuntimeFailure(f"Open vSwitch did not come up: {name} wrote no pid file "
                             f"within {self.timeout_s:.0f} s (see {self.dir}/{name}.log)")

    def stop(self) -> None:
        from testbed.emu.state import ProcRecord, kill_procs, proc_start_ticks

        recs = []
        for role, pid in reversed(list(self.pids.items())):
            ticks = proc_start_ticks(pid)
            if ticks is not None:
                recs.append(ProcRecord(pid, ticks, role))
        # A private, throw-away instance: no need to wait for ovs-vswitchd to remove its
        # ports one by one (they vanish with the run's namespace).
        kill_procs(recs, grace_s=0.3)
        self.pids.clear()
