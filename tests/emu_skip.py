"""Why a root emulation test cannot run here: not root, a tool or a Python module
missing, or what testbed.envprobe finds the kernel lacks."""

from __future__ import annotations

import importlib.util
import os
import shutil

import pytest

_OVS = bool(all(shutil.which(t) for t in ("mnexec", "iperf3", "ip", "ovs-vsctl", "ovsdb-tool"))
            and (shutil.which("ovs-vswitchd") or os.path.exists("/usr/sbin/ovs-vswitchd")))
# tests that build networks with Open vSwitch and time traffic with iperf3
need_root = pytest.mark.skipif(not (os.geteuid() == 0 and _OVS),
                               reason="needs root, mnexec, iperf3 and Open vSwitch binaries")


def emulation_skip_reason(tools: tuple[str, ...] = ("mnexec", "prometheus"),
                          modules: tuple[tuple[str, str], ...] = ()) -> str | None:
    """None where a whole emulated run can go here, else why not: not root, one of
    `tools` not on PATH, a module of `modules` ((module, the reason to give) pairs) not
    importable, or emulation impossible on this kernel (testbed.envprobe)."""
    if os.geteuid() != 0:
        return "needs root (network namespaces, Open vSwitch)"
    for tool in tools:
        if shutil.which(tool) is None:
            return f"needs {tool}"
    for mod, why in modules:
        if importlib.util.find_spec(mod) is None:
            return why
    from testbed.envprobe import probe

    rep = probe()
    if not rep.emulation_possible:
        return "emulation not possible here: " + "; ".join(rep.reasons)
    return None
