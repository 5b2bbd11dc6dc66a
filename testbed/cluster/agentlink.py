"""The driver's side of the worker agents: one SSH session per machine, remote workers as
process proxies for the launcher, their records mirrored here on the driver's clock.

`ClusterWorkers` is what `testbed.orchestrate.launch.Launcher` calls for a host that lives
on another machine (`Host.machine`): it asks that machine's agent (testbed.cluster.agent)
to start the stage, and hands back a `RemoteProc` that polls, waits and signals like a
`subprocess.Popen`. Each record line a remote worker writes arrives over the session and
is appended to the local record file the launcher reads, its times shifted by that
machine's clock offset (testbed.cluster.clock), so everything downstream (supervision,
iteration times, the Chrome trace, the summary) reads the same files as on one machine.
Stage 0's rendezvous port is relayed to the job's other machines. A session that ends
early fails its workers (code 255, with a record that says why).
"""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from testbed.cluster.clock import ClockOffset, estimate_offset, shift_record
from testbed.cluster.drive import MARK, share_args
from testbed.cluster.ofrelay import OPS as OF_OPS
from testbed.cluster.ofrelay import Channels, controller_connector
from testbed.cluster.remote import Ssh, check_ssh_inputs, ssh_error
from testbed.cluster.spec import ClusterSpec, MachineSpec
from testbed.errors import RuntimeFailure

log = logging.getLogger(__name__)

LINE_MAX_BYTES = 8 << 20
STDERR_KEEP_BYTES = 8192
LOST_CODE = 255
# requests the agent answers with a message of the same op
ASKED = ("links", "openflow", "fibre", "cap", "fidelity")


def resolve_address(address: str) -> str:
    """An IP address as it is, a host name as the first address it resolves to here
    (RuntimeFailure naming it when it does not resolve)."""
    import ipaddress
    import socket

    try:
        return str(ipaddress.ip_address(address))
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(address, None, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise RuntimeFailure(f"machine address {address!r} does not resolve here "
                             f"({exc.strerror or exc})") from None
    return str(infos[0][4][0])


class RemoteProc:
    """A worker on another machine, as far as the launcher's supervision needs a process:
    pid (on that machine), poll, wait, send_signal, kill, returncode."""

    def __init__(self, session: AgentSession, job: str, stage: int, pid: int) -> None:
        self.session = session
        self.job = job
        self.stage = stage
        self.pid = pid
        self.returncode: int | None = None
        self._done = threading.Event()

    def finish(self, code: int) -> None:
        if self.returncode is None:
            self.returncode = code
        self._done.set()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._done.wait(timeout):
            raise subprocess.TimeoutExpired(f"{self.job}/stage{self.stage}", timeout or 0.0)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is not None:
            return
        name = {signal.SIGTERM: "TERM", signal.SIGKILL: "KILL"}.get(signal.Signals(sig))
        if name is None:
            raise ValueError(f"only SIGTERM and SIGKILL reach a remote worker, not {sig}")
        self.session.send({"op": "signal", "job": self.job, "stage": self.stage,
                           "signal": name})

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


@dataclass
class _Mirror:
    proc: RemoteProc | None
    record_path: Path
    log_path: Path
    started: threading.Event
    reply: dict[str, Any] | None = None


class AgentSession:
    """One machine's worker agent over one ssh session (JSON lines both ways)."""

    def __init__(self, cluster: ClusterSpec, machine: MachineSpec, prefix: str,
                 owner: ClusterWorkers) -> None:
        check_ssh_inputs(cluster, machine)
        self.cluster = cluster
        self.machine = machine
        self.prefix = prefix
        self.owner = owner
        self.argv = Ssh(cluster, machine).argv(share_args(cluster, machine, "agent", prefix))
        self.proc: subprocess.Popen[bytes] | None = None
        self.hello: dict[str, Any] | None = None
        self.offset = ClockOffset(0.0, 0.0, 0.0, 0)
        self._lock = threading.Lock()
        self._hello = threading.Event()
        self._ended = threading.Event()  # the reader is done: no answer will come
        self._clock: dict[float, float] = {}
        self._clock_cv = threading.Condition()
        self._stderr = bytearray()
        self._drainer: threading.Thread | None = None  # reads ssh's stderr (open)
        self._early: list[str] = []  # what the session said instead of hello
        self.closing = False
        self.lost = False
        self._metrics_ip: str | None = None
        # Requests answered by a message of the same op (one at a time per op).
        self._answers: dict[str, dict[str, Any] | None] = {op: None for op in ASKED}
        self._answered = {op: threading.Event() for op in ASKED}
        self._asking = {op: threading.Lock() for op in ASKED}
        self.of: Channels | None = None  # the OpenFlow relay's driver end

    @property
    def name(self) -> str:
        return self.machine.name

    def head(self) -> str:
        return f"machine {self.machine.name} ({self.machine.address})"

    def metrics_address(self) -> str:
        """The IP where this machine's workers serve /metrics for the driver's Prometheus:
        its SSH address (the one the driver reaches), a host name resolved here once."""
        if self._metrics_ip is None:
            self._metrics_ip = resolve_address(self.machine.address)
        return self._metrics_ip

    # -- life --------------------------------------------------------------------------
    def open(self, timeout_s: float = 60.0) -> dict[str, Any]:
        """Start the session and wait for the agent's hello (RuntimeFailure naming the
        machine and why not)."""
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, start_new_session=True)
        assert self.proc.stdout is not None and self.proc.stderr is not None
        threading.Thread(target=self._read, args=(self.proc.stdout,), daemon=True,
                         name=f"agent-{self.name}").start()
        self._drainer = threading.Thread(target=self._drain, args=(self.proc.stderr,),
                                         daemon=True, name=f"agent-{self.name}-err")
        self._drainer.start()
        if not self._hello.wait(timeout_s) or self.hello is None:
            self.close(bye=False)
            raise RuntimeFailure(f"{self.head()}: worker agent: {self.why_not()}")
        return self.hello

    def why_not(self) -> str:
        words = [w for w in self._early if w]
        for w in words:
            if w.startswith(MARK + " "):
                word = w[len(MARK) + 1:].split(" ", 1)[0]
                return {"venv-missing": "no LightPipe venv (bin/lightpipe, bin/python) at "
                        "the venv path", "no-root": "neither root nor password-less sudo"
                        }.get(word, w[len(MARK) + 1:])
            try:
                doc = json.loads(w)
            except ValueError:
                continue
            if isinstance(doc, dict) and doc.get("op") == "fatal":
                return str(doc.get("why", "refused"))[:300]
        code = self.proc.poll() if self.proc is not None else None
        if code is not None:
            return ssh_error(code, self.stderr_text())
        return "no answer (hello) in time"

    def ask(self, msg: Mapping[str, Any], timeout_s: float) -> dict[str, Any]:
        """Send a request whose answer is a message of the same op; that answer, or
        {ok: False, why} when none comes in time."""
        op = str(msg["op"])
        with self._asking[op]:
            self._answered[op].clear()
            self._answers[op] = None
            # after the clear: the reader marks the end before it sets every event, so
            # an end that came before the clear is seen here and one after wakes the wait
            # (checked before the clear, an end in between left the wait to its time-out)
            if self._ended.is_set():
                return {"ok": False, "why": "the session ended"}
            self.send(msg)
            answer = self._answers[op] if self._answered[op].wait(timeout_s) else None
            if answer is None:
                why = "the session ended" if self.lost else f"no answer within {timeout_s:g} s"
                return {"ok": False, "why": why}
            return answer

    def serve_links(self, timeout_s: float = 30.0) -> dict[str, Any]:
        """Ask the machine's share holder (through the agent) to serve its link metrics at
        the machine's metrics address; the reply (ok, target, fibres, why)."""
        return self.ask({"op": "links", "address": self.metrics_address()}, timeout_s)

    def fibre_event(self, u: str, v: str, up: bool, timeout_s: float = 30.0
                    ) -> dict[str, Any]:
        """Cut (up False) or repair fibre u-v, emulated on this machine, in the data plane
        (its share holder sets the emulator's links); the reply (ok, why)."""
        return self.ask({"op": "fibre", "u": u, "v": v, "up": up}, timeout_s)

    def set_cap(self, fibre: str, vlan: int, rate_mbps: float | None,
                timeout_s: float = 30.0) -> dict[str, Any]:
        """Set (or remove: None) lightpath `vlan`'s capacity on fibre `fibre` (its middle
        node), emulated on this machine, through its share holder; the reply (ok,
        caps_mbps: the fibre's caps now, why)."""
        return self.ask({"op": "cap", "fibre": fibre, "vlan": vlan, "rate_mbps": rate_mbps},
                        timeout_s)

    def relay_openflow(self, of_port: int, probe_ms: int, timeout_s: float = 60.0
                       ) -> dict[str, Any]:
        """Carry this machine's switches' OpenFlow connections to the controller listening
        on our loopback port `of_port` (testbed.cluster.ofrelay); the agent's reply (ok,
        switches, ports, why)."""
        if self.of is None:
            self.of = Channels(self.send, controller_connector(of_port),
                               name=f"openflow-{self.name}")
        return self.ask({"op": "openflow", "probe_ms": probe_ms}, timeout_s)

    def measure_clock(self, samples: int = 21, timeout_s: float = 10.0) -> ClockOffset:
        """This machine's monotonic clock minus ours (testbed.cluster.clock)."""
        rows = []
        for _ in range(samples):
            t0 = time.monotonic()
            self.send({"op": "clock", "t": t0})
            with self._clock_cv:
                ok = self._clock_cv.wait_for(
                    lambda t0=t0: t0 in self._clock or self._ended.is_set(), timeout_s)
                here = self._clock.pop(t0, None)
            t1 = time.monotonic()
            if not ok or here is None:
                why = ("the session ended" if self._ended.is_set()
                       else f"no clock answer within {timeout_s:g} s")
                raise RuntimeFailure(f"{self.head()}: {why}")
            rows.append((t0, here, t1))
        self.offset = estimate_offset(rows)
        return self.offset

    def send(self, msg: Mapping[str, Any]) -> None:
        data = json.dumps(msg, separators=(",", ":")).encode() + b"\n"
        with self._lock:
            if self.proc is None or self.proc.stdin is None:
                return
            try:
                self.proc.stdin.write(data)
                self.proc.stdin.flush()
            except (BrokenPipeError, OSError, ValueError):
                pass  # the reader sees the end of the session and fails its workers

    def close(self, bye: bool = True, timeout_s: float = 30.0) -> None:
        """End the session (`bye` first: the agent stops what is left and ends)."""
        self.closing = True
        if self.of is not None:
            self.of.close()
        if self.proc is None:
            return
        if bye:
            self.send({"op": "bye"})
        with self._lock:
            try:
                if self.proc.stdin is not None:
                    self.proc.stdin.close()
            except OSError:
                pass
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def stderr_text(self) -> str:
        return bytes(self._stderr).decode(errors="replace")

    def ended_status(self, timeout_s: float = 5.0) -> tuple[int | None, str]:
        """ssh's exit status (None: still running after timeout_s) and its stderr, both
        read once they are in. The end of the session's stdout comes before ssh exits and
        before the stderr thread has read the last lines (the agent's traceback, ssh's
        reason): read at that moment, a session that ended with the agent's error was
        judged by the status of an ssh still running, 255, "unreachable", without the
        line that said why."""
        code = None
        if self.proc is not None:
            try:
                code = self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                code = None
        if self._drainer is not None:
            self._drainer.join(timeout_s)
        return code, self.stderr_text()

    # -- reading -----------------------------------------------------------------------
    def _drain(self, stream: BinaryIO) -> None:
        for chunk in iter(lambda: stream.read(4096), b""):
            self._stderr.extend(chunk)
            del self._stderr[:-STDERR_KEEP_BYTES]

    def _read(self, stream: BinaryIO) -> None:
        try:
            while True:
                line = stream.readline(LINE_MAX_BYTES)
                if not line:
                    break
                try:
                    msg = json.loads(line)
                except ValueError:
                    msg = None
                if not isinstance(msg, dict):
                    if self.hello is None:
                        self._early.append(line.decode(errors="replace").strip()[:400])
                    continue
                op = msg.get("op")
                if op == "hello" and self.hello is None:
                    self.hello = msg
                    self._hello.set()
                elif op == "clock":
                    with self._clock_cv:
                        t, here = msg.get("t"), msg.get("here")
                        if isinstance(t, float) and isinstance(here, (int, float)):
                            self._clock[t] = float(here)
                            self._clock_cv.notify_all()
                elif op in OF_OPS:
                    if self.of is not None:
                        self.of.handle(msg)
                elif op in ASKED:
                    self._answers[op] = msg
                    self._answered[op].set()
                elif op == "fatal":
                    self._early.append(line.decode(errors="replace").strip()[:400])
                else:
                    self.owner.dispatch(self, msg)
        finally:
            self.lost = not self.closing
            self._ended.set()  # before the events: see ask()
            with self._clock_cv:
                self._clock_cv.notify_all()
            self._hello.set()
            for ev in self._answered.values():
                ev.set()  # nobody waits out a time-out on a session that is gone
            self.owner.session_ended(self)


class ClusterWorkers:
    """Workers on the machines of a cluster run, through each machine's agent."""

    def __init__(self, cluster: ClusterSpec, prefix: str,
                 machines: Sequence[str] | None = None) -> None:
        self.cluster = cluster
        self.prefix = prefix
        by = {m.name: m for m in cluster.machines}
        chosen = list(machines) if machines is not None else list(by)
        self.sessions = {n: AgentSession(cluster, by[n], prefix, self) for n in chosen}
        self._mirrors: dict[tuple[str, int], _Mirror] = {}
        self._where: dict[str, dict[int, str]] = {}  # job -> stage -> machine
        self._ports: dict[str, dict[str, Any]] = {}  # job -> stage 0's rendezvous
        self._told: set[tuple[str, str]] = set()     # (job, machine) sent the rendezvous
        self._lock = threading.RLock()
        self.errors: list[str] = []

    def __enter__(self) -> ClusterWorkers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def open(self, own: bool = False, timeout_s: float = 60.0) -> dict[str, dict[str, Any]]:
        """Open every session (side by side), measure each clock; with `own`, each agent
        takes the run down on its machine if the driver goes away without `bye`.
        Returns per machine: hello and clock offset."""
        from concurrent.futures import ThreadPoolExecutor

        def one(s: AgentSession) -> dict[str, Any]:
            hello = s.open(timeout_s)
            if own:
                s.send({"op": "own"})
            s.send({"op": "fidelity_start"})  # its processes' CPU, read from now on
            links = s.serve_links()
            if not links.get("ok"):
                log.warning("%s: no link metrics: %s", s.head(), links.get("why"))
            return {"hosts": hello.get("hosts", []), "clock": s.measure_clock().as_dict(),
                    "links": links}

        out: dict[str, dict[str, Any]] = {}
        with ThreadPoolExecutor(max_workers=max(1, min(8, len(self.sessions)))) as pool:
            futs = {n: pool.submit(one, s) for n, s in self.sessions.items()}
            first: RuntimeFailure | None = None
            for n, f in futs.items():
                try:
                    out[n] = f.result()
                except RuntimeFailure as exc:
                    first = first or exc
        if first is not None:
            self.close()
            raise first
        return out

    def close(self) -> None:
        for s in self.sessions.values():
            s.close(bye=True)

    def relay_openflow(self, of_port: int, probe_ms: int) -> dict[str, dict[str, Any]]:
        """Every machine's switches to the controller on our loopback port (side by
        side); per machine the agent's reply."""
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=max(1, min(8, len(self.sessions)))) as pool:
            futs = {n: pool.submit(s.relay_openflow, of_port, probe_ms)
                    for n, s in self.sessions.items()}
            return {n: f.result() for n, f in futs.items()}

    def stop_openflow(self) -> None:
        """No more switch connections to the controller (before it stops: the switches'
        reconnections are refused quietly)."""
        for s in self.sessions.values():
            if s.of is not None:
                s.of.close()

    def openflow_stats(self) -> dict[str, dict[str, int]]:
        """Per machine: the relay's channels and bytes (seen from the driver's end)."""
        return {n: s.of.stats() for n, s in self.sessions.items() if s.of is not None}

    def fidelity(self, timeout_s: float = 60.0) -> dict[str, dict[str, Any]]:
        """Per machine (side by side): the fidelity verdict's inputs its agent read (its
        processes' CPU, its steal time, its share's counters), or {ok: False, why}."""
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=max(1, min(8, len(self.sessions)))) as pool:
            futs = {n: pool.submit(s.ask, {"op": "fidelity"}, timeout_s)
                    for n, s in self.sessions.items()}
            return {n: f.result() for n, f in futs.items()}

    def clocks(self) -> dict[str, dict[str, float | int]]:
        return {n: s.offset.as_dict() for n, s in self.sessions.items()}

    # -- the launcher's side -----------------------------------------------------------
    def spawn(self, machine: str, *, job: str, stage: int, host: str, plan: dict[str, Any],
              master: str, record_path: Path, log_path: Path, timeout_s: float,
              duty: float, linger_s: float, nice: int, go_on: bool = False,
              fault: Mapping[str, Any] | None = None,
              reply_timeout_s: float = 60.0) -> tuple[RemoteProc, str, int, float]:
        """Start one stage on `machine`'s host; (process, metrics host, metrics port,
        spawn time on the driver's clock). go_on: the stage iterates on until
        events_done(). fault: the workers' fault options, wall seconds
        (testbed.orchestrate.launch.FaultPolicy.as_order: collective_timeout_s, on_fault,
        max_restarts, restart_s), as a local stage gets them; None: the worker's
        defaults. RuntimeFailure naming the machine when the agent refuses or does not
        answer."""
        s = self.sessions.get(machine)
        if s is None:
            raise RuntimeFailure(f"no worker agent for machine {machine!r}")
        mirror = _Mirror(None, Path(record_path), Path(log_path), threading.Event())
        with self._lock:
            self._mirrors[(job, stage)] = mirror
            self._where.setdefault(job, {})[stage] = machine
        mirror.record_path.write_bytes(b"")
        s.send({"op": "start", "job": job, "stage": stage, "host": host, "plan": plan,
                "master": master, "timeout_s": timeout_s, "duty": duty, "linger_s": linger_s,
                "nice": nice, "metrics_address": s.metrics_address(), "go_on": go_on,
                **({"fault": dict(fault)} if fault is not None else {})})
        if not mirror.started.wait(reply_timeout_s) or mirror.reply is None:
            raise RuntimeFailure(f"{s.head()}: worker agent did not start {job}/stage{stage}"
                                 f" within {reply_timeout_s:g} s")
        if mirror.reply.get("op") == "error":
            raise RuntimeFailure(f"{s.head()}: {job}/stage{stage} refused: "
                                 f"{str(mirror.reply.get('why'))[:300]}")
        r = mirror.reply
        proc = mirror.proc  # (made as the reply was read: dispatch)
        assert proc is not None
        self._relay(job)
        return (proc, s.metrics_address(), int(r["metrics_port"]),
                float(r["spawn_s"]) - s.offset.offset_s)

    def events_done(self) -> None:
        """Every machine's `go_on` stages end their extra iterations (the run's events
        have all run)."""
        for s in self.sessions.values():
            s.send({"op": "events_done"})

    # -- from the sessions -------------------------------------------------------------
    def dispatch(self, s: AgentSession, msg: dict[str, Any]) -> None:
        op, job, stage = msg.get("op"), msg.get("job"), msg.get("stage")
        with self._lock:
            mirror = self._mirrors.get((job, stage)) if isinstance(job, str) else None
            if s.name != self._where.get(str(job), {}).get(stage if isinstance(stage, int)
                                                           else -1):
                mirror = None  # only the machine a stage runs on speaks for it
        if op in ("started", "error") and mirror is not None and mirror.reply is None:
            # The proxy is made here, on the session's reading thread, before the next
            # message is read: a worker that exits at once has its `exit` read right
            # after `started`, and made by spawn() once it woke, the proxy missed it
            # (never finished: the launcher's supervision waited on it for ever).
            if op == "started":
                try:
                    proc = RemoteProc(s, str(job), int(stage), int(msg["pid"]))
                except (KeyError, TypeError, ValueError):
                    msg = {"op": "error", "why": f"a `started` without a pid: {msg}"[:300]}
                else:
                    with self._lock:
                        mirror.proc = proc
            mirror.reply = msg
            mirror.started.set()
        elif op == "error":
            self.errors.append(f"{s.name}: {str(msg.get('why'))[:300]}")
            log.warning("worker agent on %s: %s", s.name, msg.get("why"))
        elif op == "record" and mirror is not None and isinstance(msg.get("rec"), dict):
            rec = shift_record(msg["rec"], s.offset.offset_s)
            with open(mirror.record_path, "a") as fh:
                fh.write(json.dumps(rec) + "\n")
        elif op == "rendezvous" and isinstance(job, str) and isinstance(msg.get("data"),
                                                                        dict):
            with self._lock:
                if self._where.get(job, {}).get(0) == s.name:
                    self._ports[job] = msg["data"]
                    self._told.add((job, s.name))
            self._relay(job)
        elif op == "exit" and mirror is not None:
            tail = msg.get("log_tail")
            if isinstance(tail, str):
                mirror.log_path.write_text(tail)
            code = msg.get("code")
            if mirror.proc is not None:
                mirror.proc.finish(code if isinstance(code, int) else LOST_CODE)

    def _relay(self, job: str) -> None:
        """Stage 0's port to every other machine that runs a stage of the job."""
        with self._lock:
            data = self._ports.get(job)
            if data is None:
                return
            todo = []
            for stage, m in self._where.get(job, {}).items():
                mirror = self._mirrors.get((job, stage))
                if (job, m) in self._told or mirror is None or mirror.proc is None:
                    continue
                self._told.add((job, m))
                todo.append(m)
        for m in todo:
            self.sessions[m].send({"op": "rendezvous", "job": job, "data": data})

    def session_ended(self, s: AgentSession) -> None:
        """Every worker of that machine still running has failed with it."""
        with self._lock:
            lost = [m for (job, stage), m in self._mirrors.items()
                    if self._where.get(job, {}).get(stage) == s.name]
        if any(m.proc is not None and m.proc.returncode is None for m in lost):
            status, said = s.ended_status()  # (not as the session's stdout ended: see it)
        else:
            status, said = None, s.stderr_text()
        code = status or LOST_CODE
        for m in lost:
            if m.proc is not None and m.proc.returncode is None:
                why = f"the session to machine {s.name} ended: {ssh_error(code, said)}"
                with open(m.record_path, "a") as fh:
                    fh.write(json.dumps({"type": "error", "error": why}) + "\n")
                m.proc.finish(LOST_CODE)
            m.started.set()
