"""Progress: a rich bar on a terminal; off a terminal one line per phase; nothing under --quiet.

Every bar names its phase (and, through describe(), the point it is at); its ETA is
rich's estimate from the steps done so far, so callers count steps of similar cost, or
give each step a weight (`weighted`: its expected cost), the ETA then saying "unknown"
until a step of the heaviest kind has finished.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Protocol


class Progress(Protocol):
    def advance(self, n: float = 1) -> None: ...

    def describe(self, text: str) -> None: ...


class _Silent:
    def advance(self, n: float = 1) -> None:
        return None

    def describe(self, text: str) -> None:
        return None


class _Rich:
    def __init__(self, bar, task, phase: str) -> None:  # type: ignore[no-untyped-def]
        self._bar, self._task, self._phase = bar, task, phase

    def advance(self, n: float = 1) -> None:
        self._bar.advance(self._task, n)

    def describe(self, text: str) -> None:
        self._bar.update(self._task, description=f"{self._phase}: {text}")


class _Weighted:
    """Steps of unequal cost: advance() moves the bar by the next step's weight and counts
    one step; the ETA is known once a step of the heaviest weight has finished."""

    def __init__(self, bar, task, phase: str, weights: Sequence[float]) -> None:  # type: ignore[no-untyped-def]
        self._bar, self._task, self._phase = bar, task, phase
        self._weights = list(weights)
        self._heaviest = max(self._weights, default=0.0)
        self._done = 0

    def advance(self, n: float = 1) -> None:
        for _ in range(int(n)):
            w = self._weights[self._done] if self._done < len(self._weights) else 0.0
            self._done += 1
            fields: dict[str, Any] = {"steps": f"{self._done}/{len(self._weights)}"}
            if w >= self._heaviest:
                fields["eta_known"] = True
            self._bar.update(self._task, advance=w, **fields)

    def describe(self, text: str) -> None:
        self._bar.update(self._task, description=f"{self._phase}: {text}")


def enabled(quiet: bool) -> bool:
    return not quiet and sys.stderr.isatty()


def say(text: str, quiet: bool = False) -> None:
    """One progress line on stderr (terminal or not) unless quiet."""
    if not quiet:
        sys.stderr.write(f"lightpipe: {text}\n")
        sys.stderr.flush()


@contextmanager
def phase(name: str, quiet: bool = False) -> Iterator[None]:
    """Say a phase once when it starts and how long it took when it ends."""
    say(f"{name} ...", quiet)
    t0 = time.monotonic()
    yield
    say(f"{name}: done in {time.monotonic() - t0:.1f} s", quiet)


def count_text(n: float) -> str:
    """A count as people write it: 1,000,000 (not 1e+06); a fraction with 3 digits."""
    return f"{int(n):,}" if float(n).is_integer() else f"{n:,.3g}"


@contextmanager
def progress(total: float | None, description: str, quiet: bool = False) -> Iterator[Progress]:
    """Yield an object with advance(n) and describe(text): a bar on a terminal, else one
    line naming the phase (and its step count) at the start, nothing under quiet."""
    if quiet:
        yield _Silent()
        return
    if not sys.stderr.isatty():
        steps = f" ({count_text(total)} steps)" if total else ""
        say(f"{description}{steps} ...")
        t0 = time.monotonic()
        yield _Silent()
        say(f"{description}: done in {time.monotonic() - t0:.1f} s")
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
                      TimeElapsedColumn(), TextColumn("left"), TimeRemainingColumn(),
                      console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(description, total=total)
        yield _Rich(bar, task, description)


def _eta_column() -> Any:
    """Time left, or "ETA unknown" while the task's `eta_known` field is False."""
    from rich.progress import ProgressColumn, TimeRemainingColumn
    from rich.text import Text

    class EtaColumn(ProgressColumn):
        def __init__(self) -> None:
            super().__init__()
            self._time = TimeRemainingColumn()

        def render(self, task: Any) -> Any:
            if not task.fields.get("eta_known", True):
                return Text("ETA unknown", style="progress.remaining")
            return self._time.render(task)

    return EtaColumn()


@contextmanager
def weighted(weights: Sequence[float], description: str, quiet: bool = False,
             kinds: str = "") -> Iterator[Progress]:
    """Like progress() for steps of unequal cost: weights[i] is step i's expected cost
    (any unit); each advance() is one step. The bar shows steps done of all, and the ETA
    says "unknown" until a step of the heaviest weight has finished. `kinds` (e.g. "12
    exact solves") is said with the step count."""
    if quiet:
        yield _Silent()
        return
    extra = f", {kinds}" if kinds else ""
    if not sys.stderr.isatty():
        say(f"{description} ({len(weights)} steps{extra}) ...")
        t0 = time.monotonic()
        yield _Silent()
        say(f"{description}: done in {time.monotonic() - t0:.1f} s")
        return
    from rich.console import Console
    from rich.progress import BarColumn, TextColumn, TimeElapsedColumn
    from rich.progress import Progress as RichProgress

    with RichProgress(TextColumn("{task.description}"), BarColumn(),
                      TextColumn("{task.fields[steps]} steps"), TimeElapsedColumn(),
                      TextColumn("left"), _eta_column(), console=Console(stderr=True),
                      transient=True) as bar:
        task = bar.add_task(description, total=sum(weights) or None,
                            steps=f"0/{len(weights)}",
                            eta_known=len(set(weights)) <= 1)
        yield _Weighted(bar, task, description, weights)
