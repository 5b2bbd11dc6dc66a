"""LIGHTPIPE_EMU_PRIORITY: the emulated network's processes in the real-time class, at
nice -10, or left as started (the background lane of `make test`)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from testbed.emu import priority

ROOT = os.geteuid() == 0

CHILD = ("import os, sys, threading, time\n"
         "from testbed.emu import priority\n"
         "t = threading.Thread(target=time.sleep, args=(30,), daemon=True); t.start()\n"
         "print(priority.raise_priority(int(sys.argv[1]) if sys.argv[1] != 'self' else "
         "os.getpid(), 7), flush=True)\n"
         "print(os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, 0), "
         "os.sched_getscheduler(t.native_id), flush=True)\n")


def _run(env_value: str | None, who: str = "self",
         extra: dict[str, str] | None = None) -> tuple[str, list[int]]:
    env = {k: v for k, v in os.environ.items()
           if k not in (priority.ENV, "LIGHTPIPE_FORWARDER_RT")}
    if env_value is not None:
        env[priority.ENV] = env_value
    env.update(extra or {})
    out = subprocess.run(["nice", "-n", "5", sys.executable, "-c", CHILD, who],
                         capture_output=True, text=True, env=env, timeout=120, check=True)
    got, nums = out.stdout.splitlines()
    return got, [int(x) for x in nums.split()]


def test_choice_reads_the_variable_and_the_older_switch(monkeypatch: pytest.MonkeyPatch,
                                                        caplog: pytest.LogCaptureFixture
                                                        ) -> None:
    monkeypatch.delenv(priority.ENV, raising=False)
    monkeypatch.delenv("LIGHTPIPE_FORWARDER_RT", raising=False)
    assert priority.choice() == "realtime"
    monkeypatch.setenv("LIGHTPIPE_FORWARDER_RT", "0")
    assert priority.choice() == "nice"
    monkeypatch.setenv(priority.ENV, " Inherit ")
    assert priority.choice() == "inherit"  # the new variable wins
    monkeypatch.setenv(priority.ENV, "turbo")
    assert priority.choice() == "realtime"
    assert "LIGHTPIPE_EMU_PRIORITY='turbo' is not one of realtime, nice, inherit" in caplog.text


def test_inherit_leaves_the_process_as_started() -> None:
    got, (policy, nice, _thread) = _run("inherit")
    assert got == "inherit" and policy == os.SCHED_OTHER and nice == min(19, os.nice(0) + 5)


@pytest.mark.skipif(not ROOT, reason="SCHED_RR and a negative nice need root")
def test_realtime_and_nice_as_root() -> None:
    # every thread of another process, the caller's only when it names itself with 0
    got, (policy, _nice, thread) = _run("realtime")
    assert got == "realtime" and policy == os.SCHED_RR and thread == os.SCHED_RR
    got, (policy, _nice, thread) = _run(None, who="0")
    assert got == "realtime" and policy == os.SCHED_RR and thread == os.SCHED_OTHER
    got, (policy, nice, _thread) = _run("nice")
    assert got == "nice" and policy == os.SCHED_OTHER and nice == priority.NICE
    got, (_policy, nice, _thread) = _run(None, extra={"LIGHTPIPE_FORWARDER_RT": "0"})
    assert got == "nice" and nice == priority.NICE


CONTROL_CHILD = ("import os, threading, time\n"
                 "from testbed.emu import priority\n"
                 "t = threading.Thread(target=time.sleep, args=(30,), daemon=True); t.start()\n"
                 "got = priority.raise_control_priority(os.getpid())\n"
                 "late = []\n"
                 "u = threading.Thread(target=lambda: late.append(os.getpriority("
                 "os.PRIO_PROCESS, 0)), daemon=True); u.start(); u.join()\n"
                 "print(got, os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, 0), "
                 "os.getpriority(os.PRIO_PROCESS, t.native_id), late[0], flush=True)\n")


@pytest.mark.skipif(not ROOT, reason="a negative nice needs root")
@pytest.mark.parametrize("env_value", ["realtime", "nice", "inherit"])
def test_the_controller_gets_nice_on_every_thread_never_realtime(env_value: str) -> None:
    """The SDN controller (raise_control_priority): nice -10 on the thread that ran before
    and on one started after, never SCHED_RR; left as started under `inherit`."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("LIGHTPIPE_FORWARDER_RT", priority.CONTROL_ENV)}
    env[priority.ENV] = env_value
    out = subprocess.run([sys.executable, "-c", CONTROL_CHILD], capture_output=True,
                         text=True, env=env, timeout=120, check=True).stdout.split()
    got, policy, *nices = out
    assert int(policy) == os.SCHED_OTHER
    want = os.nice(0) if env_value == "inherit" else priority.NICE
    assert got == ("inherit" if env_value == "inherit" else "nice")
    assert [int(n) for n in nices] == [want] * 3


def test_the_controllers_own_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    """LIGHTPIPE_CONTROL_PRIORITY overrides; unset, the controller follows the network."""
    monkeypatch.delenv("LIGHTPIPE_FORWARDER_RT", raising=False)
    monkeypatch.delenv(priority.CONTROL_ENV, raising=False)
    monkeypatch.setenv(priority.ENV, "realtime")
    assert priority.control_choice() == "nice"
    monkeypatch.setenv(priority.ENV, "inherit")
    assert priority.control_choice() == "inherit"
    monkeypatch.setenv(priority.CONTROL_ENV, "nice")
    assert priority.control_choice() == "nice"
    monkeypatch.setenv(priority.ENV, "realtime")
    monkeypatch.setenv(priority.CONTROL_ENV, "inherit")
    assert priority.control_choice() == "inherit"
