"""Shanghai AI Lab Acme (InternLM/AcmeTrace, data/job_trace/trace_seren.csv and
trace_kalos.csv): job_id, user, node_num, gpu_num, cpu_num, [mem_per_pod_GB,
shared_mem_per_pod,] type, state, submit_time, start_time, end_time, [fail_time,
stop_time,] duration (s), queue (s), gpu_time; times ISO 8601 with an offset."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from testbed.traceimport.common import (
    FAILED,
    KILLED,
    OK,
    UNFINISHED,
    SourceJob,
    parse_number,
    parse_time,
)
from testbed.traceimport.reader import bad, clip, csv_records

SEREN_COLUMNS = ("job_id", "user", "node_num", "gpu_num", "cpu_num", "type", "state",
                 "submit_time", "start_time", "end_time", "duration", "queue", "gpu_time")
REQUIRED = ("job_id", "node_num", "gpu_num", "state", "submit_time", "start_time",
            "end_time")
STATES = {"COMPLETED": OK, "FAILED": FAILED, "TIMEOUT": FAILED, "NODE_FAIL": FAILED,
          "CANCELLED": KILLED, "RUNNING": UNFINISHED, "PENDING": UNFINISHED}


def read(path: str | Path, header: list[str] | None = None) -> Iterator[SourceJob]:
    """Run time: `duration` when the file has it (end - start, seconds), else end_time -
    start_time; a job without a start or an end never ran (no run time)."""
    origin = str(path)
    for where, row in csv_records(path, SEREN_COLUMNS, REQUIRED, header):
        job_id = row["job_id"].strip()
        if not job_id:
            raise bad(origin, where, "job_id", "missing")
        state = row["state"].strip()
        if state not in STATES:
            raise bad(origin, where, "state", f"expected one of {', '.join(STATES)}, got "
                      f"{clip(state)!r}")
        gpus = parse_number(origin, where, "gpu_num", row["gpu_num"], empty=0.0,
                            integer=True)
        nodes = parse_number(origin, where, "node_num", row["node_num"], empty=0.0,
                             integer=True)
        submit = parse_time(origin, where, "submit_time", row["submit_time"])
        if submit is None:
            raise bad(origin, where, "submit_time", "missing")
        start = parse_time(origin, where, "start_time", row["start_time"])
        end = parse_time(origin, where, "end_time", row["end_time"])
        run_s: float | None = None
        if start is not None and end is not None:
            given = parse_number(origin, where, "duration", row.get("duration", ""))
            run_s = given if given is not None else max(0.0, end - start)
        yield SourceJob(job_id, submit, run_s, gpus or 0.0, int(nodes or 0) or None,
                        STATES[state], f"{origin}: {where}")
