"""`lightpipe doctor`'s checks: what this machine can run, each with the feature and the fix."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from testbed import envprobe

log = logging.getLogger(__name__)

OK, WARN, MISSING = "ok", "warn", "missing"
SUPPORTED_PYTHONS = ((3, 11), (3, 12), (3, 13))
TORCH_VERSION = "2.13.0"  # scripts/setup.sh's TORCH_VERSION
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
TORCH_TIMEOUT_S = 60.0
TORCH_SOURCE_FILE = "lightpipe-torch-source.json"  # written by scripts/install_torch.py
TORCH_SOURCE_MAX_BYTES = 64 * 1024
TOOL_VERSION_TIMEOUT_S = 5.0
FREE_CORES_WARN = 2.0
DISK_WARN_GB = 5.0
DISK_MIN_GB = 1.0
SIM_REQUESTS = 500  # of the default scenario's 20,000: a fraction of a second
REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SCENARIO = Path("scenarios") / "quickstart.yaml"
SETUP_FIX = "`make setup`"
APT_FIX = "apt-get install {pkg} (`make setup` as root installs it)"

# A matrix product and a gradient with exact answers (float64, small integers): 740 and
# [156, 224, 292], as scripts/install_torch.py checks after installing torch.
TORCH_CHECK_CODE = """\
import json, torch
a = torch.arange(6, dtype=torch.float64).reshape(2, 3)
x = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64, requires_grad=True)
y = (a @ x).pow(2).sum()
y.backward()
ok = float(y.detach()) == 740.0 and x.grad.tolist() == [156.0, 224.0, 292.0]
print(json.dumps({"ok": ok, "version": torch.__version__, "cuda": torch.version.cuda}))
"""


@dataclass(frozen=True)
class Found:
    """What one check found: its status, a detail (version, path, why) and the fix."""

    status: str
    detail: str
    fix: str = ""


@dataclass(frozen=True)
class Check:
    """One line of the doctor's report."""

    name: str
    status: str
    enables: str
    detail: str
    fix: str

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


@dataclass(frozen=True)
class Probe:
    """A check to run: its name, what it enables, the function that finds it out."""

    name: str
    enables: str
    find: Callable[[], Found]
    emulation_needs: bool = False  # the emulation cannot run without it
    background: bool = False  # slow (a subprocess): run beside the others


@dataclass(frozen=True)
class Report:
    """Every check's line, and what they add up to."""

    checks: tuple[Check, ...]
    simulator_ok: bool
    emulation_missing: tuple[str, ...]

    @property
    def emulation_available(self) -> bool:
        return not self.emulation_missing

    def as_dict(self) -> dict[str, Any]:
        return {"checks": [c.as_dict() for c in self.checks],
                "simulator_ok": self.simulator_ok,
                "emulation": {"available": self.emulation_available,
                              "missing": list(self.emulation_missing)},
                "summary": summary_line(self)}


def ok(detail: str) -> Found:
    return Found(OK, detail)


def warn(detail: str, fix: str) -> Found:
    return Found(WARN, detail, fix)


def missing(detail: str, fix: str) -> Found:
    return Found(MISSING, detail, fix)


def one_line(text: str, max_chars: int = 200) -> str:
    """The last non-empty line of text, shortened (an error's own line, not its traceback)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    line = lines[-1] if lines else ""
    return line if len(line) <= max_chars else line[:max_chars - 3] + "..."


def tool_version(binary: str, arg: str = "--version") -> str:
    """The first line a tool prints for --version ('' when it does not answer quickly)."""
    try:
        proc = subprocess.run([binary, arg], capture_output=True, text=True,
                              timeout=TOOL_VERSION_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    lines = (proc.stdout or proc.stderr).strip().splitlines()
    return lines[0].strip()[:120] if lines else ""


def with_version(path: str) -> str:
    version = tool_version(path)
    return f"{path} ({version})" if version else path


# ---- the checks -----------------------------------------------------------------------

def check_python(version: Sequence[int] | None = None) -> Found:
    v = tuple(sys.version_info[:3] if version is None else version)
    shown = ".".join(str(p) for p in v)
    if v[:2] in SUPPORTED_PYTHONS:
        return ok(f"{shown} ({sys.executable})")
    return warn(f"{shown} is not supported (3.11-3.13 are)",
                "install Python 3.11-3.13 (e.g. apt-get install python3.11 / pyenv) and run "
                "`make setup PYTHON=python3.X`")


def torch_fix() -> str:
    return (f"{SETUP_FIX} (or `pip install torch=={TORCH_VERSION} --index-url "
            f"{TORCH_CPU_INDEX}`)")


def read_torch_source(prefix: Path) -> tuple[dict[str, Any] | None, str]:
    """(the record scripts/install_torch.py wrote in prefix, '') or (None, why not): read
    bounded, no symbolic link followed, owned by this user or root."""
    from testbed.errors import InputError
    from testbed.io.bounded import read_owned_nofollow_bytes

    path = prefix / TORCH_SOURCE_FILE
    if not path.exists() and not path.is_symlink():
        return None, ""
    try:
        data = json.loads(read_owned_nofollow_bytes(path, TORCH_SOURCE_FILE,
                                                    TORCH_SOURCE_MAX_BYTES))
    except InputError as exc:
        return None, exc.message
    except ValueError:  # (UnicodeDecodeError included)
        return None, f"{path} is not JSON"
    if not isinstance(data, dict):
        return None, f"{path} is not a JSON object"
    return data, ""


def describe_source(record: dict[str, Any] | None, problem: str, version: str | None) -> str:
    """'from SOURCE (DETAIL)', or 'source unknown' (with why, where the file was refused)."""
    if record is None:
        return f"source unknown ({problem})" if problem else "source unknown"
    source = str(record.get("source") or "?")[:40]
    detail = str(record.get("detail") or "")[:160]
    text = f"from {source}" + (f" ({detail})" if detail else "")
    recorded = record.get("torch")
    if recorded and version and str(recorded) != version:
        text += f"; recorded for torch {str(recorded)[:40]}"
    return text


def run_torch_check(python: str, timeout_s: float) -> tuple[dict[str, Any] | None, str]:
    """({'ok', 'version', 'cuda'}, '') when `python` imports torch and computes; else
    (None, the one-line reason)."""
    try:
        proc = subprocess.run([python, "-c", TORCH_CHECK_CODE], capture_output=True,
                              text=True, timeout=timeout_s, check=False,
                              stdin=subprocess.DEVNULL, cwd="/")  # (no module of the cwd)
    except subprocess.TimeoutExpired:
        return None, f"`import torch` gave no answer in {timeout_s:.0f} s"
    except OSError as exc:
        return None, f"cannot run {python}: {exc.strerror or exc}"
    if proc.returncode < 0:
        return None, f"`import torch` crashed (signal {-proc.returncode})"
    if proc.returncode != 0:
        return None, one_line(proc.stderr) or f"exit status {proc.returncode}"
    try:
        result = json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None, "the torch check printed no result"
    if not isinstance(result, dict):
        return None, "the torch check printed no result"
    return result, ""


def check_torch(python: str | None = None, prefix: Path | None = None,
                timeout_s: float = TORCH_TIMEOUT_S) -> Found:
    result, why = run_torch_check(python or sys.executable, timeout_s)
    record, problem = read_torch_source(Path(sys.prefix if prefix is None else prefix))
    if result is None:
        installed = envprobe.dist_version("torch")
        where = f"torch {installed} installed, but" if installed else "not installed:"
        return missing(f"{where} {why}; {describe_source(record, problem, installed)}",
                       torch_fix())
    version = str(result.get("version", "?"))[:40]
    cuda = result.get("cuda")
    build = f"CUDA {str(cuda)[:20]} build" if cuda else "CPU build"
    source = describe_source(record, problem, version)
    if not result.get("ok"):
        return missing(f"{version}, {build}: imports but computes wrong numbers; {source}",
                       torch_fix())
    return ok(f"{version}, {build}, computes; {source}")


def check_root() -> Found:
    euid = os.geteuid()
    if euid == 0:
        return ok("running as root")
    return missing(f"not root (uid {euid})",
                   "run the emulation as root: `sudo .venv/bin/lightpipe run SPEC` "
                   "(or the VM: `cd vagrant && vagrant up`)")


def check_ovs_userspace() -> Found:
    daemon = envprobe.ovs_vswitchd_binary()
    if envprobe.ovs_installed() and daemon is not None:
        return ok(with_version(daemon))
    what = "ovs-vsctl" if daemon else "ovs-vswitchd"
    return missing(f"{what} not found", APT_FIX.format(pkg="openvswitch-switch"))


def check_ovs_kernel() -> Found:
    state = envprobe.module_state("openvswitch")
    if state == "loaded":
        return ok("openvswitch module loaded")
    if state == "loadable":
        return ok("openvswitch module loadable (loaded on first use)")
    return warn("no openvswitch module in this kernel: the userspace (netdev) datapath is "
                "used, slower", "a kernel with the openvswitch module (e.g. apt-get install "
                "linux-modules-extra-$(uname -r)), or the VM: `cd vagrant && vagrant up`")


NETEM_FIX = ("a kernel with sch_netem (e.g. apt-get install linux-modules-extra-$(uname -r)),"
             " or the VM: `cd vagrant && vagrant up`")


def check_netem() -> Found:
    state = envprobe.module_state("sch_netem")
    if os.geteuid() != 0:
        return warn(f"not tried (needs root); sch_netem module {state}",
                    "run as root to try it; " + NETEM_FIX)
    if envprobe.netem_available():
        return ok(f"a netem qdisc can be added (sch_netem {state})")
    return warn("no netem qdisc here: the user-space link forwarder is used", NETEM_FIX)


def check_mininet() -> Found:
    mnexec = envprobe.mnexec_binary()
    package = (envprobe.dist_version("mininet") or "importable") if envprobe.mininet_python() \
        else None
    if mnexec and package:
        return ok(f"{mnexec}, python package {package}")
    lacks = [what for what, have in (("mnexec", mnexec), ("the mininet python package",
                                                          package)) if not have]
    fix = [APT_FIX.format(pkg="mininet")] if not mnexec else []
    if not package:
        fix.append(f"{SETUP_FIX} (the python package, in the venv)")
    return missing(" and ".join(lacks) + " not found", "; ".join(fix))


def check_os_ken() -> Found:
    from testbed.orchestrate.controller import controller_available

    available, _ = controller_available()
    if available:
        return ok(f"os-ken {envprobe.dist_version('os-ken') or 'importable'}")
    return missing("os-ken not importable", f"{SETUP_FIX} (os-ken is in the venv's "
                   "dependencies), or set emulation.forwarding: static")


def check_iperf3() -> Found:
    path = envprobe.iperf3_binary()
    if path:
        return ok(with_version(path))
    return missing("iperf3 not found", APT_FIX.format(pkg="iperf3"))


def check_prometheus() -> Found:
    path = envprobe.prometheus_binary()
    if path:
        return ok(with_version(path))
    return missing("prometheus not found", APT_FIX.format(pkg="prometheus"))


def vagrant_libvirt_plugin(home: Path | None = None) -> str | None:
    """Where the vagrant-libvirt plugin was found (a user's plugins.json, or the
    distribution's system plugin), or None."""
    vagrant_home = home or Path(os.environ.get("VAGRANT_HOME") or Path.home() / ".vagrant.d")
    try:
        from testbed.io.trusted import read_regular

        text = read_regular(vagrant_home / "plugins.json", 1 << 20).decode("utf-8", "replace")
        if '"vagrant-libvirt"' in text:
            return str(vagrant_home / "plugins.json")
    except (OSError, ValueError):
        pass
    system = (Path("/usr/share/vagrant-plugins/plugins.d/vagrant-libvirt.json"),
              Path("/usr/share/rubygems-integration/all/specifications"))
    if system[0].is_file():
        return str(system[0])
    if system[1].is_dir() and any(system[1].glob("vagrant-libvirt-*.gemspec")):
        return str(system[1])
    return None


VAGRANT_FIXES = {
    "vagrant": "apt-get install vagrant",
    "the vagrant-libvirt plugin": "apt-get install vagrant-libvirt (or `vagrant plugin "
                                  "install vagrant-libvirt`)",
    "libvirt (libvirtd/virsh)": "apt-get install libvirt-daemon-system qemu-system-x86",
}


def check_vagrant() -> Found:
    vagrant = shutil.which("vagrant")
    plugin = vagrant_libvirt_plugin()
    libvirt = shutil.which("libvirtd") or shutil.which("virsh")
    vbox = shutil.which("VBoxManage")
    providers = [p for p, have in (("libvirt", plugin and libvirt), ("VirtualBox", vbox))
                 if have]
    if vagrant and providers:
        return ok(f"{with_version(vagrant)}, provider {' or '.join(providers)}")
    parts = (("vagrant", vagrant), ("the vagrant-libvirt plugin", plugin),
             ("libvirt (libvirtd/virsh)", libvirt))
    lacks = [what for what, have in parts if not have]
    have = [what for what, where in parts if where]
    detail = " and ".join(lacks) + " not found" + (f" ({', '.join(have)} found)"
                                                    if have else "")
    fix = "; ".join(VAGRANT_FIXES[what] for what in lacks)
    return missing(detail, f"{fix} (or VirtualBox); docs/vm.md")


def check_free_cores(cores: int | None = None, load_1min: float | None = None) -> Found:
    n = len(os.sched_getaffinity(0)) if cores is None else cores
    load = os.getloadavg()[0] if load_1min is None else load_1min
    free = max(0.0, n - load)
    detail = f"{n} cores usable, load {load:.2f} (1 min): ~{free:.1f} free"
    if free < FREE_CORES_WARN:
        return warn(detail, "stop other work or use more cores: emulated links and workers "
                    "share the CPU (delays drift and tests slow down on a busy machine)")
    return ok(detail)


def disk_found(path: Path, what: str) -> Found:
    free_gb = shutil.disk_usage(path).free / 1e9
    detail = f"{free_gb:.1f} GB free in {path} ({what})"
    fix = f"free space on {path}'s filesystem (at least {DISK_WARN_GB:g} GB)"
    if free_gb < DISK_MIN_GB:
        return missing(detail, fix)
    if free_gb < DISK_WARN_GB:
        return warn(detail, fix)
    return ok(detail)


def runs_dir() -> Path:
    """Where runs are written: ./runs when it is there, else the current directory."""
    runs = Path.cwd() / "runs"
    return runs if runs.is_dir() else Path.cwd()


def check_disk_runs() -> Found:
    return disk_found(runs_dir(), "runs")


def check_disk_venv() -> Found:
    return disk_found(Path(sys.prefix), "the venv")


def default_scenario() -> Path | None:
    for base in (REPO_ROOT, Path.cwd()):
        if (base / DEFAULT_SCENARIO).is_file():
            return base / DEFAULT_SCENARIO
    return None


def shown_path(path: Path) -> str:
    """path relative to the current directory where it is inside it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


SIM_FIX = (f"{SETUP_FIX} again; if it still fails, report it with the output of "
           "`lightpipe -vv doctor`")


def check_simulator(spec: Path | None = None, requests: int = SIM_REQUESTS) -> Found:
    """Validate the bundled default scenario and simulate its first requests, in process and
    through the backend `lightpipe sim` uses (its run records in a temporary directory)."""
    import tempfile

    from testbed.backends.sim import SimBackend
    from testbed.errors import InputError
    from testbed.spec import load_scenario
    from testbed.spec.load import parse_scenario

    path = spec or default_scenario()
    if path is None:
        return missing(f"{DEFAULT_SCENARIO} not found (run from the LightPipe checkout)",
                       SIM_FIX)
    try:
        base = load_scenario(path)
    except InputError as exc:
        return missing(f"{path}: {exc.line()}", SIM_FIX)
    if base.workload.kind != "lightpath_requests":
        return missing(f"{path}: a {base.workload.kind} scenario, not the bundled "
                       "lightpath_requests default", SIM_FIX)
    data = base.model_dump(mode="json")
    total = int(data["workload"]["requests"])
    data["workload"]["requests"] = min(requests, total)
    scenario = parse_scenario(data)
    with tempfile.TemporaryDirectory(prefix="lightpipe-doctor-") as tmp:
        summary = SimBackend().run(scenario, Path(tmp) / "run", quiet=True)
    done = int(summary.get("accepted", -1)) + int(summary.get("blocked", -1))
    ratio = float(summary.get("blocking_ratio", -1.0))
    if done != data["workload"]["requests"] or not 0.0 <= ratio <= 1.0:
        return missing(f"{base.name}: the simulation's summary does not add up "
                       f"({done} requests decided, blocking {ratio})", SIM_FIX)
    return ok(f"{base.name} ({shown_path(path)}) valid; {done:,} of its {total:,} requests "
              f"simulated: blocking {ratio:.1%}")


# ---- the list, and running it ----------------------------------------------------------

PYTHON, TORCH, ROOT, SIMULATOR = "Python", "torch", "root", "simulator"
OVS_USER, OVS_KERNEL = "Open vSwitch (userspace)", "OVS kernel datapath"


def probes() -> list[Probe]:
    """Every check, in the order they are shown."""
    return [
        Probe(PYTHON, "LightPipe itself", check_python),
        Probe(SIMULATOR, "`lightpipe sim`, sweeps, reproductions, reports", check_simulator),
        Probe(TORCH, "real PyTorch pipeline workers (the emulation's workers)", check_torch,
              background=True),
        Probe(ROOT, "emulation: namespaces, Mininet, tc", check_root, emulation_needs=True),
        Probe(OVS_USER, "emulated switches (ovs-vswitchd)", check_ovs_userspace,
              emulation_needs=True),
        Probe(OVS_KERNEL, "faster emulated switches (kernel datapath)", check_ovs_kernel),
        Probe("netem", "kernel delay links (else the user-space forwarder)", check_netem),
        Probe("Mininet", "emulated hosts (mnexec, python package)", check_mininet,
              emulation_needs=True),
        Probe("os-ken", "the SDN controller (emulation.forwarding: controller)",
              check_os_ken),
        Probe("iperf3", "the emulation's goodput checks per lightpath", check_iperf3,
              emulation_needs=True),
        Probe("Prometheus", "the monitor and metrics (`lightpipe monitor`, Grafana)",
              check_prometheus),
        Probe("Vagrant + libvirt", "the VM testbed (`cd vagrant && vagrant up`)",
              check_vagrant, background=True),
        Probe("free cores", "faithful emulation timing; parallel sweeps", check_free_cores),
        Probe("disk (runs)", "run records", check_disk_runs),
        Probe("disk (venv)", "installing and upgrading the venv", check_disk_venv),
    ]


def run_probe(probe: Probe) -> Check:
    """The probe's line; a probe that raises is reported as its own failure, not raised."""
    t0 = time.perf_counter()
    try:
        found = probe.find()
    except Exception as exc:
        log.debug("doctor: check %s crashed", probe.name, exc_info=True)
        found = missing(f"the check crashed: {type(exc).__name__}: {one_line(str(exc))}",
                        "report it with the output of `lightpipe -vv doctor`")
    log.info("doctor: %s: %s (%.2f s)", probe.name, found.status, time.perf_counter() - t0)
    return Check(probe.name, found.status, probe.enables, found.detail, found.fix)


def run_probes(todo: Sequence[Probe]) -> list[Check]:
    """Every probe's line, in order; the slow ones (subprocesses) run beside the rest."""
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="doctor") as pool:
        later = {i: pool.submit(run_probe, p) for i, p in enumerate(todo) if p.background}
        done = {i: run_probe(p) for i, p in enumerate(todo) if not p.background}
        done |= {i: future.result() for i, future in later.items()}
    return [done[i] for i in range(len(todo))]


def diagnose(todo: Sequence[Probe] | None = None) -> Report:
    todo = probes() if todo is None else todo
    checks = run_probes(todo)
    needs = {p.name for p in todo if p.emulation_needs}
    simulator = [c for c in checks if c.name == SIMULATOR]
    return Report(checks=tuple(checks),
                  simulator_ok=bool(simulator) and simulator[0].status == OK,
                  emulation_missing=tuple(c.name for c in checks
                                          if c.name in needs and c.status != OK))


def summary_line(report: Report) -> str:
    """'doctor: the simulator works; emulation: available (...)' or '... not available
    here: needs ...'."""
    sim = ("the simulator works" if report.simulator_ok
           else "the simulator does NOT work (see its line)")
    if report.emulation_available:
        names = {c.name: c.status for c in report.checks}
        links = "netem links" if names.get("netem") == OK else "user-space links"
        datapath = ("OVS kernel datapath" if names.get(OVS_KERNEL) == OK
                    else "OVS userspace datapath")
        emu = f"available ({links}, {datapath})"
    else:
        emu = "not available here: needs " + ", ".join(report.emulation_missing)
    return f"doctor: {sim}; emulation: {emu}"
