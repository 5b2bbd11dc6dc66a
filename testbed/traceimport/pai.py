"""Alibaba PAI 2020 (alibaba/clusterdata cluster-trace-gpu-v2020): pai_task_table.csv
(job_name, task_name, inst_num, status, start_time, end_time, plan_cpu, plan_mem, plan_gpu,
gpu_type; plan_gpu in percent of one GPU) grouped by job, with pai_job_table.csv (job_name,
inst_id, user, status, start_time = submission, end_time) for submission times when
given. Times are seconds (shifted by a constant in the release). The release's CSVs
have no header line (the columns are in pai_*.header files): both forms are read."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from testbed.traceimport.common import (
    FAILED,
    OK,
    UNFINISHED,
    SourceJob,
    parse_number,
)
from testbed.traceimport.reader import bad, clip, csv_records

TASK_COLUMNS = ("job_name", "task_name", "inst_num", "status", "start_time", "end_time",
                "plan_cpu", "plan_mem", "plan_gpu", "gpu_type")
TASK_REQUIRED = ("job_name", "inst_num", "status", "start_time", "end_time", "plan_gpu")
JOB_COLUMNS = ("job_name", "inst_id", "user", "status", "start_time", "end_time")
JOB_REQUIRED = ("job_name", "status", "start_time")
STATUSES = {"Terminated": OK, "Failed": FAILED, "Running": UNFINISHED, "Waiting": UNFINISHED}


@dataclass(slots=True)
class _Job:
    """A job's tasks, folded: GPUs (sum of inst_num x plan_gpu / 100), earliest start,
    latest end (None once a task has none), worst status."""

    where: str
    gpus: float
    start_s: float | None
    end_s: float | None
    ended: bool
    outcome: str


def read(path: str | Path, jobs_path: str | Path | None = None,
         header: list[str] | None = None) -> Iterator[SourceJob]:
    """Jobs from the task table (GPUs, run time) and, when given, the job table
    (submission time and status; jobs absent from it keep the tasks' own)."""
    origin = str(path)
    folded: dict[str, _Job] = {}
    for where, row in csv_records(path, TASK_COLUMNS, TASK_REQUIRED, header):
        name = row["job_name"].strip()
        if not name:
            raise bad(origin, where, "job_name", "missing")
        outcome = _status(origin, where, row["status"])
        inst = parse_number(origin, where, "inst_num", row["inst_num"], empty=1.0,
                            integer=True)
        pct = parse_number(origin, where, "plan_gpu", row["plan_gpu"], empty=0.0)
        start = parse_number(origin, where, "start_time", row["start_time"])
        end = parse_number(origin, where, "end_time", row["end_time"])
        gpus = (inst or 0.0) * (pct or 0.0) / 100.0
        job = folded.get(name)
        if job is None:
            folded[name] = _Job(f"{origin}: {where}", gpus, start, end, end is not None, outcome)
            continue
        job.gpus += gpus
        if start is not None:
            job.start_s = start if job.start_s is None else min(job.start_s, start)
        job.ended = job.ended and end is not None
        if end is not None:
            job.end_s = end if job.end_s is None else max(job.end_s, end)
        job.outcome = _worse(job.outcome, outcome)
    submitted: dict[str, tuple[float, str]] = {}
    if jobs_path is not None:
        submitted = _job_table(jobs_path, folded)
    for name, job in folded.items():
        run_s = None
        if job.start_s is not None and job.end_s is not None and job.ended:
            run_s = max(0.0, job.end_s - job.start_s)
        submit, outcome = submitted.get(name, (job.start_s, job.outcome))
        if submit is None:
            outcome = UNFINISHED  # never launched, and no submission time
        yield SourceJob(name, submit, run_s, job.gpus, None, outcome, job.where)


def _job_table(path: str | Path, tasks: dict[str, _Job]) -> dict[str, tuple[float, str]]:
    """job_name -> (submission time, outcome) for the jobs that have tasks."""
    origin = str(path)
    out: dict[str, tuple[float, str]] = {}
    for where, row in csv_records(path, JOB_COLUMNS, JOB_REQUIRED):
        name = row["job_name"].strip()
        if name not in tasks:
            continue
        outcome = _status(origin, where, row["status"])
        submit = parse_number(origin, where, "start_time", row["start_time"])
        if submit is None:
            continue
        out[name] = (submit, outcome)
    return out


def _status(origin: str, where: str, raw: str) -> str:
    text = raw.strip()
    if text not in STATUSES:
        raise bad(origin, where, "status",
                  f"expected Terminated, Failed, Running or Waiting, got {clip(text)!r}")
    return STATUSES[text]


_RANK = {OK: 0, FAILED: 1, UNFINISHED: 2}


def _worse(a: str, b: str) -> str:
    return a if _RANK[a] >= _RANK[b] else b
