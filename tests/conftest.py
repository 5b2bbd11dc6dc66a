"""Shared pytest fixtures: bundled scenarios as dicts, an in-process CLI runner and the
quick reproductions, each run once per session for every test that reads it."""

from __future__ import annotations

import copy
import fcntl
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from testbed.cli.main import main
from tests.cpulog import pytest_runtest_protocol  # noqa: F401  (LIGHTPIPE_TEST_CPU_LOG)

# No run guardians (testbed.emu.guardian) unless a test asks for one: the kill -9 tests
# check what `lightpipe clean` finds after a crash, which a guardian would clean first.
os.environ.setdefault("LIGHTPIPE_GUARDIAN", "0")

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ROOT / "scenarios"


@dataclass
class CliResult:
    code: int
    out: str
    err: str


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]):  # type: ignore[no-untyped-def]
    """Run `lightpipe ARGS...` in-process and capture its exit code and output."""

    def run(*argv: str) -> CliResult:
        code = main(list(argv))
        captured = capsys.readouterr()
        return CliResult(code, captured.out, captured.err)

    return run


@dataclass(frozen=True)
class Reproduction:
    """A finished `lightpipe reproduce NAME --quick -q --report` run: read it, never write."""

    out: Path
    code: int
    stdout: str
    stderr: str


@pytest.fixture(scope="session")
def reproduced(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Reproduction]:
    """reproduced(NAME, "key=value", ...): `lightpipe reproduce NAME --quick -q --report
    --set key=value ...`, run once per session for every test that reads it (several
    files check one reproduction: its tables, its report; each used to run it again).
    Under pytest-xdist the workers share the runs: the first takes a lock file and runs
    it, the others wait on the lock and read its result."""
    base = tmp_path_factory.getbasetemp()
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "reproductions"
    root.mkdir(exist_ok=True)

    def get(name: str, *sets: str) -> Reproduction:
        key = re.sub(r"[^A-Za-z0-9_.=-]", "_", "-".join([name, *sets]))
        out, done = root / key, root / f"{key}.json"
        with open(root / f"{key}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not done.exists():
                argv = ["reproduce", name, "--quick", "-q", "--report", "--out", str(out)]
                for s in sets:
                    argv += ["--set", s]
                r = subprocess.run([sys.executable, "-c",
                                    "from testbed.cli.main import entry; entry()", *argv],
                                   cwd=ROOT, capture_output=True, text=True, timeout=900)
                tmp = done.with_suffix(".tmp")
                tmp.write_text(json.dumps({"code": r.returncode, "stdout": r.stdout,
                                           "stderr": r.stderr}))
                tmp.replace(done)
            res = json.loads(done.read_text())
        return Reproduction(out, res["code"], res["stdout"], res["stderr"])

    return get


def load_yaml(name: str) -> dict[str, Any]:
    return copy.deepcopy(yaml.safe_load((SCENARIOS / name).read_text()))


@pytest.fixture
def quickstart() -> dict[str, Any]:
    return load_yaml("quickstart.yaml")


@pytest.fixture
def ppjobs() -> dict[str, Any]:
    return load_yaml("pp-jobs.yaml")


# Root tests that build no emulated network and time no packets (second users, file
# modes, `vagrant validate`): they may run beside other tests under xdist.
ROOT_BUT_NOT_TIMED = frozenset({"test_security_report", "test_security_fault",
                                "test_security_monitor", "test_sockbuf", "test_emu_priority",
                                "test_vagrant", "test_tcp_tuning_root"})

# Root tests that build emulated networks but assert no timing (that a run completes,
# what it records, what it leaves behind, what `clean` does, what a report shows): their
# runs only warn when an RTT or a probe's delay drifts (emulation.rtt_check auto,
# user-space links), each uses names and state of its own, and the soak counts only its
# own runs. `make test` runs them one at a time in a lane of their own, beside the timed
# ones.
ROOT_UNTIMED = frozenset({"test_records_emu_kill", "test_rough_edges", "test_monitor_emu",
                          "test_report", "test_soak", "test_faultctl",
                          "test_security_clean", "test_readme"})


def _needs_root(item: pytest.Item) -> bool:
    """Marked `root`, or skipped unless root (a skipif whose reason names root)."""
    if item.get_closest_marker("root") is not None:
        return True
    return any("root" in str(m.kwargs.get("reason", "")) for m in item.iter_markers("skipif"))


def pytest_itemcollected(item: pytest.Item) -> None:
    """Tiers: `root` on every test that needs root (so `-m "not root and not vm"` is the
    fast tier, `make test-fast`), `serial` on those that time packets, `rootlane` on the
    root tests that build networks but time nothing, and `stress` on the root and
    controller tests (`make test-stress` runs those again and again with a core kept
    busy)."""
    module = item.nodeid.split("::", 1)[0].rsplit("/", 1)[-1].removesuffix(".py")
    root = _needs_root(item)
    if root and item.get_closest_marker("root") is None:
        item.add_marker(pytest.mark.root)
    if root and (module in ROOT_UNTIMED or item.get_closest_marker("untimed") is not None):
        item.add_marker(pytest.mark.rootlane)
    elif root and module not in ROOT_BUT_NOT_TIMED:
        # `make test` (scripts/test.sh) runs the `serial` tests one at a time in a lane of
        # their own: they time packets, and two emulations at once on a 2-core machine
        # would measure each other. The `rootlane` tests run one at a time beside them
        # (at nice 5, their network elements not in the real-time class: test.sh),
        # the rest on pytest-xdist workers at nice 10.
        item.add_marker(pytest.mark.serial)
    if root or module.startswith("test_controller_"):
        item.add_marker(pytest.mark.stress)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The longest tests first (_longest_first); every test's pytest-timeout (its own
    `timeout` mark, else pyproject's `timeout`)
    scaled as its deadlines are (tests.waiting.time_scale: a machine slower than the
    reference gets proportionally longer): the whole-test limit only stops a hang, and a
    fixed one killed a test whose scaled steps were all within their own deadlines
    (test_readme_slow_commands, 900 s, on a machine 1.7x slower, 2026-11-28)."""
    from tests.waiting import time_scale

    _longest_first(items)
    scale = time_scale()
    if scale == 1.0:
        return
    try:
        default = float(config.getini("timeout") or 0)
    except (ValueError, TypeError):
        default = 0.0
    for item in items:
        mark = item.get_closest_marker("timeout")
        base = default
        kwargs: dict[str, Any] = {}
        if mark is not None:
            kwargs = {k: v for k, v in mark.kwargs.items() if k != "timeout"}
            base = float(mark.args[0] if mark.args else mark.kwargs.get("timeout", 0) or 0)
        if base > 0:
            item.add_marker(pytest.mark.timeout(base * scale, **kwargs), append=False)


def _cost_s(item: pytest.Item) -> float:
    mark = item.get_closest_marker("cost")
    return float(mark.args[0]) if mark is not None and mark.args else 0.0


def _longest_first(items: list[pytest.Item]) -> None:
    """Tests marked `cost(seconds)` first, the longest first; the rest keep their order
    (a stable sort). With `--dist load` and small chunks (scripts/test.sh) that is longest
    processing time first. Measured: the README's routing reproduction, started last, was
    the parallel lane's tail (CI of d340887, lane 1,680 s); started first it still was (CI
    of 6dcc62a, 1,219 s of the lane's 1,704 s), being CPU-starved at nice 10 rather than
    late."""
    items.sort(key=lambda it: -_cost_s(it))


_THREADS_LEFT: list[tuple[str, list[str]]] = []  # (test, threads it left running)


@pytest.fixture(autouse=True)
def _test_window(request: pytest.FixtureRequest) -> Any:
    """Under `make test`, each test's start and end go to LIGHTPIPE_TEST_WINDOWS, so
    that a namespace left behind can be traced to the tests running when it was made
    (tests/leaks.py, run by scripts/test.sh after the lanes)."""
    import os
    import time

    path = os.environ.get("LIGHTPIPE_TEST_WINDOWS")
    t0 = time.time()
    yield
    if path:
        from tests.leaks import record_window

        record_window(path, request.node.nodeid, t0, time.time())


@pytest.fixture(autouse=True)
def _signal_dispositions_intact() -> Any:
    """After each test, check that the kernel's SIGINT/SIGTERM disposition still matches
    Python's handler (a C library may reset it: tests/sigstate.py) and that the main
    thread does not block them (a signal then goes to another thread, and a held run's
    signal.pause() waited for it for ever), and put Python's handler back if not, so
    that the rest of the session is not poisoned: the class of bug
    where a later Ctrl-C or SIGTERM kills a process without its clean-up. The change may
    come from a thread an earlier test left running, so the test named is where it was
    seen, not always its cause: a failure under `make test` and `make test-stress`
    (LIGHTPIPE_TEST_STRICT_SIGNALS=1, set by scripts/test.sh and scripts/stress.py), a
    warning in a plain pytest run."""
    import os
    import threading
    import warnings

    from tests.sigstate import SignalDispositionWarning, blocked, mismatches, resync, unblock

    before = set(threading.enumerate())  # (objects: an ended thread's ident is reused)
    yield
    if threading.current_thread() is not threading.main_thread():
        return
    left = sorted(t.name for t in threading.enumerate() if t not in before)
    if left:  # suspects, should a later test see a disposition change
        _THREADS_LEFT.append((os.environ.get("PYTEST_CURRENT_TEST", "?").split(" ")[0],
                              left))
        del _THREADS_LEFT[:-5]
    bad = mismatches() + blocked()
    if bad:
        resync()
        unblock()
        what = "signal disposition changed under Python: " + "; ".join(bad)
        alive = sorted(t.name for t in threading.enumerate())
        what += f" (threads alive: {alive}; the last tests that left threads: "
        what += "; ".join(f"{t} {names}" for t, names in _THREADS_LEFT) + ")"
        if os.environ.get("LIGHTPIPE_TEST_STRICT_SIGNALS") == "1":
            pytest.fail(what, pytrace=False)
        warnings.warn(what, SignalDispositionWarning, stacklevel=1)
