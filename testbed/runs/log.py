"""The run's own log: every INFO line of a run, timestamped, in RUN/lightpipe.log.

The console shows warnings (more with -v); what a run did step by step (the events'
clock, the workers' launch, each phase) is kept here whatever the console's level, so a
run that went wrong in a VM or on CI can be read afterwards. The file is created with
O_EXCL and O_NOFOLLOW in the run directory LightPipe made, written by this process only
(not by a forked child) and capped at MAX_BYTES (then one line says it was cut).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path

from testbed.io.terminal import SafeFormatter

LOG_NAME = "lightpipe.log"
MAX_BYTES = 64 << 20  # a run's log stops here (one line says so)
CUT_RESERVE = 64  # bytes kept for that line
FORMAT = "%(asctime)s.%(msecs)03d %(levelname)s %(name)s [%(threadName)s]: %(message)s"


class _RunLogHandler(logging.Handler):
    """Appends formatted records to one open file, up to MAX_BYTES; this PID only."""

    def __init__(self, fd: int, max_bytes: int) -> None:
        super().__init__(logging.INFO)
        self.fh = os.fdopen(fd, "a", encoding="utf-8", errors="replace")
        self.pid = os.getpid()
        self.left = self.cap = max_bytes
        self.setFormatter(SafeFormatter(FORMAT, datefmt="%Y-%m-%dT%H:%M:%S"))

    def emit(self, record: logging.LogRecord) -> None:
        if os.getpid() != self.pid or self.left <= 0:
            return
        try:
            line = self.format(record) + "\n"
            if len(line) + CUT_RESERVE > self.left:  # the last line says so
                line = f"(log cut at {self.cap} bytes)\n"
                self.left = 0
            else:
                self.left -= len(line)
            self.fh.write(line)
            self.fh.flush()
        except (OSError, ValueError):
            self.handleError(record)

    def close(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.fh.close()
        super().close()


@contextlib.contextmanager
def run_log(run_dir: Path, what: str = "run",
            max_bytes: int = MAX_BYTES) -> Iterator[Path | None]:
    """Log INFO and up into run_dir/lightpipe.log while the block runs, between a first
    and a last line that name `what` and the process (yields None if the file
    cannot be made: the run goes on without it). The root logger is lowered to INFO for
    the time; its other handlers keep the level they had in effect (the console's)."""
    path = Path(run_dir) / LOG_NAME
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                     | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        logging.getLogger(__name__).warning("no run log: %s: %s", path, exc.strerror)
        yield None
        return
    handler = _RunLogHandler(fd, max_bytes)
    root = logging.getLogger()
    old_level = root.level
    pinned = [h for h in root.handlers if h.level == logging.NOTSET]
    for h in pinned:  # what they showed before, they show now
        h.setLevel(old_level)
    root.addHandler(handler)
    if old_level > logging.INFO:  # (NOTSET, 0, lets everything through already)
        root.setLevel(logging.INFO)
    log = logging.getLogger(__name__)
    try:
        log.info("%s: log of pid %d (%s)", what, os.getpid(), shlex.join(sys.argv))
        yield path
    finally:
        log.info("%s: log ends", what)
        root.removeHandler(handler)
        root.setLevel(old_level)
        for h in pinned:
            h.setLevel(logging.NOTSET)
        handler.close()
