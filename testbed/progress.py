"""A progress bar on a terminal (rich), silent under --quiet or when not a TTY."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol


class Progress(Protocol):
    def advance(self, n: float = 1) -> None: ...


class _Silent:
    def advance(self, n: float = 1) -> None:
        return None


class _Rich:
    def __init__(self, bar, task) -> None:  # type: ignore[no-untyped-def]
        self._bar, self._task = bar, task

    def advance(self, n: float = 1) -> None:
        self._bar.advance(self._task, n)


def enabled(quiet: bool) -> bool:
    return not quiet and sys.stderr.isatty()


@contextmanager
def progress(total: float | None, description: str, quiet: bool = False) -> Iterator[Progress]:
    """Yield an object with advance(n); draws to stderr only on a terminal."""
    if not enabled(quiet):
        yield _Silent()
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )
    from rich.progress import Progress as RichProgress

    with RichProgress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), TimeRemainingColumn(),
                      console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(description, total=total)
        yield _Rich(bar, task)
