"""Commands on the cluster's machines over SSH, and the check that each can run LightPipe.

Plain `ssh` (OpenSSH) in batch mode: never a password prompt (BatchMode=yes), a bounded
connect (ConnectTimeout), only the cluster file's key (IdentitiesOnly=yes), host keys
checked as the cluster file says (StrictHostKeyChecking=yes, or accept-new: a first key
is trusted, a changed one refused; never 'no'). A script goes over stdin to `sh -s`,
so nothing of it is parsed by a local shell; its arguments are validated and quoted.
"""

from __future__ import annotations

import logging
import shlex
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from testbed.cluster.spec import ClusterSpec, MachineSpec
from testbed.errors import InputError

log = logging.getLogger(__name__)

SSH_FAILED = 255  # ssh's own exit status (connection, authentication, host key)
TOOLS = ("ip", "tc", "ovs-vswitchd", "ovs-vsctl", "mnexec")

# Run on each machine by `sh -s VENV TUNNEL_IP`: one `key value` line per finding.
CHECK_SCRIPT = r"""
PATH="$PATH:/usr/sbin:/sbin:/usr/local/sbin"
venv="$1"; tunnel_ip="$2"
for t in ip tc ovs-vswitchd ovs-vsctl mnexec; do
  p=$(command -v "$t" 2>/dev/null) && echo "tool $t $p" || echo "missing $t"
done
if [ -x "$venv/bin/python" ]; then
  if "$venv/bin/python" -c 'import testbed' 2>/dev/null; then echo "venv ok"
  else echo "venv no-testbed"; fi
else echo "venv missing"; fi
if [ "$(id -u)" = 0 ]; then echo "root yes"
elif sudo -n true 2>/dev/null; then echo "root sudo"
else echo "root no"; fi
if [ -d /sys/module/vxlan ] || modinfo vxlan >/dev/null 2>&1; then echo "vxlan yes"
else echo "vxlan no"; fi
dev=$(ip -o addr show to "$tunnel_ip" 2>/dev/null | awk '{print $2; exit}')
if [ -n "$dev" ]; then echo "underlay $dev $(cat /sys/class/net/$dev/mtu 2>/dev/null)"
else echo "underlay none"; fi
echo "kernel $(uname -r)"
"""


@dataclass(frozen=True)
class Ssh:
    """How to run commands on one machine."""

    cluster: ClusterSpec
    machine: MachineSpec

    @property
    def destination(self) -> str:
        host = self.machine.address
        return f"{self.cluster.user_of(self.machine)}@{host}"

    def options(self) -> list[str]:
        ssh = self.cluster.ssh
        opts = ["-o", "BatchMode=yes", "-o", f"ConnectTimeout={ssh.connect_timeout_s}",
                "-o", "StrictHostKeyChecking="
                + ("yes" if ssh.host_key_checking == "strict" else "accept-new"),
                "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3",
                "-o", "LogLevel=ERROR", "-p", str(self.cluster.port_of(self.machine))]
        known = self.cluster.known_hosts_path()
        if known is not None:
            # Quoted: ssh reads a space in this option as a second file.
            opts += ["-o", f'UserKnownHostsFile="{known}"']
        key = self.cluster.key_of(self.machine)
        if key is not None:
            opts += ["-i", str(key), "-o", "IdentitiesOnly=yes"]
        return opts

    def argv(self, remote: Sequence[str]) -> list[str]:
        """The ssh command line that runs `remote` (quoted words) on the machine."""
        return ["ssh", *self.options(), "--", self.destination,
                " ".join(shlex.quote(w) for w in remote)]

    def run_script(self, script: str, args: Sequence[str], timeout_s: float
                   ) -> subprocess.CompletedProcess[str]:
        """Run a POSIX sh script on the machine with `args` as $1..; its output."""
        argv = self.argv(["sh", "-s", "--", *args])
        log.debug("ssh: %s", " ".join(shlex.quote(a) for a in argv))
        try:
            return subprocess.run(argv, input=script, capture_output=True, text=True,
                                  timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired:
            return subprocess.CompletedProcess(argv, SSH_FAILED, "",
                                               f"no answer within {timeout_s:g} s")


@dataclass
class MachineCheck:
    """What `check_machine` found on one machine."""

    machine: str
    address: str
    reachable: bool = False
    error: str = ""
    tools: dict[str, str] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)
    venv: str = ""
    root: str = ""
    vxlan: str = ""
    underlay_dev: str = ""
    underlay_mtu: int | None = None
    kernel: str = ""

    @property
    def problems(self) -> list[str]:
        """What keeps LightPipe from running there, each a few words."""
        if not self.reachable:
            return [self.error or "unreachable"]
        out = [f"missing {t}" for t in self.missing]
        if self.venv == "missing":
            out.append("no venv (bin/python) at the venv path")
        elif self.venv == "no-testbed":
            out.append("the venv has no LightPipe (run `make setup` there)")
        if self.root == "no":
            out.append("neither root nor password-less sudo")
        if self.vxlan == "no":
            out.append("no vxlan kernel module")
        if self.underlay_dev == "":
            out.append("tunnel address is on no interface")
        return out

    @property
    def ok(self) -> bool:
        return not self.problems

    def line(self) -> str:
        """One line for the check's report."""
        head = f"{self.machine} ({self.address})"
        if not self.reachable:
            return f"{head}: {self.problems[0]}"
        where = f", underlay {self.underlay_dev} mtu {self.underlay_mtu}" \
            if self.underlay_dev else ""
        state = "ok" if self.ok else "; ".join(self.problems)
        return f"{head}: {state} (kernel {self.kernel}, root: {self.root}{where})"


def check_machine(cluster: ClusterSpec, machine: MachineSpec,
                  timeout_s: float | None = None) -> MachineCheck:
    """Reach the machine and look for what LightPipe needs there (no root needed here)."""
    check_ssh_inputs(cluster, machine)
    ssh = Ssh(cluster, machine)
    limit = timeout_s if timeout_s is not None else cluster.ssh.connect_timeout_s + 20
    res = ssh.run_script(CHECK_SCRIPT, [cluster.venv_of(machine), machine.underlay_ip], limit)
    out = MachineCheck(machine.name, machine.address)
    if res.returncode != 0 and not res.stdout.strip():
        out.error = ssh_error(res.returncode, res.stderr)
        return out
    out.reachable = True
    parse_check_output(res.stdout, out)
    return out


def check_ssh_inputs(cluster: ClusterSpec, machine: MachineSpec) -> None:
    """InputError naming the field when ssh would refuse the key or known_hosts file."""
    key = cluster.key_of(machine)
    i = cluster.machines.index(machine)
    field_name = f"machines[{i}].key" if machine.key else "ssh.key"
    if key is not None and not key.is_file():
        raise InputError(field_name, f"{key}: no such file")
    if key is not None and not key_is_private(key):
        raise InputError(field_name, f"{key}: others can read it (ssh refuses such a key; "
                         "chmod 600 it)")
    known = cluster.known_hosts_path()
    if known is not None and any(c in str(known) for c in '"\\\n'):
        raise InputError("ssh.known_hosts", f"{str(known)!r}: a path with a quote, a "
                         "backslash or a newline cannot be given to ssh")
    if known is not None and cluster.ssh.host_key_checking == "strict" and not known.is_file():
        raise InputError("ssh.known_hosts", f"{known}: no such file (strict host key "
                         "checking needs the machines' keys in it)")


def parse_check_output(text: str, out: MachineCheck) -> None:
    """Fill `out` from CHECK_SCRIPT's lines (unknown lines are ignored)."""
    for line in text.splitlines():
        key, _, rest = line.strip().partition(" ")
        if key == "tool":
            name, _, path = rest.partition(" ")
            out.tools[name] = path
        elif key == "missing" and rest in TOOLS:
            out.missing.append(rest)
        elif key in ("venv", "root", "vxlan", "kernel"):
            setattr(out, key, rest)
        elif key == "underlay":
            dev, _, mtu = rest.partition(" ")
            if dev != "none":
                out.underlay_dev = dev
                out.underlay_mtu = int(mtu) if mtu.isdigit() else None


def ssh_error(code: int, stderr: str) -> str:
    """A few words for why ssh failed, from its last meaningful stderr line."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    last = lines[-1] if lines else f"ssh exited with {code}"
    if "IDENTIFICATION HAS CHANGED" in stderr or "has changed and you have" in stderr:
        return "host key changed since it was recorded in known_hosts; refused"
    if "Host key verification failed" in stderr:
        return ("host key not known (add it to known_hosts, or set ssh.host_key_checking: "
                "accept-new)")
    if "Permission denied" in stderr:
        return f"authentication refused ({last})"
    if code == SSH_FAILED:
        return f"unreachable ({last})"
    return f"remote shell failed with {code} ({last})"


def check_cluster(cluster: ClusterSpec, timeout_s: float | None = None
                  ) -> list[MachineCheck]:
    """check_machine on every machine, side by side (one ssh each)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=min(8, len(cluster.machines))) as pool:
        return list(pool.map(lambda m: check_machine(cluster, m, timeout_s),
                             cluster.machines))


def key_is_private(path: Path) -> bool:
    """OpenSSH refuses a private key others can read; say so before ssh does."""
    return path.stat().st_mode & 0o077 == 0
