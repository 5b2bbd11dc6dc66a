"""Job traces: the documented CSV format, a seeded generator from a workload, an importer."""

from __future__ import annotations

import csv
import io
import random
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from testbed.atomicio import atomic_write_text
from testbed.errors import InputError
from testbed.names import KEY_RE
from testbed.spec.models import PPJobsWorkload

JOB_TRACE_COLUMNS = ("job_id", "arrival_s", "model", "stages", "gpus_per_stage",
                     "microbatches", "iterations")


@dataclass(frozen=True)
class JobRequest:
    """One pipeline-parallel training job as it arrives."""

    job_id: int
    arrival_s: float
    model: str
    stages: int
    gpus_per_stage: int
    microbatches: int
    iterations: int

    @property
    def gpus(self) -> int:
        return self.stages * self.gpus_per_stage


def generate_jobs(workload: PPJobsWorkload, rng: random.Random | None = None) -> list[JobRequest]:
    """Poisson arrivals (mean_interarrival_s) over the weighted mix; seeded and repeatable."""
    if workload.trace is not None:
        return read_job_trace(workload.trace)
    rng = rng or random.Random(workload.seed)
    weights = [t.weight for t in workload.mix]
    jobs: list[JobRequest] = []
    t = 0.0
    for job_id in range(workload.jobs):
        t += rng.expovariate(1.0 / workload.mean_interarrival_s)
        tmpl = rng.choices(workload.mix, weights=weights)[0]
        jobs.append(JobRequest(job_id, round(t, 6), tmpl.model, tmpl.stages,
                               tmpl.gpus_per_stage, tmpl.microbatches, tmpl.iterations))
    return jobs


def format_job_trace(jobs: list[JobRequest]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(JOB_TRACE_COLUMNS)
    for j in jobs:
        w.writerow([getattr(j, c) for c in JOB_TRACE_COLUMNS])
    return buf.getvalue()


def write_job_trace(jobs: list[JobRequest], path: str | Path) -> Path:
    return atomic_write_text(path, format_job_trace(jobs))


def read_job_trace(path: str | Path) -> list[JobRequest]:
    """Import a job trace CSV; errors name the file, row and column."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError("workload.trace", f"cannot read {str(p)!r}: {exc.strerror}") from None
    return parse_job_trace(text, origin=str(p))


def parse_job_trace(text: str, origin: str = "<trace>") -> list[JobRequest]:
    reader = csv.DictReader(io.StringIO(text))
    header = reader.fieldnames or []
    missing = [c for c in JOB_TRACE_COLUMNS if c not in header]
    if missing:
        raise InputError("workload.trace", f"{origin}: missing column {missing[0]!r} "
                         f"(columns: {','.join(JOB_TRACE_COLUMNS)})")
    types = {f.name: f.type for f in fields(JobRequest)}
    jobs: list[JobRequest] = []
    ids: set[int] = set()
    last = 0.0
    for row_no, row in enumerate(reader, start=2):
        values: dict[str, object] = {}
        for col in JOB_TRACE_COLUMNS:
            raw = (row.get(col) or "").strip()
            where = f"{origin}: row {row_no}: {col}"
            if types[col] in ("int", int):
                if not raw.isdigit() or (col != "job_id" and int(raw) < 1):
                    raise InputError("workload.trace", f"{where}: expected a positive "
                                     f"integer, got {raw!r}")
                values[col] = int(raw)
            elif types[col] in ("float", float):
                try:
                    val = float(raw)
                except ValueError:
                    val = float("nan")
                if not val >= 0 or val == float("inf"):
                    raise InputError("workload.trace", f"{where}: expected a time >= 0, "
                                     f"got {raw!r}")
                values[col] = val
            else:
                if not KEY_RE.fullmatch(raw):
                    raise InputError("workload.trace", f"{where}: bad model name {raw!r}")
                values[col] = raw
        job = JobRequest(**values)  # type: ignore[arg-type]
        if job.job_id in ids:
            raise InputError("workload.trace", f"{origin}: row {row_no}: duplicate job_id "
                             f"{job.job_id}")
        if job.arrival_s < last:
            raise InputError("workload.trace", f"{origin}: row {row_no}: arrival_s goes back "
                             f"in time ({job.arrival_s} < {last})")
        ids.add(job.job_id)
        last = job.arrival_s
        jobs.append(job)
    if not jobs:
        raise InputError("workload.trace", f"{origin}: no jobs")
    return jobs


def job_as_dict(job: JobRequest) -> dict[str, object]:
    return asdict(job)
