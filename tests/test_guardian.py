"""The run guardian (testbed.emu.guardian): kill -9 of a run's owner cleans what the run
recorded, with no command; a run taken down by its owner, or a guardian turned off, leaves
the guardian nothing to do. Real processes, no root (no namespaces: the root case with a
whole emulated network is in tests/test_emu_net.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from testbed.emu.state import proc_start_ticks
from tests.proclist import pids_with_cmdline
from tests.waiting import wait_until

REPO = Path(__file__).resolve().parent.parent

# A run's owner: makes the run's state (new_state starts the guardian), records a child
# process as the run's, says so, then waits (killed by the test) or takes the run down.
OWNER = """
import shutil, subprocess, sys, time
from testbed.emu.state import new_state
st = new_state(sys.argv[1])
child = subprocess.Popen(["sleep", "300"])
st.add_proc(child.pid, "forwarder")
print(child.pid, flush=True)
if sys.argv[2] == "down":
    child.kill(); child.wait()
    shutil.rmtree(st.state_dir)
    print("down", flush=True)
time.sleep(300)
"""


def owner(tmp_path: Path, prefix: str, how: str, guardian: str = "1"
          ) -> tuple[subprocess.Popen[str], int]:
    env = {**os.environ, "LIGHTPIPE_STATE_DIR": str(tmp_path / "state"),
           "LIGHTPIPE_GUARDIAN": guardian}
    proc = subprocess.Popen([sys.executable, "-c", OWNER, prefix, how], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert proc.stdout is not None
    return proc, int(proc.stdout.readline())


def guardians(state_dir: Path) -> list[int]:
    """PIDs of the guardians watching state_dir (by their command line)."""
    return pids_with_cmdline(f"testbed.emu.guardian\0{state_dir}\0".encode())


def stop(proc: subprocess.Popen[str], *pids: int) -> None:
    for pid in pids:
        if proc_start_ticks(pid) is not None:
            os.kill(pid, signal.SIGKILL)
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=10)


def test_kill_9_of_the_owner_cleans_the_run(tmp_path: Path) -> None:
    proc, child = owner(tmp_path, "lp9a01", "hold")
    state_dir = tmp_path / "state" / "lp9a01"
    try:
        wait_until(lambda: guardians(state_dir), "the run's guardian", timeout_s=30)
        assert proc_start_ticks(child) is not None
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        wait_until(lambda: not state_dir.exists(), "the run's state removed", timeout_s=30)
        wait_until(lambda: proc_start_ticks(child) is None, "the run's process killed",
                   timeout_s=30)
        wait_until(lambda: not guardians(state_dir), "the guardian gone", timeout_s=30)
        line = (tmp_path / "state" / "lp9a01.guardian.log").read_text()
        assert "the owner of run lp9a01 died without taking it down" in line
        assert "'killed': 1" in line and "skipped" not in line, line
    finally:
        stop(proc, child)


def test_a_run_taken_down_by_its_owner_ends_its_guardian(tmp_path: Path) -> None:
    proc, child = owner(tmp_path, "lp9a02", "down")
    state_dir = tmp_path / "state" / "lp9a02"
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "down"
        # The owner lives on (as a process that runs networks one after another does).
        wait_until(lambda: not guardians(state_dir), "the guardian gone after the run's "
                   "take-down", timeout_s=30)
        assert proc.poll() is None
        assert not (tmp_path / "state" / "lp9a02.guardian.log").exists()
    finally:
        stop(proc, child)


def test_a_new_run_in_the_same_directory_is_not_the_guardians(tmp_path: Path) -> None:
    """A guardian watches one directory (its device and inode): the directory removed and
    made again under the same name is another run's, and the guardian leaves it."""
    proc, child = owner(tmp_path, "lp9a03", "hold")
    state_dir = tmp_path / "state" / "lp9a03"
    try:
        wait_until(lambda: guardians(state_dir), "the run's guardian", timeout_s=30)
        keep = tmp_path / "keep"
        keep.mkdir(mode=0o700)
        (keep / "state.json").write_bytes((state_dir / "state.json").read_bytes())
        os.rename(state_dir, tmp_path / "gone")
        os.rename(keep, state_dir)
        wait_until(lambda: not guardians(state_dir), "the guardian gone", timeout_s=30)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        assert (state_dir / "state.json").exists()
        assert proc_start_ticks(child) is not None
        assert not (tmp_path / "state" / "lp9a03.guardian.log").exists()
    finally:
        stop(proc, child)


@pytest.mark.parametrize("setting", ["0"])
def test_no_guardian_when_turned_off(tmp_path: Path, setting: str) -> None:
    proc, child = owner(tmp_path, "lp9a04", "hold", guardian=setting)
    state_dir = tmp_path / "state" / "lp9a04"
    try:
        assert not guardians(state_dir)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        assert state_dir.exists() and proc_start_ticks(child) is not None
    finally:
        stop(proc, child)


def test_a_guardian_without_a_run_exits_and_writes_nothing(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "testbed.emu.guardian",
                        str(tmp_path / "nowhere" / "lp9a05"), "1:2"], cwd=REPO,
                       capture_output=True)
    assert r.returncode == 0  # the run is gone: nothing to do
    assert not (tmp_path / "nowhere").exists()
    (tmp_path / "lp9a06").mkdir()  # a directory, but not the one named (device, inode)
    r = subprocess.run([sys.executable, "-m", "testbed.emu.guardian",
                        str(tmp_path / "lp9a06"), "1:2"], cwd=REPO, capture_output=True)
    assert r.returncode == 0 and not (tmp_path / "lp9a06.guardian.log").exists()
    for bad in ([], [str(tmp_path)], [str(tmp_path), "1:x"], [str(tmp_path), "1:2", "3"]):
        r = subprocess.run([sys.executable, "-m", "testbed.emu.guardian", *bad], cwd=REPO,
                           capture_output=True, text=True)
        assert r.returncode == 2 and "usage" in r.stderr
