"""The worker agent: a cluster run's pipeline workers in this machine's hosts, for the driver.

`python -m testbed.cluster.agent RUN` runs on each machine of `lightpipe emu --cluster`
(root, started over SSH by the driver's fixed script: testbed.cluster.drive, action
`agent`) and speaks JSON lines, one message per line, on its stdin and stdout:

in (driver -> agent)                      out (agent -> driver)
  start  job, stage, host, plan, master,    hello  machine, prefix, hosts, pid
         timeout_s, duty, linger_s, nice,   started job, stage, pid, metrics_port, spawn_s
         metrics_address, go_on, fault      record job, stage, rec (a worker's record line)
         (fault: collective_timeout_s,
         on_fault, max_restarts, restart_s,
         wall s; absent: the defaults)
  rendezvous job, data (stage 0's port)     rendezvous job, data (a local stage 0's port)
  signal job, stage, signal (TERM|KILL)     exit   job, stage, code, log_tail
  clock  t                                  clock  t, here (this machine's monotonic s)
  links  address (serve this machine's      links  ok, target (IP:PORT), fibres, why
         link metrics there: the holder's
         control socket, testbed.cluster.holdctl)
  openflow probe_ms (relay this machine's   openflow ok, switches, ports, why
         switches to the driver's controller:
         testbed.cluster.ofrelay)
  of_open / of_data / of_close  ch, b64: one switch connection's bytes, both ways
  fibre  u, v, up (a fibre event in the     fibre  ok, why
         data plane, by the share holder)
  fidelity_start (read the CPU of this     fidelity ok, processes, host, network, why
         machine's forwarders, switch and
         workers from now on)
  fidelity (what was read, and the share
         holder's counters: the run's
         fidelity verdict's inputs here)
  own    (take the run down if the          error  why (a refused message), job, stage
         session ends without `bye`)
  bye    (stop the workers and end)

Workers run as on one machine (testbed.orchestrate.launch): `mnexec -a PID` into the
share's host (the PID from the run's own state, proved by its start time), a /metrics
listener bound here on `metrics_address` (this machine's address that the driver's
Prometheus scrapes) and passed down, records under the run's state directory. Every
message is validated (names, numbers, addresses, the plan) before anything runs; a bad
one is answered with `error` and changes nothing. When the session ends (the driver
ended, even by kill -9: sshd closes our stdin) the workers are stopped by their PIDs;
after `own`, the run's share holder too, then this machine's `lightpipe clean RUN`.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import math
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from testbed import names
from testbed.cluster.ofrelay import OPS as OF_OPS
from testbed.errors import InputError
from workloads.faultargs import ON_FAULT, fault_argv

log = logging.getLogger(__name__)

MSG_MAX_BYTES = 4 << 20      # one message (a job plan rides in `start`)
RECORD_LINE_MAX = 1 << 20    # one worker record line
LOG_TAIL_BYTES = 2000
STOP_GRACE_S = 3.0
REPO_ROOT = Path(__file__).resolve().parents[2]
SIGNALS = {"TERM": signal.SIGTERM, "KILL": signal.SIGKILL}


@dataclass(frozen=True)
class LocalHost:
    """A host of this machine's share: its shell PID (proved live), address, interface."""

    node: str
    pid: int
    ip: str
    iface: str


@dataclass(frozen=True)
class StartOrder:
    """A validated `start` message."""

    job: str
    stage: int
    host: LocalHost
    plan: dict[str, Any]
    master: str
    timeout_s: float
    duty: float
    linger_s: float
    nice: int
    metrics_address: str
    go_on: bool = False  # iterate on until the driver says the events are done
    fault: FaultOrder | None = None  # the workers' fault options (None: their defaults)


@dataclass(frozen=True)
class FaultOrder:
    """A `start` message's `fault`: the worker's fault-tolerance options in wall seconds,
    as the driver's launcher gives its own stages (testbed.orchestrate.launch.FaultPolicy:
    the scenario's policy.workers x time_factor)."""

    collective_timeout_s: float | None
    on_fault: str
    max_restarts: int
    restart_s: float

    def argv(self) -> list[str]:
        """workloads.worker's options for it."""
        return fault_argv(self.collective_timeout_s, self.on_fault, self.max_restarts,
                          self.restart_s)


FAULT_KEYS = ("collective_timeout_s", "on_fault", "max_restarts", "restart_s")
MAX_WALL_TIMEOUT_S = 604_800.0 * 1e6
"""A fault option's largest wall time: the spec's largest time-out x the largest
time_factor (testbed.spec.models.MAX_TIMEOUT_S, testbed.emu.scale.MAX_TIME_FACTOR)."""


EVENTS_DONE_NAME = "events-done"
"""The file in a job's directory here whose appearance ends a `go_on` stage's extra
iterations (the agent makes it on `events_done`)."""


@dataclass
class AgentWorker:
    order: StartOrder
    proc: subprocess.Popen[bytes]
    record_path: Path
    log_path: Path
    lsock: socket.socket
    offset: int = 0
    partial: bytes = b""
    exited: bool = False


def _number(msg: Mapping[str, Any], key: str, lo: float, hi: float,
            field: str | None = None) -> float:
    v = msg.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
            or not lo <= v <= hi:
        raise InputError(field or key, f"a number in {lo:g}..{hi:g}, got {str(v)[:40]!r}")
    return float(v)


def _ip(text: Any, what: str) -> str:
    try:
        return str(ipaddress.ip_address(str(text)))
    except ValueError:
        raise InputError(what, f"not an IP address: {str(text)[:60]!r}") from None


def _job(msg: Mapping[str, Any]) -> str:
    job = msg.get("job")
    if not isinstance(job, str):
        raise InputError("job", "a job name")
    try:
        return names.check(names.NODE_NAME_RE, job, "job")
    except ValueError as exc:
        raise InputError("job", str(exc)) from None


def _job_stage(msg: Mapping[str, Any]) -> tuple[str, int]:
    job = _job(msg)
    stage = msg.get("stage")
    if isinstance(stage, bool) or not isinstance(stage, int) or not 0 <= stage < 4096:
        raise InputError("stage", f"a stage number 0..4095, got {str(stage)[:20]!r}")
    return job, stage


def parse_start(msg: Mapping[str, Any], hosts: Mapping[str, LocalHost]) -> StartOrder:
    """A `start` message checked field by field (InputError naming the field)."""
    from workloads.plan import JobPlan

    job, stage = _job_stage(msg)
    node = msg.get("host")
    if not isinstance(node, str) or node not in hosts:
        raise InputError("host", f"{str(node)[:40]!r} is not a host of this machine's share "
                         f"(here: {', '.join(sorted(hosts)) or 'none'})")
    plan = msg.get("plan")
    if not isinstance(plan, dict):
        raise InputError("plan", "a job plan object")
    try:
        jp = JobPlan.from_dict(plan)
    except (TypeError, ValueError, KeyError) as exc:
        raise InputError("plan", f"not a job plan: {str(exc)[:120]}") from None
    if jp.job != job:
        raise InputError("plan", f"the plan is job {jp.job!r}, not {job!r}")
    if stage >= jp.stages:
        raise InputError("stage", f"job {job} has stages 0..{jp.stages - 1}")
    master = msg.get("master")
    if not isinstance(master, str) or ":" not in master:
        raise InputError("master", "ADDRESS:0 (stage 0's host; the port comes from it)")
    m_host, _, m_port = master.rpartition(":")
    if m_port != "0":
        raise InputError("master", "the port must be 0: stage 0 binds one from the kernel")
    master = f"{_ip(m_host, 'master')}:0"
    return StartOrder(job, stage, hosts[node], plan, master,
                      _number(msg, "timeout_s", 1, 86400), _number(msg, "duty", 0.01, 1.0),
                      _number(msg, "linger_s", 0, 3600), int(_number(msg, "nice", 0, 19)),
                      _ip(msg.get("metrics_address"), "metrics_address"),
                      _flag(msg, "go_on"), parse_fault(msg.get("fault")))


def parse_fault(raw: Any) -> FaultOrder | None:
    """A `start` message's `fault` object checked key by key (InputError naming
    `fault.KEY`); absent or null: None (the worker's defaults, as before the agents
    passed them)."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise InputError("fault", "an object with " + ", ".join(FAULT_KEYS))
    extra = sorted(set(raw) - set(FAULT_KEYS))
    if extra:
        raise InputError("fault", f"unknown key {str(extra[0])[:40]!r} (known: "
                         f"{', '.join(FAULT_KEYS)})")
    timeout = raw.get("collective_timeout_s")
    if timeout is not None:
        timeout = _number(raw, "collective_timeout_s", 1e-6, MAX_WALL_TIMEOUT_S,
                          "fault.collective_timeout_s")
    on_fault = raw.get("on_fault", "fail")
    if on_fault not in ON_FAULT:
        raise InputError("fault.on_fault", f"one of {', '.join(ON_FAULT)}, got "
                         f"{str(on_fault)[:20]!r}")
    restarts = raw.get("max_restarts", 3)
    if isinstance(restarts, bool) or not isinstance(restarts, int) or not 0 <= restarts <= 1000:
        raise InputError("fault.max_restarts", f"an integer 0..1000, got "
                         f"{str(restarts)[:20]!r}")
    restart_s = _number({"restart_s": raw.get("restart_s", 0.0)}, "restart_s", 0,
                        MAX_WALL_TIMEOUT_S, "fault.restart_s")
    return FaultOrder(timeout, str(on_fault), restarts, restart_s)


def _flag(msg: Mapping[str, Any], key: str) -> bool:
    v = msg.get(key, False)
    if not isinstance(v, bool):
        raise InputError(key, f"true or false, got {str(v)[:20]!r}")
    return v


def parse_rendezvous(msg: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    job = _job(msg)
    data = msg.get("data")
    if not isinstance(data, dict):
        raise InputError("data", "an object with host and port")
    port = data.get("port")
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise InputError("data.port", f"a port 1..65535, got {str(port)[:20]!r}")
    return job, {"host": _ip(data.get("host"), "data.host"), "port": port}


def local_hosts(state_dir: Path) -> tuple[str, dict[str, LocalHost]]:
    """This machine's name and its share's hosts: shells recorded in the run's state and
    still the same processes (start time), with the address and interface the holder wrote
    in ready.json (both files the run's own: regular, ours, bounded)."""
    from testbed.emu.state import RunState, alive
    from testbed.io.trusted import read_regular

    st = RunState.load(state_dir)
    ready = json.loads(read_regular(state_dir / "ready.json", 1 << 20,
                                    owner_uid=os.geteuid()))
    info = ready.get("hosts", {}) if isinstance(ready, dict) else {}
    out = {}
    for p in st.procs:
        h = info.get(p.name)
        if p.role != "host-shell" or not isinstance(h, dict) or not alive(p):
            continue
        iface = str(h.get("iface", f"{p.name}-eth0"))
        names.check_ifname(iface)
        out[p.name] = LocalHost(p.name, p.pid, _ip(h.get("ip"), "ready.hosts.ip"), iface)
    machine = ready.get("machine", "") if isinstance(ready, dict) else ""
    return str(machine)[:64], out


class Agent:
    """One session's workers (see the module docstring)."""

    def __init__(self, prefix: str, state_dir: Path, hosts: Mapping[str, LocalHost],
                 out: BinaryIO, python: str = sys.executable) -> None:
        self.prefix = prefix
        self.state_dir = state_dir
        self.hosts = dict(hosts)
        self.python = python
        self._out = out
        self._lock = threading.Lock()
        self.workers: dict[tuple[str, int], AgentWorker] = {}
        self.sent_rendezvous: set[str] = set()
        self.own = False
        self.openflow: Any = None  # testbed.cluster.ofrelay.MachineEnd, once asked
        self.sampler: Any = None   # testbed.emu.procstat.ProcSampler, after fidelity_start
        self.host_load: Any = None  # testbed.metrics.hostload.HostLoad, with it
        self.fidelity_problem = ""  # why fidelity_start could not start
        self.inbox: queue.Queue[dict[str, Any] | None] = queue.Queue()

    # -- output ------------------------------------------------------------------------
    def send(self, msg: Mapping[str, Any]) -> bool:
        data = json.dumps(msg, separators=(",", ":")).encode() + b"\n"
        with self._lock:
            try:
                self._out.write(data)
                self._out.flush()
                return True
            except (BrokenPipeError, OSError, ValueError):
                return False

    # -- input -------------------------------------------------------------------------
    def read_loop(self, inp: BinaryIO) -> None:
        """Messages from the driver into the inbox (clock answered at once); None at EOF."""
        try:
            while True:
                line = inp.readline(MSG_MAX_BYTES + 1)
                if not line:
                    break
                if len(line) > MSG_MAX_BYTES:
                    self.send({"op": "error", "why": f"a message over {MSG_MAX_BYTES} bytes"})
                    while line and not line.endswith(b"\n"):
                        line = inp.readline(MSG_MAX_BYTES)
                    continue
                try:
                    msg = json.loads(line)
                except ValueError:
                    self.send({"op": "error", "why": "a line that is not JSON"})
                    continue
                if not isinstance(msg, dict):
                    self.send({"op": "error", "why": "a message that is not an object"})
                elif msg.get("op") in OF_OPS:  # a switch's bytes: at once, in order
                    if self.openflow is not None:
                        self.openflow.handle(msg)
                elif msg.get("op") == "clock":
                    t = msg.get("t")
                    if isinstance(t, (int, float)) and not isinstance(t, bool):
                        self.send({"op": "clock", "t": t, "here": time.monotonic()})
                else:
                    self.inbox.put(msg)
        finally:
            self.inbox.put(None)

    def handle(self, msg: Mapping[str, Any]) -> bool:
        """Act on one message; False when the session is to end (`bye`)."""
        op = msg.get("op")
        try:
            if op == "start":
                self.start(parse_start(msg, self.hosts))
            elif op == "rendezvous":
                self.rendezvous(*parse_rendezvous(msg))
            elif op == "signal":
                job, stage = _job_stage(msg)
                sig = SIGNALS.get(str(msg.get("signal")))
                if sig is None:
                    raise InputError("signal", "TERM or KILL")
                w = self.workers.get((job, stage))
                if w is None:
                    raise InputError("job", f"no worker {job}/{stage} here")
                if w.proc.poll() is None:
                    w.proc.send_signal(sig)
            elif op == "links":
                from testbed.cluster.holdctl import request

                reply = request(self.state_dir, {"links": _ip(msg.get("address"), "address")})
                self.send({"op": "links", "ok": bool(reply.get("ok")),
                           "target": reply.get("target"), "fibres": reply.get("fibres", []),
                           "why": reply.get("error")})
            elif op == "openflow":
                self.send(self.relay_openflow(msg.get("probe_ms")))
            elif op == "fibre":
                from testbed.cluster.holdctl import request

                reply = request(self.state_dir, {"fibre": {k: msg.get(k)
                                                           for k in ("u", "v", "up")}})
                self.send({"op": "fibre", "ok": bool(reply.get("ok")),
                           "why": reply.get("error")})
            elif op == "cap":
                from testbed.cluster.holdctl import parse_cap, request

                try:
                    body = parse_cap({k: msg.get(k) for k in ("fibre", "vlan", "rate_mbps")})
                except InputError as exc:  # answered as a cap, so the asker need not wait
                    reply = {"ok": False, "error": str(exc)}
                else:
                    reply = request(self.state_dir, {"cap": body})
                self.send({"op": "cap", "ok": bool(reply.get("ok")),
                           "fibre": msg.get("fibre"), "vlan": msg.get("vlan"),
                           "caps_mbps": reply.get("caps_mbps"), "why": reply.get("error")})
            elif op == "events_done":
                self.events_done()
            elif op == "fidelity_start":
                self.start_fidelity()
            elif op == "fidelity":
                self.send(self.fidelity())
            elif op == "own":
                self.own = True
            elif op == "bye":
                return False
            else:
                raise InputError("op", f"unknown message {str(op)[:20]!r}")
        except InputError as exc:
            self.send({"op": "error", "why": str(exc), "job": msg.get("job"),
                       "stage": msg.get("stage")})
        except OSError as exc:
            self.send({"op": "error", "why": f"{type(exc).__name__}: {exc}",
                       "job": msg.get("job"), "stage": msg.get("stage")})
        return True

    def relay_openflow(self, probe_ms: Any) -> dict[str, Any]:
        """Serve the relay socket and have the share holder point the switches at it."""
        from testbed.cluster.holdctl import request
        from testbed.cluster.ofrelay import MachineEnd

        if self.openflow is None:
            try:
                self.openflow = MachineEnd(self.state_dir, self.send)
            except OSError as exc:
                return {"op": "openflow", "ok": False,
                        "why": f"cannot serve the OpenFlow relay socket: {exc}"}
        reply = request(self.state_dir, {"controller": {"probe_ms": probe_ms}})
        return {"op": "openflow", "ok": bool(reply.get("ok")),
                "switches": reply.get("switches", []), "ports": reply.get("ports", []),
                "why": reply.get("error")}

    # -- fidelity ----------------------------------------------------------------------
    def start_fidelity(self) -> None:
        """Read the CPU of the share's forwarders and switch (by the PIDs and start times
        the run's state recorded: testbed.emu.procstat), of the workers started from now
        on, and this machine's steal time, until `fidelity`."""
        from testbed.emu.fidelity_probe import watch_run_processes
        from testbed.emu.procstat import ProcSampler
        from testbed.emu.state import RunState
        from testbed.metrics.hostload import HostLoad

        if self.sampler is not None:
            return
        try:
            state = RunState.load(self.state_dir)
        except (OSError, ValueError, TypeError) as exc:  # answered at `fidelity`
            self.fidelity_problem = f"the run's state is unreadable here ({exc})"[:300]
            return
        sampler = ProcSampler().start()
        watch_run_processes(sampler, state)
        self.sampler, self.host_load = sampler, HostLoad()
        self.host_load.start()

    def fidelity(self) -> dict[str, Any]:
        """The `fidelity` answer: what this machine's processes got (a worker's over its
        iterations), its steal time, and the share holder's counters."""
        from testbed.cluster.holdctl import request
        from testbed.emu.fidelity_probe import worker_records

        if self.sampler is None:
            return {"op": "fidelity", "ok": False,
                    "why": self.fidelity_problem or "not started (fidelity_start)"}
        procs = worker_records(self.sampler)
        host = self.host_load.summary()
        reply = request(self.state_dir, {"fidelity": {}})
        network = {k: reply.get(k) for k in ("forwarders", "tcp", "fabric", "switch",
                                             "send_socket", "receive_sockets")}
        return {"op": "fidelity", "ok": bool(reply.get("ok")), "processes": procs,
                "host": host, "network": network if reply.get("ok") else {},
                "why": reply.get("error")}

    # -- workers -----------------------------------------------------------------------
    def events_done(self) -> None:
        """The run's events have all run: end the extra iterations of this machine's
        `go_on` stages (the file each was given, in its job's directory)."""
        for job in sorted({j for j, _ in self.workers}):
            path = self.job_dir(job) / EVENTS_DONE_NAME
            try:
                os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600))
            except OSError as exc:  # its workers then stop at their deadline
                log.error("events done: cannot write %s: %s", path, exc)

    def job_dir(self, job: str) -> Path:
        d = self.state_dir / "workers" / job
        d.mkdir(mode=0o700, parents=True, exist_ok=True)
        return d

    def start(self, o: StartOrder) -> None:
        from testbed.io.atomic import atomic_write_text
        from testbed.io.trusted import open_regular

        if (o.job, o.stage) in self.workers:
            raise InputError("stage", f"{o.job}/{o.stage} is already running here")
        jdir = self.job_dir(o.job)
        if not any(j == o.job for j, _ in self.workers):
            # The job's first stage here: a rendezvous file left by an earlier session's
            # job of the same name (the run's state directory outlives a session) is
            # stale, and would be read at once: relayed as stage 0's port (pump) or
            # taken by a stage here as the port to join. Later stages of the job here keep
            # what stage 0 (or the driver's relay, which follows its start) wrote.
            for stale in ("rendezvous.json", "rendezvous.json.tmp"):
                (jdir / stale).unlink(missing_ok=True)
        plan_path = jdir / "plan.json"
        atomic_write_text(plan_path, json.dumps(o.plan), mode=0o600)
        rec, logp = jdir / f"stage{o.stage}.jsonl", jdir / f"stage{o.stage}.log"
        rec.unlink(missing_ok=True)
        family = socket.AF_INET6 if ":" in o.metrics_address else socket.AF_INET
        lsock = socket.socket(family, socket.SOCK_STREAM)
        try:
            lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            lsock.bind((o.metrics_address, 0))
            lsock.listen(16)
        except OSError as exc:
            lsock.close()
            raise InputError("metrics_address", f"cannot listen on {o.metrics_address} "
                             f"here ({exc.strerror or exc})") from None
        env = dict(os.environ)
        env["PYTHONPATH"] = str(REPO_ROOT)
        env["OMP_NUM_THREADS"] = "1"
        argv = ["mnexec", "-a", str(o.host.pid), self.python, "-m", "workloads.worker",
                "--plan", str(plan_path), "--rank", str(o.stage), "--master", o.master,
                "--rendezvous-file", str(jdir / "rendezvous.json"), "--out", str(rec),
                "--metrics-fd", str(lsock.fileno()), "--timeout-s", f"{o.timeout_s:.1f}",
                "--duty", f"{o.duty:.4f}", "--metrics-linger-s", f"{o.linger_s:.1f}",
                "--nice", str(o.nice), "--iface", o.host.iface]
        if o.fault is not None:  # the launcher's own stages' options (FaultPolicy)
            argv += o.fault.argv()
        if o.go_on:
            done = jdir / EVENTS_DONE_NAME
            done.unlink(missing_ok=True)
            argv += ["--go-on-until", str(done)]
        try:
            fd = open_regular(logp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
                              owner_uid=os.geteuid())
            with os.fdopen(fd, "wb") as logf:
                spawn_s = time.monotonic()
                proc = subprocess.Popen(argv, stdout=logf, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, env=env, cwd=REPO_ROOT,
                                        pass_fds=(lsock.fileno(),), start_new_session=True)
        except OSError:
            lsock.close()
            raise
        self.workers[(o.job, o.stage)] = AgentWorker(o, proc, rec, logp, lsock)
        if self.sampler is not None:  # mnexec execs the worker in place: its PID is ours
            self.sampler.watch(proc.pid, "worker", f"{o.job}/stage{o.stage}",
                               records=str(rec),
                               compute="device" if o.plan.get("compute") == "device" else "cpu")
        log.info("job %s stage %d: pid %d on %s", o.job, o.stage, proc.pid, o.host.node)
        self.send({"op": "started", "job": o.job, "stage": o.stage, "pid": proc.pid,
                   "metrics_port": int(lsock.getsockname()[1]), "spawn_s": spawn_s})

    def rendezvous(self, job: str, data: dict[str, Any]) -> None:
        """Stage 0 runs elsewhere: its port, where this machine's stages of the job wait."""
        from testbed.io.atomic import atomic_write_json

        if not any(j == job for j, _ in self.workers):
            raise InputError("job", f"no stage of job {job} runs here")
        atomic_write_json(self.job_dir(job) / "rendezvous.json", data, mode=0o600)

    def pump(self) -> None:
        """Send what the workers wrote since the last call, stage 0's port, and exits."""
        for (job, stage), w in list(self.workers.items()):
            if w.exited:
                continue
            code = w.proc.poll()  # before the last read: every line is in the file by then
            self._tail(w)
            if stage == 0 and job not in self.sent_rendezvous:
                self._send_port(job)
            if code is not None:
                w.exited = True
                w.lsock.close()
                self.send({"op": "exit", "job": job, "stage": stage, "code": code,
                           "log_tail": _tail_text(w.log_path)})

    def _send_port(self, job: str) -> None:
        from testbed.io.trusted import read_regular

        try:
            data = json.loads(read_regular(self.job_dir(job) / "rendezvous.json", 4096))
        except (OSError, ValueError):
            return
        if isinstance(data, dict):
            self.sent_rendezvous.add(job)
            self.send({"op": "rendezvous", "job": job, "data": data})

    def _tail(self, w: AgentWorker) -> None:
        from testbed.io.trusted import open_regular

        try:  # the worker's own file: regular, not followed through a link
            with os.fdopen(open_regular(w.record_path), "rb") as fh:
                fh.seek(w.offset)
                chunk = fh.read(8 << 20)
        except OSError:
            return
        w.offset += len(chunk)
        buf = w.partial + chunk
        *lines, w.partial = buf.split(b"\n")
        if len(w.partial) > RECORD_LINE_MAX:
            w.partial = b""
        for line in lines:
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            self.send({"op": "record", "job": w.order.job, "stage": w.order.stage,
                       "rec": rec})

    def stop_all(self, grace_s: float = STOP_GRACE_S) -> None:
        """Stop every worker still running, by its own Popen (SIGTERM, then SIGKILL)."""
        live = [w for w in self.workers.values() if w.proc.poll() is None]
        for w in live:
            w.proc.send_signal(signal.SIGTERM)
        end = time.monotonic() + grace_s
        for w in live:
            try:
                w.proc.wait(max(0.0, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                w.proc.kill()
                w.proc.wait()

    def serve(self, inp: BinaryIO) -> bool:
        """Until `bye` (True) or the end of the session (False)."""
        threading.Thread(target=self.read_loop, args=(inp,), daemon=True,
                         name="agent-in").start()
        try:
            while True:
                try:
                    msg = self.inbox.get(timeout=0.05)
                except queue.Empty:
                    msg = {}
                if msg is None:
                    return False
                if msg and not self.handle(msg):
                    self.pump()
                    return True
                self.pump()
        finally:
            self.stop_all()
            self.pump()
            if self.openflow is not None:
                self.openflow.close()
            if self.sampler is not None:
                self.sampler.stop()


def _tail_text(path: Path) -> str:
    from testbed.io.trusted import open_regular

    try:
        with os.fdopen(open_regular(path), "rb") as fh:
            fh.seek(max(0, os.fstat(fh.fileno()).st_size - LOG_TAIL_BYTES))
            return fh.read(LOG_TAIL_BYTES).decode(errors="replace")
    except OSError:
        return ""


def take_down(prefix: str) -> None:
    """The driver is gone (no `bye`) and owned the run: stop the share holder, then this
    machine's `lightpipe clean` of the run (--force once the holder is proved gone), as
    `lightpipe cluster down` does."""
    from testbed.cluster.hold import cmd_stop

    rc = cmd_stop(prefix)
    tool = Path(sys.executable).with_name("lightpipe")
    argv = [str(tool), "clean", *(["--force"] if rc == 0 else []), prefix]
    subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, timeout=300, check=False)


def main(argv: list[str] | None = None) -> int:
    from testbed.emu.state import PREFIX_RE, state_root

    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s agent: %(message)s")
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    args = list(sys.argv[1:] if argv is None else argv)
    out = sys.stdout.buffer
    if len(args) != 1 or not PREFIX_RE.fullmatch(args[0]):
        out.write(b'{"op":"fatal","why":"usage: agent RUN (lp + 4 hex digits)"}\n')
        return 2
    prefix = args[0]
    d = state_root() / prefix
    try:
        machine, hosts = local_hosts(d)
    except (OSError, ValueError, InputError) as exc:
        why = f"run {prefix} is not held here ({type(exc).__name__}: {str(exc)[:200]})"
        out.write(json.dumps({"op": "fatal", "why": why}).encode() + b"\n")
        out.flush()
        return 1
    agent = Agent(prefix, d, hosts, out)
    agent.send({"op": "hello", "prefix": prefix, "machine": machine, "pid": os.getpid(),
                "hosts": sorted(hosts), "here": time.monotonic()})
    said_bye = agent.serve(sys.stdin.buffer)
    if not said_bye and agent.own:
        log.warning("run %s: the driver's session ended without bye: taking the run down",
                    prefix)
        os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # nobody reads our pipe any more
        take_down(prefix)
    return 0


if __name__ == "__main__":
    sys.exit(main())
