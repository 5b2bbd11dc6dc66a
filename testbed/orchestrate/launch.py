"""Starts, supervises and stops pipeline workers: one process per stage, on given hosts.

A host is a name, an address, the interface gloo must use and an argv prefix that
runs a command inside it (`mnexec -a PID` for a Mininet host, `ip netns exec NS`, or
nothing for the local machine). For every worker the launcher binds a /metrics
listening socket in its own network namespace and passes it down, so a Prometheus
server next to the launcher scrapes workers inside emulated hosts directly.

Supervision: a worker that exits with an error or is killed marks its job failed
(with the worker's own error line when it wrote one); the job's other workers are
stopped, since a pipeline cannot go on without a stage, and every other job keeps
running. Everything already recorded (iterations, metrics) is kept. Processes are
stopped by their own PIDs only.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from testbed import names
from testbed.errors import InputError
from testbed.io.atomic import atomic_write_json, atomic_write_text
from testbed.metrics.hostload import HostLoad, free_cores
from testbed.orchestrate.results import read_records
from workloads import zygote
from workloads.faultargs import fault_argv
from workloads.plan import JobPlan
from workloads.zygote import ZygoteProc

log = logging.getLogger(__name__)
REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Host:
    """Where a worker runs."""

    name: str
    ip: str
    iface: str | None = None
    prefix: tuple[str, ...] = ()
    machine: str | None = None  # another machine's host: started by its worker agent


@dataclass(frozen=True)
class FaultPolicy:
    """How the workers live through a network fault (spec policy.workers), in wall-clock
    seconds (the scenario's x time_factor): the training collectives' time-out, fail or
    retry, restarts allowed and the stand-in reload time after each (workloads.faulttol).

    A scenario's `collective_timeout_s: null` is torch's gloo default, 1800 s, as the
    simulator takes it (testbed.analysis.faultimpact.effective_timeout_s): 1800 s x
    time_factor here (`timeout_source` "gloo default"). A policy made without a scenario
    (FaultPolicy()) has none: the workers keep their start-up time-out for training."""

    collective_timeout_s: float | None = None
    on_fault: str = "fail"
    max_restarts: int = 3
    restart_s: float = 0.0
    timeout_source: str = "launcher"  # "spec", "gloo default" or "launcher" (given here)
    time_factor: float = 1.0

    @classmethod
    def of(cls, spec: Any, time_factor: float) -> FaultPolicy:
        """From a scenario's policy.workers (a WorkersFaultSpec, or None: the defaults)."""
        from testbed.analysis.faultimpact import effective_timeout_s

        if spec is None:
            return cls()
        timeout = spec.collective_timeout_s
        return cls(effective_timeout_s(timeout) * time_factor, spec.on_fault,
                   spec.max_restarts, spec.restart_s * time_factor,
                   "gloo default" if timeout is None else "spec", time_factor)

    def argv(self) -> list[str]:
        """The worker's options for it (workloads.worker)."""
        return fault_argv(self.collective_timeout_s, self.on_fault, self.max_restarts,
                          self.restart_s)

    def as_order(self) -> dict[str, Any]:
        """The same options as a worker agent's `start` message carries them
        (testbed.cluster.agent.parse_start: a stage on another machine)."""
        return {"collective_timeout_s": self.collective_timeout_s, "on_fault": self.on_fault,
                "max_restarts": self.max_restarts, "restart_s": self.restart_s}

    def as_record(self) -> dict[str, Any]:
        """summary.json `worker_fault_policy`: wall seconds, and which time-out applied
        (`collective_timeout_source`; `collective_timeout_scenario_s`: the scenario's,
        what the simulator's model uses)."""
        t = self.collective_timeout_s
        scenario = self.timeout_source in ("spec", "gloo default")
        if t is None:
            source = "none given: the workers' start-up time-out (--timeout-s)"
        elif self.timeout_source == "gloo default":
            source = "null in the scenario: torch's gloo default (1800 s) x time_factor"
        elif self.timeout_source == "spec":
            source = "the scenario's policy.workers.collective_timeout_s x time_factor"
        else:
            source = "given to the launcher (wall seconds)"
        return {"collective_timeout_s": t,
                "collective_timeout_scenario_s": t / self.time_factor
                if t is not None and scenario else None,
                "collective_timeout_source": source,
                "on_fault": self.on_fault, "max_restarts": self.max_restarts,
                "restart_s": self.restart_s}


@dataclass
class Worker:
    job: str
    stage: int
    host: Host
    proc: Any  # subprocess.Popen, or testbed.cluster.agentlink.RemoteProc (same methods)
    record_path: Path
    log_path: Path
    metrics_port: int
    spawn_s: float
    exit_code: int | None = None
    fault: str | None = None  # set when killed on purpose (kill_stage): the failure reason
    killed_s: float | None = None  # monotonic time of that kill
    ready: bool = False  # its `start` record seen (training_started)
    metrics_host: str = "127.0.0.1"  # where its /metrics listens (a remote machine's address)


@dataclass
class JobRun:
    plan: JobPlan
    workers: list[Worker] = field(default_factory=list)
    failure: str | None = None
    failed_s: float | None = None  # monotonic time the supervision noticed the failure
    done: bool = False
    lost_peer_s: float | None = None  # when only exits that lost a peer were known (a wait)


PEER_LOSS = ("connection closed by peer", "connection reset by peer", "broken pipe",
             "check the logs of the remote worker")
"""Words of a collective's error that say a peer went away (gloo's transport, as torch
words it): the stage that wrote one failed because another stage ended first."""

CAUSE_WAIT_S = 2.0
"""How long a job whose every known failed exit lost a peer waits for the exit that
caused them before it is judged. Exit statuses come in asynchronously (the zygote's
reports, a remote agent's), so the cause can be reported after its consequences: a CI
run named stage 1's "peer closed" where stage 2 had been SIGKILLed (2026-12-05)."""
CAUSE_WAIT_MAX_S = 15.0
"""The longest that wait lasts while a worker is known to have exited (its pidfd) but its
status is not yet reported."""


def _exit_unreported(w: Worker) -> bool:
    """True when the worker is known to have exited but its status is not in yet."""
    pending = getattr(w.proc, "exited_unreported", None)
    return bool(pending()) if pending is not None else False


def _last_error(w: Worker) -> str | None:
    """The worker's own last error line (its `error` record), if it wrote one."""
    errs = [r["error"] for r in read_records(w.record_path) if r.get("type") == "error"]
    return str(errs[-1]) if errs else None


def _lost_peer(w: Worker) -> bool:
    """True when the worker's last error record says that a peer went away."""
    if w.fault is not None or (w.exit_code or 0) < 0:
        return False  # killed on purpose, or by a signal: a cause
    err = _last_error(w)
    return err is not None and any(k in err.lower() for k in PEER_LOSS)


MIN_DUTY = 0.05
FREE_CORES_WINDOW_S = 0.5  # how long the machine's idle time is read before the workers start


def default_duty(workers: int, cores: float | None = None) -> float:
    """Share of op time in tensor work so that `workers` stages fit on half the cores (the
    other half for the emulated network): 0.5 x cores / workers, within [MIN_DUTY, 1]."""
    if cores is None:
        cores = os.cpu_count() or 1
    return max(MIN_DUTY, min(1.0, 0.5 * cores / max(1, workers)))


def fitting_duty(workers: int, free: float | None, cores: int | None = None
                 ) -> dict[str, Any]:
    """The workers' duty sized to the cores the machine has free (free_cores: another
    process spinning on one of 2 cores leaves 1), never to more than `cores` (the workers'
    CPU set where they are pinned, else the machine's): CPU workers
    that ask for more than is free are starved and their ops late (docs/workers.md). What
    was chosen and from what: duty, free_cores, cores, workers."""
    cores = cores or os.cpu_count() or 1
    # sized from the free cores as recorded (rounded, at most the cores the workers may
    # use: those of their CPU set), so the record reproduces its duty
    free = None if free is None else round(min(float(cores), free), 3)
    usable = cores if free is None else max(0.0, free)
    return {"duty": round(default_duty(workers, usable), 4), "workers": workers,
            "cores": cores, "free_cores": free}


class Launcher:
    """Runs the workers of several jobs at once; use as a context manager."""

    def __init__(self, out_dir: Path, *, timeout_s: float = 120.0, duty: float | None = None,
                 nice: int = 0, python: str = sys.executable,
                 metrics_netns_fd: int | None = None, metrics_linger_s: float = 0.0,
                 remote: Any = None, go_on_until: Path | None = None,
                 cpus: Sequence[int] | None = None,
                 fault_policy: FaultPolicy | None = None) -> None:
        """metrics_linger_s: how long each worker waits, after its last iteration, for a
        scrape of its final metrics (set it when a monitor scrapes the workers).
        remote: what starts stages on hosts of other machines (`Host.machine`): a
        testbed.cluster.agentlink.ClusterWorkers. go_on_until: a file whose appearance
        ends the jobs' iterations beyond their plans' (the run's events all ran; the
        worker's --go-on-until); a job with a stage on another machine, which cannot see
        the file, runs its plan's iterations only. cpus: the cores this machine's CPU
        workers run on (the worker's --cpus; testbed.emu.cpuset's split), default any.
        fault_policy: the training collectives' time-out and fail/retry (FaultPolicy),
        for every stage: a stage on another machine gets the same options through its
        worker agent (the `start` message's `fault`)."""
        self.out_dir = Path(out_dir)
        self.fault_policy = fault_policy or FaultPolicy()
        self.go_on_until = go_on_until
        self.cpus = tuple(int(c) for c in cpus) if cpus else ()  # CPU workers' cores here
        self.timeout_s = timeout_s
        self.duty = duty
        self.duty_choice: dict[str, Any] = {}  # what start() chose (host_load's worker_duty)
        self.nice = nice
        self.python = python
        self.jobs: dict[str, JobRun] = {}
        self._sockets: list[socket.socket] = []
        self.metrics_netns_fd = metrics_netns_fd
        self.metrics_linger_s = metrics_linger_s
        self.remote = remote
        self._load = HostLoad()
        self._zygote: zygote.Zygote | None = None
        self._zygote_failed = False

    def __enter__(self) -> Launcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, plans: list[tuple[JobPlan, list[Host]]]) -> None:
        """Start every stage of every plan (stage i on hosts[i])."""
        total = sum(p.stages for p, _ in plans if p.compute == "cpu")  # device ones: no CPU
        if self.duty is not None:
            self.duty_choice = {"duty": self.duty, "workers": total, "set": True}
        elif total:
            # pinned (testbed.emu.cpuset): sized to the cores of their set, not the machine's
            self.duty_choice = fitting_duty(total, free_cores(FREE_CORES_WINDOW_S),
                                            len(self.cpus) or None)
            log.info("CPU workers' duty %.4f: %d workers on %s of %d cores free",
                     self.duty_choice["duty"], total, self.duty_choice["free_cores"],
                     self.duty_choice["cores"])
        else:
            self.duty_choice = {"duty": 1.0, "workers": 0}
        duty = float(self.duty_choice["duty"])
        self._load.start()
        for plan, hosts in plans:
            names.check(names.NODE_NAME_RE, plan.job, "job name")
            if plan.job in self.jobs:
                raise InputError("job", f"duplicate job {plan.job!r}")
            if len(hosts) != plan.stages:
                raise InputError("hosts", f"job {plan.job}: {plan.stages} stages need "
                                 f"{plan.stages} hosts, got {len(hosts)}")
            self._start_job(plan, hosts, duty)

    def _start_job(self, plan: JobPlan, hosts: list[Host], duty: float) -> None:
        jdir = self.out_dir / "workers" / plan.job
        jdir.mkdir(parents=True, exist_ok=True)
        plan_path = jdir / "plan.json"
        atomic_write_text(plan_path, plan.to_json())
        run = JobRun(plan)
        self.jobs[plan.job] = run
        master = f"{hosts[0].ip}:0"  # stage 0 binds a free port and publishes it
        port_file = jdir / "rendezvous.json"
        port_file.unlink(missing_ok=True)
        env = dict(os.environ)
        env["PYTHONPATH"] = str(REPO_ROOT) + (os.pathsep + env["PYTHONPATH"]
                                              if env.get("PYTHONPATH") else "")
        env["OMP_NUM_THREADS"] = "1"
        # Every stage of a job iterating through the events, or none (they agree on
        # each extra iteration in one collective): a remote stage watches a file its
        # machine's agent makes when told (ClusterWorkers.events_done).
        go_on: list[str] = []
        if self.go_on_until is not None:
            go_on = ["--go-on-until", str(self.go_on_until)]
        for stage, host in enumerate(hosts):
            if host.machine is not None:
                self._start_remote(run, plan, stage, host, master, duty)
                continue
            lsock = _listening_socket(self.metrics_netns_fd)
            self._sockets.append(lsock)
            rec = jdir / f"stage{stage}.jsonl"
            rec.unlink(missing_ok=True)
            logp = jdir / f"stage{stage}.log"
            argv = [*host.prefix, self.python, "-m", "workloads.worker",
                    "--plan", str(plan_path), "--rank", str(stage), "--master", master,
                    "--rendezvous-file", str(port_file),
                    "--out", str(rec), "--metrics-fd", str(lsock.fileno()),
                    "--timeout-s", str(self.timeout_s), "--duty", f"{duty:.4f}",
                    "--metrics-linger-s", f"{self.metrics_linger_s:.1f}",
                    "--nice", str(self.nice), *go_on, *self.fault_policy.argv()]
            if self.cpus and plan.compute == "cpu":
                argv += ["--cpus", ",".join(map(str, self.cpus))]
            if host.iface:
                argv += ["--iface", host.iface]
            t_spawn = time.monotonic()  # (the zygote's start, at the first, counts)
            with open(logp, "wb") as logf:
                proc = self._forked(argv, host, env, logf.fileno(), lsock.fileno())
                if proc is None:
                    proc = subprocess.Popen(argv, stdout=logf, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, env=env, cwd=REPO_ROOT,
                                            pass_fds=(lsock.fileno(),),
                                            start_new_session=True)
            run.workers.append(Worker(plan.job, stage, host, proc, rec, logp,
                                      int(lsock.getsockname()[1]), t_spawn))
            log.info("job %s stage %d: pid %d on %s", plan.job, stage, proc.pid, host.name)

    def _forked(self, argv: list[str], host: Host, env: dict[str, str], log_fd: int,
                metrics_fd: int) -> ZygoteProc | None:
        """The worker forked by this launcher's zygote (started at the first worker: one
        torch import for all; workloads.zygote), or None where it does not apply (turned
        off, another python, a host prefix other than `mnexec -a PID`)."""
        netns = zygote.netns_of_prefix(host.prefix)
        if (netns is False or not zygote.enabled() or self.python != sys.executable
                or self._zygote_failed):
            return None
        if self._zygote is None:
            try:
                self._zygote = zygote.Zygote(self.python, env, REPO_ROOT,
                                             self.out_dir / "workers" / "zygote.log",
                                             self.timeout_s).start()
            except (RuntimeError, OSError) as exc:
                log.warning("workers start one by one: %s", exc)
                self._zygote_failed = True
                return None
        tail = argv[argv.index("workloads.worker") + 1:]
        tail[tail.index("--metrics-fd") + 1] = "@fd:0"
        try:
            return self._zygote.spawn(tail, env, REPO_ROOT, log_fd, (metrics_fd,),
                                      netns if isinstance(netns, str) else None)
        except (RuntimeError, OSError) as exc:  # (the zygote died: the rest one by one)
            log.warning("workers start one by one from now: %s", exc)
            self._zygote_failed = True
            return None

    def _start_remote(self, run: JobRun, plan: JobPlan, stage: int, host: Host,
                      master: str, duty: float) -> None:
        """One stage on another machine's host, through its worker agent; its records
        are mirrored into the same file a local stage writes (on this machine's clock)."""
        if self.remote is None:
            raise InputError("hosts", f"host {host.name} is on machine {host.machine}, and "
                             "this launcher has no worker agents")
        jdir = self.out_dir / "workers" / plan.job
        rec, logp = jdir / f"stage{stage}.jsonl", jdir / f"stage{stage}.log"
        proc, mhost, mport, spawn_s = self.remote.spawn(
            host.machine, job=plan.job, stage=stage, host=host.name,
            plan=json.loads(plan.to_json()), master=master, record_path=rec, log_path=logp,
            timeout_s=self.timeout_s, duty=duty, linger_s=self.metrics_linger_s,
            nice=self.nice, go_on=self.go_on_until is not None,
            fault=self.fault_policy.as_order())
        run.workers.append(Worker(plan.job, stage, host, proc, rec, logp, mport, spawn_s,
                                  metrics_host=mhost))
        log.info("job %s stage %d: pid %d on %s (machine %s)", plan.job, stage, proc.pid,
                 host.name, host.machine)

    def metrics_targets(self) -> list[tuple[str, dict[str, str]]]:
        """(host:port, labels) of every worker's /metrics endpoint."""
        return [(f"{_bracket(w.metrics_host)}:{w.metrics_port}",
                 {"component": "worker", "host": w.host.name})
                for run in self.jobs.values() for w in run.workers]

    # -- supervision -------------------------------------------------------------------
    def poll(self) -> bool:
        """Update worker states; return True while any job is still running."""
        running = False
        for run in self.jobs.values():
            if run.done:
                continue
            for w in run.workers:
                if w.exit_code is None:
                    w.exit_code = w.proc.poll()
            failed = [w for w in run.workers if w.exit_code not in (None, 0)]
            if failed and run.failure is None:
                # the cause before its consequences: a worker that lost a peer (its
                # transport closed under it) is a consequence of another's exit, whatever
                # the order the exits were reaped in; then the first to exit (where known:
                # forked workers' exits come in reaping order, processes of their own in
                # stage order)
                cause = min(failed, key=lambda w: (_lost_peer(w),
                                                   getattr(w.proc, "exit_seq", 0)))
                if _lost_peer(cause) and not self._cause_waited(run):
                    running = True  # the exit that caused it may not be reported yet
                    continue
                run.failure = self._describe(cause)
                run.failed_s = time.monotonic()
                log.warning("job %s failed: %s", run.plan.job, run.failure)
                self._stop_workers(run)
            if all(w.exit_code is not None for w in run.workers):
                run.done = True
            else:
                running = True
        return running

    def _cause_waited(self, run: JobRun) -> bool:
        """True once a job whose known failures all lost a peer has waited long enough for
        the exit that caused them (CAUSE_WAIT_S; up to CAUSE_WAIT_MAX_S while a worker has
        exited unreported), or when every worker's exit is in (nothing more will come)."""
        now = time.monotonic()
        if run.lost_peer_s is None:
            run.lost_peer_s = now
        if all(w.exit_code is not None for w in run.workers):
            return True
        pending = False
        for w in run.workers:
            if w.exit_code is not None:
                continue
            unreported = _exit_unreported(w)
            # asked after exited_unreported, so a status that lands at any moment of this
            # pass (a later worker's poll pumped the zygote, an agent's report came in on
            # its thread) is seen here and never judged without
            if w.proc.poll() is not None:
                return False  # judge on the next pass, with it
            pending = pending or unreported
        waited = now - run.lost_peer_s
        return waited >= (CAUSE_WAIT_MAX_S if pending else CAUSE_WAIT_S)

    def training_started(self) -> bool:
        """True once every worker has joined its job's process group (its `start`
        record: training begins), or once any job has ended (it will not begin)."""
        for run in self.jobs.values():  # (another thread supervises: no poll() here)
            if run.done or run.failure is not None or any(
                    w.proc.returncode is not None for w in run.workers):
                return True
            for w in run.workers:
                if not w.ready:
                    w.ready = any(r.get("type") == "start"
                                  for r in read_records(w.record_path))
        return bool(self.jobs) and all(w.ready for run in self.jobs.values()
                                       for w in run.workers)

    def not_ready(self) -> list[str]:
        """The workers training_started() still waits for ("JOB/stageN"), as it last saw."""
        return [f"{w.job}/stage{w.stage}" for run in self.jobs.values()
                for w in run.workers if not w.ready]

    def _describe(self, w: Worker) -> str:
        code = w.exit_code or 0
        how = (f"killed by signal {signal.Signals(-code).name}" if code < 0
               else f"exited with code {code}")
        if w.fault is not None:
            return f"{w.fault} (pid {w.proc.pid}, host {w.host.name}, {how})"
        err = _last_error(w)
        detail = f": {err}" if err is not None else ""
        return f"stage {w.stage} (pid {w.proc.pid}, host {w.host.name}) {how}{detail}"

    def wait(self, deadline_s: float | None = None, interval_s: float = 0.1) -> None:
        """Supervise until every job ends or the deadline (then the rest time out)."""
        end = time.monotonic() + deadline_s if deadline_s is not None else None
        while self.poll():
            if end is not None and time.monotonic() > end:
                for run in self.jobs.values():
                    if not run.done and run.failure is None:
                        run.failure = f"timed out after {deadline_s:.0f} s"
                self.stop()
                self.poll()
                return
            self._load.tick()
            time.sleep(interval_s)

    def host_load(self) -> dict[str, Any]:
        """The machine's CPU busy/steal shares and load average since start(), and the CPU
        workers' duty with what it was sized from (`worker_duty`, fitting_duty)."""
        return {**self._load.summary(), "worker_duty": dict(self.duty_choice)}

    def _stop_workers(self, run: JobRun, grace_s: float = 3.0) -> None:
        live = [w for w in run.workers if w.proc.poll() is None]
        for w in live:
            _signal(w.proc, signal.SIGTERM)
        end = time.monotonic() + grace_s
        for w in live:
            try:
                w.proc.wait(max(0.0, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal(w.proc, signal.SIGKILL)
                w.proc.wait()
            w.exit_code = w.proc.returncode

    def stop(self) -> None:
        """Stop every worker still running (by PID) and close the metrics sockets."""
        for run in self.jobs.values():
            self._stop_workers(run)
        for s in self._sockets:
            s.close()
        self._sockets = []
        if self._zygote is not None:
            self._zygote.close()
            self._zygote = None

    # -- faults (testbed.orchestrate.faults) --------------------------------------------
    def worker(self, job: int | str, stage: int) -> Worker:
        """A job's stage worker; job is an index into the started jobs (in start order)
        or a job name. KeyError naming what exists when there is no such worker."""
        names_ = list(self.jobs)
        if isinstance(job, int):
            if not 0 <= job < len(names_):
                raise KeyError(f"no job {job} (the run has {len(names_)}: {names_})")
            job = names_[job]
        run = self.jobs.get(job)
        if run is None:
            raise KeyError(f"no job {job!r} (the run has {names_})")
        if not 0 <= stage < len(run.workers):
            raise KeyError(f"job {job} has no stage {stage} (stages 0..{len(run.workers) - 1})")
        return run.workers[stage]

    def kill_stage(self, w: Worker, reason: str) -> bool:
        """SIGKILL one worker by its PID (a fault); `reason` becomes its job's failure
        text. False when it had already exited."""
        if w.proc.poll() is not None or _exit_unreported(w):
            return False  # it ended on its own: its own status is its failure, not `reason`
        w.fault = reason
        w.killed_s = time.monotonic()
        _signal(w.proc, signal.SIGKILL)
        log.warning("job %s stage %d (pid %d): %s", w.job, w.stage, w.proc.pid, reason)
        return True

    # -- results -----------------------------------------------------------------------
    def records(self) -> dict[str, list[list[dict[str, Any]]]]:
        return {job: [read_records(w.record_path) for w in run.workers]
                for job, run in self.jobs.items()}

    def outcome(self) -> dict[str, dict[str, Any]]:
        """Per job: ok flag, failure text, worker exit codes and start-up times."""
        out = {}
        for job, run in self.jobs.items():
            ups = []
            for w in run.workers:
                starts = [r for r in read_records(w.record_path) if r.get("type") == "start"]
                if starts:
                    ups.append(starts[0]["ready_s"] - w.spawn_s)
            finished = all(any(r.get("type") == "done" for r in read_records(w.record_path))
                           for w in run.workers)
            out[job] = {"ok": run.failure is None and finished, "failure": run.failure,
                        "exit_codes": [w.exit_code for w in run.workers],
                        "pids": [w.proc.pid for w in run.workers],
                        "hosts": [w.host.name for w in run.workers],
                        "startup_s": max(ups) if ups else None}
        return out

    def write_outcome(self, path: Path) -> None:
        atomic_write_json(path, self.outcome())


def _setns(fd: int) -> None:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, 0x40000000) != 0:  # CLONE_NEWNET
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


def _listening_socket(netns_fd: int | None) -> socket.socket:
    """A /metrics listener on 127.0.0.1:any, created in `netns_fd`'s namespace if given.

    A socket stays in the namespace it was created in, so the launcher can hand
    workers inside emulated hosts a listener that a root-namespace Prometheus reaches.
    """
    back = os.open("/proc/thread-self/ns/net", os.O_RDONLY) if netns_fd is not None else None
    try:
        if netns_fd is not None:
            _setns(netns_fd)
        lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        lsock.bind(("127.0.0.1", 0))
        lsock.listen(16)
        return lsock
    finally:
        if back is not None:
            _setns(back)
            os.close(back)


def _bracket(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _signal(proc: Any, sig: int) -> None:
    try:
        proc.send_signal(sig)
    except ProcessLookupError:
        pass
