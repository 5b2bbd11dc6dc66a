"""Hunt flaky tests: run the root, emulation and controller tests N times in a row while
another process keeps one core busy, and report every failure with its test and cause.

    python scripts/stress.py              # 5 rounds of `-m stress` (`make test-stress`)
    python scripts/stress.py --rounds 2 -- tests/test_emu_link.py   # other pytest arguments

By default a round runs the stress tests in two lanes at once, as `make test` does: the
`serial` ones (they time packets) one at a time, and the rest one at a time beside them,
so that with the busy core three processes share a 2-core machine (`--lanes 1`: all one
after another). Explicit pytest arguments run in one lane.

Each round's JUnit XML and pytest output per lane (roundN-LANE.xml, .log) and the summary
(stress.md) go to --out (default runs/stress).
Exit status: 0 when every round passed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import multiprocessing
import os
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("stress")
ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Failure:
    round_no: int
    test: str
    cause: str


def busy_loop() -> None:
    """Keep one core busy until killed (the load a shared CI machine adds)."""
    with contextlib.suppress(OSError):
        os.nice(0)
    x = 0
    while True:
        x = (x * 1103515245 + 12345) & 0x7FFFFFFF


def failures_of(junit: Path, round_no: int) -> tuple[int, list[Failure]]:
    """(tests run, failures and errors) of one round's JUnit XML."""
    if not junit.is_file():
        return 0, [Failure(round_no, "(whole round)", "pytest wrote no JUnit XML")]
    tree = ET.parse(junit)
    found: list[Failure] = []
    total = 0
    for case in tree.iter("testcase"):
        total += 1
        for tag in ("failure", "error"):
            for el in case.findall(tag):
                msg = (el.get("message") or el.text or "").strip().splitlines()
                cause = msg[0][:300] if msg else tag
                found.append(Failure(round_no, f"{case.get('classname')}::{case.get('name')}",
                                     cause))
    return total, found


def lane_selections(pytest_args: list[str], lanes: int) -> dict[str, list[str]]:
    """{file-name suffix: pytest arguments} of the lanes a round runs at once: explicit
    arguments in one lane; else the stress tests, split as `make test` splits them."""
    if pytest_args:
        return {"": list(pytest_args)}
    if lanes == 2:
        return {"-serial": ["-m", "stress and serial", "tests"],
                "-other": ["-m", "stress and not serial", "tests"]}
    return {"": ["-m", "stress", "tests"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--busy", type=int, default=1, help="cores to keep busy (default 1)")
    ap.add_argument("--lanes", type=int, choices=(1, 2), default=2,
                    help="2: serial and other stress tests at once, as make test (default)")
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "stress")
    ap.add_argument("pytest_args", nargs="*",
                    help="pytest arguments after -- (default: -m stress tests)")
    args = ap.parse_args(argv)
    if not 1 <= args.rounds <= 100:
        ap.error(f"--rounds: {args.rounds} is not within 1..100")
    if not 0 <= args.busy <= 64:
        ap.error(f"--busy: {args.busy} is not within 0..64")
    logging.basicConfig(level=logging.INFO, format="stress: %(message)s")
    args.out.mkdir(parents=True, exist_ok=True, mode=0o750)
    lanes = lane_selections(args.pytest_args, args.lanes)
    hogs = [multiprocessing.Process(target=busy_loop, daemon=True) for _ in range(args.busy)]
    for h in hogs:
        h.start()
    all_failures: list[Failure] = []
    lines: list[str] = []
    try:
        for r in range(1, args.rounds + 1):
            t0 = time.monotonic()
            windows = args.out / f"round{r}.windows"
            windows.unlink(missing_ok=True)
            before = args.out / f"round{r}.netns"
            netns = Path("/run/netns")
            before.write_text("".join(f"{n}\n" for n in
                                      sorted(os.listdir(netns) if netns.is_dir() else [])))
            state_before = args.out / f"round{r}.state"
            from testbed.emu.state import state_root

            runs = state_root()
            state_before.write_text("".join(f"{n}\n" for n in
                                            sorted(os.listdir(runs) if runs.is_dir() else [])))
            # (bytecode cached, as scripts/test.sh does: PYTHONDONTWRITEBYTECODE dropped)
            env = {**{k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"},
                   "LIGHTPIPE_TEST_STRICT_SIGNALS": "1",  # conftest
                   "LIGHTPIPE_TEST_WINDOWS": str(windows)}
            procs: dict[str, tuple[Path, subprocess.Popen[bytes]]] = {}
            for suffix, selection in lanes.items():
                junit = args.out / f"round{r}{suffix}.xml"
                junit.unlink(missing_ok=True)
                cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                       f"--junitxml={junit}", *selection]
                # Never through a link someone left in --out (this runs as root).
                fd = os.open(args.out / f"round{r}{suffix}.log",
                             os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o640)
                with os.fdopen(fd, "wb") as out:
                    procs[suffix] = (junit, subprocess.Popen(cmd, cwd=ROOT, env=env,
                                                             stdout=out,
                                                             stderr=subprocess.STDOUT))
            log.info("round %d/%d: %d lane(s) running, output in %s", r, args.rounds,
                     len(lanes), ", ".join(str(args.out / f"round{r}{x}.log") for x in lanes))
            total, found = 0, []
            for suffix, (junit, proc) in procs.items():
                rc = proc.wait()
                n, lane_found = failures_of(junit, r)
                if rc not in (0, 1):  # how pytest ended: a test that killed it is in its log
                    how = (f"killed by {signal.Signals(-rc).name}" if rc < 0
                           else f"exited {rc}")
                    lane_found = [f for f in lane_found if f.test != "(whole round)"]
                    lane_found.append(Failure(r, f"(whole round{suffix})", f"pytest {how}"
                                              + ("" if junit.is_file() else ", no JUnit XML")))
                total += n
                found += lane_found
            leak = subprocess.run([sys.executable, "-m", "tests.leaks", str(before),
                                   str(windows), "--state-before", str(state_before)],
                                  cwd=ROOT, check=False, text=True,
                                  capture_output=True,
                                  env={**os.environ, "LIGHTPIPE_TEST_STRICT_LEAKS": "1"})
            if leak.returncode != 0:  # namespaces and runs the round left (tests/leaks.py)
                found.append(Failure(r, "(namespaces or runs left)",
                                     (leak.stdout + leak.stderr).strip()[-2000:]))
            all_failures += found
            line = (f"round {r}/{args.rounds}: {total} tests, {len(found)} failed, "
                    f"{time.monotonic() - t0:.0f} s (busy cores: {args.busy}, "
                    f"lanes: {len(lanes)})")
            log.info(line)
            lines.append(line)
    finally:
        for h in hogs:
            h.kill()
    report = ["# Stress rounds", "", *[f"- {x}" for x in lines], ""]
    if all_failures:
        report += ["## Failures", "", "| round | test | cause |", "|---|---|---|"]
        report += [f"| {f.round_no} | {f.test} | {f.cause.replace('|', '/')} |"
                   for f in all_failures]
    else:
        report.append(f"All {args.rounds} rounds passed.")
    tmp = args.out / "stress.md.tmp"
    tmp.write_text("\n".join(report) + "\n")
    tmp.replace(args.out / "stress.md")
    for f in all_failures:
        log.info("FAILED round %d %s: %s", f.round_no, f.test, f.cause)
    log.info("%s (report: %s)", "all rounds green" if not all_failures else
             f"{len(all_failures)} failures", args.out / "stress.md")
    return 0 if not all_failures else 1


if __name__ == "__main__":
    sys.exit(main())
