"""Probe what this machine supports: root, netem, OVS datapaths, Mininet, Prometheus, torch."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
import uuid
from dataclasses import asdict, dataclass
from functools import cache


@dataclass(frozen=True)
class EnvReport:
    """What the emulation backend can use on this machine."""

    root: bool
    netem: bool
    ovs_installed: bool
    ovs_kernel_datapath: bool
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


@cache
def netem_available() -> bool:
    """True if `tc qdisc add ... netem` works (tried in a throw-away namespace)."""
    if os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("tc") is None:
        return False
    ns = f"lpprobe{uuid.uuid4().hex[:8]}"
    if not _run_ok(["ip", "netns", "add", ns]):
        return False
    try:
        _run_ok(["ip", "-n", ns, "link", "set", "lo", "up"])
        return _run_ok(["tc", "-n", ns, "qdisc", "add", "dev", "lo", "root", "netem",
                        "delay", "1ms"])
    finally:
        _run_ok(["ip", "netns", "del", ns])


def ovs_kernel_datapath() -> bool:
    """True if the openvswitch kernel module is loaded (or built in)."""
    return os.path.isdir("/sys/module/openvswitch")


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def prometheus_binary() -> str | None:
    return shutil.which("prometheus")


def probe() -> EnvReport:
    root = os.geteuid() == 0
    ovs = shutil.which("ovs-vsctl") is not None and (
        shutil.which("ovs-vswitchd") is not None or os.path.exists("/usr/sbin/ovs-vswitchd"))
    mnexec = shutil.which("mnexec") is not None
    mininet_py = importlib.util.find_spec("mininet") is not None
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
        mnexec=mnexec,
        mininet_python=mininet_py,
        os_ken=importlib.util.find_spec("os_ken") is not None,
        iperf3=shutil.which("iperf3") is not None,
        prometheus=prometheus_binary(),
        torch=_version("torch"),
        emulation_possible=not reasons,
        reasons=tuple(reasons),
    )
