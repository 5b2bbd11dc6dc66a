"""A machine's share held on that machine, run over SSH by `lightpipe cluster up/down`.

    python -m testbed.cluster.hold start < SHARE.json    build the share, hold it, return
    python -m testbed.cluster.hold stop RUN              tear the held share down
    python -m testbed.cluster.hold ping RUN < PROBES.json   ping DC pairs from its hosts
    python -m testbed.cluster.hold correct RUN < REQUEST.json   set fibre delay corrections

`start` validates the document (testbed.cluster.sharedoc), starts `serve` in a session
of its own (so it outlives the SSH session) and waits for its readiness line, written
after the share is up (ShareNetwork: the run's state, namespaces and processes recorded
under this machine's state root, so its own `lightpipe clean` removes them even after
kill -9); the document and the readiness record are written atomically into the run's
state directory. The holder re-shapes its fibre emulators on request (`correct`: the
driver's delay calibration, through its control socket, testbed.cluster.holdctl).
Each command's result is one status line `@lightpipe-share WORD ...`.
Exit 0 done, 1 failed, 2 bad input.
"""

from __future__ import annotations

import json
import logging
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from testbed.errors import InputError, RuntimeFailure
from testbed.io.atomic import atomic_write_json
from testbed.io.signals import until_signalled

MARK = "@lightpipe-share"
T = TypeVar("T")
READY_TIMEOUT_S = 600.0
STOP_TIMEOUT_S = 120.0
TAIL_LINES = 20

log = logging.getLogger(__name__)


def status(word: str, rest: str = "") -> None:
    print(f"{MARK} {word}{' ' + rest if rest else ''}", flush=True)


def _read_stdin(limit: int) -> bytes:
    return sys.stdin.buffer.read(limit + 1)


def cmd_start(ready_timeout_s: float = READY_TIMEOUT_S) -> int:
    """Validate, start `serve` detached, wait for its readiness line or its end."""
    from testbed.cluster.sharedoc import DOC_MAX_BYTES, read_share_doc
    from testbed.emu.state import state_root

    raw = _read_stdin(DOC_MAX_BYTES)
    try:
        order = read_share_doc(raw)
    except InputError as exc:
        status("bad", str(exc))
        return 2
    if (state_root() / order.plan.prefix).exists():
        status("failed", f"run {order.plan.prefix} already has state on this machine")
        return 1
    child = subprocess.Popen([sys.executable, "-m", "testbed.cluster.hold", "serve"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, start_new_session=True)
    assert child.stdin is not None and child.stdout is not None
    child.stdin.write(raw)
    child.stdin.close()
    tail: list[str] = []
    deadline = time.monotonic() + ready_timeout_s
    fd = child.stdout.fileno()
    buf = b""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            child.send_signal(signal.SIGTERM)  # it tears down what it built
            try:
                child.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                child.kill()
            status("failed", f"share not up within {ready_timeout_s:g} s")
            return 1
        r, _, _ = select.select([fd], [], [], left)
        if not r:
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        buf += chunk
        *lines, buf = buf.split(b"\n")
        for raw_line in lines:
            line = raw_line.decode(errors="replace").rstrip()
            if line.startswith(f"{MARK} ready "):
                print(line, flush=True)
                return 0
            if line.strip():
                tail = [*tail, line][-TAIL_LINES:]
    code = child.wait()
    for line in tail:
        print(line)
    errs = [ln for ln in tail if "error" in ln.lower() or "failure" in ln.lower()] or tail
    status("failed", f"share builder exited with {code}"
           + (f": {errs[-1][-300:]}" if errs else ""))
    return 1


def cmd_serve() -> int:
    """Build the share, write its records, print the readiness line, hold until SIGTERM."""
    from testbed.cluster.holdctl import ControlServer
    from testbed.cluster.lpwatch import ProbeWatch
    from testbed.cluster.sharedoc import DOC_MAX_BYTES, read_share_doc
    from testbed.cluster.sharenet import ShareNetwork
    from testbed.emu.network import sigterm_as_interrupt

    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(name)s: %(message)s")
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    order = read_share_doc(_read_stdin(DOC_MAX_BYTES))
    net = ShareNetwork(order.plan, order.share, link_mode=order.link_mode,
                       datapath=order.datapath)
    with sigterm_as_interrupt():
        try:
            with net:
                state_dir = net.state_dir
                watch = ProbeWatch(net)
                control = ControlServer(
                    state_dir, net.emulators, home_fd=net.home_netns_fd,
                    hooks={"controller": lambda b: attach_switches(net, b["probe_ms"]),
                           "fibre": lambda b: fibre_event(net, b["u"], b["v"], b["up"]),
                           "fidelity": lambda _b: share_fidelity(net),
                           "probe_watch": watch.watch, "probe_send": watch.send,
                           "probe_collect": watch.collect, "probe_run": watch.run}
                ).start()
                atomic_write_json(state_dir / "share.json", order.doc, mode=0o600)
                hosts = {h.node: {"dc": h.dc, "ip": h.ip.split("/")[0],
                                  "pid": int(net.nodes[h.node].pid),
                                  "iface": str(net.nodes[h.node].defaultIntf())}
                         for h in order.share.hosts}
                _tune_hosts(order.plan, hosts)  # as a one-machine run tunes its workers'
                ready = {"machine": order.share.machine, "prefix": order.plan.prefix,
                         "pid": os.getpid(), "state_dir": str(state_dir),
                         "up_s": round(net.timings_s.get("up", 0.0), 3),
                         "link_mode": net.link_mode, "datapath": net.datapath,
                         "hosts": hosts,
                         "tunnels": [e.device for _, e in order.share.tunnel_ends]}
                atomic_write_json(state_dir / "ready.json", ready, mode=0o600)
                logfd = os.open(state_dir / "hold.log",
                                os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
                status("ready", json.dumps(ready, sort_keys=True))
                # From now on nobody reads our pipe: the log goes to the state directory.
                os.dup2(logfd, 1)
                os.dup2(logfd, 2)
                os.close(logfd)
                try:
                    until_signalled()
                finally:
                    control.close()
                    watch.close()
        except KeyboardInterrupt:
            log.info("share %s: stopping", order.plan.prefix)
    return 0


def attach_switches(net: Any, probe_ms: int) -> dict[str, Any]:
    """Point the share's switches at the run's OpenFlow relay socket (served by the worker
    agent, testbed.cluster.ofrelay; fail-mode secure, so they keep forwarding on their
    rules until the controller replaces them); the reply with their port numbers."""
    from testbed.cluster.ofrelay import socket_path
    from testbed.io.trusted import own_socket

    path = socket_path(net.state_dir)
    mine = own_socket(path)
    if mine is None:
        return {"ok": False, "error": "no OpenFlow relay socket (the agent serves it)"}
    if not mine:
        return {"ok": False, "error": f"{path} is not the run's relay socket"}
    target = f"unix:{path}"
    local = sorted(net.local_switches)
    try:
        for sw in local:
            net.ovs.vsctl("set-controller", sw, target)
            net.ovs.vsctl("set", "controller", sw, f"inactivity_probe={probe_ms}")
    except RuntimeFailure as exc:
        return {"ok": False, "error": f"ovs-vsctl set-controller: {str(exc)[:300]}"}
    ports = sorted([a, b, int(p)] for (a, b), p in net.ports.items() if a in net.local_switches)
    return {"ok": True, "target": target, "switches": local, "ports": ports}


def fibre_event(net: Any, u: str, v: str, up: bool) -> dict[str, Any]:
    """A fibre cut (up False) or repair of a fibre emulated here, in the data plane."""
    from testbed.emu.events import set_fibre_link

    try:
        middle = net.plan.fibre(u, v).middle
    except KeyError:
        return {"ok": False, "error": f"no fibre {u[:64]}-{v[:64]} in the plan"}
    if middle not in net.emulators:
        return {"ok": False, "error": f"fibre {u}-{v} is not emulated on this machine"}
    try:
        set_fibre_link(net, u, v, up)
    except RuntimeFailure as exc:
        return {"ok": False, "error": str(exc)[:300]}
    return {"ok": True}


def share_fidelity(net: Any) -> dict[str, Any]:
    """The share's part of the run's fidelity measurements (its own fibres, hosts and
    switch); the reply."""
    from testbed.emu.fidelity_probe import network_measurements

    try:
        got = network_measurements(net, [h.node for h in net.share.hosts])
    except Exception as exc:  # a verdict that cannot be made says why
        return {"ok": False, "error": f"fidelity not measured: {str(exc)[:300]}"}
    return {"ok": True, **got}


def _tune_hosts(plan: Any, hosts: dict[str, dict[str, Any]]) -> None:
    """The TCP settings and per-DC window routes a one-machine run gives the hosts of its
    workers (testbed.emu.tcp_tuning), on this share's hosts (workers may run there)."""
    from testbed.emu.tcp_tuning import tune_host_tcp
    from testbed.orchestrate.launch import Host

    by_dc: dict[str, list[Host]] = {}
    for node, h in hosts.items():
        by_dc.setdefault(str(h["dc"]), []).append(
            Host(node, str(h["ip"]), str(h["iface"]), ("mnexec", "-a", str(h["pid"]))))
    tune_host_tcp(plan, by_dc)


def _is_share_owner(pid: int) -> bool:
    try:
        return b"testbed.cluster.hold" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _zombie(pid: int) -> bool:
    """An ended process its new parent has not reaped yet (after kill -9, say)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False


def _wait_gone(pid: int, timeout_s: float) -> bool:
    """Wait for `pid` to end (its pidfd becomes readable); True when it did."""
    try:
        pfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        r, _, _ = select.select([pfd], [], [], timeout_s)
        return bool(r)
    finally:
        os.close(pfd)


def cmd_stop(prefix: str, timeout_s: float = STOP_TIMEOUT_S) -> int:
    """SIGTERM the run's share holder (proved by PID + start time and its command line),
    wait for its teardown; SIGKILL after timeout_s (its own clean removes the rest)."""
    from testbed.emu.state import PREFIX_RE, RunState, run_is_live, signal_if, state_root

    if not PREFIX_RE.fullmatch(prefix):
        status("bad", f"RUN: not a run prefix: {prefix[:20]!r}")
        return 2
    d = state_root() / prefix
    if not d.is_dir():
        status("stopped", f"{prefix}: not on this machine")
        return 0
    try:
        st = RunState.load(d)
    except (OSError, ValueError, TypeError) as exc:
        status("failed", f"run {prefix}: unreadable state ({exc})")
        return 1
    if not run_is_live(st) or _zombie(st.owner_pid):
        status("stopped", f"{prefix}: its holder had already ended")
        return 0
    if not _is_share_owner(st.owner_pid):
        status("failed", f"run {prefix} is not a cluster share (pid {st.owner_pid}); "
               "left alone")
        return 1
    t0 = time.monotonic()

    def ours(_pid: int) -> bool:
        return run_is_live(st)

    signal_if(st.owner_pid, signal.SIGTERM, ours)
    if not _wait_gone(st.owner_pid, timeout_s):
        signal_if(st.owner_pid, signal.SIGKILL, ours)
        _wait_gone(st.owner_pid, 10.0)
        status("stopped", f"{prefix}: killed, no teardown within {timeout_s:g} s")
        return 0
    status("stopped", f"{prefix} in {time.monotonic() - t0:.2f} s")
    return 0


def _run_input(prefix: str, limit: int, parse: Callable[[bytes], T]) -> tuple[Path, T] | int:
    """A step on a held run: its state directory and the parsed input on stdin, or the
    exit code once a status line said why not (2 bad input, 1 no such run here)."""
    from testbed.emu.state import PREFIX_RE, state_root

    if not PREFIX_RE.fullmatch(prefix):
        status("bad", f"RUN: not a run prefix: {prefix[:20]!r}")
        return 2
    try:
        parsed = parse(_read_stdin(limit))
    except InputError as exc:
        status("bad", str(exc))
        return 2
    d = state_root() / prefix
    if not d.is_dir():
        status("failed", f"run {prefix} is not up on this machine")
        return 1
    return d, parsed


def cmd_ping(prefix: str) -> int:
    """Ping each probe's pair from its source host (in this machine's held share)."""
    from testbed.cluster.sharedoc import PROBES_MAX_BYTES, read_probes
    from testbed.emu.calibrate import PathProbe, ping_path
    from testbed.emu.delaycal import RTT_TOL_MS, path_row, rtt_ok
    from testbed.emu.state import RunState, alive

    got_input = _run_input(prefix, PROBES_MAX_BYTES, read_probes)
    if isinstance(got_input, int):
        return got_input
    d, probes = got_input
    st = RunState.load(d)
    shells = {p.name: p for p in st.procs if p.role == "host-shell" and alive(p)}
    bad = 0
    for pr in probes:
        rec = shells.get(pr.src_node)
        if rec is None:
            status("failed", f"host {pr.src_node[:64]} of run {prefix} is not here")
            return 1
        probe = PathProbe(pr.pair, f"/proc/{rec.pid}/ns/net", pr.dst_ip, pr.fibres,
                          pr.configured_ms, pr.vlan)
        got = ping_path(probe, pr.pings, pr.interval_s, pr.dense_pings, pr.dense_interval_s)
        row: dict[str, object] = {"pair": pr.pair, "src_machine": pr.src_machine,
                                  "dst_machine": pr.dst_machine, "pings_sent": pr.pings}
        if got.rtts_ms:
            row |= path_row(got)
            row["within_band"] = rtt_ok(got.median_ms, pr.configured_ms, RTT_TOL_MS)
            # Each echo, for the driver's delay calibration (testbed.cluster.calib).
            row["rtts_ms"] = [round(r, 4) for r in got.rtts_ms]
            row["dense_rtts_ms"] = [round(r, 4) for r in got.dense_rtts_ms]
        else:
            row |= {"expected_rtt_ms": round(2 * pr.configured_ms, 4), "pings": 0,
                    "median_ms": None, "within_band": False}
            bad += 1
        status("rtt", json.dumps(row, sort_keys=True))
    return 1 if bad else 0


def cmd_correct(prefix: str) -> int:
    """Relay a validated control request to the run's holder; print its fibres' state (a
    correction), or its whole reply on a `probe` line (the lightpath probes' requests)."""
    from testbed.cluster.holdctl import (
        PROBE_REQUESTS,
        REQUEST_MAX_BYTES,
        parse_request,
        request,
    )

    got_input = _run_input(prefix, REQUEST_MAX_BYTES, parse_request)
    if isinstance(got_input, int):
        return got_input
    d, req = got_input
    reply = request(d, req)
    if not reply.get("ok"):
        status("failed", str(reply.get("error", "refused"))[:300])
        return 1
    if set(req) & set(PROBE_REQUESTS):
        status("probe", json.dumps(reply, sort_keys=True))
    else:
        status("fibres", json.dumps(reply.get("fibres", {}), sort_keys=True))
    return 0


def held_shares() -> list[dict[str, Any]]:
    """What this machine holds: per run directory of the state root with a share in it
    (ready.json, written by its holder), the run, whether its holder is still the process
    that made it (PID and start time), its phase and what the holder reported ready.
    Every file is the run's own: regular, root's (this user's), bounded."""
    from testbed.emu.state import RunState, alive, list_runs, run_is_live
    from testbed.io.trusted import read_regular

    out = []
    for d in list_runs():
        try:
            ready = json.loads(read_regular(d / "ready.json", 1 << 20,
                                            owner_uid=os.geteuid()))
            st = RunState.load(d)
        except FileNotFoundError:
            continue  # a one-machine run, or a share not ready yet
        except (OSError, ValueError, TypeError) as exc:
            out.append({"prefix": d.name, "error": f"unreadable ({exc})"[:200]})
            continue
        if not isinstance(ready, dict):
            continue
        hosts = ready.get("hosts") if isinstance(ready.get("hosts"), dict) else {}
        out.append({"prefix": d.name, "machine": str(ready.get("machine", ""))[:64],
                    "holder_pid": st.owner_pid, "holder_alive": run_is_live(st),
                    "phase": st.phase,
                    "processes_alive": sum(1 for p in st.procs if alive(p)),
                    "processes": len(st.procs),
                    "hosts": sorted(str(h)[:64] for h in hosts)[:256],
                    "tunnels": [str(t)[:16] for t in ready.get("tunnels", [])][:256],
                    "link_mode": str(ready.get("link_mode", ""))[:16],
                    "datapath": str(ready.get("datapath", ""))[:16],
                    "up_s": ready.get("up_s") if isinstance(ready.get("up_s"), int | float)
                    else None})
    return out


def cmd_status() -> int:
    """One `held` line per share this machine holds (a state root that cannot be trusted:
    one `failed` line)."""
    try:
        rows = held_shares()
    except InputError as exc:
        status("failed", str(exc)[:300])
        return 1
    for row in rows:
        status("held", json.dumps(row, sort_keys=True))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args == ["start"]:
        return cmd_start()
    if args == ["serve"]:
        return cmd_serve()
    if args == ["status"]:
        return cmd_status()
    if len(args) == 2 and args[0] == "stop":
        return cmd_stop(args[1])
    if len(args) == 2 and args[0] == "ping":
        return cmd_ping(args[1])
    if len(args) == 2 and args[0] == "correct":
        return cmd_correct(args[1])
    status("bad", "usage: start | status | stop RUN | ping RUN | correct RUN")
    return 2


if __name__ == "__main__":
    sys.exit(main())
