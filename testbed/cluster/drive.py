"""`lightpipe cluster up/down`: each machine's share started, checked and stopped over one
SSH session per machine and step (testbed.cluster.hold runs on the far side).

One plan for all machines (one run prefix), placed once; each machine gets its share's
document on stdin and answers with one status line: ready (with its hosts and tunnels),
failed, or bad input. If any machine does not come up, those that were reached are taken
down: their share holder stopped, then their own `lightpipe clean RUN` (with --force once
the holder is proven gone: an ended holder not yet reaped reads as live). Every argument
that reaches a remote shell is validated first and quoted.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from testbed.cluster.remote import Ssh, check_ssh_inputs, ssh_error
from testbed.cluster.spec import ClusterSpec, MachineSpec, check_venv
from testbed.emu.state import PREFIX_RE
from testbed.errors import InputError

log = logging.getLogger(__name__)

MARK = "@lightpipe-share"
ACTIONS = ("start", "ping", "correct", "down", "agent", "status")
NO_RUN = ("start", "status")  # the actions that name no run

# `sh -c SCRIPT sh VENV ACTION [RUN]`, stdin passed on to the tool (the document).
SHARE_SCRIPT = r"""
PATH="$PATH:/usr/sbin:/sbin:/usr/local/sbin"
venv="$1"; shift
S=@lightpipe-share
if [ ! -x "$venv/bin/lightpipe" ] || [ ! -x "$venv/bin/python" ]; then
  echo "$S venv-missing"; exit 0
fi
if [ "$(id -u)" = 0 ]; then as=""
elif sudo -n true 2>/dev/null; then as="sudo -n"
else echo "$S no-root"; exit 0; fi
if [ "$1" = agent ]; then  # the worker agent: JSON lines on this session's stdin/stdout
  exec $as "$venv/bin/python" -m testbed.cluster.agent "$2"
fi
if [ "$1" = down ]; then
  $as "$venv/bin/python" -m testbed.cluster.hold stop "$2" 2>&1
  rc=$?
  echo "$S step stop $rc"
  # The share's holder is gone (stopped, or ended before): its run is no longer live,
  # even while its parent has not reaped it yet, so clean it whatever its record says.
  if [ "$rc" = 0 ]; then force=--force; else force=""; fi
  $as "$venv/bin/lightpipe" clean $force "$2" 2>&1
  echo "$S step clean $?"
  exit 0
fi
$as "$venv/bin/python" -m testbed.cluster.hold "$@" 2>&1
echo "$S step $1 $?"
"""


@dataclass
class ShareResult:
    """What one machine answered to one step."""

    machine: str
    address: str
    reachable: bool = False
    error: str = ""
    ready: dict[str, Any] | None = None
    rows: list[dict[str, Any]] = field(default_factory=list)  # ping's rtt lines
    fibres: dict[str, Any] | None = None  # correct's state of the fibres emulated there
    status: dict[str, int] = field(default_factory=dict)     # step -> exit code
    said: list[tuple[str, str]] = field(default_factory=list)  # (word, rest)
    lines: list[str] = field(default_factory=list)           # the tools' own lines

    @property
    def problem(self) -> str:
        """Why the step failed on this machine; empty when it did not."""
        if not self.reachable:
            return self.error or "unreachable"
        words = dict(self.said)
        if "venv-missing" in words:
            return "no LightPipe venv (bin/lightpipe, bin/python) at the venv path"
        if "no-root" in words:
            return "neither root nor password-less sudo"
        for w in ("bad", "failed"):
            if w in words:
                return ("bad input there: " if w == "bad" else "") + words[w]
        if not self.status:
            return "the step did not finish (the session ended early)"
        for step, code in self.status.items():
            if code != 0:
                last = self.lines[-1:] or [""]
                return f"{step} failed with exit code {code}" + \
                    (f" ({last[0][-300:]})" if last[0] else "")
        return ""

    @property
    def ok(self) -> bool:
        return not self.problem

    def head(self) -> str:
        return f"{self.machine} ({self.address})"


def share_args(cluster: ClusterSpec, machine: MachineSpec, action: str,
               prefix: str | None = None) -> list[str]:
    """The remote command's words for one machine (each validated; InputError names it)."""
    if action not in ACTIONS:
        raise InputError("ACTION", f"one of {', '.join(ACTIONS)}")
    if action not in NO_RUN and (prefix is None or not PREFIX_RE.fullmatch(prefix)):
        raise InputError("RUN", f"not a LightPipe run prefix: {prefix!r} (lp + 4 hex "
                         "digits)")
    venv = cluster.venv_of(machine)
    try:
        check_venv(venv)
    except ValueError as exc:
        raise InputError(f"machines[{cluster.machines.index(machine)}].venv",
                         str(exc)) from None
    return ["sh", "-c", SHARE_SCRIPT, "sh", venv, action, *([prefix] if prefix else [])]


def parse_share_output(text: str, out: ShareResult) -> None:
    """Fill `out` from the script's and the tool's lines."""
    for raw in text.splitlines():
        line = raw.rstrip()
        if not line.startswith(MARK + " "):
            if line.strip():
                out.lines.append(line)
            continue
        word, _, rest = line[len(MARK) + 1:].partition(" ")
        if word == "step":
            step, _, code = rest.partition(" ")
            if code.strip().lstrip("-").isdigit():
                out.status[step] = int(code)
            continue
        if word in ("ready", "rtt", "fibres", "held", "probe"):
            try:
                doc = json.loads(rest)
            except ValueError:
                doc = None
            if not isinstance(doc, dict):
                out.said.append(("failed", f"unreadable {word} line"))
            elif word == "ready":
                out.ready = doc
            elif word == "fibres":
                out.fibres = doc
            else:  # a ping's rtt rows, status's held shares, or a probe request's reply
                out.rows.append(doc)
            continue
        out.said.append((word, rest))


def run_step(cluster: ClusterSpec, machine: MachineSpec, action: str,
             prefix: str | None = None, stdin: bytes = b"",
             timeout_s: float = 900.0) -> ShareResult:
    """One step on one machine over one ssh session."""
    args = share_args(cluster, machine, action, prefix)
    ssh = Ssh(cluster, machine)
    out = ShareResult(machine.name, machine.address)
    import subprocess

    argv = ssh.argv(args)
    try:
        res = subprocess.run(argv, input=stdin, capture_output=True, timeout=timeout_s,
                             check=False)
        stdout, stderr, code = (res.stdout.decode(errors="replace"),
                                res.stderr.decode(errors="replace"), res.returncode)
    except subprocess.TimeoutExpired:
        stdout, stderr, code = "", f"no answer within {timeout_s:g} s", 255
    if MARK not in stdout:
        out.error = ssh_error(code, stderr)
        return out
    out.reachable = True
    parse_share_output(stdout, out)
    return out


def on_every(cluster: ClusterSpec, machines: Sequence[MachineSpec],
             step: Callable[[MachineSpec], ShareResult]) -> list[ShareResult]:
    """`step` on the machines side by side (results in their order)."""
    if not machines:
        return []
    with ThreadPoolExecutor(max_workers=min(8, len(machines))) as pool:
        return list(pool.map(step, machines))


def status_shares(cluster: ClusterSpec) -> list[ShareResult]:
    """Every machine's held shares (`hold status`: one `held` row per run), side by side."""
    for m in cluster.machines:
        check_ssh_inputs(cluster, m)
        share_args(cluster, m, "status")
    return on_every(cluster, list(cluster.machines),
                    lambda m: run_step(cluster, m, "status", timeout_s=60.0))


def up_shares(cluster: ClusterSpec, prefix: str, docs: dict[str, bytes],
              ready_timeout_s: float) -> tuple[list[ShareResult], list[ShareResult]]:
    """Start every machine's share; on any failure take every machine that was reached
    down again. (start results, down results: empty when all came up)."""
    machines = [m for m in cluster.machines if m.name in docs]
    for m in machines:
        check_ssh_inputs(cluster, m)
        share_args(cluster, m, "start")
    started = on_every(cluster, machines, lambda m: run_step(
        cluster, m, "start", stdin=docs[m.name], timeout_s=ready_timeout_s + 60))
    for r in started:
        if r.ok and r.ready is None:
            r.said.append(("failed", "no readiness line"))
    if all(r.ok for r in started):
        return started, []
    back = [m for m, r in zip(machines, started, strict=True) if r.reachable]
    return started, down_shares(cluster, prefix, back)


def down_shares(cluster: ClusterSpec, prefix: str,
                machines: Sequence[MachineSpec] | None = None) -> list[ShareResult]:
    """Stop the run's share and clean it by its prefix, on each machine side by side."""
    ms = list(cluster.machines if machines is None else machines)
    for m in ms:
        check_ssh_inputs(cluster, m)
        share_args(cluster, m, "down", prefix)
    return on_every(cluster, ms, lambda m: run_step(cluster, m, "down", prefix,
                                                    timeout_s=300.0))


def ping_pairs(cluster: ClusterSpec, prefix: str, probes: Sequence[Any]
               ) -> list[ShareResult]:
    """Each machine pings the pairs whose first DC it holds."""
    from testbed.cluster.sharedoc import probes_doc

    by: dict[str, list[Any]] = {}
    for p in probes:
        by.setdefault(p.src_machine, []).append(p)
    ms = [m for m in cluster.machines if m.name in by]
    return on_every(cluster, ms, lambda m: run_step(
        cluster, m, "ping", prefix, stdin=probes_doc(by[m.name]), timeout_s=600.0))
