"""The workers' fork server (workloads.zygote): one torch import, a fork per worker, exit
statuses reported, signals through pidfds, the host's network namespace entered, and the
launcher's jobs the same with it as without it."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from testbed.orchestrate.launch import REPO_ROOT, Host, Launcher
from testbed.orchestrate.results import summarize_job
from testbed.schedule import PipelineProblem, build_schedule
from tests.waiting import scaled, wait_until
from workloads import zygote
from workloads.plan import shadow_plan

LOCAL = Host("local", "127.0.0.1", "lo")


def _env() -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = str(REPO_ROOT)
    return env


@pytest.fixture
def zyg(tmp_path: Path):  # type: ignore[no-untyped-def]
    z = zygote.Zygote(sys.executable, _env(), REPO_ROOT, tmp_path / "zygote.log",
                      scaled(120)).start()
    try:
        yield z
    finally:
        z.close()
    assert z.proc is not None and z.proc.returncode == 0


def _spawn(z: zygote.Zygote, tmp_path: Path, argv: list[str], name: str = "w",
           netns: str | None = None) -> tuple[zygote.ZygoteProc, Path]:
    logp = tmp_path / f"{name}.log"
    with open(logp, "wb") as logf:
        return z.spawn(argv, _env(), REPO_ROOT, logf.fileno(), (), netns), logp


def test_prefixes_that_can_be_forked() -> None:
    assert zygote.netns_of_prefix(()) is None
    assert zygote.netns_of_prefix(("mnexec", "-a", "42")) == "/proc/42/ns/net"
    assert zygote.netns_of_prefix(("/usr/bin/mnexec", "-a", "7")) == "/proc/7/ns/net"
    assert zygote.netns_of_prefix(("ip", "netns", "exec", "x")) is False
    assert zygote.netns_of_prefix(("mnexec", "-a", "1; rm")) is False


def test_an_exit_status_and_the_log_come_back(zyg: zygote.Zygote, tmp_path: Path) -> None:
    proc, logp = _spawn(zyg, tmp_path, ["--no-such-option"])
    assert proc.wait(scaled(60)) == 2  # argparse's usage error, in the worker's own log
    assert "the following arguments are required: --plan" in logp.read_text()
    assert proc.poll() == 2
    proc.send_signal(signal.SIGKILL)  # exited: nothing is signalled (as Popen)
    # the fork is a process of its own session, not the zygote
    assert proc.pid != zyg.proc.pid  # type: ignore[union-attr]


def _waiting_stage(tmp_path: Path) -> list[str]:
    """Stage 1 of a job whose stage 0 never comes: it waits for the rendezvous file."""
    plan = tmp_path / "plan.json"
    prob = PipelineProblem.uniform(2, 2, 5.0, 10.0, activation_mb=0.01)
    plan.write_text(shadow_plan("j", prob, build_schedule("gpipe", prob), iterations=2,
                                bandwidth_divisor=1.0, time_factor=1.0).to_json())
    return ["--plan", str(plan), "--rank", "1", "--master", "127.0.0.1:0",
            "--rendezvous-file", str(tmp_path / "never.json"),
            "--out", str(tmp_path / "s1.jsonl"), "--timeout-s", "600"]


def _signal_masks(pid: int) -> dict[str, str]:
    rows = (ln.split(":", 1) for ln in open(f"/proc/{pid}/status"))
    return {k: v.strip() for k, v in rows if k in ("SigIgn", "SigBlk")}


def test_a_fork_has_a_fresh_interpreters_signal_dispositions(zyg: zygote.Zygote,
                                                              tmp_path: Path) -> None:
    """SIGPIPE and SIGXFSZ ignored, nothing blocked, as in `python -m workloads.worker`: a
    fork with SIGPIPE at its default died when a scrape's connection closed (2026-11-29)."""
    proc, _logp = _spawn(zyg, tmp_path, _waiting_stage(tmp_path))
    fresh = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                             start_new_session=True)
    try:
        pipe = 1 << (signal.SIGPIPE - 1)
        wait_until(lambda: int(_signal_masks(fresh.pid)["SigIgn"], 16) & pipe,
                   "the fresh interpreter's start-up", timeout_s=scaled(30))
        assert _signal_masks(proc.pid) == _signal_masks(fresh.pid)
        assert int(_signal_masks(proc.pid)["SigIgn"], 16) & pipe
    finally:
        fresh.kill()
        fresh.wait()
        proc.kill()
        proc.wait(scaled(60))


def test_a_signal_reaches_the_worker_and_its_death_is_reported(zyg: zygote.Zygote,
                                                               tmp_path: Path) -> None:
    proc, _logp = _spawn(zyg, tmp_path, _waiting_stage(tmp_path))
    wait_until(lambda: os.path.exists(f"/proc/{proc.pid}"), "the worker", timeout_s=30)
    wait_until(lambda: os.getsid(proc.pid) == proc.pid, "its own session", timeout_s=30)
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(0.3)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(scaled(60)) == -signal.SIGTERM


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                    reason="entering another network namespace needs root and unshare")
def test_the_fork_enters_the_hosts_network_namespace(zyg: zygote.Zygote,
                                                     tmp_path: Path) -> None:
    holder = subprocess.Popen(["unshare", "--net", "sleep", "600"])
    try:
        wait_until(lambda: os.readlink(f"/proc/{holder.pid}/ns/net")
                   != os.readlink("/proc/self/ns/net"), "the new namespace", timeout_s=30)
        ns = f"/proc/{holder.pid}/ns/net"
        proc, _logp = _spawn(zyg, tmp_path, _waiting_stage(tmp_path), netns=ns)
        wait_until(lambda: os.readlink(f"/proc/{proc.pid}/ns/net") == os.readlink(ns),
                   "the worker in the host's namespace", timeout_s=scaled(30))
        proc.kill()
        assert proc.wait(scaled(60)) == -signal.SIGKILL
        # a namespace that cannot be entered: the worker fails, saying why, in its log
        proc2, logp2 = _spawn(zyg, tmp_path, _waiting_stage(tmp_path), name="bad-ns",
                              netns=f"/proc/{holder.pid}/ns/nope")
        assert proc2.wait(scaled(60)) == 1
        assert "FileNotFoundError" in logp2.read_text()
    finally:
        holder.kill()
        holder.wait()


def test_the_zygote_leaves_when_the_launcher_hangs_up(tmp_path: Path) -> None:
    z = zygote.Zygote(sys.executable, _env(), REPO_ROOT, tmp_path / "zygote.log",
                      scaled(120)).start()
    assert z.proc is not None
    pid = z.proc.pid
    z.close()
    assert z.proc.returncode == 0 and not os.path.exists(f"/proc/{pid}")


@pytest.mark.parametrize("forked", ["1", "0"])
def test_jobs_through_the_zygote_and_without(tmp_path: Path, forked: str,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The same two 3-stage jobs with and without the fork server: every stage completes
    its iterations and a SIGKILLed worker fails its job, named so."""
    monkeypatch.setenv(zygote.ENV, forked)
    prob = PipelineProblem.uniform(3, 2, 5.0, 10.0, activation_mb=0.01)
    sched = build_schedule("1f1b", prob)
    plans = [(shadow_plan("ok", prob, sched, iterations=3, bandwidth_divisor=1.0,
                          time_factor=1.0), [LOCAL] * 3),
             (shadow_plan("doomed", prob, sched, iterations=100_000, bandwidth_divisor=1.0,
                          time_factor=1.0), [LOCAL] * 3)]
    with Launcher(tmp_path, timeout_s=scaled(60)) as launcher:
        launcher.start(plans)
        kinds = {type(w.proc).__name__ for run in launcher.jobs.values() for w in run.workers}
        assert kinds == ({"ZygoteProc"} if forked == "1" else {"Popen"})
        victim = launcher.jobs["doomed"].workers[2]
        wait_until(lambda: victim.record_path.exists() and "iteration" in
                   victim.record_path.read_text(), "an iteration of the doomed job",
                   timeout_s=scaled(120))
        os.kill(victim.proc.pid, signal.SIGKILL)
        t0 = time.monotonic()
        launcher.wait(scaled(180))
        outcome = launcher.outcome()
        records = launcher.records()
    assert time.monotonic() - t0 < scaled(60)
    assert outcome["ok"]["ok"], outcome
    assert summarize_job("ok", records["ok"])["iterations_measured"] == 3
    assert not outcome["doomed"]["ok"]
    assert "stage 2" in outcome["doomed"]["failure"], outcome
    assert "SIGKILL" in outcome["doomed"]["failure"], outcome["doomed"]
    assert (tmp_path / "workers" / "zygote.log").exists() == (forked == "1")


class _Supervisor:
    """The launcher's supervising thread, polling (pumping the zygote) at one moment: the
    moment another thread is about to use a worker's pidfd. It takes the zygote's lock as
    every pump does; where the lock is held it pumps later (after())."""

    def __init__(self, z: zygote.Zygote) -> None:
        self.z, self.deferred = z, False

    def now(self) -> None:
        def poll() -> None:
            if self.z._lock.acquire(blocking=False):
                try:
                    self.z.pump()
                finally:
                    self.z._lock.release()
            else:
                self.deferred = True

        t = threading.Thread(target=poll)
        t.start()
        t.join()

    def after(self) -> None:
        if self.deferred:
            self.z.pump()


@pytest.mark.parametrize("use", ["send_signal", "exited_unreported"])
def test_an_exit_report_pumped_meanwhile_never_closes_the_pidfd_in_use(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, use: str) -> None:
    """A fault injector's kill (or the cause's wait asking exited_unreported) on one thread
    while the supervision's poll, on another, takes in that worker's exit report, which
    closes its pidfd: the pidfd stays open until the signal is sent (it raised EBADF, or a
    reused descriptor number signalled another process) and the select is done (it raised
    ValueError on -1). Deterministic: the other thread pumps exactly in the window."""
    import json
    import select as select_mod
    import socket

    z = zygote.Zygote(sys.executable, _env(), REPO_ROOT, tmp_path / "zygote.log", 5.0)
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    z.sock = mine
    victim = subprocess.Popen(["sleep", "60"])
    try:
        proc = zygote.ZygoteProc(z, victim.pid, os.pidfd_open(victim.pid))
        z.procs[victim.pid] = proc
        sup = _Supervisor(z)
        used: list[int] = []

        def report() -> None:  # the zygote reaped it: its report waits on the socket
            theirs.send(json.dumps({"exit": victim.pid, "code": -9}).encode())

        if use == "send_signal":
            real_send = signal.pidfd_send_signal

            def send(fd: int, sig: int) -> None:
                report()
                sup.now()
                used.append(fd)
                real_send(fd, sig)  # EBADF had the pump closed it

            monkeypatch.setattr(signal, "pidfd_send_signal", send)
            proc.kill()
            assert victim.wait(30) == -signal.SIGKILL  # the signal reached it
        else:
            victim.kill()
            victim.wait(30)

            class RacingSelect:
                def __getattr__(self, name: str) -> object:
                    return getattr(select_mod, name)

                @staticmethod
                def select(r: list, w: list, x: list, t: float | None = None) -> tuple:
                    if not used and proc._pidfd in r:
                        used.append(proc._pidfd)
                        report()
                        monkeypatch.setattr(zygote, "select", select_mod)
                        sup.now()
                    return select_mod.select(r, w, x, t)

            monkeypatch.setattr(zygote, "select", RacingSelect())
            assert proc.exited_unreported() is True  # read before its report landed
        assert used
        sup.after()
        assert proc.returncode == -9 and proc._pidfd == -1
    finally:
        if victim.poll() is None:
            victim.kill()
            victim.wait()
        mine.close()
        theirs.close()
