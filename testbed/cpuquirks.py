"""Work-arounds for CPUs emulated in software (QEMU's TCG), applied before NumPy loads.

Under TCG (a VM without KVM, as the Vagrant guests and the VM kernel path run here), NumPy
2.4's AVX2 (X86_V3) kernels are not safe: `np.argsort` of an int64 array of 12, 16 or 40
elements dies with a general protection fault in `_multiarray_umath` (measured in the
Debian 12 box under QEMU TCG, 2026-11-28; the same calls through the same X86_V3
kernels on this machine's real CPU are fine), which took `lightpipe emu`'s request
replay down with SIGSEGV in its simulator reference. On such a CPU NumPy is told to keep
to its baseline kernels (`NPY_DISABLE_CPU_FEATURES`), unless the user set that variable
already. Child processes inherit it. A real or KVM-accelerated CPU is left alone.

    python -c "import testbed.cpuquirks as q; print(q.software_cpu())"
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Container, MutableMapping
from pathlib import Path

log = logging.getLogger(__name__)

NUMPY_DISABLE = "X86_V3 X86_V4"   # NumPy's dispatch groups above the X86_V2 baseline
DMI_VENDOR = Path("/sys/class/dmi/id/sys_vendor")


def software_cpu(vendor_file: Path = DMI_VENDOR) -> bool:
    """Whether this machine is a QEMU guest whose CPU is emulated in software (TCG):
    QEMU's DMI vendor, and systemd-detect-virt naming `qemu` (it says `kvm` under KVM)."""
    try:
        vendor = vendor_file.read_text(errors="replace")[:64].strip()
    except OSError:
        return False
    if vendor != "QEMU":
        return False
    tool = shutil.which("systemd-detect-virt")
    if tool is None:
        return False
    try:
        r = subprocess.run([tool, "--vm"], capture_output=True, text=True, timeout=5,
                           check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.stdout.strip() == "qemu"


def apply(environ: MutableMapping[str, str] | None = None,
          modules: Container[str] | None = None) -> bool:
    """Set NPY_DISABLE_CPU_FEATURES on a software-emulated CPU if NumPy is not loaded yet
    (in `modules`, default sys.modules) and the user did not set it; whether it was set."""
    env = os.environ if environ is None else environ
    loaded = sys.modules if modules is None else modules
    if "NPY_DISABLE_CPU_FEATURES" in env or "numpy" in loaded or not software_cpu():
        return False
    env["NPY_DISABLE_CPU_FEATURES"] = NUMPY_DISABLE
    log.debug("software-emulated CPU: NumPy kept to its baseline kernels")
    return True
