"""Parameter sweeps: a grid of `--set dotted.path=v1,v2` values x seeds, run in processes."""

from __future__ import annotations

import csv
import io
import itertools
import logging
import math
import multiprocessing
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from testbed.errors import InputError
from testbed.sim.stats import t975
from testbed.spec import Scenario, parse_scenario

log = logging.getLogger(__name__)

# Summary fields that describe the setting rather than the outcome (left out of rows).
SKIPPED = {"scenario", "backend", "workload", "topology", "seed", "policy", "grid", "slots",
           "k_paths", "load_erlang", "blocking_ci95"}


def parse_set(text: str) -> tuple[str, list[Any]]:
    """'workload.load_erlang=100,200' -> ('workload.load_erlang', [100, 200])."""
    key, sep, values = text.partition("=")
    key = key.strip()
    if not sep or not key or not values.strip():
        raise InputError("--set", f"expected dotted.path=v1,v2,... got {text!r}")
    if any(not part for part in key.split(".")):
        raise InputError("--set", f"bad field path {key!r}")
    out = []
    for raw in values.split(","):
        try:
            out.append(yaml.safe_load(raw.strip()))
        except yaml.YAMLError:
            raise InputError("--set", f"{key}: cannot read value {raw!r}") from None
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


def run_point(args: tuple[int, dict[str, Any], dict[str, Any], str | None]) -> dict[str, Any]:
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


def run_sweep(points: list[tuple[dict[str, Any], dict[str, Any]]], jobs: int,
              records: Path | None = None, on_done: Any = None) -> list[dict[str, Any]]:
    """Run every point with `jobs` worker processes; rows in point order."""
    tasks = [(i, labels, data, str(records) if records else None)
             for i, (labels, data) in enumerate(points)]
    if jobs <= 1 or len(tasks) <= 1:
        rows = []
        for t in tasks:
            rows.append(run_point(t))
            if on_done:
                on_done()
        return rows
    ctx = multiprocessing.get_context("spawn")
    rows = []
    with ctx.Pool(processes=min(jobs, len(tasks))) as pool:
        for row in pool.imap(run_point, tasks):
            rows.append(row)
            if on_done:
                on_done()
    return rows


def rows_csv(rows: list[dict[str, Any]]) -> str:
    cols: list[str] = []
    for r in rows:
        cols += [c for c in r if c not in cols]
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=cols, lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({c: _cell(r.get(c)) for c in cols})
    return buf.getvalue()


def _cell(v: Any) -> Any:
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
        mean = sum(vals) / len(vals)
        half = math.nan
        if len(vals) > 1:
            sd = math.sqrt(sum((v - mean) ** 2 for v in vals) / (len(vals) - 1))
            half = t975(len(vals) - 1) * sd / math.sqrt(len(vals))
        out.append(dict(zip(keys, combo, strict=True)) | {
            metric: mean, f"{metric}_ci95_half": None if math.isnan(half) else half,
            "seeds": len(vals)})
    return out


def _hashable(v: Any) -> Any:
    return tuple(v) if isinstance(v, list) else v


def plot(agg: list[dict[str, Any]], keys: list[str], metric: str, path: Path,
         title: str) -> None:
    """Metric vs the x key (load if swept, else the first key), one line per other combo."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xkey = "workload.load_erlang" if "workload.load_erlang" in keys else (keys[0] if keys
                                                                          else None)
    # Lines differ by the other swept keys that take more than one value.
    others = [k for k in keys if k != xkey and len({_hashable(a[k]) for a in agg}) > 1]
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    lines: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for a in agg:
        lines.setdefault(tuple(_hashable(a[k]) for k in others), []).append(a)
    numeric_x = xkey is not None and all(isinstance(a[xkey], (int, float)) for a in agg)
    positive = all(a[metric] > 0 for a in agg)
    for combo, pts in lines.items():
        pts.sort(key=lambda a: a[xkey] if numeric_x and xkey else 0)
        xs = [a[xkey] if xkey else 0 for a in pts]
        if not numeric_x:
            xs = [str(x) for x in xs]
        ys = [a[metric] for a in pts]
        err = [a[f"{metric}_ci95_half"] or 0.0 for a in pts]
        label = ", ".join(f"{k.split('.')[-1]}={v}" for k, v in zip(others, combo,
                                                                     strict=True)) or metric
        ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, label=label)
    ax.set_xlabel(xkey or "")
    ax.set_ylabel(metric.replace("_", " "))
    if positive and metric.endswith("ratio"):
        ax.set_yscale("log")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
