"""Workers across machines without root: the clock offsets and the records shifted onto the
driver's clock (testbed.cluster.clock), the worker agent's input checks and its protocol
over a real pipe (testbed.cluster.agent), the launcher's view of a remote worker
(testbed.cluster.agentlink.RemoteProc) and the hosts of a cluster run per DC. The agent
starting real workers in real shares is the harness's (tests/cluster/test_cluster_emu.py)."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest

from testbed.cluster.agent import Agent, LocalHost, parse_rendezvous, parse_start
from testbed.cluster.agentlink import RemoteProc
from testbed.cluster.clock import estimate_offset, shift_record
from testbed.cluster.workload import cluster_hosts
from testbed.errors import InputError
from testbed.orchestrate.results import job_iterations

HOSTS = {"h1": LocalHost("h1", 4242, "10.0.1.1", "h1-eth0")}


def _plan(job: str = "job0", stages: int = 2) -> dict[str, Any]:
    from testbed.emu.scale import Scale
    from testbed.schedule import Hop, PipelineProblem, build_schedule
    from workloads.plan import scaled_plan

    problem = PipelineProblem((1.0,) * stages, (2.0,) * stages,
                              tuple(Hop(1.0, 10.0) for _ in range(stages - 1)), 1.0, 2)
    sched = build_schedule("1f1b", problem)
    return json.loads(scaled_plan(job, problem, sched, Scale(), iterations=2,
                                  warmup_iterations=1).to_json())


def _start(**over: Any) -> dict[str, Any]:
    msg = {"op": "start", "job": "job0", "stage": 1, "host": "h1", "plan": _plan(),
           "master": "10.0.0.1:0", "timeout_s": 120, "duty": 0.5, "linger_s": 2, "nice": 0,
           "metrics_address": "10.252.16.2"}
    msg.update(over)
    return msg


# -- the clock -----------------------------------------------------------------------------

def test_offset_from_the_shortest_round_trip() -> None:
    # The remote clock is 5 s ahead; the second sample's round trip is the shortest.
    got = estimate_offset([(0.0, 5.004, 0.010), (1.0, 6.0005, 1.001), (2.0, 7.0, 2.004)])
    assert got.offset_s == pytest.approx(5.0, abs=1e-9)
    assert got.rtt_s == pytest.approx(0.001) and got.error_s == pytest.approx(0.0005)
    assert got.samples == 3
    with pytest.raises(ValueError):
        estimate_offset([(1.0, 2.0, 0.5)])  # received before it was sent


def test_shifted_records_give_the_one_clock_iteration_time() -> None:
    """Stage 1 on a machine whose clock is 100 s ahead: unshifted, the iteration would
    last 100 s; shifted, it is the 0.3 s it took."""
    s0 = [{"type": "iteration", "iteration": 0, "start_s": 10.0, "end_s": 10.2,
           "ops": [["F0", 10.0, 10.1], ["B0", 10.2, 10.25]], "waits": [],
           "compute_s": 0.15, "sent_bytes": 1}]
    s1 = [{"type": "iteration", "iteration": 0, "start_s": 110.0, "end_s": 110.3,
           "ops": [["F0", 110.1, 110.2], ["B0", 110.2, 110.3]], "waits": [["r", 110.0,
                                                                         110.1]],
           "compute_s": 0.2, "sent_bytes": 1}]
    assert job_iterations([s0, s1])[0]["time_s"] == pytest.approx(100.3)
    shifted = [shift_record(r, 100.0) for r in s1]
    assert job_iterations([s0, shifted])[0]["time_s"] == pytest.approx(0.3)
    assert shifted[0]["waits"] == [["r", pytest.approx(10.0), pytest.approx(10.1)]]
    start = shift_record({"type": "start", "ready_s": 105.0, "pid": 7, "job": "j"}, 100.0)
    assert start == {"type": "start", "ready_s": 5.0, "pid": 7, "job": "j"}
    assert shift_record({"end_s": True, "ops": "x"}, 1.0) == {"end_s": True, "ops": "x"}


# -- the agent's input -------------------------------------------------------------------

def test_a_valid_start_message() -> None:
    o = parse_start(_start(), HOSTS)
    assert (o.job, o.stage, o.host.pid, o.master) == ("job0", 1, 4242, "10.0.0.1:0")
    assert o.metrics_address == "10.252.16.2" and o.nice == 0 and o.go_on is False
    assert parse_start(_start(go_on=True), HOSTS).go_on is True


@pytest.mark.parametrize("over, field", [
    ({"job": "job0;rm"}, "job"),
    ({"stage": -1}, "stage"),
    ({"stage": True}, "stage"),
    ({"stage": 2}, "stage"),                       # the plan has stages 0..1
    ({"host": "h9"}, "host"),                      # not a host of this share
    ({"plan": {"job": "job0"}}, "plan"),
    ({"plan": _plan("other")}, "plan"),
    ({"master": "10.0.0.1:29500"}, "master"),      # ports come from the kernel
    ({"master": "$(id):0"}, "master"),
    ({"timeout_s": float("nan")}, "timeout_s"),
    ({"duty": 2}, "duty"),
    ({"nice": 40}, "nice"),
    ({"metrics_address": "0.0.0.0; id"}, "metrics_address"),
    ({"go_on": "yes"}, "go_on"),
])
def test_a_bad_start_message_names_its_field(over: dict[str, Any], field: str) -> None:
    with pytest.raises(InputError) as exc:
        parse_start(_start(**over), HOSTS)
    assert exc.value.path == field, str(exc.value)


def test_rendezvous_checks() -> None:
    assert parse_rendezvous({"job": "j", "data": {"host": "10.0.0.1", "port": 4000}}) == (
        "j", {"host": "10.0.0.1", "port": 4000})
    for data in ({"host": "10.0.0.1", "port": 0}, {"host": "x y", "port": 80}, "80"):
        with pytest.raises(InputError):
            parse_rendezvous({"job": "j", "data": data})


def test_the_agent_answers_over_a_pipe_and_refuses_bad_messages(tmp_path: Path) -> None:
    """The agent's own loop on a real pipe: clock answered at once, bad lines refused
    with `error`, nothing started, `bye` ends the session as asked."""
    r, w = os.pipe()
    out = io.BytesIO()
    agent = Agent("lp0001", tmp_path, HOSTS, out)
    lines = [b'{"op": "clock", "t": 1.5}', b"not json", b"[1]",
             json.dumps(_start(host="nope")).encode(), b'{"op": "signal", "job": "job0", '
             b'"stage": 0, "signal": "TERM"}', b'{"op": "launch"}', b'{"op": "bye"}']
    with os.fdopen(w, "wb") as wf:
        wf.write(b"\n".join(lines) + b"\n")
    with os.fdopen(r, "rb") as rf:
        said_bye = agent.serve(rf)
    assert said_bye is True and agent.workers == {}
    msgs = [json.loads(x) for x in out.getvalue().splitlines()]
    assert msgs[0]["op"] == "clock" and msgs[0]["t"] == 1.5 and msgs[0]["here"] > 0
    errors = [m["why"] for m in msgs if m["op"] == "error"]
    assert len(errors) == 5, msgs
    assert "not JSON" in errors[0] and "not an object" in errors[1]
    assert errors[2].startswith("host:") and "no worker job0/0" in errors[3]
    assert "unknown message" in errors[4]
    assert not (tmp_path / "workers").exists()


def test_the_end_of_the_session_without_bye_is_told_apart(tmp_path: Path) -> None:
    r, w = os.pipe()
    os.close(w)
    agent = Agent("lp0001", tmp_path, HOSTS, io.BytesIO())
    with os.fdopen(r, "rb") as rf:
        assert agent.serve(rf) is False


# -- the driver's side ---------------------------------------------------------------------

class _Session:
    """What RemoteProc sends through: the messages, kept."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    def send(self, msg: dict[str, Any]) -> None:
        self.sent.append(msg)


def test_remote_proc_waits_polls_and_signals_like_popen() -> None:
    s = _Session()
    p = RemoteProc(s, "job0", 2, 777)  # type: ignore[arg-type]
    assert p.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        p.wait(0.01)
    p.terminate()
    p.kill()
    assert s.sent == [{"op": "signal", "job": "job0", "stage": 2, "signal": "TERM"},
                      {"op": "signal", "job": "job0", "stage": 2, "signal": "KILL"}]
    threading.Timer(0.05, p.finish, args=(0,)).start()
    assert p.wait(5) == 0 and p.poll() == 0
    p.finish(3)  # the first exit code stays
    p.kill()     # and an ended worker gets no signal
    assert p.returncode == 0 and len(s.sent) == 2


def test_cluster_hosts_per_dc_with_their_machine() -> None:
    rec = {"machines": {
        "m-b": {"hosts": {"h3": {"dc": "c", "ip": "10.0.3.1", "iface": "h3-eth0"}}},
        "m-a": {"hosts": {"h2": {"dc": "a", "ip": "10.0.1.2", "iface": "h2-eth0"},
                          "h1": {"dc": "a", "ip": "10.0.1.1", "iface": "h1-eth0"}}}}}
    by = cluster_hosts(rec)
    assert [(h.name, h.machine, h.prefix) for h in by["a"]] == [("h1", "m-a", ()),
                                                                 ("h2", "m-a", ())]
    assert by["c"][0].machine == "m-b" and by["c"][0].iface == "h3-eth0"


def test_emu_cluster_usage_errors_exit_2(cli: Any, tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("machines:\n  - {name: m1, address: 192.0.2.1}\n")
    scen = Path(__file__).parent.parent / "scenarios"
    pp = str(tmp_path / "pp.yaml")
    Path(pp).write_text((scen / "calib-latency-1f1b.yaml").read_text())
    out = str(tmp_path / "out")
    static = tmp_path / "quick-static.yaml"
    static.write_text((scen / "quickstart.yaml").read_text().replace(
        "emulation: {", "emulation: {forwarding: static, "))
    for argv, words in (
            ([str(scen / "routing-leafspine.yaml"), "--cluster", str(f)], "workload.kind: "
             "allreduce_jobs runs in one DC's leaf-spine fabric, which a cluster never "
             "splits"),
            ([str(static), "--cluster", str(f)], "emulation.forwarding: lightpath_requests "
             "replays"),
            ([pp, "--cluster", str(f), "--hold"], "--hold: not with --cluster"),
            ([pp, "--place", "dc-a=m1"], "--place: only with --cluster"),
            ([pp, "--no-calibrate"], "--no-calibrate: only with --cluster"),
            ([pp, "--cluster", str(f), "--place", "dc-a=m9"], "--place"),
            ([pp, "--cluster", str(f), "--ready-timeout", "0"], "--ready-timeout"),
            ([pp, "--cluster", str(tmp_path / "none.yaml")], "none.yaml")):
        res = cli("emu", *argv, "--out", out)
        assert res.code == 2 and words in res.err and res.err.count("\n") == 1, res.err
    assert not Path(out).exists()


def test_a_machine_address_resolves_to_the_ip_its_workers_listen_on() -> None:
    from testbed.cluster.agentlink import resolve_address
    from testbed.errors import RuntimeFailure

    assert resolve_address("10.252.16.2") == "10.252.16.2"
    assert resolve_address("localhost") in ("127.0.0.1", "::1")
    with pytest.raises(RuntimeFailure, match="does not resolve"):
        resolve_address("no-such-host.invalid")


def test_the_holder_serves_its_link_metrics_where_asked(tmp_path: Path) -> None:
    """`{"links": IP}` on the holder's control socket: a /metrics endpoint on that address
    (once per holder; the same target when asked again); a bad address is refused."""
    import urllib.request

    from testbed.cluster.holdctl import ControlServer, parse_request, request

    assert parse_request(b'{"links": "127.0.0.1"}') == {"links": "127.0.0.1"}
    for bad in (b'{"links": "0.0.0.0 -p"}', b'{"links": "127.0.0.1", "fibres": {}}'):
        with pytest.raises(InputError):
            parse_request(bad)
    d = tmp_path / "run"
    d.mkdir(mode=0o700)
    server = ControlServer(d, {}).start()
    try:
        first = request(d, {"links": "127.0.0.1"})
        assert first["ok"] and first["target"].startswith("127.0.0.1:"), first
        assert request(d, {"links": "127.0.0.1"})["target"] == first["target"]
        with urllib.request.urlopen(f"http://{first['target']}/metrics", timeout=10) as r:
            assert r.status == 200
    finally:
        server.close()
    assert server.links is not None and not (d / "hold.sock").exists()


@pytest.mark.skipif(shutil.which("ssh") is None, reason="needs the OpenSSH client")
def test_emu_cluster_unreachable_machine_is_one_line(cli: Any, tmp_path: Path) -> None:
    """A machine nobody answers on: `cluster up`'s one line, exit 1, no share anywhere."""
    from tests.test_cluster import _free_port

    port = _free_port()  # nothing listens there: a real "connection refused"
    f = tmp_path / "c.yaml"
    f.write_text(f"ssh: {{port: {port}, connect_timeout_s: 3}}\nmachines:\n"
                 "  - {name: near, address: 127.0.0.1}\n")
    spec = tmp_path / "pp.yaml"
    spec.write_text((Path(__file__).parent.parent / "scenarios" /
                     "calib-latency-1f1b.yaml").read_text())
    res = cli("emu", str(spec), "--cluster", str(f), "--out", str(tmp_path / "o"))
    assert res.code == 1, (res.out, res.err)
    assert "up near (127.0.0.1): unreachable (" in res.out
    assert res.err.startswith("lightpipe: error: machine near (127.0.0.1): unreachable (")
    assert res.err.count("\n") == 1


def test_the_driver_relays_stage_0s_port_and_mirrors_records_on_its_clock(
        tmp_path: Path) -> None:
    """ClusterWorkers between two sessions whose far ends are `cat` (a real pipe: what the
    driver sends comes back to be read). Stage 0's port reaches the other machine once
    its stage runs, never the wrong way; records land on the driver's clock and only from
    the machine the stage runs on; exits and a session's end reach the launcher's view."""
    from testbed.cluster.agentlink import ClusterWorkers
    from testbed.cluster.clock import ClockOffset
    from testbed.cluster.spec import parse_cluster
    from testbed.orchestrate.results import read_records

    c = parse_cluster({"machines": [{"name": "m1", "address": "192.0.2.1"},
                                    {"name": "m2", "address": "192.0.2.2"}]})
    cw = ClusterWorkers(c, "lp0a0b")
    s1, s2 = cw.sessions["m1"], cw.sessions["m2"]
    for s in (s1, s2):
        s.proc = subprocess.Popen(["cat"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    s2.offset = ClockOffset(100.0, 1e-4, 2e-4, 21)  # m2's clock is 100 s ahead

    def answer(s: Any, stage: int, pid: int) -> None:
        """The agent answers the next `start` (once it is sent: on a 0.05 s timer, the
        answer came before spawn() registered the stage on a loaded machine, and spawn()
        waited in vain)."""
        real_send = type(s).send.__get__(s)

        def send(msg: dict[str, Any]) -> None:
            real_send(msg)
            if msg.get("op") == "start":
                s.send = real_send
                threading.Thread(target=cw.dispatch, args=(s, {
                    "op": "started", "job": "job0", "stage": stage, "pid": pid,
                    "metrics_port": 9000 + stage, "spawn_s": 150.0})).start()

        s.send = send

    def spawn(m: str, stage: int) -> Any:
        return cw.spawn(m, job="job0", stage=stage, host=f"h{stage}", plan={},
                        master="10.0.0.1:0", record_path=tmp_path / f"s{stage}.jsonl",
                        log_path=tmp_path / f"s{stage}.log", timeout_s=60, duty=1.0,
                        linger_s=0.0, nice=0, reply_timeout_s=10)

    try:
        answer(s1, 0, 11)
        p0, host0, port0, spawn0 = spawn("m1", 0)
        assert (p0.pid, host0, port0, spawn0) == (11, "192.0.2.1", 9000, 150.0)
        # The port comes before stage 1 runs; a claim from the wrong machine is ignored.
        cw.dispatch(s1, {"op": "rendezvous", "job": "job0",
                         "data": {"host": "10.0.0.1", "port": 4242}})
        cw.dispatch(s2, {"op": "rendezvous", "job": "job0",
                         "data": {"host": "10.6.6.6", "port": 1}})
        answer(s2, 1, 22)
        p1, host1, _, spawn1 = spawn("m2", 1)
        assert host1 == "192.0.2.2" and spawn1 == pytest.approx(50.0)
        cw.dispatch(s2, {"op": "record", "job": "job0", "stage": 1,
                         "rec": {"type": "start", "ready_s": 150.5}})
        cw.dispatch(s1, {"op": "record", "job": "job0", "stage": 1,
                         "rec": {"type": "start", "ready_s": 1.0}})
        assert read_records(tmp_path / "s1.jsonl") == [{"type": "start",
                                                          "ready_s": pytest.approx(50.5)}]
        cw.dispatch(s2, {"op": "exit", "job": "job0", "stage": 1, "code": 0,
                         "log_tail": "last line\n"})
        assert p1.wait(5) == 0 and (tmp_path / "s1.log").read_text() == "last line\n"
        cw.session_ended(s1)  # m1's session ends while stage 0 runs: it failed with it
        assert p0.poll() == 255
        why = read_records(tmp_path / "s0.jsonl")[-1]
        assert why["type"] == "error" and "session to machine m1 ended" in why["error"]
    finally:
        sent = {}
        for name, s in (("m1", s1), ("m2", s2)):
            assert s.proc is not None and s.proc.stdin is not None
            s.proc.stdin.close()
            sent[name] = [json.loads(x) for x in s.proc.stdout.read().splitlines()]
            s.proc.wait(10)
    assert [m["op"] for m in sent["m1"]] == ["start"]  # stage 0's machine: no relay
    assert [m["op"] for m in sent["m2"]] == ["start", "rendezvous"]
    assert sent["m2"][1]["data"] == {"host": "10.0.0.1", "port": 4242}
    assert sent["m2"][0]["metrics_address"] == "192.0.2.2"


def test_a_worker_that_exits_at_once_is_not_lost_between_started_and_the_proxy(
        tmp_path: Path) -> None:
    """The agent's `started` and, right after it, the worker's `exit` (a stage that fails
    at once) are read by the session's thread one after the other; spawn() wakes on the
    first. The proxy exists before the second is read, so the exit reaches the launcher
    (made by spawn() once it woke, the proxy missed the exit: supervision waited for ever).
    Deterministic: both are read before spawn() wakes, as the reader can."""
    from testbed.cluster.agentlink import ClusterWorkers
    from testbed.cluster.spec import parse_cluster
    from testbed.orchestrate.results import read_records

    c = parse_cluster({"machines": [{"name": "m1", "address": "192.0.2.1"}]})
    cw = ClusterWorkers(c, "lp0a0c")
    s = cw.sessions["m1"]

    def agent_answers(msg: dict[str, Any]) -> None:  # (the reader thread, before spawn wakes)
        assert msg["op"] == "start"
        cw.dispatch(s, {"op": "started", "job": "job0", "stage": 0, "pid": 31,
                        "metrics_port": 9000, "spawn_s": 1.0})
        cw.dispatch(s, {"op": "record", "job": "job0", "stage": 0,
                        "rec": {"type": "error", "error": "bad plan"}})
        cw.dispatch(s, {"op": "exit", "job": "job0", "stage": 0, "code": 3,
                        "log_tail": "Traceback\n"})

    s.send = agent_answers  # type: ignore[method-assign]
    proc, _host, port, _spawn = cw.spawn(
        "m1", job="job0", stage=0, host="h0", plan={}, master="10.0.0.1:0",
        record_path=tmp_path / "s0.jsonl", log_path=tmp_path / "s0.log", timeout_s=60,
        duty=1.0, linger_s=0.0, nice=0, reply_timeout_s=10)
    assert (proc.pid, port) == (31, 9000)
    assert proc.poll() == 3 and proc.wait(0) == 3
    assert read_records(tmp_path / "s0.jsonl") == [{"type": "error", "error": "bad plan"}]


def test_a_request_asked_as_the_session_ends_is_answered_at_once() -> None:
    """The session's reader ends (it sets every answer's event) between ask()'s look at
    the session and its clearing of the event: the ask is answered 'the session ended' at
    once, not after its time-out (the look came before the clear, which undid the end's
    wake-up)."""
    from testbed.cluster.agentlink import ClusterWorkers
    from testbed.cluster.spec import parse_cluster

    c = parse_cluster({"machines": [{"name": "m1", "address": "192.0.2.1"}]})
    s = ClusterWorkers(c, "lp0a0d").sessions["m1"]
    s.proc = subprocess.Popen(["true"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert s.proc.stdout is not None
    try:
        real_clear = s._answered["fidelity"].clear

        def clear_as_it_ends() -> None:  # the session's end lands just before the clear
            s._read(s.proc.stdout)  # type: ignore[union-attr]  # (EOF: its `finally`)
            real_clear()

        waited: list[float | None] = []

        def wait(timeout: float | None = None) -> bool:  # (what the event's wait would do)
            waited.append(timeout)
            return s._answered["fidelity"].is_set()

        s._answered["fidelity"].clear = clear_as_it_ends  # type: ignore[method-assign]
        s._answered["fidelity"].wait = wait  # type: ignore[method-assign]
        answer = s.ask({"op": "fidelity"}, timeout_s=60)
        assert answer == {"ok": False, "why": "the session ended"}
        assert waited == []  # (it waited out its 60 s on an event nobody would set)
    finally:
        s.proc.wait(10)


def test_a_rendezvous_file_left_by_an_earlier_session_is_never_relayed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The run's state directory outlives an agent's session: a job of the same name run
    again finds the last one's rendezvous.json. Stage 0 here must not relay that stale
    port (read at once, long before the new stage 0 binds its own), and a stage here must
    not join it; a second stage of the job here keeps what the first's job wrote."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    fake = bindir / "mnexec"  # (the worker itself is not the point: it ends at once)
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}")
    jdir = tmp_path / "workers" / "job0"
    jdir.mkdir(parents=True)
    stale = jdir / "rendezvous.json"
    stale.write_text(json.dumps({"host": "10.0.0.1", "port": 4242}))
    out = io.BytesIO()
    agent = Agent("lp0001", tmp_path, HOSTS, out)
    try:
        agent.start(parse_start(_start(stage=0, metrics_address="127.0.0.1"), HOSTS))
        agent.pump()
        sent = [json.loads(x) for x in out.getvalue().splitlines()]
        assert [m["op"] for m in sent][:1] == ["started"], sent
        assert not [m for m in sent if m["op"] == "rendezvous"], sent
        assert not stale.exists()
        # stage 0 publishes; stage 1 of the same job starting here keeps that file
        fresh = {"host": "10.0.0.1", "port": 5151}
        stale.write_text(json.dumps(fresh))
        agent.start(parse_start(_start(stage=1, metrics_address="127.0.0.1"), HOSTS))
        assert json.loads(stale.read_text()) == fresh
    finally:
        agent.stop_all(grace_s=5.0)
        for w in agent.workers.values():
            w.lsock.close()


def test_a_session_that_ends_is_judged_by_how_ssh_ended_not_as_its_stdout_closed(
        tmp_path: Path) -> None:
    """The agent dies with an error: its stdout closes, then ssh writes the last line of
    stderr and exits with the remote status. The stage that ran there fails with that
    status and line, not with the status of an ssh still running (255: "unreachable") and
    a stderr missing its last line, as read at the moment its stdout ended.
    Deterministic: this ssh exits only once someone waits for it."""
    from testbed.cluster.agentlink import LOST_CODE, ClusterWorkers
    from testbed.cluster.spec import parse_cluster
    from testbed.orchestrate.results import read_records

    c = parse_cluster({"machines": [{"name": "m1", "address": "192.0.2.1"}]})
    cw = ClusterWorkers(c, "lp0a0e")
    s = cw.sessions["m1"]
    s.send = lambda msg: cw.dispatch(s, {  # type: ignore[method-assign]
        "op": "started", "job": "job0", "stage": 0, "pid": 41, "metrics_port": 9000,
        "spawn_s": 1.0})
    proc, *_ = cw.spawn("m1", job="job0", stage=0, host="h0", plan={},
                        master="10.0.0.1:0", record_path=tmp_path / "s0.jsonl",
                        log_path=tmp_path / "s0.log", timeout_s=60, duty=1.0, linger_s=0.0,
                        nice=0, reply_timeout_s=10)
    ssh = subprocess.Popen(["sh", "-c", "exec 1>&-; echo 'agent: starting' >&2; read go; "
                            "echo 'agent: OSError: no space left on device' >&2; exit 7"],
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE)
    assert ssh.stdin is not None and ssh.stdout is not None
    real_wait = ssh.wait

    def wait(timeout: float | None = None) -> int:  # ssh exits a moment after: on a wait
        ssh.stdin.write(b"go\n")  # type: ignore[union-attr]
        ssh.stdin.close()  # type: ignore[union-attr]
        ssh.wait = real_wait  # type: ignore[method-assign]
        return real_wait(timeout)

    ssh.wait = wait  # type: ignore[method-assign]
    s.proc = ssh
    s._drainer = threading.Thread(target=s._drain, args=(ssh.stderr,), daemon=True)
    s._drainer.start()
    try:
        s._read(ssh.stdout)  # its end: the session's end (session_ended)
        assert proc.poll() == LOST_CODE
        why = read_records(tmp_path / "s0.jsonl")[-1]["error"]
        assert "session to machine m1 ended" in why
        assert "failed with 7" in why and "no space left on device" in why, why
    finally:
        if ssh.poll() is None:
            ssh.kill()
        real_wait(10)
