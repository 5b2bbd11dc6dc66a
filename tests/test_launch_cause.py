"""The launcher names the cause of a job's failure, not its consequences, whatever the
order in which the workers' exit statuses come in (the zygote's reports and a remote
agent's come asynchronously: a cause can be reported after the peers it took down)."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest

from testbed.orchestrate import launch
from testbed.orchestrate.launch import Host, JobRun, Launcher, Worker
from testbed.schedule import PipelineProblem, build_schedule
from workloads.plan import shadow_plan

LOCAL = Host("local", "127.0.0.1", "lo")
PEER_GONE = ("[../gloo/transport/tcp/pair.cc:534] Connection closed by peer; check the "
             "logs of the remote worker before reporting an error. GLHF!")


class LateProc:
    """A process whose exit status is reported `delay_s` after the test starts (as the
    zygote's or a remote agent's report): poll() says None until then."""

    def __init__(self, pid: int, code: int | None, delay_s: float,
                 exited_early: bool = False) -> None:
        self.pid, self._code, self.returncode = pid, code, None
        self._at = time.monotonic() + delay_s
        self._exited_early = exited_early
        self.signals: list[int] = []

    def poll(self) -> int | None:
        if self.returncode is None and self._code is not None and \
                time.monotonic() >= self._at:
            self.returncode = self._code
        return self.returncode

    def exited_unreported(self) -> bool:
        return self._exited_early and self.poll() is None

    def wait(self, timeout: float | None = None) -> int:
        end = time.monotonic() + (timeout if timeout is not None else 1e9)
        while self.poll() is None:
            if time.monotonic() > end:
                raise subprocess.TimeoutExpired("late", timeout or 0.0)
            time.sleep(0.01)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        self.signals.append(sig)
        if self.returncode is None and self._code is None:
            self._code, self._at = -sig, time.monotonic()


def _launcher(tmp_path: Path, procs: list[LateProc], errors: list[str | None]) -> Launcher:
    prob = PipelineProblem.uniform(len(procs), 2, 5.0, 10.0, activation_mb=0.01)
    plan = shadow_plan("j", prob, build_schedule("gpipe", prob), iterations=2,
                       bandwidth_divisor=1.0, time_factor=1.0)
    la = Launcher(tmp_path)
    run = JobRun(plan)
    for stage, (proc, err) in enumerate(zip(procs, errors, strict=True)):
        rec = tmp_path / f"stage{stage}.jsonl"
        rec.write_text(json.dumps({"type": "error", "error": err}) + "\n" if err else "")
        run.workers.append(Worker("j", stage, LOCAL, proc, rec, tmp_path / "log", 0, 0.0))
    la.jobs["j"] = run
    return la


def _judge(la: Launcher, limit_s: float = 30.0) -> str:
    end = time.monotonic() + limit_s
    while la.jobs["j"].failure is None:
        la.poll()
        assert time.monotonic() < end, "no failure judged"
        time.sleep(0.02)
    return str(la.jobs["j"].failure)


def test_a_kill_reported_after_the_peers_it_took_down_is_the_cause(tmp_path: Path) -> None:
    # stage 2 SIGKILLed; stages 0 and 1 lost their peer and exited first in the reports
    procs = [LateProc(100, 1, 0.0), LateProc(101, 1, 0.0), LateProc(102, -9, 0.6)]
    la = _launcher(tmp_path, procs, [PEER_GONE, PEER_GONE, None])
    failure = _judge(la)
    assert failure.startswith("stage 2 (pid 102"), failure
    assert "SIGKILL" in failure


def test_an_exit_known_but_unreported_is_waited_for(tmp_path: Path, monkeypatch:
                                                    pytest.MonkeyPatch) -> None:
    """Past CAUSE_WAIT_S while a worker's pidfd says it exited: its status is awaited."""
    monkeypatch.setattr(launch, "CAUSE_WAIT_S", 0.05)
    procs = [LateProc(100, 1, 0.0), LateProc(101, -9, 0.5, exited_early=True)]
    la = _launcher(tmp_path, procs, [PEER_GONE, None])
    assert _judge(la).startswith("stage 1 (pid 101")


class PumpedProc(LateProc):
    """Forked by the zygote that forked the others: its status lands right after this
    pass read it as running (a later worker's poll pumped the zygote)."""

    def __init__(self, pid: int, code: int) -> None:
        super().__init__(pid, code, 1e9)
        self._polls = 0

    def poll(self) -> int | None:
        self._polls += 1
        if self._polls == 2:
            self._at = 0.0
        return super().poll()


class ReportedMidCheck(LateProc):
    """An agent's report lands (on its own thread) while the launcher asks whether the
    worker exited unreported: the answer is no, its status is in."""

    def exited_unreported(self) -> bool:
        self._at = 0.0
        self.returncode = self._code
        return False


def test_a_status_landing_during_the_pass_is_judged_with(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    # stage 0 SIGKILLed; its status lands only after this pass read stage 0 as running,
    # while stage 1 (which lost its peer) is polled: no wait at all would judge stage 1
    monkeypatch.setattr(launch, "CAUSE_WAIT_S", 0.0)
    late = ReportedMidCheck(100, -9, 1e9)
    procs: list[LateProc] = [late, LateProc(101, 1, 0.0)]
    la = _launcher(tmp_path, procs, [None, PEER_GONE])
    failure = _judge(la)
    assert failure.startswith("stage 0 (pid 100"), failure
    assert "SIGKILL" in failure


def test_a_status_pumped_by_another_workers_poll_is_the_cause(tmp_path: Path,
                                                               monkeypatch:
                                                               pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launch, "CAUSE_WAIT_S", 0.0)
    procs: list[LateProc] = [PumpedProc(99, -9), LateProc(100, 1, 0.0)]
    la = _launcher(tmp_path, procs, [None, PEER_GONE])
    failure = _judge(la)
    assert failure.startswith("stage 0 (pid 99"), failure


def test_lost_peers_with_no_other_cause_are_judged_after_the_wait(tmp_path: Path,
                                                                   monkeypatch:
                                                                   pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launch, "CAUSE_WAIT_S", 0.3)
    procs = [LateProc(100, 1, 0.0), LateProc(101, None, 0.0)]  # stage 1 lives on
    la = _launcher(tmp_path, procs, [PEER_GONE, None])
    t0 = time.monotonic()
    failure = _judge(la)
    assert time.monotonic() - t0 >= 0.3  # it waited for a cause that never came
    assert failure.startswith("stage 0 (pid 100") and "Connection closed by peer" in failure
    assert procs[1].signals[:1] == [signal.SIGTERM]  # the rest is stopped, as before
    la.poll()
    assert la.jobs["j"].done


def test_every_exit_in_judges_at_once(tmp_path: Path) -> None:
    procs = [LateProc(100, 1, 0.0), LateProc(101, 1, 0.0)]
    la = _launcher(tmp_path, procs, [PEER_GONE, PEER_GONE])
    la.poll()  # nothing more can come: no wait
    assert str(la.jobs["j"].failure).startswith("stage 0 (pid 100")
