"""LIGHTPIPE_EMU_PRIORITY: the emulated network's processes in the real-time class, at
nice -10, or left as started (the background lane of `make test`)."""

from __future__ import annotations

import json
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
                 "u = threading.Thread(target=lambda: late.append((os.sched_getscheduler(0), "
                 "os.getpriority(os.PRIO_PROCESS, 0))), daemon=True); u.start(); u.join()\n"
                 "print(got, os.sched_getscheduler(0), os.sched_getparam(0).sched_priority, "
                 "os.sched_getscheduler(t.native_id), late[0][0], "
                 "os.getpriority(os.PRIO_PROCESS, 0), "
                 "os.getpriority(os.PRIO_PROCESS, t.native_id), late[0][1], flush=True)\n")


@pytest.mark.skipif(not ROOT, reason="SCHED_RR and a negative nice need root")
@pytest.mark.parametrize("env_value", ["realtime", "nice", "inherit"])
def test_the_controller_gets_its_class_on_every_thread(env_value: str) -> None:
    """The SDN controller (raise_control_priority) follows the network's choice: SCHED_RR
    at CONTROL_RT_PRIORITY (nice -10 for its compute threads) on the thread that ran
    before and on one started after; nice -10 only; or left as started."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("LIGHTPIPE_FORWARDER_RT", priority.CONTROL_ENV)}
    env[priority.ENV] = env_value
    out = subprocess.run([sys.executable, "-c", CONTROL_CHILD], capture_output=True,
                         text=True, env=env, timeout=120, check=True).stdout.split()
    got, policy, rt_prio, before, after, *nices = out
    assert got == env_value
    want_policy = os.SCHED_RR if env_value == "realtime" else os.SCHED_OTHER
    assert [int(policy), int(before), int(after)] == [want_policy] * 3
    assert int(rt_prio) == (priority.CONTROL_RT_PRIORITY if env_value == "realtime" else 0)
    want = os.nice(0) if env_value == "inherit" else priority.NICE
    assert [int(n) for n in nices] == [want] * 3


COMPUTE_CHILD = ("import json, os, threading\n"
                 "from testbed.emu import priority\n"
                 "os.setpriority(os.PRIO_PROCESS, 0, -10)\n"
                 "os.sched_setscheduler(0, os.SCHED_RR, os.sched_param(3))\n"
                 "seen = []\n"
                 "def look(): seen.append((os.sched_getscheduler(0), "
                 "os.getpriority(os.PRIO_PROCESS, 0)))\n"
                 "with priority.compute_thread():\n"
                 "    look()\n"
                 "    u = threading.Thread(target=look); u.start(); u.join()\n"
                 "look()\n"
                 "print(json.dumps([seen, os.sched_getparam(0).sched_priority]), flush=True)\n"
                 "os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))\n"
                 "with priority.compute_thread():\n"
                 "    look()\n"
                 "print(json.dumps(seen[-1]), flush=True)\n")


@pytest.mark.skipif(not ROOT, reason="SCHED_RR and a negative nice need root")
def test_compute_thread_leaves_the_realtime_class_for_its_body() -> None:
    """Inside compute_thread a SCHED_RR thread runs in the ordinary class at its nice value,
    and so do the threads it starts; after it, the thread is back in SCHED_RR at its old
    priority. An ordinary thread is left as it was."""
    out = subprocess.run([sys.executable, "-c", COMPUTE_CHILD], capture_output=True,
                         text=True, timeout=120, check=True).stdout.splitlines()
    seen, rt_prio = json.loads(out[0])
    assert seen == [[os.SCHED_OTHER, -10], [os.SCHED_OTHER, -10], [os.SCHED_RR, -10]]
    assert rt_prio == 3
    assert json.loads(out[1]) == [os.SCHED_OTHER, -10]


def test_compute_thread_is_harmless_without_the_right() -> None:
    """Without SCHED_RR (any user) the body just runs."""
    ran = []
    with priority.compute_thread():
        ran.append(os.sched_getscheduler(0))
    assert ran and os.sched_getscheduler(0) == ran[0]


def test_the_controllers_own_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    """LIGHTPIPE_CONTROL_PRIORITY overrides; unset, the controller follows the network."""
    monkeypatch.delenv("LIGHTPIPE_FORWARDER_RT", raising=False)
    monkeypatch.delenv(priority.CONTROL_ENV, raising=False)
    monkeypatch.setenv(priority.ENV, "realtime")
    assert priority.control_choice() == "realtime"
    monkeypatch.setenv(priority.ENV, "nice")
    assert priority.control_choice() == "nice"
    monkeypatch.setenv(priority.ENV, "inherit")
    assert priority.control_choice() == "inherit"
    monkeypatch.setenv(priority.CONTROL_ENV, "nice")
    assert priority.control_choice() == "nice"
    monkeypatch.setenv(priority.ENV, "realtime")
    monkeypatch.setenv(priority.CONTROL_ENV, "inherit")
    assert priority.control_choice() == "inherit"


WORKER_CHILD = ("import json, os, sys, threading, time\n"
                "from testbed.emu import priority\n"
                "got = priority.raise_worker_priority(sys.argv[1])\n"
                "t = threading.Thread(target=time.sleep, args=(30,), daemon=True); t.start()\n"
                "slices = [open(f'/proc/self/task/{i}/sched').read().split('se.slice')[1]"
                ".split(':')[1].split()[0] if 'se.slice' in open(f'/proc/self/task/{i}/sched')"
                ".read() else None for i in (threading.get_native_id(), t.native_id)]\n"
                "print(json.dumps({'got': got, 'policy': os.sched_getscheduler(0), "
                "'nice': [os.getpriority(os.PRIO_PROCESS, i) for i in "
                "(0, t.native_id)], 'slices': slices}), flush=True)\n")


def _worker(compute: str, env_value: str | None, nice: int = 0) -> dict[str, object]:
    """The child started at `nice` (absolute: the suite's lanes run at 0, 5 and 10)."""
    env = {k: v for k, v in os.environ.items()
           if k not in (priority.ENV, "LIGHTPIPE_FORWARDER_RT")}
    if env_value is not None:
        env[priority.ENV] = env_value
    out = subprocess.run([sys.executable, "-c", WORKER_CHILD, compute], capture_output=True,
                         text=True, env=env, timeout=120, check=True,
                         preexec_fn=lambda: os.setpriority(os.PRIO_PROCESS, 0, nice))
    return json.loads(out.stdout)


@pytest.mark.skipif(not ROOT, reason="a negative nice and SCHED_RR need root")
def test_a_cpu_worker_goes_ahead_of_ordinary_processes_and_its_threads_with_it() -> None:
    """A shadow CPU worker: nice WORKER_NICE and, where the kernel keeps a task's own slice
    (Linux >= 6.12), WORKER_SLICE_NS, on the threads it starts after too; a stand-in
    accelerator in the real-time class; `inherit` leaves either as started."""
    cpu = _worker("cpu", None)
    got = cpu["got"]
    assert got["priority"] == "nice" and got["nice"] == priority.WORKER_NICE
    assert cpu["policy"] == os.SCHED_OTHER and cpu["nice"] == [priority.WORKER_NICE] * 2
    if got["slice_us"] is not None:  # taken: the kernel says so for both threads
        assert got["slice_us"] == priority.WORKER_SLICE_NS / 1000
        assert cpu["slices"] == [str(priority.WORKER_SLICE_NS)] * 2
    device = _worker("device", None)
    assert device["got"] == {"priority": "realtime"} and device["policy"] == os.SCHED_RR
    for compute in ("cpu", "device"):
        left = _worker(compute, "inherit")
        assert left["got"] == {"priority": "inherit"} and left["policy"] == os.SCHED_OTHER
        assert left["nice"] == [0, 0]
    # started in the background (the suite's parallel lane at nice 10): ahead of nothing,
    # or it takes the CPU from the measured lane at nice 0 (two red CI runs of stop 56)
    background = _worker("cpu", None, nice=10)
    assert background["got"] == {"priority": "inherit", "nice": 10, "slice_us": None}
    assert background["nice"] == [10, 10]
    if got["slice_us"] is not None:
        assert background["slices"] != [str(priority.WORKER_SLICE_NS)] * 2
