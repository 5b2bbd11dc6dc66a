"""The controller's REST client (testbed.orchestrate.ctl_process): kept-alive connections
against a real controller process (no root)."""

from __future__ import annotations

import http.client
import json
import threading
import time
from pathlib import Path

import pytest

from controllers.api import KEEP_ALIVE_TIMEOUT_S
from testbed.orchestrate.ctl_process import ControllerProcess, start_controller
from tests.test_controller_core import small_scenario

LP = {"src_dc": "dc-a", "dst_dc": "dc-c", "slots": 2}


def _start(tmp_path: Path) -> ControllerProcess:
    from testbed.orchestrate.controller import write_spec

    spec = write_spec(small_scenario(), tmp_path / "s.yaml")
    return start_controller(spec, tmp_path / "c.db", timeout_s=60)


def _local_port(ctl: ControllerProcess) -> int:
    (conn,) = [c for (tid, _), c in ctl._conns.items() if tid == threading.get_ident()]
    assert conn.sock is not None
    return conn.sock.getsockname()[1]


def test_calls_share_one_connection_and_survive_the_server_closing_it(
        tmp_path: Path) -> None:
    ctl = _start(tmp_path)
    try:
        assert ctl.request("GET", "/health")[0] == 200
        port = _local_port(ctl)
        status, lp = ctl.request("POST", "/lightpaths", LP)
        assert status == 201 and lp["src_dc"] == "dc-a"
        assert ctl.request("GET", f"/lightpaths/{lp['id']}")[1]["id"] == lp["id"]
        assert _local_port(ctl) == port  # the same TCP connection all along
        # a refusal the guard sends with `Connection: close`, then a call afresh
        token, ctl.token = ctl.token, "wrong"
        assert ctl.request("POST", "/lightpaths", LP)[0] == 401
        ctl.token = token
        assert ctl.request("GET", "/health")[0] == 200
        port = _local_port(ctl)
        # the server closes an idle connection after its keep-alive time-out: the next
        # call (a POST, never sent twice) sees that before it goes and reconnects
        time.sleep(KEEP_ALIVE_TIMEOUT_S + 1.0)
        status, lp2 = ctl.request("POST", "/lightpaths", LP)
        assert status == 201 and lp2["id"] != lp["id"]
        assert _local_port(ctl) != port
        lps = ctl.request("GET", "/lightpaths")[1]["lightpaths"]
        assert sorted(x["id"] for x in lps) == sorted([lp["id"], lp2["id"]])
    finally:
        ctl.stop()
    assert ctl._conns == {}


def test_each_thread_has_its_own_connection(tmp_path: Path) -> None:
    """Four threads alive together (a barrier before their calls and one after: a thread
    that ended could hand its ident to the next one) keep a connection each."""
    ctl = _start(tmp_path)
    got: list[int] = []
    together = threading.Barrier(4, timeout=60)
    try:
        def call() -> None:
            together.wait()
            for _ in range(5):
                got.append(ctl.request("GET", "/health")[0])
            together.wait()

        threads = [threading.Thread(target=call) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert got == [200] * 20
        mine = {t.ident for t in threads}
        assert len([k for k in ctl._conns if k[0] in mine]) == 4
        assert json.dumps(ctl.describe())  # what network.json records still serializes
    finally:
        ctl.stop()


def test_a_dropped_connection_is_resent_only_for_an_idempotent_call(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The server closes the idle connection and the check before reuse misses it (as in
    the instant between the check and the send): a GET goes again on a new connection,
    a POST is never sent twice."""
    from testbed.orchestrate import ctl_process

    ctl = _start(tmp_path)
    try:
        assert ctl.request("GET", "/health")[0] == 200
        monkeypatch.setattr(ctl_process, "_dropped", lambda conn: False)
        time.sleep(KEEP_ALIVE_TIMEOUT_S + 1.0)
        assert ctl.request("GET", "/lightpaths")[0] == 200  # resent, afresh
        time.sleep(KEEP_ALIVE_TIMEOUT_S + 1.0)
        with pytest.raises((http.client.HTTPException, ConnectionError)):
            ctl.request("POST", "/lightpaths", LP)
        assert ctl.request("GET", "/lightpaths")[1]["lightpaths"] == []
    finally:
        ctl.stop()
