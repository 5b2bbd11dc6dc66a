"""Small client of the Prometheus HTTP API (instant and range queries, waiting for data)."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from testbed.errors import RuntimeFailure


def api_get(url: str, path: str, params: dict[str, str], timeout_s: float) -> Any:
    """GET one Prometheus HTTP API path (e.g. /api/v1/label/NAME/values) with params; its
    `data` (RuntimeFailure when unreachable or the query failed)."""
    full = f"{url.rstrip('/')}{path}?{urllib.parse.urlencode(params)}"
    try:
        with urllib.request.urlopen(full, timeout=timeout_s) as r:
            body = json.loads(r.read())
    except urllib.error.HTTPError as exc:
        try:
            body = json.loads(exc.read())
        except ValueError:
            raise RuntimeFailure(f"prometheus {path}: HTTP {exc.code}") from exc
    except (urllib.error.URLError, OSError) as exc:
        raise RuntimeFailure(f"prometheus at {url} unreachable: {exc}") from exc
    if body.get("status") != "success":
        raise RuntimeFailure(f"prometheus query failed: {body.get('errorType')}: "
                             f"{body.get('error')}")
    return body["data"]


def query(url: str, promql: str, timeout_s: float = 10.0,
          at_s: float | None = None) -> list[dict[str, Any]]:
    """Instant query evaluated now, or at the Unix time at_s (a finished run's TSDB holds
    nothing "now": an instant query looks back 5 minutes only); returns the result vector
    ([{'metric': {...}, 'value': [t, 'v']}])."""
    params = {"query": promql} if at_s is None else {"query": promql, "time": f"{at_s:.3f}"}
    data = api_get(url, "/api/v1/query", params, timeout_s)
    result = data.get("result", [])
    if data.get("resultType") == "scalar":
        return [{"metric": {}, "value": result}]
    return list(result)


def query_range(url: str, promql: str, start_s: float, end_s: float, step_s: float = 1.0,
                timeout_s: float = 10.0) -> list[dict[str, Any]]:
    data = api_get(url, "/api/v1/query_range", {"query": promql, "start": str(start_s),
                                             "end": str(end_s), "step": str(step_s)},
                timeout_s)
    return list(data.get("result", []))


def values(result: list[dict[str, Any]]) -> list[float]:
    return [float(r["value"][1]) for r in result]


def wait_for(url: str, promql: str, timeout_s: float = 30.0,
             interval_s: float = 0.5, at_s: float | None = None) -> list[dict[str, Any]]:
    """Poll an instant query (evaluated now, or at at_s: see query) until it returns
    data; RuntimeFailure on timeout."""
    end = time.monotonic() + timeout_s
    while True:
        try:
            res = query(url, promql, at_s=at_s)
        except RuntimeFailure:
            res = []
        if res:
            return res
        if time.monotonic() > end:
            raise RuntimeFailure(f"no data for {promql!r} from {url} within {timeout_s:.0f} s")
        time.sleep(interval_s)


def targets(url: str) -> list[dict[str, Any]]:
    """Active scrape targets with their health."""
    return list(api_get(url, "/api/v1/targets", {"state": "active"}, 10.0)["activeTargets"])
