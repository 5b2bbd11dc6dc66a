"""A switch's connection as the controller app sees it, in-process with os-ken's own classes.

Two races of os-ken's native hub (real threads), each found as a failure elsewhere:
- os-ken queues EventOFPSwitchFeatures to the apps before its own handler sets
  `datapath.id`; the app's handler may run first and see None (the VM ring's switches
  then never counted as connected: /health failed on a None id);
- a switch that connects before the controller has a layout (a restarted controller's
  switches reconnect at once) must keep the rules it forwards on until the layout says
  what is wanted (they were wiped: echoes lost across a controller restart).
No root, no Open vSwitch: os-ken's real `Datapath` over a loopback connection; what the
app would send to the switch stays in the datapath's send queue (its loop is not run).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.waiting import wait_until

SCENARIO = """
version: 1
name: ctl-connect
topology:
  links:
    - {u: A, v: B, length_km: 100}
dcs:
  - {name: dc-a, node: A, gpus: 8}
  - {name: dc-b, node: B, gpus: 8}
optical: {slots: 16, k_paths: 1}
workload: {kind: lightpath_requests}
"""


@pytest.fixture
def app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    os.environ.setdefault("OSKEN_HUB_TYPE", "native")
    from controllers.lightpath_app import LightpathApp
    from controllers.tokenfile import write_secret

    spec = tmp_path / "s.yaml"
    spec.write_text(SCENARIO)
    token = tmp_path / "t.token"
    write_secret(token, "t0ken")
    monkeypatch.setenv("LIGHTPIPE_CTL_SPEC", str(spec))
    monkeypatch.setenv("LIGHTPIPE_CTL_DB", str(tmp_path / "ctl.db"))
    monkeypatch.setenv("LIGHTPIPE_CTL_TOKEN_FILE", str(token))
    monkeypatch.setenv("LIGHTPIPE_CTL_REST", "127.0.0.1:0")
    monkeypatch.delenv("LIGHTPIPE_CTL_REST_FD", raising=False)
    monkeypatch.delenv("LIGHTPIPE_CTL_LAYOUT", raising=False)
    monkeypatch.setenv("LIGHTPIPE_CTL_SWITCH_TIMEOUT_S", "0.5")
    a = LightpathApp()
    try:
        yield a
    finally:
        a.close()


def _datapath() -> tuple[Any, socket.socket]:
    """os-ken's Datapath on one end of a loopback TCP connection (its id unset, as on
    connect); the other end stands where the switch would."""
    from os_ken.controller.controller import Datapath
    from os_ken.ofproto import ofproto_v1_3

    with socket.create_server(("127.0.0.1", 0)) as srv:
        switch = socket.create_connection(srv.getsockname())
        ours, addr = srv.accept()
    dp = Datapath(ours, addr)
    dp.set_version(ofproto_v1_3.OFP_VERSION)
    switch.settimeout(0.2)
    return dp, switch


def _features(dp: Any, dpid: int) -> Any:
    from os_ken.controller import ofp_event

    msg = dp.ofproto_parser.OFPSwitchFeatures(dp, datapath_id=dpid, n_buffers=0,
                                              n_tables=254, auxiliary_id=0, capabilities=0)
    return ofp_event.EventOFPSwitchFeatures(msg)


def test_features_before_os_ken_sets_the_id(app: Any) -> None:
    dp, _switch = _datapath()
    assert dp.id is None  # as when the app's handler runs before os-ken's
    app._features(_features(dp, 0x2A))
    assert app.datapaths == {0x2A: dp} and dp.id == 0x2A
    assert app.core.connected == {0x2A}
    from testbed.orchestrate.ctl_process import rest_call

    status, body = rest_call(app.api.url, "GET", "/health")
    assert status == 200 and body["switches"] == [0x2A]


def test_no_layout_leaves_the_switch_tables_alone(app: Any) -> None:
    dp, _switch = _datapath()  # the far end stays open
    app._features(_features(dp, 7))
    wait_until(lambda: 7 in getattr(app, "awaiting_layout", ()) or dp.send_q.qsize(),
               timeout_s=10, what="the switch's full sync to decide")
    # Nothing was queued for the switch: no table read, no wipe, no rule.
    assert dp.send_q.qsize() == 0
    assert app.awaiting_layout == {7}
    assert 7 not in app.core.synced  # not claimed as holding its rules either
    app._dead(type("Ev", (), {"datapath": dp})())  # it goes away: forgotten
    assert 7 not in app.awaiting_layout and 7 not in app.core.connected
