"""Import public GPU-cluster job traces (Philly, Alibaba PAI 2020, Acme) as LightPipe job
traces: one reader per format (streamed, bounded) and one documented mapping (common)."""

from __future__ import annotations

from pathlib import Path

from testbed.traceimport.common import (
    DEFAULT_BUCKETS,
    ImportOptions,
    ImportResult,
    SourceJob,
    map_jobs,
    parse_buckets,
)

FORMATS = ("philly", "pai", "acme")

__all__ = ["DEFAULT_BUCKETS", "FORMATS", "ImportOptions", "ImportResult", "SourceJob",
           "import_trace", "map_jobs", "parse_buckets"]


def import_trace(fmt: str, path: str | Path, opts: ImportOptions,
                 header: str | Path | None = None,
                 pai_jobs: str | Path | None = None) -> ImportResult:
    """Read `path` in format `fmt` and map its jobs (docs/traces.md, "Importing")."""
    from testbed.errors import InputError
    from testbed.traceimport.reader import read_header_file

    columns = read_header_file(header) if header is not None else None
    if fmt == "philly":
        from testbed.traceimport import philly

        if columns is not None or pai_jobs is not None:
            raise InputError("--format", "philly is JSON: --header and --pai-jobs do not "
                             "apply")
        return map_jobs(philly.read(path), opts)
    if fmt == "pai":
        from testbed.traceimport import pai

        return map_jobs(pai.read(path, pai_jobs, columns), opts)
    if fmt == "acme":
        from testbed.traceimport import acme

        if pai_jobs is not None:
            raise InputError("--pai-jobs", "only with --format pai")
        return map_jobs(acme.read(path, columns), opts)
    raise InputError("--format", f"unknown format {fmt!r}; known: {', '.join(FORMATS)}")
