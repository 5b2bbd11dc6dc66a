"""tests/cpulog.py: a test's CPU, its own and its reaped children's, lands in the log
(LIGHTPIPE_TEST_CPU_LOG), and the summary sums it per lane."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.cpulog import summarise

ROOT = Path(__file__).resolve().parent.parent

SPIN = '''
import subprocess, sys, time

def test_spins_itself():
    end = time.process_time() + 0.3
    while time.process_time() < end:
        pass

def test_spins_a_child():
    subprocess.run([sys.executable, "-c",
                    "import time\\nend = time.process_time() + 0.3\\n"
                    "while time.process_time() < end: pass"], check=True)
'''


def test_each_tests_cpu_is_logged_and_summed(tmp_path: Path) -> None:
    (tmp_path / "test_spin.py").write_text(SPIN)
    log = tmp_path / "cpu.jsonl"
    env = {**os.environ, "LIGHTPIPE_TEST_CPU_LOG": str(log), "LIGHTPIPE_TEST_LANE": "mine"}
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "tests.cpulog",
                          "-p", "no:cacheprovider", str(tmp_path / "test_spin.py")],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout[-2000:]
    rows = {r["test"].rsplit("::", 1)[1]: r for r in map(json.loads, log.read_text().splitlines())}
    assert set(rows) == {"test_spins_itself", "test_spins_a_child"}
    own = rows["test_spins_itself"]
    assert own["self_s"] >= 0.25 and own["lane"] == "mine"
    assert rows["test_spins_a_child"]["children_s"] >= 0.25
    text = summarise(list(rows.values()), top=1)
    assert "mine           2" in text and "test_spins_" in text
    # without the variable, nothing is written
    log.unlink()
    env.pop("LIGHTPIPE_TEST_CPU_LOG")
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "tests.cpulog", "-p",
                    "no:cacheprovider", str(tmp_path / "test_spin.py")], cwd=ROOT, env=env,
                   capture_output=True, timeout=120, check=True)
    assert not log.exists()
