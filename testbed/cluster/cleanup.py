"""`lightpipe clean --cluster`: clean every machine of a cluster over one SSH session each.

On each machine a POSIX sh script (on stdin to `sh -s`, as the machine check) finds the
venv from the cluster file, becomes root (already, or `sudo -n`), removes the runs' VXLAN
tunnel devices left in the root namespace (testbed.cluster.roottunnels: name, kind, VNI,
local address and port) and then runs that machine's own `lightpipe clean`, which proves
what it removes by PID + start time and held namespaces (testbed.emu.state). Every
argument is validated here before it reaches the remote shell, and quoted. The machines
are cleaned side by side; one that cannot be reached does not stop the others.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from testbed.cluster.remote import Ssh, check_ssh_inputs, ssh_error
from testbed.cluster.spec import ClusterSpec, MachineSpec, check_venv
from testbed.emu.state import PREFIX_RE
from testbed.errors import InputError

STATUS = "@lightpipe-clean"  # marks the script's own lines among the tools' output

# `sh -s VENV DRY FORCE TUNNEL_IP UDP_PORT [RUN...]`: the tools' lines, then status lines.
CLEAN_SCRIPT = r"""
PATH="$PATH:/usr/sbin:/sbin:/usr/local/sbin"
venv="$1"; dry="$2"; force="$3"; tunnel_ip="$4"; port="$5"; shift 5
S=@lightpipe-clean
if [ ! -x "$venv/bin/lightpipe" ] || [ ! -x "$venv/bin/python" ]; then
  echo "$S venv-missing"; exit 0
fi
if [ "$(id -u)" = 0 ]; then as=""
elif sudo -n true 2>/dev/null; then as="sudo -n"
else echo "$S no-root"; exit 0; fi
opts=""
if [ "$dry" = 1 ]; then opts="--dry-run"; fi
if [ "$force" = 1 ]; then opts="$opts --force"; fi
$as "$venv/bin/python" -m testbed.cluster.roottunnels --local-ip "$tunnel_ip" \
  --udp-port "$port" $opts "$@" 2>&1
echo "$S tunnels $?"
$as "$venv/bin/lightpipe" clean $opts "$@" 2>&1
echo "$S clean $?"
"""


@dataclass
class MachineClean:
    """What `lightpipe clean --cluster` did on one machine."""

    machine: str
    address: str
    reachable: bool = False
    error: str = ""
    lines: list[str] = field(default_factory=list)   # the tools' own lines, in order
    status: dict[str, int] = field(default_factory=dict)  # tunnels / clean -> exit code
    flags: list[str] = field(default_factory=list)   # venv-missing, no-root
    step_lines: dict[str, list[str]] = field(default_factory=dict)  # step -> its lines

    @property
    def removed_tunnels(self) -> int:
        return sum(ln.startswith("tunnel: removed ") for ln in self.lines)

    @property
    def removed_runs(self) -> int:
        return sum(ln.startswith("clean: removed run ") for ln in self.lines)

    @property
    def problem(self) -> str:
        """Why this machine was not (fully) cleaned; empty when it was."""
        if not self.reachable:
            return self.error or "unreachable"
        if "venv-missing" in self.flags:
            return "no LightPipe venv (bin/lightpipe, bin/python) at the venv path"
        if "no-root" in self.flags:
            return "neither root nor password-less sudo"
        for step, what in (("tunnels", "the tunnel sweep"), ("clean", "lightpipe clean")):
            if step not in self.status:
                return f"{what} did not finish (the session ended early)"
            if self.status[step] != 0:
                last = self._last_error(step)
                return f"{what} failed with exit code {self.status[step]}{last}"
        return ""

    def _last_error(self, step: str) -> str:
        """The step's last error line, else its last line (Python's own, say)."""
        mine = self.step_lines.get(step, [])
        tag = "roottunnels: error: " if step == "tunnels" else "lightpipe: error: "
        errs = [ln for ln in mine if ln.startswith(tag)] or mine[-1:]
        return f" ({errs[-1]})" if errs else ""

    @property
    def ok(self) -> bool:
        return not self.problem

    def line(self, dry_run: bool = False) -> str:
        """One line for the report."""
        head = f"{self.machine} ({self.address})"
        if not self.ok:
            return f"{head}: {self.problem}"
        if dry_run:
            return f"{head}: ok (dry run: nothing removed)"
        return (f"{head}: ok, removed {self.removed_tunnels} tunnel device(s) and "
                f"{self.removed_runs} run(s)")


def clean_args(cluster: ClusterSpec, machine: MachineSpec, prefixes: Sequence[str],
               dry_run: bool, force: bool) -> list[str]:
    """The script's arguments for one machine, each validated (InputError names it)."""
    for p in prefixes:
        if not PREFIX_RE.fullmatch(p):
            raise InputError("RUN", f"not a LightPipe run prefix: {p!r} (lp + 4 hex digits)")
    venv = cluster.venv_of(machine)
    try:
        check_venv(venv)
        tunnel_ip = str(ipaddress.ip_address(machine.underlay_ip))
    except ValueError as exc:
        raise InputError(f"machines[{cluster.machines.index(machine)}]", str(exc)) from None
    return [venv, "1" if dry_run else "0", "1" if force else "0", tunnel_ip,
            str(int(cluster.tunnel.udp_port)), *prefixes]


def parse_clean_output(text: str, out: MachineClean) -> None:
    """Fill `out` from CLEAN_SCRIPT's output: status lines, and the tools' lines (each
    also under the step it came from: before `tunnels N`, the tunnel sweep's)."""
    step = "tunnels"
    for raw in text.splitlines():
        line = raw.rstrip()
        if line.startswith(STATUS + " "):
            words = line.split()[1:]
            if len(words) == 2 and words[0] in ("tunnels", "clean") \
                    and words[1].isdigit():
                out.status[words[0]] = int(words[1])
                step = "clean"
                continue
            if len(words) == 1 and words[0] in ("venv-missing", "no-root"):
                out.flags.append(words[0])
                continue
        if line.strip():  # a tool's line (an unknown status line is kept as one)
            out.lines.append(line)
            out.step_lines.setdefault(step, []).append(line)


def clean_machine(cluster: ClusterSpec, machine: MachineSpec, prefixes: Sequence[str],
                  dry_run: bool = False, force: bool = False,
                  timeout_s: float | None = None) -> MachineClean:
    """Clean one machine over one ssh session (the key checks raise InputError first)."""
    check_ssh_inputs(cluster, machine)
    args = clean_args(cluster, machine, prefixes, dry_run, force)
    ssh = Ssh(cluster, machine)
    limit = timeout_s if timeout_s is not None else cluster.ssh.connect_timeout_s + 120
    res = ssh.run_script(CLEAN_SCRIPT, args, limit)
    out = MachineClean(machine.name, machine.address)
    if res.returncode != 0 and STATUS not in res.stdout:
        out.error = ssh_error(res.returncode, res.stderr)
        return out
    out.reachable = True
    parse_clean_output(res.stdout, out)
    return out


def clean_cluster(cluster: ClusterSpec, prefixes: Sequence[str], dry_run: bool = False,
                  force: bool = False, timeout_s: float | None = None) -> list[MachineClean]:
    """clean_machine on every machine, side by side; inputs are checked for all first."""
    for m in cluster.machines:
        check_ssh_inputs(cluster, m)
        clean_args(cluster, m, prefixes, dry_run, force)
    with ThreadPoolExecutor(max_workers=min(8, len(cluster.machines))) as pool:
        return list(pool.map(lambda m: clean_machine(cluster, m, prefixes, dry_run, force,
                                                     timeout_s), cluster.machines))
