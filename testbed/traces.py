"""Job traces: the documented CSV format, a seeded generator from a workload, an importer."""

from __future__ import annotations

import csv
import io
import random
import re
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from testbed.errors import InputError
from testbed.io.atomic import atomic_write_text
from testbed.io.bounded import TRACE_MAX_BYTES, read_bounded_text
from testbed.names import KEY_RE
from testbed.spec.models import JobTemplate, PPJobsWorkload

JOB_TRACE_COLUMNS = ("job_id", "arrival_s", "model", "stages", "gpus_per_stage",
                     "microbatches", "iterations")
_ASCII_INT = re.compile(r"[0-9]{1,18}")
MAX_TRACE_JOBS = 10_000_000
"""Most jobs a trace may hold (the spec's bound on workload.jobs)."""
MAX_ARRIVAL_S = 1e12


def _bounds(name: str) -> tuple[int, int]:
    """(min, max) of a job field, taken from the spec's JobTemplate so both stay equal."""
    lo, hi = 1, None
    for meta in JobTemplate.model_fields[name].metadata:
        lo = getattr(meta, "ge", None) if getattr(meta, "ge", None) is not None else lo
        hi = getattr(meta, "le", None) if getattr(meta, "le", None) is not None else hi
    assert hi is not None
    return int(lo), int(hi)


FIELD_BOUNDS: dict[str, tuple[int, int]] = {
    "job_id": (0, MAX_TRACE_JOBS * 100),
    **{c: _bounds(c) for c in ("stages", "gpus_per_stage", "microbatches", "iterations")},
}


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
    text = read_bounded_text(p, "workload.trace", TRACE_MAX_BYTES)
    return parse_job_trace(text, origin=str(p))


def parse_job_trace(text: str, origin: str = "<trace>") -> list[JobRequest]:
    try:
        return _parse_job_trace(text, origin)
    except csv.Error as exc:
        raise InputError("workload.trace", f"{origin}: bad CSV: {exc}") from None


def _parse_job_trace(text: str, origin: str) -> list[JobRequest]:
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
        if len(jobs) >= MAX_TRACE_JOBS:
            raise InputError("workload.trace", f"{origin}: more than {MAX_TRACE_JOBS} jobs")
        values: dict[str, object] = {}
        for col in JOB_TRACE_COLUMNS:
            raw = (row.get(col) or "").strip()
            where = f"{origin}: row {row_no}: {col}"
            if types[col] in ("int", int):
                lo, hi = FIELD_BOUNDS[col]
                if not _ASCII_INT.fullmatch(raw):
                    raise InputError("workload.trace", f"{where}: expected an integer "
                                     f"(digits 0-9), got {_clip(raw)!r}")
                if not lo <= int(raw) <= hi:
                    raise InputError("workload.trace", f"{where}: must be in {lo}..{hi}, "
                                     f"got {raw}")
                values[col] = int(raw)
            elif types[col] in ("float", float):
                try:
                    val = float(raw)
                except ValueError:
                    val = float("nan")
                if not 0 <= val <= MAX_ARRIVAL_S or not raw.isascii():
                    raise InputError("workload.trace", f"{where}: expected a time in "
                                     f"0..{MAX_ARRIVAL_S:g} s, got {_clip(raw)!r}")
                values[col] = val
            else:
                if not KEY_RE.fullmatch(raw):
                    raise InputError("workload.trace", f"{where}: bad model name "
                                     f"{_clip(raw)!r}")
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


def _clip(text: str, limit: int = 40) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


def job_as_dict(job: JobRequest) -> dict[str, object]:
    return asdict(job)
