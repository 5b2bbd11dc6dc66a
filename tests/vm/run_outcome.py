"""Print each job's outcome of an emulation run (RUNDIR/summary.json) and fail unless every
job finished and measured iterations; for a job that did not, the tail of its stages' logs.

    python tests/vm/run_outcome.py RUNDIR      # in the user-path test (tests/vm/user_path.sh)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

LOG_TAIL_LINES = 15


def _summary(run_dir: Path) -> dict[str, Any]:
    for name in ("summary.json", "emu/summary.json"):
        path = run_dir / name
        if path.is_file():
            return dict(json.loads(path.read_text()))
    raise FileNotFoundError(f"no summary.json in {run_dir}")


def _jobs(summary: dict[str, Any]) -> list[dict[str, Any]]:
    for key in ("worker_jobs", "workload"):
        got = summary.get(key)
        if isinstance(got, list):
            return got
        if isinstance(got, dict) and isinstance(got.get("worker_jobs"), list):
            return list(got["worker_jobs"])
    return []


def report(run_dir: Path) -> int:
    """Print the outcome lines; 0 when every job finished with measured iterations."""
    summary = _summary(run_dir)
    jobs = _jobs(summary)
    limits = summary.get("worker_time_limits_s") or {}
    print(f"run-outcome: {run_dir.name}: {len(jobs)} job(s); worker time-out "
          f"{limits.get('timeout', '?')} s, deadline {limits.get('deadline', '?')} s")
    bad = 0
    if not jobs:
        print("run-outcome: the summary lists no worker jobs")
        return 1
    for job in jobs:
        n = int(job.get("iterations_measured") or 0)
        ok = bool(job.get("ok")) and n > 0
        print(f"run-outcome: job {job.get('job')}: {'ok' if ok else 'FAILED'}, {n} measured "
              f"iteration(s), start-up {job.get('startup_s')} s, failure: {job.get('failure')}")
        if ok:
            continue
        bad += 1
        for log in sorted((run_dir / "workers" / str(job.get("job"))).glob("stage*.log")):
            lines = log.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
            print(f"run-outcome: --- {log} (last {len(lines)} lines)")
            for line in lines:
                print(f"    {line}")
    return 1 if bad else 0


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python tests/vm/run_outcome.py RUNDIR", file=sys.stderr)
        return 2
    try:
        return report(Path(argv[0]))
    except (OSError, ValueError) as exc:
        print(f"run-outcome: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
