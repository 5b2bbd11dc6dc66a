"""CPU isolation (testbed.emu.cpuset): the split, the choice, and pinning only the
processes the run recorded."""

from __future__ import annotations

import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from testbed.emu import cpuset, priority
from testbed.emu.state import ProcRecord, proc_start_ticks


def test_split_gives_the_network_the_upper_half_and_the_workers_the_rest() -> None:
    assert cpuset.split([0]) is None and cpuset.split([]) is None
    assert cpuset.split([1, 0]) == cpuset.Split(network=(1,), workers=(0,))
    assert cpuset.split([0, 1, 2]) == cpuset.Split(network=(2,), workers=(0, 1))
    assert cpuset.split(range(4)) == cpuset.Split(network=(2, 3), workers=(0, 1))
    assert cpuset.split([3, 5, 5, 9]) == cpuset.Split(network=(9,), workers=(3, 5))
    got = cpuset.split([0, 1])
    assert got is not None and got.as_record(4) == {
        "network_cpus": [1], "worker_cpus": [0], "network_processes": 4}


def test_choice_and_when_a_split_is_wanted(monkeypatch: pytest.MonkeyPatch,
                                           caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.delenv(cpuset.ENV, raising=False)
    monkeypatch.delenv(priority.ENV, raising=False)
    monkeypatch.delenv("LIGHTPIPE_FORWARDER_RT", raising=False)
    assert cpuset.choice() == "auto"
    monkeypatch.setenv(cpuset.ENV, "sideways")
    assert cpuset.choice() == "auto" and "'sideways' is not one of auto, off" in caplog.text
    monkeypatch.setenv(cpuset.ENV, "auto")
    monkeypatch.setattr(cpuset.os, "getpriority", lambda *_: 0)  # the suite's lanes: 0-10
    many = len(os.sched_getaffinity(0)) >= 2
    assert (cpuset.wanted(True) is not None) == many
    assert cpuset.wanted(False) is None  # no CPU workers: the network is left as it is
    if many:  # a run started in the background (positive nice) is left as it is
        with monkeypatch.context() as m:
            m.setattr(cpuset.os, "getpriority", lambda *_: 10)
            assert cpuset.wanted(True) is None
        assert cpuset.wanted(True) is not None  # back at nice 0
    monkeypatch.setenv(priority.ENV, "inherit")  # make test's background emulations
    assert cpuset.wanted(True) is None
    monkeypatch.setenv(priority.ENV, "realtime")
    monkeypatch.setenv(cpuset.ENV, " OFF ")
    assert cpuset.wanted(True) is None


def test_cpu_list_names_what_is_wrong() -> None:
    import argparse

    assert cpuset.cpu_list("0,3") == (0, 3)
    for bad, words in (("x", "not a list"), ("", "not a list"), ("-1", "0..4095"),
                       ("4096", "0..4095")):
        with pytest.raises(argparse.ArgumentTypeError, match=words):
            cpuset.cpu_list(bad)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs")
def test_only_the_recorded_network_processes_are_pinned_with_their_threads() -> None:
    """Pinned: a recorded forwarder (every thread, and one it starts later), not a process
    of another role, nor one whose start time is not the recorded one (a reused PID)."""
    cpus = sorted(os.sched_getaffinity(0))
    child = ("import os, sys, threading, time\n"
             "threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n"
             "sys.stdout.write('up\\n'); sys.stdout.flush(); sys.stdin.readline()\n"
             "t = threading.Thread(target=time.sleep, args=(60,), daemon=True); t.start()\n"
             "print(sorted(os.sched_getaffinity(0)), sorted(os.sched_getaffinity(t.native_id)),"
             " flush=True)\n")
    procs = [subprocess.Popen([sys.executable, "-c", child], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True) for _ in range(3)]
    try:
        for p in procs:
            assert p.stdout is not None and p.stdout.readline() == "up\n"
        ticks = [proc_start_ticks(p.pid) for p in procs]
        assert all(t is not None for t in ticks)
        state = SimpleNamespace(procs=[
            ProcRecord(procs[0].pid, ticks[0] or 0, "forwarder", "A-B"),
            ProcRecord(procs[1].pid, ticks[1] or 0, "prometheus", "prometheus"),
            ProcRecord(procs[2].pid, (ticks[2] or 0) + 1, "ovs-vswitchd", "")])
        assert cpuset.isolate_network(state, [cpus[-1]]) == 1
        for p in procs:
            tids = os.listdir(f"/proc/{p.pid}/task")
            got = {tuple(sorted(os.sched_getaffinity(int(t)))) for t in tids}
            assert got == ({(cpus[-1],)} if p is procs[0] else {tuple(cpus)}), (p.pid, got)
        out, _ = procs[0].communicate("\n", timeout=30)
        assert out.strip() == f"[{cpus[-1]}] [{cpus[-1]}]"  # a thread started later too
    finally:
        for p in procs:
            p.kill()
            p.wait()
