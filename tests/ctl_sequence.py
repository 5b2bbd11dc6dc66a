"""A recorded request sequence for the controller's POST /jobs (tests/test_controller_place).

`python -m tests.ctl_sequence` replays SEQUENCE on a fresh controller for the bundled
scenario scenarios/pp-jobs.yaml (first_fit, and random_fit to exercise the planner's
RNG) and writes what came back to tests/data/ctl_jobs_sequence.json. The file was
recorded from main before placement moved outside the core's lock (commit 7668c7a):
the test replays the sequence on the current code and expects the same answers.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from controllers.api import RestApi
from controllers.core import ControllerCore
from controllers.jobs import JobService
from controllers.layout import default_layout
from controllers.store import Store
from testbed.orchestrate.ctl_process import rest_call
from testbed.spec import load_scenario
from tests.test_controller_core import Recorder

REPO = Path(__file__).resolve().parents[1]
SCENARIO = REPO / "scenarios" / "pp-jobs.yaml"
RECORD = REPO / "tests" / "data" / "ctl_jobs_sequence.json"
SPECTRUM = ("first_fit", "random_fit")


def _job(model: str, stages: int, gps: int, policy: str, **extra: Any) -> dict[str, Any]:
    return {"model": model, "stages": stages, "gpus_per_stage": gps, "microbatches": 16,
            "iterations": 100, "policy": policy, **extra}


# (method, path, body): placements by every kind of policy, refusals (no GPUs, no spectrum:
# the planner's RNG is advanced by refused requests too), removals, a lightpath and a cut.
SEQUENCE: list[tuple[str, str, Any]] = [
    ("POST", "/jobs", _job("gpt3-6.7b", 4, 8, "sp-ff")),
    ("POST", "/jobs", _job("llama2-13b", 8, 8, "cba")),
    ("POST", "/jobs", _job("gpt3-6.7b", 4, 8, "delay-first", max_stages_per_dc=1)),
    ("POST", "/jobs", _job("llama2-13b", 8, 8, "bace-pipe", max_stages_per_dc=2)),
    ("POST", "/jobs", _job("gpt3-6.7b", 4, 8, "joint", max_stages_per_dc=1)),
    ("POST", "/jobs", _job("llama2-13b", 8, 16, "cost-first")),
    ("DELETE", "/jobs/2", None),
    ("POST", "/jobs", _job("gpt3-6.7b", 4, 16, "cba-ilp", max_stages_per_dc=1)),
    ("POST", "/lightpaths", {"src_dc": "dc-a", "dst_dc": "dc-c", "slots": 6}),
    ("POST", "/jobs", _job("llama2-13b", 8, 64, "sp-ff")),
    *[("POST", "/jobs", _job("llama2-13b", 4, 8, "delay-first", max_stages_per_dc=1))
      for _ in range(5)],
    ("POST", "/jobs", _job("gpt3-6.7b", 4, 4, "cba-k1", max_stages_per_dc=1,
                           schedule="crosspipe-greedy")),
    ("DELETE", "/jobs/4", None),
    ("POST", "/failures", {"link": ["9", "10"]}),
    ("POST", "/jobs", _job("gpt3-6.7b", 4, 8, "sp-ff-best", max_stages_per_dc=1)),
    ("POST", "/jobs", _job("gpt3-6.7b", 4, 8, "bace-pipe-no-cost", max_stages_per_dc=1)),
    ("DELETE", "/jobs/1", None),
    ("POST", "/jobs", _job("llama2-13b", 8, 8, "delay-first-best", max_stages_per_dc=2)),
]


def summary(status: int, body: Any) -> dict[str, Any]:
    """What must not change: status, refusal reason, DCs, hosts, every lightpath's route,
    slots and VLAN id, the timing."""
    out: dict[str, Any] = {"status": status}
    if not isinstance(body, dict):
        return out
    if status >= 400:
        out["reason"] = body.get("reason")
        return out
    if "boundaries" in body:
        out["id"] = body["id"]
        out["dcs"] = body["dcs"]
        out["hosts"] = [s["host"] for s in body["stages_placement"]]
        out["iteration_ms"] = round(body["iteration_ms"], 6)
        out["schedule"] = body["schedule"]
        out["lightpaths"] = [None if b["lightpath"] is None else
                             [b["lightpath"][k] for k in ("id", "vid", "nodes", "first_slot",
                                                           "n_slots")]
                             for b in body["boundaries"]]
    elif "nodes" in body:
        out["lightpath"] = [body[k] for k in ("id", "vid", "nodes", "first_slot", "n_slots")]
    else:
        out["restored"], out["lost"] = body.get("restored"), body.get("lost")
    return out


def replay(api: RestApi, token: str) -> dict[str, Any]:
    """SEQUENCE's summaries and the final spectrum occupancy."""
    got = [summary(*rest_call(api.url, m, p, b, token, timeout_s=120)) for m, p, b in SEQUENCE]
    _, spec = rest_call(api.url, "GET", "/spectrum", None, token, timeout_s=30)
    return {"replies": got,
            "spectrum": {f"{f['u']}-{f['v']}": f["occupancy"] for f in spec["fibres"]}}


def run(spectrum: str, tmp: Path) -> dict[str, Any]:
    """A fresh controller for the scenario with this spectrum policy; the replayed sequence."""
    base = load_scenario(SCENARIO)
    sc = base.model_copy(update={"policy": base.policy.model_copy(
        update={"spectrum": spectrum})})
    core = ControllerCore(sc, Store(tmp / f"{spectrum}.db"), layout=default_layout(sc),
                          southbound=Recorder())
    api = RestApi(core, port=0, token="tok", jobs=JobService(core))
    api.serve()
    try:
        return replay(api, "tok")
    finally:
        api.close()
        core.store.close()


def main() -> int:
    with tempfile.TemporaryDirectory() as d:
        record = {s: run(s, Path(d)) for s in SPECTRUM}
    RECORD.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    print(f"wrote {RECORD}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
