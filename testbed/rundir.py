"""A run directory written as the run goes: a status in the manifest, records streamed.

`run_dir(out, scenario, backend)` puts the run's directory at `out` at once (swapped in
for a replaced run: testbed.outdir.install_dir) with manifest.json saying
`"status": "running"` and the writer's PID. Records are appended there as they are
produced (RecordStream: a CSV header, then one line per record, handed to the OS per
record or per `flush_s`, fsync'd every `fsync_s`). At the end summary.json and the
manifest (`"finished"`) are written atomically, and a record file may be rewritten
whole (sorted) by its writer. A failed run says `"failed"` and why; a run killed with
SIGKILL keeps `"running"`, and run_status() reports it as `"killed"` (nobody holds its
lock). Every complete line of a record file parses; a torn last line is ignored by
read_records and the report's readers.

Bad input found while running (InputError) leaves `out` as it was before the run.
"""

from __future__ import annotations

import contextlib
import csv
import io
import logging
import os
import shutil
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, Any

from testbed.atomicio import atomic_write_json, check_out_target, make_stage
from testbed.errors import InputError
from testbed.outdir import install_dir, lock_owner, out_lock, put_back, remove_stale_siblings
from testbed.records import manifest
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
def read_manifest(path: Path) -> dict[str, Any] | None:
    import json

    try:
        m = json.loads((Path(path) / "manifest.json").read_text())
    except (OSError, ValueError):
        return None
    return m if isinstance(m, dict) else None


def run_status(path: str | os.PathLike[str]) -> dict[str, Any]:
    """{"status": finished | running | killed | failed | unknown, "pid", "error"}: a
    manifest saying running whose lock nobody holds is a killed run. A manifest without
    a status (written before statuses existed) is a finished run."""
    p = Path(path).resolve()
    m = read_manifest(p)
    if m is None:
        return {"status": "unknown", "pid": None, "error": "no readable manifest.json"}
    status = m.get("status", "finished")
    pid = m.get("pid")
    if status == "running" and lock_owner(p) is None:
        status = "killed"
    return {"status": status, "pid": pid, "error": m.get("error")}


def complete_text(path: Path) -> str:
    """A record file's text up to its last complete line (a torn last line is dropped)."""
    with open(path, encoding="utf-8", errors="replace", newline="") as fh:
        text = fh.read()
    if text and not text.endswith("\n"):
        text = text[: text.rfind("\n") + 1]
    return text


def read_records(path: str | os.PathLike[str]) -> list[dict[str, str]]:
    """The records of a CSV record file, complete lines only ([] when it is missing)."""
    import io

    try:
        text = complete_text(Path(path))
    except FileNotFoundError:
        return []
    return list(csv.DictReader(io.StringIO(text, newline="")))


def describe_unfinished(path: str | os.PathLike[str]) -> str | None:
    """None for a finished run; else one line: its status and its partial records."""
    p = Path(path)
    st = run_status(p)
    if st["status"] in ("finished", "unknown"):
        return None
    how = {"running": f"still running (pid {st['pid']})",
           "killed": f"did not finish: its process (pid {st['pid']}) ended without "
                     "finishing (killed?)",
           "failed": f"failed: {st['error']}"}.get(st["status"], st["status"])
    parts = [f"{f.name} {len(read_records(f))} rows" for f in sorted(p.glob("*.csv"))]
    workers = sorted(p.glob("workers/*/*.jsonl"))  # emulated workers' iteration records
    if workers:
        lines = sum(complete_text(f).count("\n") for f in workers)
        parts.append(f"workers/*/*.jsonl {lines} lines")
    kept = f"; partial records: {', '.join(parts)}" if parts else "; no records"
    return f"the run in {path} {how}{kept}"
