"""REST API tests without root: real HTTP server around a controller core (no switches)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from controllers.api import RestApi
from controllers.core import ControllerCore
from controllers.layout import default_layout
from controllers.store import Store
from testbed.cli.main import main
from testbed.orchestrate.ctl_process import rest_call
from tests.test_controller_core import small_scenario
from tests.waiting import scaled


@pytest.fixture
def api(tmp_path: Path) -> Iterator[RestApi]:
    sc = small_scenario()
    core = ControllerCore(sc, Store(tmp_path / "s.db"), layout=default_layout(sc))
    server = RestApi(core, port=0, token="tok")
    server.serve()
    yield server
    server.close()


def call(api: RestApi, method: str, path: str, body: Any = None,
         token: str | None = "tok") -> tuple[int, Any]:
    return rest_call(api.url, method, path, body, token, timeout_s=scaled(60))


def test_lightpath_lifecycle(api: RestApi) -> None:
    status, lp = call(api, "POST", "/lightpaths", {"src_dc": "dc-a", "dst_dc": "dc-c",
                                                   "bitrate_gbps": 100})
    assert status == 201
    for key in ("nodes", "slots", "modulation", "capacity_gbps", "vid"):
        assert key in lp
    got = call(api, "GET", f"/lightpaths/{lp['id']}")[1]
    assert got == {k: v for k, v in lp.items() if k != "setup_s"}  # same keys, no nulls added
    assert call(api, "GET", "/lightpaths")[1]["lightpaths"] == [got]
    status, spec = call(api, "GET", "/spectrum")
    used = {(f["u"], f["v"]): f["used"] for f in spec["fibres"]}
    assert used[("A", "B")] == lp["slots"]
    assert call(api, "DELETE", f"/lightpaths/{lp['id']}")[0] == 200
    assert call(api, "GET", f"/lightpaths/{lp['id']}")[0] == 404


@pytest.mark.parametrize("method,path,body,status", [
    ("POST", "/lightpaths", b"{oops", 400),
    ("POST", "/lightpaths", b"\xff", 400),
    ("POST", "/lightpaths", b"[]", 400),
    ("POST", "/lightpaths", {"src_dc": "dc-a"}, 422),
    ("POST", "/lightpaths", {"src_dc": "dc-a", "dst_dc": "dc-c", "slots": "3"}, 422),
    ("POST", "/lightpaths", {"src_dc": "dc-a", "dst_dc": "dc-c", "slots": 0}, 422),
    ("POST", "/lightpaths", {"src_dc": "dc-a", "dst_dc": "dc-c", "bitrate_gbps": -5}, 422),
    ("POST", "/lightpaths", {"src_dc": "dc-a", "dst_dc": "dc-c", "slots": 1, "y": 2}, 422),
    ("POST", "/lightpaths", {"src_dc": "dc-q", "dst_dc": "dc-c", "slots": 1}, 404),
    ("POST", "/lightpaths", {"src_dc": "dc-a", "dst_dc": "dc-c", "slots": 17}, 400),
    ("POST", "/failures", {"link": ["A", "Q"]}, 404),
    ("POST", "/failures", {"link": "AB"}, 422),
    ("POST", "/failures", {"link": ["A", "Q"], "first_slot": 0, "slots": 1}, 404),
    ("POST", "/failures", {"link": ["A", "B"], "first_slot": 15, "slots": 2}, 400),
    ("POST", "/repairs", {"link": ["A", "B"], "first_slot": 16, "slots": 1}, 400),
    ("POST", "/failures", {"link": ["A", "B"], "first_slot": 0}, 422),
    ("POST", "/repairs", {"link": ["A", "B"], "slots": 2}, 422),
    ("POST", "/failures", {"link": ["A", "B"], "first_slot": "0", "slots": 1}, 422),
    ("POST", "/failures", {"link": ["A", "B"], "first_slot": 0, "slots": 0}, 422),
    ("PUT", "/layout", {"switches": []}, 422),
    ("DELETE", "/lightpaths/77", None, 404),
    ("DELETE", "/lightpaths", None, 405),
    ("GET", "/lightpaths/x", None, 404),
    ("GET", "/nothing", None, 404),
])
def test_bad_input_is_4xx(api: RestApi, method: str, path: str, body: Any,
                          status: int) -> None:
    got, reply = call(api, method, path, body)
    assert got == status, reply
    assert isinstance(reply, dict) and reply["error"]
    assert call(api, "GET", "/health")[0] == 200


def test_token_required(api: RestApi) -> None:
    assert call(api, "GET", "/lightpaths", token=None)[0] == 401
    assert call(api, "GET", "/lightpaths", token="bad")[0] == 401
    assert call(api, "GET", "/health", token=None)[0] == 200


def test_blocked_409_and_metrics(api: RestApi) -> None:
    for _ in range(2):
        assert call(api, "POST", "/lightpaths", {"src_dc": "dc-a", "dst_dc": "dc-c",
                                                 "slots": 16})[0] == 201
    status, reply = call(api, "POST", "/lightpaths", {"src_dc": "dc-a", "dst_dc": "dc-c",
                                                      "slots": 1})
    assert status == 409 and reply["reason"] == "no_spectrum"
    status, text = call(api, "GET", "/metrics", token=None)
    assert 'lightpipe_lightpath_blocks_total{reason="no_spectrum"} 1.0' in text
    assert "lightpipe_lightpath_requests_total 3.0" in text
    assert "lightpipe_lightpaths_active 2.0" in text
    assert 'lightpipe_fibre_slots_used{fibre="A-B"} 16.0' in text
    assert "lightpipe_lightpath_setup_seconds_count 2.0" in text


def test_failure_and_repair(api: RestApi) -> None:
    _, lp = call(api, "POST", "/lightpaths", {"src_dc": "dc-a", "dst_dc": "dc-c", "slots": 2})
    status, res = call(api, "POST", "/failures", {"link": ["B", "A"]})
    assert status == 200 and res["restored"] == [lp["id"]]
    assert call(api, "GET", f"/lightpaths/{lp['id']}")[1]["nodes"] == ["A", "D", "C"]
    topo = call(api, "GET", "/topology")[1]
    assert next(f for f in topo["fibres"] if f["u"] == "A" and f["v"] == "B")["failed"]
    assert call(api, "POST", "/repairs", {"link": ["A", "B"]})[0] == 200


def test_wavelength_loss_and_repair(api: RestApi) -> None:
    _, a = call(api, "POST", "/lightpaths", {"src_dc": "dc-a", "dst_dc": "dc-c", "slots": 2})
    _, b = call(api, "POST", "/lightpaths", {"src_dc": "dc-a", "dst_dc": "dc-b", "slots": 2})
    assert a["slots"] == [0, 1] and b["slots"] == [2, 3]
    body = {"link": ["B", "A"], "first_slot": 1, "slots": 2}
    assert call(api, "POST", "/failures", body, token=None)[0] == 401
    assert call(api, "POST", "/repairs", body, token="bad")[0] == 401
    status, res = call(api, "POST", "/failures", body)
    assert status == 200, res
    assert res["restored"] == [a["id"], b["id"]] and res["lost"] == []
    assert (res["fibre"], res["first_slot"], res["slots"]) == (["B", "A"], 1, 2)
    assert res["restoration_s"] >= 0
    # re-placed in id order with the same request, past the lost block, same routes
    got = {lp["id"]: lp for lp in call(api, "GET", "/lightpaths")[1]["lightpaths"]}
    assert got[a["id"]]["slots"] == [3, 4] and got[b["id"]]["slots"] == [5, 6]
    assert got[a["id"]]["nodes"] == a["nodes"] and got[a["id"]]["vid"] == a["vid"]
    ab = next(f for f in call(api, "GET", "/spectrum")[1]["fibres"] if f["u"] == "A"
              and f["v"] == "B")
    assert ab["lost_slots"] == [1, 2] and ab["used"] == [3, 4, 5, 6] and not ab["failed"]
    text = call(api, "GET", "/metrics", token=None)[1]
    assert "lightpipe_lightpaths_restored_total 2.0" in text
    assert "lightpipe_restoration_seconds_count 1.0" in text
    status, rep = call(api, "POST", "/repairs", {"link": ["A", "B"], "first_slot": 2,
                                                 "slots": 1})
    assert status == 200 and rep == {"fibre": ["A", "B"], "failed": False, "lost_slots": [1],
                                     "first_slot": 2, "slots": 1}
    # a plain fibre repair leaves the lost slot out of service
    assert call(api, "POST", "/repairs", {"link": ["A", "B"]})[1]["lost_slots"] == [1]
    assert call(api, "POST", "/lightpaths", {"src_dc": "dc-a", "dst_dc": "dc-b",
                                             "slots": 1})[1]["slots"] == [0]
    assert call(api, "POST", "/lightpaths", {"src_dc": "dc-a", "dst_dc": "dc-b",
                                             "slots": 1})[1]["slots"] == [2]


def test_openapi_document(api: RestApi) -> None:
    status, doc = call(api, "GET", "/openapi.json", token=None)
    assert status == 200 and doc["openapi"].startswith("3.")
    for path in ("/topology", "/spectrum", "/lightpaths", "/lightpaths/{id}", "/jobs",
                 "/health", "/failures"):
        assert path in doc["paths"]
    assert "LightpathRequest" in doc["components"]["schemas"]
    event = doc["components"]["schemas"]["FibreEvent"]
    assert {"link", "first_slot", "slots"} <= set(event["properties"])
    assert event["dependentRequired"] == {"first_slot": ["slots"], "slots": ["first_slot"]}
    assert "lost_slots" in doc["components"]["schemas"]["RepairReply"]["properties"]


def test_cli_bad_input_exit_2(tmp_path: Path) -> None:
    assert main(["controller", str(tmp_path / "missing.yaml")]) == 2
    spec = tmp_path / "s.yaml"
    spec.write_text("version: 1\nname: x\ntopology: {library: nsfnet}\n"
                    "workload: {kind: lightpath_requests}\n")
    assert main(["controller", str(spec), "--port", "70000"]) == 2
    bad = tmp_path / "layout.json"
    bad.write_text('{"switches": 3}')
    assert main(["controller", str(spec), "--layout", str(bad)]) == 2
