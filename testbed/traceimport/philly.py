"""Microsoft Philly (msr-fiddle/philly-traces, `cluster_job_log`): a JSON array of jobs
{jobid, user, vc, status, submitted_time, attempts: [{start_time, end_time,
detail: [{ip, gpus: [...]}]}]}, times 'YYYY-MM-DD HH:MM:SS'."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from testbed.traceimport.common import FAILED, KILLED, OK, UNFINISHED, SourceJob, parse_time
from testbed.traceimport.reader import bad, clip, json_objects

TIME_FORMAT = "%Y-%m-%d %H:%M:%S"
STATUSES = {"Pass": OK, "Failed": FAILED, "Killed": KILLED}


def read(path: str | Path) -> Iterator[SourceJob]:
    origin = str(path)
    for where, job in json_objects(path):
        yield parse_job(origin, where, job)


def parse_job(origin: str, where: str, job: Any) -> SourceJob:
    """One cluster_job_log entry. GPUs and servers: the last attempt that lists any
    (`detail`); run time: the sum of the attempts' end - start (an attempt with a missing
    or reversed time adds nothing); a last attempt without an end: still running."""
    if not isinstance(job, dict):
        raise bad(origin, where, "", f"expected a job object, got {type(job).__name__}")
    jobid = _text(origin, where, job, "jobid")
    if not jobid:
        raise bad(origin, where, "jobid", "missing")
    where = f"{where}, jobid {clip(jobid)}"
    status = _text(origin, where, job, "status")
    if status not in STATUSES:
        raise bad(origin, where, "status", f"expected Pass, Killed or Failed, got "
                  f"{clip(status)!r}")
    submit = parse_time(origin, where, "submitted_time",
                        _text(origin, where, job, "submitted_time"), TIME_FORMAT)
    if submit is None:
        raise bad(origin, where, "submitted_time", "missing")
    attempts = job.get("attempts") or []
    if not isinstance(attempts, list):
        raise bad(origin, where, "attempts", "expected a list")
    run_s, gpus, nodes, running = 0.0, 0, 0, False
    for i, att in enumerate(attempts):
        col = f"attempts[{i}]"
        if not isinstance(att, dict):
            raise bad(origin, where, col, "expected an object")
        start = parse_time(origin, where, f"{col}.start_time",
                           _text(origin, where, att, "start_time", col), TIME_FORMAT)
        end = parse_time(origin, where, f"{col}.end_time",
                         _text(origin, where, att, "end_time", col), TIME_FORMAT)
        if start is not None and end is not None and end >= start:
            run_s += end - start
        running = end is None
        detail = att.get("detail") or []
        if not isinstance(detail, list):
            raise bad(origin, where, f"{col}.detail", "expected a list")
        servers: set[str] = set()
        held = 0
        for j, host in enumerate(detail):
            hcol = f"{col}.detail[{j}]"
            if not isinstance(host, dict) or not isinstance(host.get("gpus", []), list):
                raise bad(origin, where, hcol, "expected {ip, gpus: [...]}")
            servers.add(str(host.get("ip", j)))
            held += len(host.get("gpus") or [])
        if detail:
            gpus, nodes = held, len(servers)
    outcome = UNFINISHED if attempts and running else STATUSES[status]
    return SourceJob(jobid, submit, run_s if attempts else None, float(gpus), nodes or None,
                     outcome, f"{origin}: {where}")


def _text(origin: str, where: str, obj: dict[str, Any], key: str, prefix: str = "") -> str:
    """A string member ('' for null / absent times); other types are an error."""
    value = obj.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        col = f"{prefix}.{key}" if prefix else key
        raise bad(origin, where, col, f"expected a string, got {clip(repr(value))}")
    return value
