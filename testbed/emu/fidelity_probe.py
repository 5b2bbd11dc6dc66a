"""Measure a live emulated run's fidelity invariants (before teardown) and judge them.

What testbed.emu.fidelity judges, read from the run's own parts: the verification's RTT
rows per lightpath, every forwarder's counters and timer slack (its control channel),
each host namespace's TCP counters (`nstat` run inside it), the CPU its processes got
(testbed.emu.procstat, by the PIDs the run recorded) and the machine's steal time.
"""

from __future__ import annotations

import json
import logging
import math
import re
import subprocess
from collections.abc import Mapping
from typing import Any

from testbed.emu.fidelity import fault_accounting, verdict, with_fidelity
from testbed.emu.procstat import ProcSampler
from testbed.errors import InputError
from testbed.io.records import read_json_lines

log = logging.getLogger(__name__)

# Out and retransmitted segments, and what tells a retransmission's cause: RTOs (and the
# spurious ones), tail loss probes, fast retransmits, D-SACKs received (the peer already
# had the segment: spurious), retransmissions lost again, segments queued out of order at
# the receiver (a gap), reordering detected, and the receiver's own drops (its receive
# queue full, out-of-order queue pruned, backlog full while its socket was busy, zero
# window): testbed.emu.fidelity.retransmit_causes names them.
TCP_FIDELITY_COUNTERS = ("TcpOutSegs", "TcpRetransSegs", "TcpExtTCPTimeouts",
                         "TcpExtTCPSpuriousRTOs", "TcpExtTCPLossProbes",
                         "TcpExtTCPFastRetrans", "TcpExtTCPDSACKRecv", "TcpExtTCPOFOQueue",
                         "TcpExtTCPLostRetransmit", "TcpExtTCPSACKReorder",
                         "TcpExtTCPRcvQDrop", "TcpExtTCPOFODrop", "TcpExtTCPBacklogDrop",
                         "TcpExtTCPZeroWindowDrop", "TcpExtPruneCalled")
GSO_MAX_BYTES = 65536  # Linux's default gso_max_size: the largest frame a host hands on
# The run state's process roles the sampler reads, as the verdict names them.
STATE_ROLES = {"forwarder": "forwarder", "ovs-vswitchd": "switch"}


def watch_run_processes(sampler: ProcSampler, state: Any) -> int:
    """Watch the run's forwarders and software switch, by the PIDs and start times its
    state (testbed.emu.state.RunState) recorded; how many."""
    n = 0
    for rec in list(getattr(state, "procs", ()) or ()):
        role = STATE_ROLES.get(rec.role)
        if role is not None:
            sampler.watch(rec.pid, role, rec.name or rec.role, rec.start_ticks)
            n += 1
    return n


def watch_workers(sampler: ProcSampler, launcher: Any) -> int:
    """Watch every worker a launcher (testbed.orchestrate.launch.Launcher) started: its
    own child processes (mnexec execs the worker in place)."""
    n = 0
    for run in getattr(launcher, "jobs", {}).values():
        for w in run.workers:
            if w.proc.poll() is None and w.host.machine is None:  # not another machine's
                sampler.watch(w.proc.pid, "worker", f"{w.job}/stage{w.stage}",
                              records=str(w.record_path),
                              compute=getattr(run.plan, "compute", "cpu"))
                n += 1
    return n


def worker_window(record_path: str) -> tuple[float | None, float | None]:
    """(ready, end) of a worker, time.monotonic() s, from its records (the `start` record's
    ready_s: imports and rendezvous done; the `done` record's end_s); None where absent."""
    t0, t1, _ = _window_and_usage(record_path)
    return t0, t1


def worker_own_usage(record_path: str) -> dict[str, Any] | None:
    """What a worker used from ready to done as it read itself (the `done` record's usage:
    testbed.emu.procstat.own_usage_since), with its window; None where it has none."""
    return own_usage_of(*_window_and_usage(record_path))


def own_usage_of(t0: float | None, t1: float | None, used: Any) -> dict[str, Any] | None:
    """worker_own_usage() of records already read (_window_and_usage)."""
    if t0 is None or t1 is None or not isinstance(used, dict):
        return None
    keys = ("wall_s", "cpu_s", "run_s", "wait_s", "cpu_share", "load")
    if not all(k in used and (used[k] is None or isinstance(used[k], (int, float)))
               for k in keys):
        return None
    extra = {k: used[k] for k in ("slices", "wait_per_slice_ms")
             if isinstance(used.get(k), (int, float)) and not isinstance(used[k], bool)}
    return {**{k: used[k] for k in keys}, **extra,
            "window_s": [round(t0, 3), round(t1, 3)], "read_by": "worker"}


def _window_and_usage(record_path: str) -> tuple[float | None, float | None, Any]:
    return _window_and_usage_of(_read_lines(record_path))


def _window_and_usage_of(records: list[dict[str, Any]]) -> tuple[float | None, float | None,
                                                                  Any]:
    """(ready, end, the done record's usage) of records already read."""
    t0 = t1 = used = None
    try:
        for r in records:
            if r.get("type") == "start":
                t0 = float(r["ready_s"])
            elif r.get("type") == "done":
                t1 = float(r["end_s"])
                used = r.get("usage")
    except (KeyError, TypeError, ValueError):
        pass
    return t0, t1, used


def host_tcp_counters(net: Any, hosts: Any = None) -> dict[str, dict[str, int]]:
    """Per emulated host (`hosts`' names; default: the plan's): TCP counters since its
    namespace was made (`nstat -asz` inside it: absolute, history untouched)."""
    out: dict[str, dict[str, int]] = {}
    for name in (hosts if hosts is not None else [h.name for h in net.plan.hosts]):
        try:
            res = net.host_cmd(name, ["nstat", "-asz", "--json", *TCP_FIDELITY_COUNTERS],
                               timeout_s=10, check=True)
            kernel = json.loads(res.stdout).get("kernel", {})
        except Exception as exc:  # a host whose counters cannot be read: left out
            log.debug("no TCP counters from %s: %s", name, exc)
            continue
        out[name] = {k: int(kernel.get(k, 0)) for k in TCP_FIDELITY_COUNTERS}
    return out


def forwarder_stats(net: Any) -> list[dict[str, Any]]:
    """stats() of every link emulator that keeps user-space counters (the forwarders)."""
    out = []
    for emu in getattr(net, "emulators", {}).values():
        if not getattr(emu, "counters", False):
            continue
        try:
            st = emu.stats()
        except Exception as exc:  # a forwarder that died: its counters are gone
            log.warning("fidelity: no counters from the forwarder of %s: %s",
                        getattr(emu.fibre, "middle", "?"), exc)
            continue
        if isinstance(st, dict) and "directions" in st:
            fibre = getattr(emu, "fibre", None)
            if fibre is not None and hasattr(fibre, "u"):  # (a fault's fibre: its losses)
                st["fibre"] = f"{fibre.u}-{fibre.v}"
            out.append(st)
    return out


def fabric_drops(net: Any) -> dict[str, int]:
    """Frames the shaped DC fabric links' queues dropped (testbed.emu.fabric: host NICs
    and switch ports, `tc -s` on each) and the most TCP segments one of them can hold
    (a GSO frame of a host NIC's gso_max_size)."""
    from testbed.emu.fabric import MIN_GSO_BYTES, nic_gso_bytes
    from testbed.emu.tcp_tuning import MSS_BYTES

    frames, biggest = 0, MIN_GSO_BYTES
    for node, intf, rate_mbps, nic, _ in getattr(net, "shaped", ()):
        try:
            out = node.cmd(f"tc -s qdisc show dev {intf}")
        except Exception as exc:  # a node already gone: its counters with it
            log.debug("no qdisc counters from %s: %s", intf, exc)
            continue
        m = re.search(r"\(dropped (\d+),", out)  # the root qdisc's: its FIFO's included
        frames += int(m.group(1)) if m else 0
        if nic:
            biggest = max(biggest, nic_gso_bytes(rate_mbps))
    return {"frames": frames, "segments_per_frame": math.ceil(biggest / MSS_BYTES)}


# ss -0 -m -p: a packet socket's owner and its skmem counters (d: the socket's drops)
_SS_PACKET = re.compile(r'users:\(\("[^"]*",pid=(\d+),fd=\d+\)\)\s+skmem:\([^)]*\bd(\d+)\)')


def parse_packet_socket_drops(text: str, pid: int) -> tuple[int, int]:
    """(sockets, frames dropped) of the packet sockets process `pid` holds, from
    `ss -0 -m -n -p` output."""
    got = [int(d) for p, d in _SS_PACKET.findall(text) if int(p) == pid]
    return len(got), sum(got)


def switch_socket_drops(net: Any) -> dict[str, int]:
    """Frames the user-space switch lost at its receive sockets (userspace datapath: one
    AF_PACKET socket per port, read by ovs-vswitchd's main thread; a burst beyond the
    socket's buffer, rmem_default, is dropped by the kernel and counted nowhere else:
    not in the interfaces' counters, not in OVS's), and the most TCP segments one of
    them can hold (a 64 kB GSO frame). Empty where there is no such switch."""
    from testbed.emu.tcp_tuning import MSS_BYTES

    ovs = getattr(net, "ovs", None)
    pid = (getattr(ovs, "pids", None) or {}).get("ovs-vswitchd")
    if pid is None or getattr(net, "datapath", "user") != "user":
        return {}
    try:
        res = subprocess.run(["ip", "netns", "exec", net.plan.prefix, "ss", "-0", "-m", "-n",
                              "-p"], capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError) as exc:
        log.debug("no packet socket counters from the switch: %s", exc)
        return {}
    sockets, frames = parse_packet_socket_drops(res.stdout, int(pid))
    if not sockets:
        return {}
    return {"frames": frames, "sockets": sockets,
            "segments_per_frame": math.ceil(GSO_MAX_BYTES / MSS_BYTES)}


def worker_records(sampler: ProcSampler,
                   lines: Mapping[str, list[dict[str, Any]]] | None = None
                   ) -> list[dict[str, Any]]:
    """The sampler's records (stopped first), a worker's over its iterations (from its
    records' ready to done, not its start-up's imports), exact where the worker read
    itself, each worker with its compute (cpu: tensor work; device: a stand-in's timer).
    `lines`: the workers' record files already read, by path (else read here)."""
    sampler.stop()
    records = {p["pid"]: str(p["meta"]["records"]) for p in sampler.watched()
               if p["role"] == "worker" and p["meta"].get("records")}
    read = {pid: _window_and_usage_of(lines[r]) if lines is not None and r in lines
            else _window_and_usage(r) for pid, r in records.items()}  # each file once
    procs = sampler.records({pid: (t0, t1) for pid, (t0, t1, _) in read.items()})
    compute = {p["pid"]: p["meta"].get("compute") for p in sampler.watched()
               if p["role"] == "worker" and p["meta"].get("compute")}
    for p in procs:  # exact where the worker read itself (a window under one reading)
        own = own_usage_of(*read[p["pid"]]) if p["pid"] in read else None
        if own is not None:
            p.update(own)
        if p["pid"] in compute:
            p["compute"] = compute[p["pid"]]
    return procs


def name_forwarders(procs: list[dict[str, Any]], plan: Any) -> list[dict[str, Any]]:
    """A forwarder named by its fibre (the link exporter's label), not its middle node."""
    fibre_of = {f.middle: f"{f.u}-{f.v}" for f in plan.fibres}
    for p in procs:
        if p["role"] == "forwarder" and p["name"] in fibre_of:
            p["name"] = fibre_of[p["name"]]
    return procs


def network_measurements(net: Any, hosts: Any = None) -> dict[str, Any]:
    """What the verdict reads from a live network besides RTTs and CPU: its forwarders'
    counters, its hosts' TCP counters (`hosts`: default every host of the plan), the
    shaped fabric's and the user-space switch's drops, the switch sockets' sizing."""
    return {"forwarders": forwarder_stats(net), "tcp": host_tcp_counters(net, hosts),
            "fabric": fabric_drops(net), "switch": switch_socket_drops(net),
            "send_socket": getattr(net, "switch_sndbuf", None),
            "receive_sockets": getattr(net, "switch_rcvbuf", None)}


def measure(net: Any, check: Mapping[str, Any], work: Mapping[str, Any],
            sampler: ProcSampler | None = None, host: Mapping[str, Any] | None = None
            ) -> dict[str, Any]:
    """The run's fidelity verdict (testbed.emu.fidelity.verdict) from the live network:
    `check` is the verification record (its final `rtts`), `work` the workload's summary
    (worker_jobs, host_load), `sampler` the run's ProcSampler (stopped here)."""
    lines = {p: _read_lines(p) for p in _record_paths(sampler)} if sampler is not None else {}
    procs = name_forwarders(worker_records(sampler, lines), net.plan) \
        if sampler is not None else []
    m = network_measurements(net)
    return verdict(net.plan.scale, check.get("rtts", []), procs, m["forwarders"], m["tcp"],
                   list(work.get("worker_jobs", [])),
                   host if host is not None else work.get("host_load"), m["fabric"],
                   m["switch"], m["send_socket"], m["receive_sockets"],
                   fault_accounting(work, list(lines.values())))


def _record_paths(sampler: ProcSampler) -> list[str]:
    """The record files of the workers the sampler watched."""
    return sorted({str(p["meta"]["records"]) for p in sampler.watched()
                   if p["role"] == "worker" and p["meta"].get("records")})


def _read_lines(path: str) -> list[dict[str, Any]]:
    """A worker's records (testbed.io.records.read_json_lines); [] where the file is
    refused, with a warning."""
    try:
        return read_json_lines(path, "worker records")
    except InputError as exc:
        log.warning("fidelity: %s", exc)
        return []


def judge_run(net: Any, check: Mapping[str, Any], summary: dict[str, Any], mon: Any
              ) -> dict[str, Any]:
    """The run path's step (testbed.orchestrate.run, before teardown): measure and judge,
    export the verdict through the run's monitor, fold it into the agreement verdict
    (an unfaithful run's agreement is UNRELIABLE); the verdict, also put in `summary`
    under `fidelity`. A verdict that cannot be made says why and is not faithful."""
    try:
        v = measure(net, check, summary, getattr(mon, "procs", None),
                    _host_load(getattr(mon, "host_load", None)) or summary.get("host_load"))
    except Exception as exc:  # the run's records must still be written
        log.warning("fidelity not measured: %s", exc, exc_info=True)
        v = {"faithful": False, "reasons": [f"fidelity not measured: {exc}"[:300]],
             "invariants": []}
    summary["fidelity"] = v
    if isinstance(summary.get("agreement_verdict"), dict):
        summary["agreement_verdict"] = with_fidelity(summary["agreement_verdict"], v)
    if mon is not None:
        mon.record_fidelity(v)
    return v


def _host_load(load: Any) -> dict[str, Any] | None:
    return None if load is None else dict(load.summary())
