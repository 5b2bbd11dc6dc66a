"""The fidelity verdict across machines without root: every machine's measurements merged
into one verdict (testbed.cluster.fidelity), the agent's `fidelity` answer over a real
pipe with its processes read from /proc (testbed.cluster.agent), the holder's request
checked (testbed.cluster.holdctl). Real shares on two stand-in machines are the harness's
(tests/cluster/test_cluster_emu.py)."""

from __future__ import annotations

import io
import itertools
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from testbed.cluster.fidelity import cluster_verdict, merge
from testbed.emu.plan import build_plan
from testbed.emu.scale import Scale
from testbed.errors import InputError


def _ring_plan() -> Any:
    from testbed.spec import load_scenario

    return build_plan(load_scenario(Path("scenarios/calib-latency-gpipe.yaml")))


def _proc(role: str, name: str, share: float, per_slice_ms: float = 0.02, **kw: Any
          ) -> dict[str, Any]:
    """A process's record: its wait for a CPU in wake-ups of per_slice_ms each."""
    run = 10.0 * share
    return {"pid": 100, "role": role, "name": name, "wall_s": 20.0, "cpu_s": run,
            "run_s": run, "wait_s": 10.0 - run, "cpu_share": share, "load": run / 20,
            "slices": max(1, round(1000 * (10.0 - run) / per_slice_ms)), **kw}


def _reply(steal: float, procs: list[dict[str, Any]], frames: int = 0,
           hosts: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"op": "fidelity", "ok": True, "processes": procs,
            "host": {"cores": 2, "busy_frac": 0.5, "steal_frac": steal},
            "network": {"forwarders": [], "fabric": {"frames": frames,
                                                      "segments_per_frame": 44},
                        "tcp": {h: {"TcpOutSegs": 1000, "TcpRetransSegs": 0}
                                for h in hosts},
                        "switch": {}, "send_socket": {"wanted_bytes": 100, "bytes": 100},
                        "receive_sockets": None}}


def _rows(plan: Any, off_ms: float = 0.0) -> list[dict[str, Any]]:
    out = []
    for lp in plan.lightpaths[:3]:
        exp = 2 * sum(plan.fibre(u, v).delay_ms for u, v in itertools.pairwise(lp.path))
        out.append({"pair": f"{lp.path[0]}~{lp.path[-1]}", "expected_rtt_ms": exp,
                    "samples_ms": [exp + off_ms] * 10, "median_ms": exp + off_ms,
                    "pings": 10, "replies": 10})
    return out


def test_every_machine_is_read_and_the_worst_named() -> None:
    plan = _ring_plan()
    mid = plan.fibres[0].middle
    replies = {
        "lp1": _reply(0.01, [_proc("forwarder", mid, 0.99), _proc("switch", "ovs", 0.98)],
                      frames=3, hosts=("h1",)),
        "lp2": _reply(0.03, [_proc("forwarder", plan.fibres[1].middle, 0.97),
                             _proc("worker", "job0/stage1", 0.95, compute="cpu")],
                      frames=4, hosts=("h2",))}
    got = merge(replies)
    assert [p["machine"] for p in got["processes"]] == ["lp1", "lp1", "lp2", "lp2"]
    assert got["host"]["machine"] == "lp2" and got["host"]["steal_frac"] == 0.03
    assert got["fabric"] == {"frames": 7, "segments_per_frame": 44}
    assert set(got["tcp"]) == {"h1", "h2"}
    assert got["machines"]["lp1"] == {"ok": True, "why": None, "steal_frac": 0.01,
                                      "processes": 2, "forwarders": 1, "workers": 0}
    v = cluster_verdict(plan.scale, plan, _rows(plan), replies)
    assert v["faithful"], v["reasons"]
    f0 = plan.fibres[0]
    named = {p["name"] for p in v["processes"] if p["role"] == "forwarder"}
    assert f"{f0.u}-{f0.v}" in named  # by its fibre, as the link exporter labels it
    inv = {i["name"]: i for i in v["invariants"]}
    assert inv["host_steal"]["value"] == 0.03 and inv["forwarder_cpu_share"]["measured"]
    assert set(v["machines"]) == {"lp1", "lp2"}


def test_a_starved_machine_or_a_missing_one_is_not_faithful() -> None:
    plan = _ring_plan()
    good = _reply(0.0, [_proc("forwarder", plan.fibres[0].middle, 0.99)])
    starved = _reply(0.0, [_proc("forwarder", plan.fibres[1].middle, 0.40,
                                 per_slice_ms=3.0)])  # 0.3 ms at its factor of 10
    v = cluster_verdict(plan.scale, plan, _rows(plan), {"lp1": good, "lp2": starved})
    assert not v["faithful"]
    assert any(r.startswith("forwarder_sched_delay") for r in v["reasons"]), v["reasons"]
    lost = {"op": "fidelity", "ok": False, "why": "the session ended"}
    v = cluster_verdict(plan.scale, plan, _rows(plan), {"lp1": good, "lp2": lost})
    assert not v["faithful"]
    assert v["reasons"][-1] == "machine lp2: fidelity not measured (the session ended)"
    v = cluster_verdict(plan.scale, plan, _rows(plan, off_ms=15.0), {"lp1": good})
    assert not v["faithful"] and any("rtt" in r.lower() for r in v["reasons"])


def test_garbage_in_a_reply_is_left_out_not_trusted() -> None:
    got = merge({"lp1": {"ok": True, "processes": ["x", {"role": 3}, *([{"role": "switch"}]
                                                                      * 5000)],
                         "network": {"tcp": {"h1": {"TcpOutSegs": "9"}}, "forwarders": [1],
                                     "fabric": {"frames": float("nan")}}},
                 "lp2": "not a reply"})
    assert len(got["processes"]) == 4096 - 2  # the first 4096 entries, two of them bad
    assert got["tcp"] == {"h1": {"TcpOutSegs": 0}} and got["forwarder_stats"] == []
    assert got["fabric"] == {} and got["machines"]["lp2"]["ok"] is False


def test_the_holder_request_is_checked() -> None:
    from testbed.cluster.holdctl import parse_request

    assert parse_request(b'{"fidelity": {}}') == {"fidelity": {}}
    for bad in (b'{"fidelity": {"x": 1}}', b'{"fidelity": []}'):
        with pytest.raises(InputError):
            parse_request(bad)


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system) process pid has run, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_the_agent_answers_fidelity_with_what_proc_says(tmp_path: Path) -> None:
    """fidelity_start reads the run state's forwarder (a real process here, by PID and
    start time) and `fidelity` answers with its CPU, the machine's steal and the holder's
    counters (its control socket, as the share holder serves it)."""
    from testbed.cluster.agent import Agent, LocalHost
    from testbed.cluster.holdctl import ControlServer
    from testbed.emu.state import RunState
    from testbed.emu.state import proc_start_ticks as ticks

    d = tmp_path / "run"
    d.mkdir(mode=0o700)
    busy = subprocess.Popen([sys.executable, "-c", "import time\nt=time.time()+60\n"
                             "while time.time()<t: pass"])
    try:
        st = RunState("lp0001", str(d), os.getpid(), ticks(os.getpid()) or 0)
        st.add_proc(busy.pid, "forwarder", "lp0001m1")
        net = {"forwarders": [], "tcp": {"h1": {"TcpOutSegs": 5}}, "fabric": {},
               "switch": {}, "send_socket": None, "receive_sockets": None}
        server = ControlServer(d, {}, hooks={"fidelity": lambda _b: {"ok": True, **net}})
        server.start()
        r, w = os.pipe()
        out = io.BytesIO()
        agent = Agent("lp0001", d, {"h1": LocalHost("h1", 1, "10.0.1.1", "h1-eth0")}, out)
        first = Agent("lp0001", tmp_path / "none", {}, io.BytesIO())
        first.start_fidelity()
        assert "unreadable" in first.fidelity()["why"]
        agent.start_fidelity()
        import time

        # A few of the sampler's readings, and (readiness by what /proc says, not by a
        # wall-clock guess: at nice 10 beside two lanes a 1.2 s sleep gave it 0.28 s) until
        # the busy process has run a second of CPU since the sampler started.
        start = _cpu_s(busy.pid)
        deadline = time.monotonic() + 120
        time.sleep(1.2)
        while _cpu_s(busy.pid) - start < 1.0 and time.monotonic() < deadline:
            time.sleep(0.1)
        with os.fdopen(w, "wb") as wf:
            wf.write(b'{"op": "fidelity"}\n{"op": "bye"}\n')
        with os.fdopen(r, "rb") as rf:
            assert agent.serve(rf) is True
        server.close()
    finally:
        busy.kill()
        busy.wait()
    msgs = [json.loads(x) for x in out.getvalue().splitlines()]
    ans = next(m for m in msgs if m["op"] == "fidelity")
    assert ans["ok"], ans
    (p,) = ans["processes"]
    assert p["pid"] == busy.pid and p["role"] == "forwarder" and p["cpu_s"] > 0.3
    assert "steal_frac" in ans["host"] and ans["network"]["tcp"] == net["tcp"]


def test_the_pair_check_keeps_each_echo_for_the_verdict(tmp_path: Path,
                                                       monkeypatch: Any) -> None:
    """cluster_rtt.json's rows carry their sparse echoes (samples_ms) and replies, as a
    one-machine verification row does, so the verdict's p99 is the echoes' own (the
    machines' answers here are what `hold ping` prints; SSH is the harness's)."""
    import testbed.cluster.checks as checks
    import testbed.cluster.drive as drive
    from testbed.cluster.checks import check_pairs, final_rtt_rows
    from testbed.emu.fidelity import lightpath_rtt_errors

    row = {"pair": "dc-1~dc-2", "src_machine": "lp1", "dst_machine": "lp2",
           "expected_rtt_ms": 4.0, "median_ms": 4.1, "pings": 3, "pings_sent": 3,
           "within_band": True, "rtts_ms": [4.0, 4.1, 7.0], "dense_rtts_ms": [4.0] * 50}
    answer = drive.ShareResult("lp1", "10.0.0.1", reachable=True, rows=[row],
                               status={"ping": 0})
    monkeypatch.setattr(checks, "ping_pairs", lambda *_a: [answer])
    probe = type("P", (), {"pair": "dc-1~dc-2"})()
    failure, doc = check_pairs(None, "lp0001", [probe], tmp_path)
    assert failure == "" and doc["pairs_within_band"] == 1
    (kept,) = final_rtt_rows(tmp_path)
    assert kept["samples_ms"] == [4.0, 4.1, 7.0] and kept["replies"] == 3
    assert "dense_rtts_ms" not in kept and "rtts_ms" not in kept
    (e,) = lightpath_rtt_errors([kept], Scale())
    assert e["replies"] == 3 and e["p99_error_ms"] > 2.9
    assert e["median_error_ms"] == pytest.approx(0.1)


def test_the_clocks_error_is_judged_against_the_shortest_iteration() -> None:
    """clock_offset_error: the worst machine's offset error (emulated ms, taken back to
    scenario time) over the shortest job's iteration; 1 % at most."""
    from testbed.cluster.fidelity import clock_invariant

    scale = Scale(time_factor=10.0)
    clocks = {"m-a": {"offset_s": 0.0, "error_ms": 0.02},
              "m-b": {"offset_s": 1e-5, "error_ms": 0.5}}
    jobs = [{"job": "j0", "emulated_iteration_time_s": 0.2},
            {"job": "j1", "emulated_iteration_time_s": 0.004}]
    inv = clock_invariant(scale, clocks, jobs)
    assert inv.value == pytest.approx(0.05 / 4.0) and not inv.ok  # 0.05 ms of 4 ms
    assert "machine m-b" in inv.detail and "j1" in inv.detail
    assert clock_invariant(scale, clocks, jobs[:1]).ok  # 0.05 ms of 200 ms
    assert not clock_invariant(scale, clocks, []).measured  # a replay: no iteration
    plan = _ring_plan()
    good = _reply(0.0, [_proc("forwarder", plan.fibres[0].middle, 0.99)])
    v = cluster_verdict(plan.scale, plan, _rows(plan), {"lp1": good}, jobs[1:], clocks)
    assert not v["faithful"] and v["reasons"][-1].startswith("clock_offset_error")
