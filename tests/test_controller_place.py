"""POST /jobs outside the controller's lock (real server, no root): the API and restoration
answer while a big placement computes; a placement over the time limit gets 503 and
leaves nothing; too many at once get 503 busy; two placements racing for the same last
GPUs both end consistent; a recorded request sequence replays exactly as before."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from controllers.api import RestApi
from controllers.core import ControllerCore
from controllers.jobs import JobService
from controllers.layout import default_layout
from controllers.placing import (
    ENV_MAX,
    ENV_TIMEOUT,
    MAX_TIMEOUT_S,
    PlaceLimits,
    place_limits_env,
)
from controllers.store import Store
from testbed.cli.main import main
from testbed.orchestrate.ctl_process import rest_call
from tests import ctl_sequence
from tests.test_controller_core import Recorder
from tests.test_controller_jobs import scenario
from tests.waiting import wait_until

TOKEN = "tok"
GPUS = 48  # scenario(): three DCs of 16 GPUs on the ring A-B-C-D
# Big placements: crosspipe-opt (an exact CP-SAT schedule, timed once per job) over 12
# stages in three DCs takes ~1 s of solver time on the 2-core dev machine (0.5-1.5 s).
BIG = {"model": "llama2-7b", "stages": 12, "gpus_per_stage": 4, "microbatches": 20,
       "iterations": 10, "policy": "sp-ff", "schedule": "crosspipe-opt"}
# Half the GPUs each: two of them fit, but not where both plan them on an empty cluster.
HALF = {**BIG, "gpus_per_stage": 2, "microbatches": 16}
SMALL = {"model": "llama2-7b", "stages": 4, "gpus_per_stage": 4, "microbatches": 8,
         "iterations": 10, "policy": "sp-ff"}


@contextmanager
def served(tmp: Path, limits: PlaceLimits | None = None) -> Iterator[RestApi]:
    sc = scenario()
    core = ControllerCore(sc, Store(tmp / "c.db"), layout=default_layout(sc),
                          southbound=Recorder())
    # The time limit is a test of its own (limits given): elsewhere a placement on a busy
    # 2-core machine may take longer than the default 20 s, and a race test must not
    # turn into a time-limit test (a CI run answered 503 to both racers).
    limits = limits or PlaceLimits(timeout_s=MAX_TIMEOUT_S)
    api = RestApi(core, port=0, token=TOKEN, jobs=JobService(core, limits))
    api.serve()
    try:
        yield api
    finally:
        wait_for(api, "lightpipe_job_placements_planning", lambda v: v == 0)
        api.close()
        core.store.close()


def call(api: RestApi, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    return rest_call(api.url, method, path, body, TOKEN, timeout_s=120)


def metric(api: RestApi, name: str) -> float:
    text = call(api, "GET", "/metrics")[1]
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def wait_for(api: RestApi, name: str, ok: Callable[[float], bool], limit_s: float = 120) -> None:
    """Poll a metric until ok(value); the limit only stops a broken run from hanging."""
    wait_until(lambda: ok(metric(api, name)), f"{name} to reach the expected value",
               timeout_s=limit_s, interval_s=0.01)


class Events:
    """Calls made from threads, and the order in which their answers came back."""

    def __init__(self) -> None:
        self.order: list[str] = []
        self.replies: dict[str, tuple[int, Any]] = {}
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    def start(self, name: str, api: RestApi, method: str, path: str, body: Any = None) -> None:
        def run() -> None:
            got = call(api, method, path, body)
            with self._lock:
                self.replies[name] = got
                self.order.append(name)

        t = threading.Thread(target=run, name=name, daemon=True)
        self._threads.append(t)
        t.start()

    def join(self, *names: str) -> None:
        """Wait for the named calls (all without names)."""
        for t in self._threads:
            if not names or t.name in names:
                t.join(180)
                assert not t.is_alive(), f"{t.name} never answered"


def held_slots(api: RestApi) -> dict[frozenset[str], list[int]]:
    """Slots held per fibre, from the lightpaths; fails if one is held twice."""
    held: dict[frozenset[str], list[int]] = {}
    for lp in call(api, "GET", "/lightpaths")[1]["lightpaths"]:
        for a, b in lp["fibres"]:
            on = held.setdefault(frozenset((a, b)), [])
            assert not set(on) & set(lp["slots"]), f"a slot of {a}-{b} is held twice"
            on += lp["slots"]
    for f in call(api, "GET", "/spectrum")[1]["fibres"]:
        if not f["failed"]:
            assert sorted(held.get(frozenset((f["u"], f["v"])), [])) == f["used"], f
    return held


def gpus_used(api: RestApi) -> int:
    jobs = call(api, "GET", "/jobs")[1]["jobs"]
    used = sum(j["stages"] * j["gpus_per_stage"] for j in jobs)
    assert sum(api.jobs.cluster.free) == GPUS - used
    for dc in api.jobs.dcs:  # per DC, too
        on = sum(j["gpus_per_stage"] for j in jobs for d in j["dcs"] if d == dc.name)
        assert api.jobs.cluster.free[dc.index] == dc.gpus - on
    return used


def test_api_and_restoration_answer_while_a_big_placement_computes(tmp_path: Path) -> None:
    with served(tmp_path) as api:
        status, lp = call(api, "POST", "/lightpaths", {"src_dc": "dc-a", "dst_dc": "node:D",
                                                       "slots": 3})
        assert status == 201 and lp["nodes"] == ["A", "D"]
        ev = Events()
        ev.start("job", api, "POST", "/jobs", BIG)
        wait_for(api, "lightpipe_job_placements_planning", lambda v: v == 1)
        ev.start("lightpaths", api, "GET", "/lightpaths")
        ev.start("cut", api, "POST", "/failures", {"link": ["A", "D"]})
        ev.join("lightpaths", "cut")
        # Both answered while the placement was still computing (not merely before its
        # commit): the lock is not held while a placement plans.
        assert metric(api, "lightpipe_job_placements_planning") == 1
        ev.join()
        assert ev.order.index("lightpaths") < ev.order.index("job"), ev.order
        assert ev.order.index("cut") < ev.order.index("job"), ev.order
        assert ev.replies["lightpaths"][0] == 200
        status, cut = ev.replies["cut"]
        assert status == 200 and cut["restored"] == [lp["id"]]
        status, job = ev.replies["job"]
        assert status == 201, job
        assert job["dcs"] == ["dc-a"] * 4 + ["dc-b"] * 4 + ["dc-c"] * 4
        assert job["schedule"] == "crosspipe-opt"
        assert gpus_used(api) == 48 and held_slots(api)
        restored = call(api, "GET", f"/lightpaths/{lp['id']}")[1]
        assert restored["nodes"] == ["A", "B", "C", "D"]


def test_over_the_time_limit_is_503_and_leaves_nothing(tmp_path: Path) -> None:
    limits = PlaceLimits(timeout_s=0.2, max_concurrent=1)
    with served(tmp_path, limits) as api:
        status, reply = call(api, "POST", "/jobs", BIG)
        assert status == 503 and reply["reason"] == "timeout", reply
        assert "0.2 s" in reply["error"] and ENV_TIMEOUT in reply["error"]
        assert "\n" not in reply["error"]
        # The abandoned computation still holds the only slot: one more is busy.
        if metric(api, "lightpipe_job_placements_planning") == 1:
            status, busy = call(api, "POST", "/jobs", SMALL)
            assert status == 503 and busy["reason"] == "busy", busy
            assert ENV_MAX in busy["error"]
        wait_for(api, "lightpipe_job_placements_planning", lambda v: v == 0)
        # Its late result was discarded: no job, no GPU, no slot taken.
        assert call(api, "GET", "/jobs")[1]["jobs"] == []
        assert gpus_used(api) == 0 and held_slots(api) == {}
        assert api.core.net.lightpaths == {} and api.core.rows == {}
        text = call(api, "GET", "/metrics")[1]
        assert 'lightpipe_job_unavailable_total{reason="timeout"} 1.0' in text
        # Once it ended, placements go through again.
        status, job = call(api, "POST", "/jobs", SMALL)
        assert status == 201, job


def test_more_placements_than_the_limit_get_503_busy(tmp_path: Path) -> None:
    with served(tmp_path, PlaceLimits(timeout_s=MAX_TIMEOUT_S, max_concurrent=1)) as api:
        ev = Events()
        ev.start("big", api, "POST", "/jobs", BIG)
        wait_for(api, "lightpipe_job_placements_planning", lambda v: v == 1)
        ev.start("second", api, "POST", "/jobs", SMALL)
        ev.join()
        assert ev.order == ["second", "big"]
        status, busy = ev.replies["second"]
        assert status == 503 and busy["reason"] == "busy", busy
        assert ev.replies["big"][0] == 201
        assert gpus_used(api) == 48
        assert call(api, "POST", "/jobs", SMALL)[0] == 409  # all GPUs taken, not busy


def race(api: RestApi, body: dict[str, Any]) -> tuple[tuple[int, Any], tuple[int, Any]]:
    """Two identical placements computing at once: both snapshots are taken before
    either commits (the second starts while the first computes, and both are seen
    computing together)."""
    ev = Events()
    ev.start("a", api, "POST", "/jobs", body)
    wait_for(api, "lightpipe_job_placements_planning", lambda v: v == 1)
    ev.start("b", api, "POST", "/jobs", body)
    wait_for(api, "lightpipe_job_placements_planning", lambda v: v == 2)
    ev.join()
    return ev.replies["a"], ev.replies["b"]


def test_two_placements_racing_for_the_same_gpus_one_goes_elsewhere(tmp_path: Path) -> None:
    """Both plan on the same (empty) state and choose the same DCs; the first to commit
    wins, the other finds its GPUs gone, is planned again and goes elsewhere."""
    with served(tmp_path) as api:
        (sa, a), (sb, b) = race(api, HALF)
        assert sa == 201 and sb == 201, (a, b)
        winner, other = (a, b) if a["dcs"][0] == "dc-a" else (b, a)
        assert winner["dcs"] == ["dc-a"] * 8 + ["dc-b"] * 4  # most free GPUs, nearest
        assert other["dcs"] == ["dc-c"] * 8 + ["dc-b"] * 4  # planned again: elsewhere
        assert metric(api, "lightpipe_job_replans_total") == 1
        assert gpus_used(api) == 48
        held = held_slots(api)
        assert sorted((tuple(sorted(f)), len(s)) for f, s in held.items()) == \
            [(("A", "B"), 4), (("B", "C"), 4)]  # one sp-ff lightpath (4 slots) each


def test_two_placements_racing_for_the_last_gpus_one_is_refused(tmp_path: Path) -> None:
    """32 + 32 GPUs of 48: the loser is planned again on the state after the winner's
    commit and refused (no_gpus); it holds nothing."""
    with served(tmp_path) as api:
        (sa, a), (sb, b) = race(api, {**BIG, "stages": 8, "microbatches": 24})
        assert sorted((sa, sb)) == [201, 409], (a, b)
        winner, loser = (a, b) if sa == 201 else (b, a)
        assert winner["dcs"] == ["dc-a"] * 4 + ["dc-b"] * 4
        assert loser["reason"] == "no_gpus"
        assert metric(api, "lightpipe_job_replans_total") == 1
        assert gpus_used(api) == 32
        held = held_slots(api)
        assert [(tuple(sorted(f)), len(s)) for f, s in held.items()] == [(("A", "B"), 4)]
        assert len(api.core.rows) == 1 and len(api.core.net.lightpaths) == 1


def test_recorded_sequence_replays_unchanged(tmp_path: Path) -> None:
    """Sequential requests give exactly what main gave before placement left the lock
    (tests/ctl_sequence.py recorded it): decisions, slots, VLAN ids, refusals, RNG."""
    want = json.loads(ctl_sequence.RECORD.read_text())
    for spectrum in ctl_sequence.SPECTRUM:
        got = ctl_sequence.run(spectrum, tmp_path)
        assert got == want[spectrum], spectrum


@pytest.mark.parametrize("env,timeout_s,max_n,needle", [
    ({ENV_TIMEOUT: "soon"}, None, None, ENV_TIMEOUT),
    ({ENV_TIMEOUT: "0"}, None, None, ENV_TIMEOUT),
    ({ENV_TIMEOUT: "inf"}, None, None, ENV_TIMEOUT),
    ({ENV_MAX: "0"}, None, None, ENV_MAX),
    ({ENV_MAX: "-1"}, None, None, ENV_MAX),
    ({}, -1.0, None, "--place-timeout-s"),
    ({}, None, 65, "--max-placements"),
])
def test_bad_limits_are_refused_naming_the_setting(env: dict[str, str], timeout_s: float | None,
                                                   max_n: int | None, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        place_limits_env(env, timeout_s, max_n)


def test_limits_from_env_and_options() -> None:
    assert PlaceLimits.from_env({}) == PlaceLimits()
    assert PlaceLimits().timeout_s == 20.0
    got = PlaceLimits.from_env({ENV_TIMEOUT: "2.5", ENV_MAX: "3"})
    assert (got.timeout_s, got.max_concurrent) == (2.5, 3)
    env = place_limits_env({ENV_TIMEOUT: "2.5"}, None, 2)
    assert env == {ENV_TIMEOUT: "2.5", ENV_MAX: "2"}
    assert PlaceLimits.from_env(place_limits_env({}, 7.0, None)).timeout_s == 7.0


def test_cli_bad_limit_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = ctl_sequence.SCENARIO
    assert main(["controller", str(spec), "--place-timeout-s", "0"]) == 2
    assert main(["controller", str(spec), "--max-placements", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "--place-timeout-s" in err[0] and "--max-placements" in err[1]


def test_openapi_documents_the_503_on_post_jobs(tmp_path: Path) -> None:
    with served(tmp_path) as api:
        doc = call(api, "GET", "/openapi.json")[1]
        post = doc["paths"]["/jobs"]["post"]["responses"]
        assert "timeout" in post["503"]["description"] and "busy" in post["503"]["description"]
        assert post["503"]["content"]["application/json"]["schema"]["$ref"].endswith(
            "ErrorReply")
