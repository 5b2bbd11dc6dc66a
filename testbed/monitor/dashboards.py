"""The Grafana dashboards as data: build them from grafana/lightpipe_dashboards.py, find
stale JSON, list every query (panels, template variables, annotations) and run them
against a Prometheus with the variables substituted (`lightpipe grafana check`)."""

from __future__ import annotations

import importlib.util
import json
import math
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from testbed.errors import InputError

BUILTINS = {"$__rate_interval": "10s", "$__interval": "2s", "$__range": "1h"}


def grafana_dir() -> Path:
    """The checkout's grafana/ directory (next to the testbed package)."""
    return Path(__file__).resolve().parents[2] / "grafana"


def load_builder(gdir: Path | None = None) -> ModuleType:
    """Import grafana/lightpipe_dashboards.py (needs grafana-foundation-sdk)."""
    path = (gdir or grafana_dir()) / "lightpipe_dashboards.py"
    if not path.exists():
        raise InputError("grafana", f"{path} not found (run from a LightPipe checkout)")
    if importlib.util.find_spec("grafana_foundation_sdk") is None:
        raise InputError("grafana", "grafana-foundation-sdk is not installed "
                         "(pip install -e '.[grafana]')")
    spec = importlib.util.spec_from_file_location("lightpipe_dashboards", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def build(gdir: Path | None = None) -> dict[str, str]:
    """{file name: JSON text} of every dashboard."""
    return dict(load_builder(gdir).build_all())


def stale(gdir: Path | None = None) -> list[str]:
    """Dashboard files in grafana/dashboards/ that differ from a fresh build (or miss)."""
    gdir = gdir or grafana_dir()
    out = []
    for name, text in build(gdir).items():
        path = gdir / "dashboards" / name
        if not path.exists() or path.read_text() != text:
            out.append(name)
    return out


def load_dashboards(gdir: Path | None = None) -> dict[str, dict[str, Any]]:
    gdir = gdir or grafana_dir()
    return {p.stem: json.loads(p.read_text())
            for p in sorted((gdir / "dashboards").glob("*.json"))}


@dataclass(frozen=True)
class DashQuery:
    """One query of a dashboard: where it is and its PromQL."""

    dashboard: str
    kind: str  # panel, variable, annotation
    title: str
    expr: str


def queries(name: str, dash: dict[str, Any]) -> list[DashQuery]:
    out = []
    for v in dash.get("templating", {}).get("list", []):
        q = v.get("query")
        out.append(DashQuery(name, "variable", v["name"],
                             q if isinstance(q, str) else q.get("query", "")))
    for a in dash.get("annotations", {}).get("list", []):
        if a.get("expr"):
            out.append(DashQuery(name, "annotation", a["name"], a["expr"]))
    for p in dash.get("panels", []):
        for t in p.get("targets", []):
            out.append(DashQuery(name, "panel", f"{p['title']} [{t.get('refId', '')}]",
                                 t["expr"]))
    return out


def builtins_for(runs: Mapping[str, Mapping[str, str]]) -> dict[str, str]:
    """BUILTINS for these runs (run id -> lightpipe_run_info labels): $__rate_interval at
    least 4 of their longest scrape interval, as Grafana takes it (a run on a slow machine
    is scraped less often: testbed.monitor.run.run_scrape_interval_s)."""
    longest = 0.0
    for facts in runs.values():
        try:
            longest = max(longest, float(facts.get("scrape_interval_s", 0) or 0))
        except ValueError:
            continue
    rate_s = max(int(BUILTINS["$__rate_interval"].removesuffix("s")), math.ceil(4 * longest))
    return {**BUILTINS, "$__rate_interval": f"{rate_s}s"}


def substitute(expr: str, values: dict[str, str],
               builtins: Mapping[str, str] | None = None) -> str:
    """Replace $__builtins and $var / ${var} with values (regexes for =~ matchers)."""
    for k, v in (builtins or BUILTINS).items():
        expr = expr.replace(k, v)

    def sub(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        return values.get(name, ".*")

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", sub, expr)


LABEL_VALUES = re.compile(r"^label_values\((?:(.*),\s*)?(\w+)\)$")


def variable_values(url: str, query: str, values: dict[str, str]) -> list[str]:
    """What Grafana would list for a `label_values(selector, label)` variable."""
    from testbed.metrics.query import api_get

    m = LABEL_VALUES.match(substitute(query, values).strip())
    if m is None:
        raise InputError("query", f"unsupported variable query {query!r}")
    selector, label = m.group(1), m.group(2)
    params = {"match[]": selector} if selector else {}
    return list(api_get(url, f"/api/v1/label/{label}/values", params, 10.0))


def run_query(url: str, q: DashQuery, values: dict[str, str], start_s: float, end_s: float,
              step_s: float = 2.0, builtins: Mapping[str, str] | None = None) -> int:
    """Number of series (variables: values) the query returns over [start, end]."""
    from testbed.metrics.query import query_range

    if q.kind == "variable":
        return len(variable_values(url, q.expr, values))
    res = query_range(url, substitute(q.expr, values, builtins), start_s, end_s, step_s)
    return sum(1 for r in res if any(v[1] not in ("NaN", "+Inf", "-Inf")
                                     for v in r.get("values", [])))
