"""What every public trace is turned into (SourceJob), the documented mapping from it to
LightPipe's job trace (JobRequest), and the filters with their drop counts."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from testbed.errors import InputError
from testbed.traces import FIELD_BOUNDS, MAX_ARRIVAL_S, MAX_TRACE_JOBS, JobRequest

# Outcomes a trace's status maps to (each format documents its own statuses).
OK, FAILED, KILLED, UNFINISHED = "ok", "failed", "killed", "unfinished"

DEFAULT_BUCKETS: tuple[tuple[float, str], ...] = (
    (8, "gpt3-6.7b"), (32, "llama2-13b"), (128, "llama2-70b"), (math.inf, "gpt3-175b"))
"""Model by the job's GPU count: the first bucket whose bound is >= the GPUs."""

# Why a job is left out (the names printed with their counts, in this order).
DROP_REASONS = ("failed", "killed", "unfinished", "no run time", "no GPU", "fractional GPU",
                "below --min-gpus", "before --since", "after --until", "over --limit")


@dataclass(frozen=True, slots=True)
class SourceJob:
    """One job of a public trace, in the trace's own clock and units."""

    source_id: str
    submit_s: float | None
    """Submission time, seconds on the trace's clock (only differences are used); None
    only for a job that never started (it is dropped as unfinished)."""
    run_s: float | None
    """Seconds it ran (None: it never started or has no end)."""
    gpus: float
    """GPUs it held (PAI: a fraction possible)."""
    nodes: int | None
    """Servers it ran on, where the trace says."""
    outcome: str
    where: str
    """`row N` / `line L (job N)`, for messages."""


@dataclass(frozen=True)
class ImportOptions:
    """The mapping's knobs (CLI options of `lightpipe trace import`)."""

    model: str | None = None
    buckets: tuple[tuple[float, str], ...] = DEFAULT_BUCKETS
    gpus_per_node: int = 8
    max_stages: int = 8
    microbatches: int | None = None
    """None: 4 x stages (1F1B bubble (p-1)/(m+p-1) below 20 %)."""
    seconds_per_iteration: float | None = None
    """None: the model's simulated iteration time (below)."""
    gpu: str = "h100"
    schedule: str = "1f1b"
    mfu: float = 0.4
    fabric_gbps: float = 400.0
    fabric_latency_ms: float = 0.005
    fractional: str = "ceil"
    keep_failed: bool = False
    keep_killed: bool = False
    min_gpus: int = 1
    since_s: float | None = None
    until_s: float | None = None
    limit: int | None = None


@dataclass
class ImportResult:
    """The mapped jobs and what was left out, by reason."""

    jobs: list[JobRequest]
    source_ids: list[str]
    read: int = 0
    dropped: Counter[str] = field(default_factory=Counter)
    rounded_up: int = 0
    """Fractional-GPU jobs rounded up to whole GPUs."""
    clamped: int = 0
    """Jobs whose iterations were cut to the trace format's maximum."""

    def summary(self) -> str:
        drops = ", ".join(f"{n} {r}" for r in DROP_REASONS if (n := self.dropped[r]))
        extra = []
        if self.rounded_up:
            extra.append(f"{self.rounded_up} fractional-GPU jobs rounded up")
        if self.clamped:
            extra.append(f"{self.clamped} jobs' iterations cut to "
                         f"{FIELD_BOUNDS['iterations'][1]}")
        tail = f"; {'; '.join(extra)}" if extra else ""
        span = self.jobs[-1].arrival_s if self.jobs else 0.0
        return (f"read {self.read} jobs, kept {len(self.jobs)} over {span:g} s, dropped "
                f"{sum(self.dropped.values())}" + (f" ({drops})" if drops else "") + tail)


def parse_time(origin: str, where: str, column: str, raw: str, fmt: str | None = None
               ) -> float | None:
    """Seconds of a time stamp (a given strptime format, else ISO 8601 with or without an
    offset; a naive one is read as UTC); None for an empty / None / NaN cell."""
    from testbed.traceimport.reader import bad, clip

    text = raw.strip()
    if text in ("", "None", "null", "nan", "NaN", "NaT"):
        return None
    try:
        stamp = (datetime.strptime(text, fmt) if fmt else datetime.fromisoformat(text))
    except ValueError:
        want = f"a time like {datetime(2017, 10, 7, 1, 11, 39).strftime(fmt)!r}" if fmt \
            else "an ISO time like '2023-03-01 00:18:22+08:00'"
        raise bad(origin, where, column, f"expected {want}, got {clip(text)!r}") from None
    if stamp.tzinfo is None:
        from datetime import UTC

        stamp = stamp.replace(tzinfo=UTC)
    return stamp.timestamp()


def parse_number(origin: str, where: str, column: str, raw: str, *, empty: float | None = None,
                 integer: bool = False) -> float | None:
    """A finite non-negative number (`integer`: a whole one, '8' or '8.0'); an empty or
    NaN cell gives `empty`."""
    from testbed.traceimport.reader import bad, clip

    text = raw.strip()
    if text in ("", "nan", "NaN", "None"):
        return empty
    try:
        value = float(text) if text.isascii() else math.nan
    except ValueError:
        value = math.nan
    kind = "a whole number" if integer else "a number"
    if not math.isfinite(value) or value < 0 or (integer and value != int(value)):
        raise bad(origin, where, column, f"expected {kind} >= 0, got {clip(text)!r}")
    return value


def stage_split(gpus: int, nodes: int | None, opts: ImportOptions) -> tuple[int, int]:
    """(stages, gpus_per_stage) with stages x gpus_per_stage = gpus exactly.

    Wanted stages: the trace's node count, else ceil(gpus / gpus_per_node); at most
    max_stages and gpus. Stages: the largest divisor of gpus not above that (a prime GPU
    count above one node's worth becomes one stage)."""
    want = nodes if nodes and nodes > 0 else math.ceil(gpus / opts.gpus_per_node)
    want = max(1, min(want, opts.max_stages, gpus, FIELD_BOUNDS["stages"][1]))
    stages = next(s for s in range(want, 0, -1) if gpus % s == 0)
    return stages, gpus // stages


def pick_model(gpus: int, opts: ImportOptions) -> str:
    if opts.model:
        return opts.model
    return next(name for bound, name in opts.buckets if gpus <= bound)


class IterationClock:
    """Seconds per iteration of (model, stages, gpus_per_stage, microbatches): the schedule
    engine's time with every stage in one DC on `opts.gpu` (docs/jobs.md), memoised."""

    def __init__(self, opts: ImportOptions) -> None:
        from testbed.jobs.timing import Timer

        self.opts = opts
        self.timer = Timer()
        self._memo: dict[tuple[str, int, int, int], float] = {}

    def seconds(self, model: str, stages: int, gpus_per_stage: int, microbatches: int) -> float:
        if self.opts.seconds_per_iteration is not None:
            return self.opts.seconds_per_iteration
        key = (model, stages, gpus_per_stage, microbatches)
        hit = self._memo.get(key)
        if hit is None:
            from testbed.catalog import GPUS, MODELS
            from testbed.jobs.model import activation_mb, stage_times

            arch = MODELS[model]
            st = stage_times(arch, [GPUS[self.opts.gpu]] * stages, gpus_per_stage,
                             self.opts.mfu)
            hops = [(self.opts.fabric_latency_ms, self.opts.fabric_gbps)] * (stages - 1)
            t = self.timer.time(st.forward_ms, st.backward_ms, hops, activation_mb(arch),
                                microbatches, self.opts.schedule)
            hit = self._memo[key] = t.iteration_ms / 1e3
        return hit


def map_jobs(source: Iterable[SourceJob], opts: ImportOptions) -> ImportResult:
    """Filter the trace's jobs, order them by submission and map each to a JobRequest."""
    result = ImportResult([], [])
    first_submit = math.inf
    kept: list[tuple[float, int, SourceJob, int]] = []  # (submit, order, job, GPUs)
    drop = result.dropped
    for src in source:
        result.read += 1
        if src.submit_s is not None:
            first_submit = min(first_submit, src.submit_s)
        if src.outcome == FAILED and not opts.keep_failed:
            drop["failed"] += 1
        elif src.outcome == KILLED and not opts.keep_killed:
            drop["killed"] += 1
        elif src.outcome == UNFINISHED or src.submit_s is None:
            drop["unfinished"] += 1
        elif not src.run_s or src.run_s <= 0:
            drop["no run time"] += 1
        elif src.gpus <= 0:
            drop["no GPU"] += 1
        elif src.gpus != int(src.gpus) and opts.fractional == "drop":
            drop["fractional GPU"] += 1
        elif math.ceil(src.gpus - 1e-9) < opts.min_gpus:
            drop["below --min-gpus"] += 1
        else:
            gpus = math.ceil(src.gpus - 1e-9)
            if gpus > FIELD_BOUNDS["stages"][1] * FIELD_BOUNDS["gpus_per_stage"][1]:
                raise InputError("", f"{src.where}: {src.gpus:g} GPUs: more than a job "
                                 "may hold")
            result.rounded_up += gpus != src.gpus
            kept.append((src.submit_s, len(kept), src, gpus))
    kept.sort(key=lambda k: (k[0], k[1]))
    since = opts.since_s or 0.0
    clock = IterationClock(opts)
    lo_it, hi_it = FIELD_BOUNDS["iterations"]
    for submit_s, _, src, gpus in kept:
        offset = submit_s - first_submit
        if offset < since:
            drop["before --since"] += 1
            continue
        if opts.until_s is not None and offset >= opts.until_s:
            drop["after --until"] += 1
            continue
        if opts.limit is not None and len(result.jobs) >= opts.limit:
            drop["over --limit"] += 1
            continue
        if len(result.jobs) >= MAX_TRACE_JOBS:
            raise InputError("", f"more than {MAX_TRACE_JOBS} jobs kept (a trace's limit); "
                             "use --limit or --until")
        stages, per_stage = stage_split(gpus, src.nodes, opts)
        model = pick_model(gpus, opts)
        mb = opts.microbatches or min(4 * stages, FIELD_BOUNDS["microbatches"][1])
        iteration_s = clock.seconds(model, stages, per_stage, mb)
        iterations = max(lo_it, round(src.run_s / iteration_s))  # type: ignore[operator]
        if iterations > hi_it:
            iterations = hi_it
            result.clamped += 1
        arrival = round(min(offset - since, MAX_ARRIVAL_S), 3)
        result.jobs.append(JobRequest(len(result.jobs), arrival, model, stages, per_stage,
                                      mb, iterations))
        result.source_ids.append(src.source_id)
    return result


def parse_buckets(text: str) -> tuple[tuple[float, str], ...]:
    """'8:gpt3-6.7b,32:llama2-13b,inf:gpt3-175b' -> buckets (bounds rising, last inf)."""
    out: list[tuple[float, str]] = []
    for part in text.split(","):
        bound, sep, name = part.strip().partition(":")
        try:
            value = math.inf if bound.strip() in ("inf", "*") else float(int(bound))
        except ValueError:
            value = math.nan
        if not sep or not name.strip() or not value >= 1 or (out and value <= out[-1][0]):
            raise InputError("--model-buckets", f"expected rising GPU bounds like "
                             f"'8:gpt3-6.7b,inf:gpt3-175b', got {part.strip()!r}")
        out.append((value, name.strip()))
    if out[-1][0] != math.inf:
        out.append((math.inf, out[-1][1]))
    return tuple(out)


def models_used(opts: ImportOptions) -> Sequence[str]:
    return [opts.model] if opts.model else [name for _, name in opts.buckets]
