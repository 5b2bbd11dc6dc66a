"""The controller's REST API fuzzed from its own /openapi.json (schemathesis + hypothesis).

A real uvicorn server around a controller core without switches. For every operation
the document lists, valid and invalid requests are generated (half of the valid ones
steered to names that exist: DCs, fibres, hosts, small ids, so that lightpaths are set
up, cut and torn down); every response must be documented (status, content type,
schema) and none a 5xx. Afterwards the spectrum is consistent (no slot held by two
lightpaths, every lightpath has its rules), and every mutating operation refuses a
request without the token. Fixed budget: MAX_EXAMPLES per operation and mode, the same
examples every run (LIGHTPIPE_FUZZ_RANDOM=1 draws new ones).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

schemathesis = pytest.importorskip("schemathesis")

from schemathesis import GenerationMode  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402
from schemathesis.specs.openapi.checks import (  # noqa: E402
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

from tests.restkit import TOKEN, assert_consistent, raw, serve  # noqa: E402

MAX_EXAMPLES = 25
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance,
          response_schema_conformance, negative_data_rejection]
DCS = ["dc-a", "dc-b", "dc-c", "node:D"]
NODES = ["A", "B", "C", "D"]
HOSTS = ["dc-a-h0", "dc-a-h1", "dc-c-h0", "dc-c-h1", "dc-b-h0"]


def steer(case: Any, data: st.DataObject) -> None:
    """Point a valid case at things that exist (half of the time), so that it changes
    the controller's state instead of meeting a 404."""
    if not data.draw(st.booleans()):
        return
    body = case.body if isinstance(case.body, dict) else None
    label = f"{case.method.upper()} {case.path}"
    if case.path_parameters and "id" in case.path_parameters:
        case.path_parameters["id"] = data.draw(st.integers(1, 12))
    if body is None:
        return
    if label == "POST /lightpaths":
        body["src_dc"], body["dst_dc"] = data.draw(st.permutations(DCS))[:2]
        body.pop("src_host", None)
        body.pop("dst_host", None)
        body.pop("vid", None)
        body.pop("slots", None)
        body.pop("bitrate_gbps", None)
        if data.draw(st.booleans()):
            body["slots"] = data.draw(st.integers(1, 6))
        else:
            body["bitrate_gbps"] = data.draw(st.sampled_from([10.0, 100.0, 400.0]))
    elif label in ("POST /failures", "POST /repairs"):
        body["link"] = data.draw(st.sampled_from([["A", "B"], ["B", "C"], ["A", "D"],
                                                  ["D", "C"]]))
        if "first_slot" in body or "slots" in body:  # a slot block inside the 16-slot grid
            body["first_slot"] = data.draw(st.integers(0, 15))
            body["slots"] = data.draw(st.integers(1, 16 - body["first_slot"]))
    elif label == "POST /routing/jobs":
        body["members"] = data.draw(st.lists(st.sampled_from(HOSTS), min_size=2, max_size=4,
                                             unique=True))
    elif label == "POST /jobs":
        body.update(model=data.draw(st.sampled_from(["llama2-7b", "gpt3-6.7b"])),
                    stages=data.draw(st.integers(1, 3)),
                    gpus_per_stage=data.draw(st.integers(1, 8)))
        for key in ("policy", "schedule", "max_stages_per_dc"):
            body.pop(key, None)
    elif label == "PUT /routing":
        body["policy"] = data.draw(st.sampled_from(["ecmp", "shortest", "greedy"]))


def fuzz(api: Any, op: Any, mode: Any, statuses: dict[str, set[int]]) -> None:
    """MAX_EXAMPLES generated requests of one operation in one mode, each checked."""
    @settings(max_examples=MAX_EXAMPLES, deadline=None, database=None,
              derandomize=not os.environ.get("LIGHTPIPE_FUZZ_RANDOM"),
              suppress_health_check=list(HealthCheck))
    @given(case=op.as_strategy(generation_mode=mode), data=st.data())
    def run(case: Any, data: st.DataObject) -> None:
        if mode == GenerationMode.POSITIVE:
            steer(case, data)
        resp = case.call_and_validate(
            base_url=api.url, headers={"Authorization": f"Bearer {TOKEN}"},
            checks=CHECKS, timeout=30)
        statuses.setdefault(op.label, set()).add(resp.status_code)

    run()


def test_rest_api_fuzzed_from_its_openapi(tmp_path: Path) -> None:
    with serve(tmp_path) as api:
        schema = schemathesis.openapi.from_url(api.url + "/openapi.json")
        operations = [r.ok() for r in schema.get_all_operations()]
        assert len(operations) >= 19
        statuses: dict[str, set[int]] = {}
        for op in operations:
            fuzz(api, op, GenerationMode.POSITIVE, statuses)
            if op.path_parameters or op.body:
                fuzz(api, op, GenerationMode.NEGATIVE, statuses)
        assert_consistent(api)
        # the state really changed on the way (not only 4xx): lightpaths were set up and
        # fibres cut
        assert 201 in statuses["POST /lightpaths"] and 200 in statuses["POST /failures"]
        assert 200 in statuses["POST /repairs"]
        assert 201 in statuses["POST /jobs"] and 200 in statuses["DELETE /lightpaths/{id}"]


def test_every_mutating_operation_needs_the_token(tmp_path: Path) -> None:
    with serve(tmp_path) as api:
        _, doc = raw(api, "GET", "/openapi.json")
        mutating = [(m.upper(), p) for p, ops in doc["paths"].items() for m in ops
                    if m in ("post", "put", "delete", "patch")]
        assert len(mutating) == 10
        for method, path in mutating:
            assert doc["paths"][path][method.lower()]["security"] == [{"HTTPBearer": []}]
            concrete = path.replace("{id}", "1")
            for headers in ({}, {"Authorization": "Bearer wrong"},
                            {"Authorization": f"Basic {TOKEN}"}):
                status, reply = raw(api, method, concrete, json.dumps({}).encode(),
                                    {"Content-Type": "application/json", **headers})
                assert status == 401, (method, path, headers, reply)
        assert not api.core.rows and not api.core.net.lightpaths
