"""Parameter sweeps: a grid of `--set dotted.path=v1,v2` values x seeds, run in processes
(or as Ray tasks: testbed/experiments/sweep_ray.py)."""

from __future__ import annotations

import itertools
import logging
import math
import multiprocessing
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

import yaml

from testbed.analysis.stats import mean_ci95
from testbed.errors import InputError, LightPipeError
from testbed.spec import Scenario, parse_scenario

log = logging.getLogger(__name__)

# Summary fields that describe the setting rather than the outcome (left out of rows).
SKIPPED = {"scenario", "backend", "workload", "topology", "seed", "policy", "grid", "slots",
           "k_paths", "load_erlang", "blocking_ci95"}


# A point as sent to a worker: (index, labels, scenario dict, records directory or None),
# and what comes back: (row, None, 0) or (None, "point N {labels}: error", exit code).
Task = tuple[int, dict[str, Any], dict[str, Any], str | None]
Result = tuple[dict[str, Any] | None, str | None, int]


def split_values(text: str) -> list[str]:
    """'1,2' -> ['1', '2']; '[100,200],[400]' -> ['[100,200]', '[400]'] (commas inside
    brackets or braces belong to a value: list and mapping values in YAML/JSON syntax)."""
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return parts


def parse_set(text: str) -> tuple[str, list[Any]]:
    """--set PATH=V1,V2: 'workload.load_erlang=100,200' -> ('workload.load_erlang',
    [100, 200]); each value read as YAML (lists and mappings allowed)."""
    key, sep, values = text.partition("=")
    key = key.strip()
    if not sep or not key or not values.strip():
        raise InputError("--set", f"expected dotted.path=v1,v2,... got {text!r}")
    if any(not part for part in key.split(".")):
        raise InputError("--set", f"bad field path {key!r}")
    out = []
    for raw in split_values(values):
        try:
            out.append(yaml.safe_load(raw.strip()))
        except yaml.YAMLError:
            raise InputError("--set", f"{key}: cannot read value {raw.strip()!r} (YAML/JSON "
                             "syntax: 100, first_fit, [100, 200])") from None
    return key, out


def set_path(data: dict[str, Any], key: str, value: Any) -> None:
    """Set data[a][b]... = value for key 'a.b...' (integer parts index lists)."""
    parts = key.split(".")
    node: Any = data
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if isinstance(node, list):
            try:
                idx = int(part)
                if last:
                    node[idx] = value
                    return
                node = node[idx]
            except (ValueError, IndexError):
                raise InputError("--set", f"{key}: {'.'.join(parts[:i])} has no item "
                                 f"{part!r}") from None
        elif isinstance(node, dict):
            if last:
                node[part] = value
                return
            if node.get(part) is None:
                node[part] = {}
            node = node[part]
        else:
            raise InputError("--set", f"{key}: {'.'.join(parts[:i])} is not a mapping")


def grid_points(base: Scenario, sets: Sequence[tuple[str, list[Any]]],
                seeds: int) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(labels, scenario dict) for every combination x seed; each validated up front."""
    dumped = base.model_dump(mode="json")
    base_seed = int(dumped["workload"].get("seed", 1))
    keys = [k for k, _ in sets]
    points = []
    for combo in itertools.product(*(vals for _, vals in sets)):
        for s in range(seeds):
            data = _copy(dumped)
            for key, value in zip(keys, combo, strict=True):
                set_path(data, key, value)
            data["workload"]["seed"] = base_seed + s
            labels = dict(zip(keys, combo, strict=True)) | {"seed": base_seed + s}
            try:
                parse_scenario(data)
            except InputError as exc:
                raise InputError(f"--set {exc.path}", f"{exc.message} (point {labels})") \
                    from None
            points.append((labels, data))
    return points


def _copy(data: Any) -> Any:
    if isinstance(data, dict):
        return {k: _copy(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_copy(v) for v in data]
    return data


def run_point(args: Task) -> dict[str, Any]:
    """Run one grid point (in a worker process) and return its row."""
    index, labels, data, records = args
    scenario = parse_scenario(data)
    if scenario.workload.kind == "lightpath_requests":
        from testbed.sim.engine import simulate_lightpaths

        if records is None:
            summary = simulate_lightpaths(scenario, None, quiet=True)
        else:
            from testbed.backends.sim import SimBackend

            summary = SimBackend().run(scenario, Path(records) / f"{index:04d}", quiet=True)
    else:
        from testbed.backends.sim import SimBackend

        with tempfile.TemporaryDirectory() as tmp:
            target = Path(records) / f"{index:04d}" if records else Path(tmp) / "run"
            summary = SimBackend().run(scenario, target, quiet=True)
    row: dict[str, Any] = {"point": index, **labels}
    ci = summary.get("blocking_ci95")
    for key, value in summary.items():
        if key not in SKIPPED and key not in row and (
                value is None or isinstance(value, (int, float, str, bool))):
            row[key] = value
    if isinstance(ci, list) and len(ci) == 2:
        row["blocking_ci95_low"], row["blocking_ci95_high"] = ci
    return row


def run_point_caught(args: Task) -> Result:
    """run_point that never raises: (row, None, 0) or (None, "point N ...: error", exit code)."""
    try:
        return run_point(args), None, 0
    except Exception as exc:  # any worker error must reach the parent, with the point named
        code = exc.exit_code if isinstance(exc, LightPipeError) else 1
        return None, f"point {args[0]} {args[1]}: {type(exc).__name__}: {exc}", code


class PointRunner(Protocol):
    """Runs sweep tasks elsewhere (Ray: sweep_ray.RayRunner): (index, result) pairs, in
    the order the points finish."""

    def results(self, tasks: list[Task]) -> Iterator[tuple[int, Result]]: ...


def run_sweep(points: list[tuple[dict[str, Any], dict[str, Any]]], jobs: int,
              records: Path | None = None, on_done: Any = None,
              runner: PointRunner | None = None) -> list[dict[str, Any]]:
    """Run every point with `jobs` worker processes (or with `runner`); rows in point
    order. on_done() is called once per finished point, failed or not."""
    tasks: list[Task] = [(i, labels, data, str(records) if records else None)
                         for i, (labels, data) in enumerate(points)]
    done: list[tuple[int, Result]] = []
    results: Iterator[tuple[int, Result]]
    if runner is not None:
        results = runner.results(tasks)
    elif jobs <= 1 or len(tasks) <= 1:
        results = ((t[0], run_point_caught(t)) for t in tasks)
    else:
        results = _pool_results(tasks, jobs)
    for index, result in results:
        done.append((index, result))
        if on_done:
            on_done()
    done.sort(key=lambda d: d[0])
    rows = [r for _, (r, _e, _c) in done if r is not None]
    failures = [(str(e), c) for _, (r, e, c) in done if r is None]
    if failures:
        raise SweepFailure(rows, failures)
    return rows


def _pool_results(tasks: list[Task], jobs: int) -> Iterator[tuple[int, Result]]:
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(processes=min(jobs, len(tasks))) as pool:
        yield from zip((t[0] for t in tasks), pool.imap(run_point_caught, tasks),
                       strict=True)


class SweepFailure(LightPipeError):
    """Some grid points failed; `rows` holds the points that finished."""

    def __init__(self, rows: list[dict[str, Any]], failures: list[tuple[str, int]]) -> None:
        self.rows = rows
        self.failures = failures
        self.exit_code = 2 if all(code == 2 for _, code in failures) else 1
        more = f" (and {len(failures) - 1} more)" if len(failures) > 1 else ""
        super().__init__(f"sweep: {failures[0][0]}{more}")


def cell_text(v: Any) -> Any:
    """sweep.csv cell: lists and dicts as flow YAML, None as empty."""
    if isinstance(v, (dict, list)):
        return yaml.safe_dump(v, default_flow_style=True).strip()
    return "" if v is None else v


def aggregate(rows: list[dict[str, Any]], keys: list[str], metric: str
              ) -> list[dict[str, Any]]:
    """Mean of `metric` over seeds per combination, with a 95 % t interval half-width."""
    groups: dict[tuple[Any, ...], list[float]] = {}
    for r in rows:
        if r.get(metric) is None:
            continue
        groups.setdefault(tuple(_hashable(r[k]) for k in keys), []).append(float(r[metric]))
    out = []
    for combo, vals in groups.items():
        mean, half = mean_ci95(vals)
        out.append(dict(zip(keys, combo, strict=True)) | {
            metric: mean, f"{metric}_ci95_half": None if math.isnan(half) else half,
            "seeds": len(vals)})
    return out


def _hashable(v: Any) -> Any:
    return tuple(v) if isinstance(v, list) else v
