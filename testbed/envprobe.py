"""Probe what this machine supports: root, netem, OVS datapaths, Mininet, Prometheus, torch."""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import logging
import os
import shutil
import subprocess
import time
import uuid
from dataclasses import asdict, dataclass
from functools import cache

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EnvReport:
    """What the emulation backend can use on this machine."""

    root: bool
    netem: bool
    ovs_installed: bool
    ovs_kernel_datapath: bool
    ovs_module: str
    mnexec: bool
    mininet_python: bool
    os_ken: bool
    iperf3: bool
    prometheus: str | None
    torch: str | None
    emulation_possible: bool
    reasons: tuple[str, ...]

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def _run_ok(cmd: list[str], timeout_s: float = 10.0) -> bool:
    try:
        return subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              timeout=timeout_s, check=False).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


MODULE_SUFFIXES = (".ko", ".ko.xz", ".ko.zst", ".ko.gz")


def module_state(name: str, sys_module: str = "/sys/module",
                 moddir: str | None = None) -> str:
    """'loaded' (or built in), 'loadable' (a module file `modprobe` would find under
    /lib/modules/$(uname -r)), or 'absent'."""
    if os.path.isdir(os.path.join(sys_module, name)):
        return "loaded"
    moddir = moddir or f"/lib/modules/{os.uname().release}"
    files = {name + sfx for sfx in MODULE_SUFFIXES} | {
        name.replace("_", "-") + sfx for sfx in MODULE_SUFFIXES}
    for index in ("modules.builtin", "modules.dep"):
        try:
            with open(os.path.join(moddir, index)) as f:
                for line in f:
                    path = line.split(":", 1)[0].strip()
                    if os.path.basename(path) in files:
                        return "loaded" if index == "modules.builtin" else "loadable"
        except OSError:
            continue
    return "absent"


def load_module(name: str) -> bool:
    """modprobe a loadable module (root only); True if it is loaded afterwards."""
    state = module_state(name)
    if state == "loaded":
        return True
    if state == "absent" or os.geteuid() != 0:
        return False
    modprobe = shutil.which("modprobe") or "/sbin/modprobe"
    if not _run_ok([modprobe, name], timeout_s=60.0):
        return False
    return module_state(name) == "loaded"


@cache
def netem_available() -> bool:
    """True if a netem qdisc can be added (tried in a throw-away namespace, through
    netlink); loads sch_netem first where it is a loadable module."""
    if os.geteuid() != 0:
        return False
    load_module("sch_netem")
    try:
        from pyroute2 import NetNS, netns
    except ImportError:
        return False
    ns = f"lpprobe{uuid.uuid4().hex[:8]}"
    try:
        netns.create(ns)
    except OSError:
        return False
    try:
        with NetNS(ns) as ipr:
            lo = ipr.link_lookup(ifname="lo")[0]
            ipr.link("set", index=lo, state="up")
            ipr.tc("add", "netem", index=lo, handle="1:", delay=1000)
        return True
    except Exception:  # NetlinkError: no such qdisc kind (ENOENT) where netem is absent
        return False
    finally:
        with contextlib.suppress(OSError):
            netns.remove(ns)


def ovs_kernel_datapath() -> bool:
    """True if the openvswitch kernel module is loaded, built in, or loadable."""
    return module_state("openvswitch") != "absent"


def ensure_ovs_kernel_datapath() -> bool:
    """Load the openvswitch module if needed; True if the kernel datapath can be used."""
    return load_module("openvswitch")


# Seconds a reference machine (the build machines: one 2-core x86 VM) takes for
# _speed_workload(); a machine that takes longer gets proportionally longer timeouts.
REFERENCE_WORKLOAD_S = 0.015
DEFAULT_STARTUP_TIMEOUT_S = 30.0


def _speed_workload() -> float:
    t0 = time.perf_counter()
    acc = 0
    for i in range(200_000):
        acc += i * i % 7
    return time.perf_counter() - t0


@cache
def machine_slowness() -> float:
    """How many times slower than the reference machine this one runs Python (1..50).

    LIGHTPIPE_TIMEOUT_SCALE overrides it; else the best of three short timings.
    """
    env = os.environ.get("LIGHTPIPE_TIMEOUT_SCALE")
    if env:
        try:
            return min(50.0, max(0.1, float(env)))
        except ValueError:
            log.warning("LIGHTPIPE_TIMEOUT_SCALE=%r is not a number: ignored", env)
    best = min(_speed_workload() for _ in range(3))
    return min(50.0, max(1.0, best / REFERENCE_WORKLOAD_S))


def startup_timeout_s(scenario_timeout_s: float | None = None,
                      base_s: float = DEFAULT_STARTUP_TIMEOUT_S) -> float:
    """Time a part of the testbed may take to come up: the scenario's
    `emulation.startup_timeout_s` if set, else base_s x machine_slowness()."""
    if scenario_timeout_s is not None:
        return float(scenario_timeout_s)
    return base_s * machine_slowness()


def dist_version(dist: str) -> str | None:
    """The installed version of a distribution (package metadata only: nothing imported)."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None



def prometheus_binary() -> str | None:
    return shutil.which("prometheus")


def ovs_vswitchd_binary() -> str | None:
    """ovs-vswitchd (Open vSwitch's userspace daemon), on PATH or in /usr/sbin."""
    found = shutil.which("ovs-vswitchd")
    if found is None and os.path.exists("/usr/sbin/ovs-vswitchd"):
        found = "/usr/sbin/ovs-vswitchd"
    return found


def ovs_installed() -> bool:
    """Open vSwitch's tools and daemon (Debian/Ubuntu package openvswitch-switch)."""
    return shutil.which("ovs-vsctl") is not None and ovs_vswitchd_binary() is not None


def mnexec_binary() -> str | None:
    return shutil.which("mnexec")


def mininet_python() -> bool:
    return importlib.util.find_spec("mininet") is not None


def iperf3_binary() -> str | None:
    return shutil.which("iperf3")


def probe() -> EnvReport:
    root = os.geteuid() == 0
    ovs = ovs_installed()
    mnexec = mnexec_binary() is not None
    mininet_py = mininet_python()
    reasons = []
    if not root:
        reasons.append("not root")
    if not ovs:
        reasons.append("Open vSwitch not installed (make setup as root installs it)")
    if not mnexec:
        reasons.append("mnexec not found (Debian/Ubuntu package mininet)")
    if not mininet_py:
        reasons.append("mininet Python package missing")
    return EnvReport(
        root=root,
        netem=netem_available(),
        ovs_installed=ovs,
        ovs_kernel_datapath=ovs_kernel_datapath(),
        ovs_module=module_state("openvswitch"),
        mnexec=mnexec,
        mininet_python=mininet_py,
        os_ken=importlib.util.find_spec("os_ken") is not None,
        iperf3=iperf3_binary() is not None,
        prometheus=prometheus_binary(),
        torch=dist_version("torch"),
        emulation_possible=not reasons,
        reasons=tuple(reasons),
    )
