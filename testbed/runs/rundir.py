"""A run directory written as the run goes: a status in the manifest, records streamed.

`run_dir(out, scenario, backend)` puts the run's directory at `out` at once (swapped in
for a replaced run: testbed.io.outdir.install_dir) with manifest.json saying
`"status": "running"` and the writer's PID. Records are appended there as they are
produced (RecordStream: a CSV header, then one line per record, handed to the OS per
record or per `flush_s`, fsync'd every `fsync_s`). At the end summary.json and the
manifest (`"finished"`) are written atomically, and a record file may be rewritten
whole (sorted) by its writer. A failed run says `"failed"` and why; a run killed with
SIGKILL keeps `"running"`, and run_status() reports it as `"killed"` (nobody holds its
lock). Every complete line of a record file parses; a torn last line is ignored by
read_records and the report's readers. lightpipe.log holds the run's INFO lines
(testbed.runs.log).

Bad input found while running (InputError) leaves `out` as it was before the run.
"""

from __future__ import annotations

import contextlib
import csv
import io
import logging
import os
import shutil
import stat
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, Any

from testbed.errors import InputError
from testbed.io.atomic import atomic_write_json, check_out_target, make_stage
from testbed.io.bounded import CSV_MAX_BYTES, RUNDIR_JSON_MAX_BYTES, DirReader
from testbed.io.outdir import (
    install_dir,
    lock_owner,
    lock_path,
    out_lock,
    put_back,
    remove_stale_siblings,
)
from testbed.runs.log import run_log
from testbed.runs.records import manifest
from testbed.spec import Scenario

log = logging.getLogger(__name__)
FSYNC_S = 0.5
STATUSES = ("running", "finished", "failed")


class RecordStream:
    """An append-only CSV record file: header first, then one line per record."""

    def __init__(self, path: Path, columns: Sequence[str], flush_s: float = 0.0,
                 fsync_s: float = FSYNC_S, buffer_bytes: int = 1 << 16) -> None:
        self.path = Path(path)
        # The file appears with its header whole or not at all: a run killed between the
        # open and the header's write left an empty record file that readers refused.
        header = io.StringIO(newline="")
        csv.writer(header, lineterminator="\n").writerow(columns)
        tmp = self.path.with_name(f".{self.path.name}.header-{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        try:
            os.write(fd, header.getvalue().encode("utf-8"))
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)
        self.fh: IO[str] = open(self.path, "a", encoding="utf-8", newline="",
                                buffering=buffer_bytes)
        self.writer = csv.writer(self.fh, lineterminator="\n")
        self.flush_s, self.fsync_s = flush_s, fsync_s
        self.rows = 0
        self._flushed = self._synced = time.monotonic()

    def write(self, values: Sequence[Any]) -> None:
        """One record (a row of cells); reaches the OS per `flush_s` (0: at once)."""
        self.writer.writerow(values)
        self.rows += 1
        self.tick()

    def write_line(self, line: str) -> None:
        """One record already formatted as a CSV line ending in a newline (hot loops;
        call tick() now and then)."""
        self.fh.write(line)

    def tick(self) -> None:
        """Flush when `flush_s` has passed, fsync when `fsync_s` has."""
        now = time.monotonic()
        if self.flush_s <= 0 or now - self._flushed >= self.flush_s:
            self.fh.flush()
            self._flushed = now
            if now - self._synced >= self.fsync_s:
                os.fsync(self.fh.fileno())
                self._synced = now

    def sync(self) -> None:
        self.fh.flush()
        os.fsync(self.fh.fileno())
        self._flushed = self._synced = time.monotonic()

    def close(self) -> None:
        if not self.fh.closed:
            self.sync()
            self.fh.close()


class RunDir:
    """The run directory of one run: its manifest and its record streams."""

    def __init__(self, path: Path, scenario: Scenario, backend: str,
                 **extra: Any) -> None:
        self.path = Path(path)
        self.base = manifest(scenario, backend, pid=os.getpid(), **extra)
        self.streams: list[RecordStream] = []
        self.status = "running"

    def stream(self, name: str, columns: Sequence[str], flush_s: float = 0.0,
               buffer_bytes: int = 1 << 16) -> RecordStream:
        """Open the record file `name` in the run directory for appending records."""
        s = RecordStream(self.path / name, columns, flush_s=flush_s,
                         buffer_bytes=buffer_bytes)
        self.streams.append(s)
        return s

    def write_manifest(self, status: str, **extra: Any) -> Path:
        assert status in STATUSES
        self.status = status
        self.base.update(extra)
        data = {**self.base, "status": status}
        if status != "running":
            data["ended_unix_s"] = round(time.time(), 3)
        return atomic_write_json(self.path / "manifest.json", data)

    def close_streams(self) -> None:
        for s in self.streams:
            with contextlib.suppress(OSError, ValueError):
                s.close()

    def finish(self, **extra: Any) -> Path:
        """Close the streams and mark the run finished (extra goes into the manifest,
        e.g. records=[...] and backend details)."""
        self.close_streams()
        return self.write_manifest("finished", **extra)


@contextlib.contextmanager
def run_dir(out: str | os.PathLike[str], scenario: Scenario, backend: str,
            **extra: Any) -> Iterator[RunDir]:
    """The run directory at `out`, there from the start and marked running (see the
    module docstring). One writer per `out`: a second is refused naming the first's PID."""
    target = Path(out).resolve()
    with out_lock(target):
        check_out_target(target)
        for x in remove_stale_siblings(target):  # what killed writers of `out` left
            log.info("removed %s (left by a killed run, pid %s)", x.path, x.pid)
        stage = make_stage(target)
        try:
            rd = RunDir(stage, scenario, backend, **extra)
            rd.write_manifest("running")
            previous = install_dir(stage, target)
        except BaseException:
            shutil.rmtree(stage, ignore_errors=True)
            raise
        rd.path = target
        try:
            # RUN/lightpipe.log: every INFO line of the run
            with run_log(target, f"{backend} run of {scenario.name}"):
                yield rd
        except InputError:  # bad input: as if the run never started
            rd.close_streams()
            put_back(previous, target)
            raise
        except BaseException as exc:
            rd.close_streams()
            why = "interrupted" if isinstance(exc, KeyboardInterrupt) else (
                f"{type(exc).__name__}: {exc}"[:500])
            with contextlib.suppress(OSError):  # (the run's own error matters more)
                rd.write_manifest("failed", error=why)
            if previous is not None:
                shutil.rmtree(previous, ignore_errors=True)
            raise
        if rd.status != "finished":
            rd.finish()
        if previous is not None:
            shutil.rmtree(previous, ignore_errors=True)


# ---- readers --------------------------------------------------------------------------
# A run directory may be another user's: its files are read through DirReader (no links
# followed, regular files of the directory's owner only, bounded; see testbed.io.bounded).
def _open_dir(path: str | os.PathLike[str] | DirReader) -> tuple[DirReader | None, bool]:
    """(a reader of the directory or None, whether this call opened it)."""
    if isinstance(path, DirReader):
        return path, False
    try:
        return DirReader.open(Path(path)), True
    except InputError:
        return None, False


def _regular_or_absent(path: Path) -> bool:
    """Whether path is absent or a regular file (checked without following a link)."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except FileNotFoundError:
        return True
    except OSError:
        return False


def read_manifest(path: str | os.PathLike[str] | DirReader) -> dict[str, Any] | None:
    d, opened = _open_dir(path)
    if d is None:
        return None
    try:
        m = d.read_json("manifest.json")
    finally:
        if opened:
            d.close()
    return m if isinstance(m, dict) else None


def run_status(path: str | os.PathLike[str] | DirReader) -> dict[str, Any]:
    """{"status": finished | running | killed | failed | unknown, "pid", "error"}: a
    manifest saying running whose lock nobody holds is a killed run. A manifest without
    a status (written before statuses existed) is a finished run."""
    p = Path(path.shown if isinstance(path, DirReader) else path).resolve()
    m = read_manifest(path)
    if m is None:
        return {"status": "unknown", "pid": None, "error": "no readable manifest.json"}
    status = m.get("status", "finished")
    pid = m.get("pid")
    if status == "running" and not _regular_or_absent(lock_path(p)):
        status = "killed"  # (a FIFO or a link where the lock goes is no LightPipe lock)
    elif status == "running" and lock_owner(p) is None:
        status = "killed"
    return {"status": status, "pid": pid, "error": m.get("error")}


def complete_text(path: Path, max_bytes: int = CSV_MAX_BYTES) -> str:
    """A record file's text up to its last complete line (a torn last line is dropped),
    at most max_bytes of it; FileNotFoundError when it is absent or refused (a link, a
    FIFO, a device, another user's file: see DirReader)."""
    path = Path(path)
    with DirReader.open(path.parent, "record file") as d:
        lines = d.read_lines(path.name, max_bytes)
        if lines is None:
            raise FileNotFoundError(f"{path}: absent or refused")
        return "".join(lines)


def read_records(path: str | os.PathLike[str]) -> list[dict[str, str]]:
    """The records of a CSV record file, complete lines only ([] when it is missing or
    refused), at most CSV_MAX_ROWS of them."""
    p = Path(path)
    try:
        d = DirReader.open(p.parent, "record file")
    except InputError:
        return []
    with d:
        return d.read_csv(p.name)


def _count_rows(d: DirReader, name: str) -> int:
    """Records of a CSV record file (its header not counted), read as a stream."""
    lines = d.read_lines(name)
    if lines is None:
        return 0
    try:
        return max(0, sum(1 for _ in csv.reader(lines)) - 1)
    except csv.Error:
        return 0


def describe_unfinished(path: str | os.PathLike[str] | DirReader) -> str | None:
    """None for a finished run; else one line: its status and its partial records."""
    d, opened = _open_dir(path)
    if d is None:
        return None
    try:
        st = run_status(d)
        if st["status"] in ("finished", "unknown"):
            return None
        how = {"running": f"still running (pid {st['pid']})",
               "killed": f"did not finish: its process (pid {st['pid']}) ended without "
                         "finishing (killed?)",
               "failed": f"failed: {st['error']}"}.get(st["status"], st["status"])
        names = d.names()
        parts = [f"{n} {_count_rows(d, n)} rows" for n in names
                 if n.endswith(".csv") and d.is_file(n)]
        lines = files = 0
        workers = d.sub("workers", quiet=True) if "workers" in names else None
        for w in workers.names() if workers is not None else []:
            wd = workers.sub(w, quiet=True) if workers is not None else None
            for f in wd.names() if wd is not None else []:
                got = wd.read_lines(f) if wd is not None and f.endswith(".jsonl") else None
                if got is not None:  # emulated workers' iteration records
                    files += 1
                    lines += sum(1 for _ in got)
        if files:
            parts.append(f"workers/*/*.jsonl {lines} lines")
        kept = f"; partial records: {', '.join(parts)}" if parts else "; no records"
        return f"the run in {d.shown} {how}{kept}"
    finally:
        if opened:
            d.close()


def _unix_s(v: Any) -> float:
    try:
        x = float(v or 0.0)
    except (TypeError, ValueError):
        return 0.0
    return x if 0.0 <= x < 1e11 else 0.0


def run_window(d: DirReader) -> tuple[float, float]:
    """The run's (start, end) in Unix seconds from its manifest (and summary), (0, 0) when
    unknown or implausible (longer than 90 days)."""
    man = d.read_json("manifest.json", RUNDIR_JSON_MAX_BYTES)
    summ = d.read_json("summary.json", RUNDIR_JSON_MAX_BYTES)
    man = man if isinstance(man, dict) else {}
    summ = summ if isinstance(summ, dict) else {}
    # (the manifest is written when the run starts, and again with ended_unix_s at its end)
    start = _unix_s(man.get("started_unix_s"))
    end = _unix_s(man.get("ended_unix_s")) or (
        start + _unix_s(summ.get("wall_s")) if start else 0.0)
    if end < start or end - start > 90 * 86400:
        return 0.0, 0.0
    return start, end
