"""Helpers for the REST API tests: a real API server around a controller core (no switches),
raw HTTP requests, and the spectrum/rules consistency check."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from controllers.api import RestApi
from controllers.controls import RunControls
from controllers.core import ControllerCore
from controllers.jobs import JobService
from controllers.layout import Layout, default_layout
from controllers.rules import COOKIE_LP
from controllers.store import Store
from tests.test_controller_core import Recorder, small_scenario

TOKEN = "tok-" + "x" * 20


@contextmanager
def serve(tmp: Path, *, controls: RunControls | None = None,
          layout: Layout | None = None) -> Iterator[RestApi]:
    """A served API on 127.0.0.1:<any>, token TOKEN, small_scenario's core."""
    sc = small_scenario()
    core = ControllerCore(sc, Store(tmp / "api.db"),
                          layout=layout if layout is not None else default_layout(sc),
                          southbound=Recorder(), controls=controls)
    api = RestApi(core, port=0, token=TOKEN, jobs=JobService(core))
    api.serve()
    try:
        yield api
    finally:
        api.close()
        core.store.close()


def raw(api: RestApi, method: str, path: str, body: bytes | None = None,
        headers: dict[str, str] | None = None, skip_host: bool = False,
        timeout_s: float = 10.0) -> tuple[int, Any]:
    """One request with exactly these headers (plus Host unless skip_host)."""
    conn = http.client.HTTPConnection(api.host, api.port, timeout=timeout_s)
    try:
        skip_host = skip_host or any(k.lower() == "host" for k in headers or {})
        conn.putrequest(method, path, skip_host=skip_host, skip_accept_encoding=True)
        for k, v in (headers or {}).items():
            conn.putheader(k, v)
        if body is not None:
            conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body)
        resp = conn.getresponse()
        data = resp.read()
        ctype = resp.getheader("Content-Type", "")
        return resp.status, (json.loads(data) if "json" in ctype else data.decode())
    finally:
        conn.close()


def auth(extra: dict[str, str] | None = None, json_body: bool = True) -> dict[str, str]:
    h = {"Authorization": f"Bearer {TOKEN}"}
    if json_body:
        h["Content-Type"] = "application/json"
    return {**h, **(extra or {})}


def assert_consistent(api: RestApi) -> None:
    """No slot held by two lightpaths, none on a lost slot; the spectrum shown is exactly
    the lightpaths'; the optical state agrees with the stored rows; every lightpath has
    its rules."""
    core = api.core
    s1, lps = raw(api, "GET", "/lightpaths", headers=auth(json_body=False))
    s2, spec = raw(api, "GET", "/spectrum", headers=auth(json_body=False))
    assert s1 == 200 and s2 == 200
    held: dict[frozenset[str], dict[int, int]] = {}
    for lp in lps["lightpaths"]:
        for a, b in lp["fibres"]:
            on = held.setdefault(frozenset((a, b)), {})
            for slot in lp["slots"]:
                assert slot not in on, f"slot {slot} of {a}-{b} held by {on[slot]} and {lp['id']}"
                on[slot] = lp["id"]
    for f in spec["fibres"]:
        on = held.get(frozenset((f["u"], f["v"])), {})
        if not f["failed"]:
            assert sorted(on) == f["used"], f
        assert not set(on) & set(f["lost_slots"]), f"a lightpath holds a lost slot: {f}"
    with core.lock:
        assert set(core.rows) == set(core.optical) == {lp["id"] for lp in lps["lightpaths"]}
        assert {r.id for r in core.store.lightpaths()} == set(core.rows)
        assert all(lp.id in core.net.lightpaths for lp in core.optical.values())
        cookies = {r.cookie for d in core.desired().values() for r in d.values()}
    for lp in lps["lightpaths"]:
        assert COOKIE_LP | lp["id"] in cookies, f"lightpath {lp['id']} has no rules"
