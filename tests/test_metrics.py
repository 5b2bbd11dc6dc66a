"""Prometheus manager: generated config passes promtool; a live server scrapes workers."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import generate_latest

from testbed.errors import RuntimeFailure
from testbed.metrics.prometheus import PrometheusServer, scrape_config
from testbed.metrics.query import query, targets, values, wait_for
from testbed.orchestrate.launch import Host, Launcher
from testbed.schedule import PipelineProblem, build_schedule
from tests.waiting import scaled, wait_until
from workloads.metrics import METRIC_NAMES, WorkerMetrics
from workloads.plan import TinyGPTConfig, model_plan, shadow_plan


def _at_least(url: str, promql: str, n: int) -> list[dict[str, Any]] | None:
    """The query's series once there are n of them (None before: keep polling)."""
    got = query(url, promql)
    return got if len(got) >= n else None


needs_prometheus = pytest.mark.skipif(shutil.which("prometheus") is None
                                      or shutil.which("promtool") is None,
                                      reason="prometheus/promtool not installed")


def test_scrape_config_shape(tmp_path: Path) -> None:
    cfg = scrape_config(tmp_path / "targets", scrape_interval_s=0.5)
    assert cfg["global"]["scrape_interval"] == "500ms"
    (job,) = cfg["scrape_configs"]
    assert job["honor_labels"] is True
    assert job["file_sd_configs"][0]["files"] == [str(tmp_path / "targets" / "*.json")]


@needs_prometheus
def test_promtool_accepts_generated_config_and_rejects_broken(tmp_path: Path) -> None:
    srv = PrometheusServer(tmp_path)
    srv.write_config()
    srv.check_config()
    srv.config_path.write_text(yaml.safe_dump({"global": {"scrape_interval": "banana"}}))
    with pytest.raises(RuntimeFailure, match="promtool rejected"):
        srv.check_config()


def test_worker_metric_names_follow_conventions() -> None:
    m = WorkerMetrics("job0", 2)
    assert "lightpipe_worker_loss{" not in generate_latest(m.registry).decode()  # not yet
    m.loss.set(2.5)
    names = {fam.name for fam in m.registry.collect()}
    text = "\n".join(s.name for fam in m.registry.collect() for s in fam.samples)
    for full in METRIC_NAMES:
        assert full.startswith("lightpipe_worker_")
        base = full.removesuffix("_total")
        assert base in names or full in names
        assert full in text or f"{full}_count" in text
    labels = {tuple(sorted(s.labels)) for fam in m.registry.collect() for s in fam.samples}
    assert all({"training_job", "stage"} <= set(lab) for lab in labels)


@needs_prometheus
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_live_prometheus_scrapes_every_worker_metric(tmp_path: Path) -> None:
    """Two jobs (shadow 4 stages, model 2 stages) on localhost; query every metric."""
    local = Host("local", "127.0.0.1", "lo")
    prob = PipelineProblem.uniform(4, 4, 30.0, 60.0, activation_mb=0.05)
    shadow = shadow_plan("shadow0", prob, build_schedule("1f1b", prob), iterations=400,
                         bandwidth_divisor=1, time_factor=1)
    model = model_plan("model0", build_schedule("gpipe", PipelineProblem.uniform(2, 4, 1, 1)),
                       4, iterations=200, config=TinyGPTConfig(layers=2, hidden=32, heads=2,
                                                               seq_len=16))
    with PrometheusServer(tmp_path, scrape_interval_s=0.5) as prom, \
            Launcher(tmp_path) as launcher:
        assert prom.url.startswith("http://127.0.0.1:")
        launcher.start([(shadow, [local] * 4), (model, [local] * 2)])
        prom.set_targets("workers", launcher.metrics_targets())
        checks = {
            "lightpipe_worker_iterations_total": 6,
            "lightpipe_worker_iteration_duration_seconds_count": 6,
            "lightpipe_worker_bubble_ratio": 6,
            "lightpipe_worker_sent_bytes_total": 6,
            "lightpipe_worker_received_bytes_total": 6,
            "lightpipe_worker_compute_seconds_total": 6,
        }
        for name, series in checks.items():
            wait_for(prom.url, f"{name} > 0", timeout_s=scaled(120))
            res = wait_until(lambda name=name, series=series: _at_least(
                prom.url, f"{name} > 0", series), f"{series} series of {name}",
                timeout_s=120, interval_s=0.5)
            assert len(res) == series, (name, res)
            assert {r["metric"]["training_job"] for r in res} == {"shadow0", "model0"}
        loss = wait_for(prom.url, 'lightpipe_worker_loss{training_job="model0",stage="1"} > 0',
                        timeout_s=scaled(120))
        assert values(loss)[0] > 0
        # rate() needs two scrapes of a job's histogram inside the window: poll for both
        # jobs (a clean-clone CI run once queried before shadow0's second scrape).
        hist_q = ("histogram_quantile(0.5, sum by (le, training_job) "
                  "(rate(lightpipe_worker_iteration_duration_seconds_bucket[5m])))")
        hist = wait_until(lambda: _at_least(prom.url, hist_q, 2),
                          "the iteration histogram of both jobs", timeout_s=120, interval_s=0.5)
        assert {r["metric"]["training_job"] for r in hist} == {"shadow0", "model0"}
        assert all(t["health"] == "up" for t in targets(prom.url))
        launcher.stop()
    assert any((tmp_path / "prometheus" / "data").iterdir())


def test_link_exporter_serves_forwarder_counters_per_fibre_and_lightpath() -> None:
    """The exporter reads each link's counters at scrape time (the forwarder's stats
    format) and serves them under the forwarder's own metric names."""
    import urllib.request
    from types import SimpleNamespace

    from testbed.emu.slack import SlackHistogram
    from testbed.metrics.links import LINK_METRIC_NAMES, LinkExporter

    def direction(tx: int) -> dict:
        return {"rx_packets": 3, "rx_bytes": tx, "tx_packets": 3, "tx_bytes": tx,
                "tx_segments": 3, "queue_drops": 2, "loss_drops": 1, "down_drops": 0,
                "send_errors": 0, "socket_drops": 4, "queue_depth_bytes": 1500,
                "in_flight_frames": 0,
                "vlans": {"101": {"rate_mbps": 50.0, "bytes": tx, "packets": 3, "drops": 2,
                                  "queue_depth_bytes": 0}},
                "released_lightpaths": {"caps": 1, "drops": 6, "packets": 9, "bytes": 9000,
                                        "max_rate_mbps": 50.0}}

    class Link:
        def __init__(self, u: str, v: str, tx: int | None) -> None:
            self.fibre = SimpleNamespace(u=u, v=v)
            self.tx = tx

        def stats(self) -> dict:
            if self.tx is None:
                raise ConnectionRefusedError("forwarder stopped")
            slack = SlackHistogram()
            for late_s in (0.00002, 0.0003, 0.2):
                slack.observe(late_s)
            return {"directions": {"a_to_b": direction(self.tx),
                                   "b_to_a": direction(self.tx + 1)},
                    "timer_slack": slack.as_record()}

    exp = LinkExporter([Link("A", "B", 1000), Link("B", "C", None)])
    exp.start()
    try:
        url = f"http://{exp.target}/metrics"
        body = urllib.request.urlopen(url, timeout=scaled(30)).read().decode()
    finally:
        exp.stop()
    for name in LINK_METRIC_NAMES:
        assert f'{name}{{' in body, name
    assert 'lightpipe_fibre_tx_bytes_total{direction="b_to_a",fibre="A-B"} 1001.0' in body
    assert ('lightpipe_lightpath_drops_total{direction="a_to_b",fibre="A-B",vlan="101"} 2.0'
            in body)
    assert 'lightpipe_fibre_socket_drops_total{direction="a_to_b",fibre="A-B"} 4.0' in body
    assert ('lightpipe_fibre_released_lightpath_drops_total{direction="a_to_b",fibre="A-B"} '
            '6.0') in body
    # timer slack: cumulative buckets (0.02 ms <= 0.05 ms; 0.3 ms <= 0.5 ms; 200 ms > all)
    assert 'lightpipe_fibre_timer_slack_seconds_bucket{fibre="A-B",le="5e-05"} 1.0' in body
    assert 'lightpipe_fibre_timer_slack_seconds_bucket{fibre="A-B",le="0.0005"} 2.0' in body
    assert 'lightpipe_fibre_timer_slack_seconds_bucket{fibre="A-B",le="0.1"} 2.0' in body
    assert 'lightpipe_fibre_timer_slack_seconds_count{fibre="A-B"} 3.0' in body
    assert 'fibre="B-C"' not in body  # a stopped forwarder gives no samples, no error
    assert exp.snapshot()["A-B"]["a_to_b"]["lightpath_drops"] == {"101": 2}


def test_stop_pid_signals_only_the_process_it_verified() -> None:
    """stop_pid goes through a pidfd checked against the verified start time: a process
    whose start time differs (a reused PID) gets no signal; the right one is stopped."""
    import subprocess

    from testbed.metrics import process

    other = subprocess.Popen(["sleep", "30"])
    try:
        ticks = process.start_ticks(other.pid)
        assert ticks is not None
        assert process.stop_pid(other.pid, start=ticks + 1) is False
        assert other.poll() is None  # untouched
        assert process.stop_pid(other.pid, start=ticks) is True
        assert other.wait(timeout=10) is not None
        assert process.stop_pid(other.pid) is False  # gone: nothing to stop
    finally:
        if other.poll() is None:
            other.kill()
            other.wait()


_DRIVER = """
import sys, time
from pathlib import Path
from testbed.metrics.prometheus import PrometheusServer
s = PrometheusServer(Path(sys.argv[1]), die_with_parent=sys.argv[2] == "1")
s.start()
print(s.proc.pid, flush=True)
time.sleep(600)
"""


@needs_prometheus
@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_prometheus_tied_to_its_driver_ends_when_the_driver_is_killed(
        tmp_path: Path, tied: bool) -> None:
    """A server started with die_with_parent gets SIGTERM from the kernel when its
    driver is killed with SIGKILL (no run state records it); an untied one outlives it
    (the case the flag exists for, and the proof that the test can fail)."""
    import signal
    import subprocess
    import sys

    from testbed.metrics import process

    data = tmp_path / "prometheus" / "data"
    drv = subprocess.Popen([sys.executable, "-c", _DRIVER, str(tmp_path), "1" if tied else "0"],
                           stdout=subprocess.PIPE, text=True, cwd=Path(__file__).parents[1])
    pid = 0
    try:
        assert drv.stdout is not None
        pid = int(drv.stdout.readline() or 0)
        assert pid, drv.communicate()
        ticks = process.start_ticks(pid)
        assert process.not_ours(pid, data, ticks) is None  # the server itself, not setpriv
        drv.send_signal(signal.SIGKILL)
        drv.wait(timeout=30)
        if tied:
            wait_until(lambda: process.not_ours(pid, data, ticks) is not None,
                       "the tied server to end with its driver", timeout_s=60)
        else:
            assert process.not_ours(pid, data, ticks) is None
    finally:
        if drv.poll() is None:
            drv.kill()
            drv.wait()
        if pid and process.not_ours(pid, data, ticks) is None:
            process.stop_pid(pid, start=ticks)


def test_parent_death_signal_refused_off_the_main_thread() -> None:
    """The kernel ties the signal to the forking thread: a short-lived thread would have
    the server killed as soon as it ends, so launching from one is refused."""
    import threading

    from testbed.metrics.process import pdeathsig_argv

    assert pdeathsig_argv()[-1] == "--"
    box: list[BaseException] = []

    def off_main() -> None:
        try:
            pdeathsig_argv()
        except ValueError as exc:
            box.append(exc)

    t = threading.Thread(target=off_main)
    t.start()
    t.join()
    assert box and "main thread" in str(box[0]) and "for_life" in str(box[0])


_FOR_LIFE_PARENT = r"""
import os, subprocess, sys, threading, time
from testbed.metrics.process import for_life, pdeathsig_argv
pids = []
def execd(pid):  # setpriv sets the signal (its prctl), then execs sleep: wait for that
    end = time.monotonic() + 300  # (against a hang only: not a guess at how long it takes)
    while os.path.basename(os.readlink(f"/proc/{pid}/exe")) != "sleep":
        assert time.monotonic() < end, "setpriv never ran sleep"
        time.sleep(0.01)
def restart():  # what a fault injector's thread does when it restarts a server
    pids.append(for_life(lambda: subprocess.Popen(pdeathsig_argv() + ["sleep", "60"])).pid)
    # the contrast: the same signal tied to this short-lived thread itself
    pids.append(subprocess.Popen(["setpriv", "--pdeathsig=TERM", "--", "sleep", "60"]).pid)
    execd(pids[-1])  # (not a fixed 1 s sleep: a guess that the prctl came first)
t = threading.Thread(target=restart)
t.start()
t.join()
print(*pids, flush=True)
sys.stdin.readline()  # the test says when this parent is to end
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_for_life_ties_a_child_to_the_process_not_the_thread() -> None:
    """A server started with a parent death signal from a short-lived thread (a fault
    injector restarting the controller or Prometheus of a cluster run) outlives that
    thread and ends with the process: for_life forks it from a thread that lives as long
    as the process. Forked from the short-lived thread itself, it dies with the thread."""
    import os
    import subprocess
    import sys

    from tests.waiting import wait_until

    p = subprocess.Popen([sys.executable, "-c", _FOR_LIFE_PARENT], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True,
                         cwd=str(Path(__file__).resolve().parents[1]))
    assert p.stdout is not None and p.stdin is not None
    kept, tied = (int(x) for x in p.stdout.readline().split())
    try:
        wait_until(lambda: not _alive(tied), "the thread-tied child to end", 10)
        assert _alive(kept)  # its parent thread has ended; the process lives on
        p.stdin.close()
        p.wait(10)
        wait_until(lambda: not _alive(kept), "the child to end with its process", 10)
    finally:
        for pid in (kept, tied):
            if _alive(pid):
                os.kill(pid, 9)


def test_metrics_server_quiet_when_the_scraper_gave_up(capsys: pytest.CaptureFixture[str]) -> None:
    """A scraper past its scrape time-out closes the connection before the answer (seen on
    a software-emulated VM): no traceback per scrape on the run's stderr; other errors
    still print theirs."""
    from prometheus_client import CollectorRegistry

    from workloads.metrics import serve

    server, _port = serve(CollectorRegistry(), port=0)
    try:
        for exc in (BrokenPipeError(32, "Broken pipe"), ConnectionResetError(104, "reset")):
            try:
                raise exc
            except OSError:
                server.handle_error(None, ("127.0.0.1", 1))
        assert capsys.readouterr().err == ""
        try:
            raise ValueError("a real handler error")
        except ValueError:
            server.handle_error(None, ("127.0.0.1", 1))
        assert "ValueError: a real handler error" in capsys.readouterr().err
    finally:
        server.shutdown()
        server.server_close()


def test_final_metrics_wait_for_a_scrape_despite_a_stale_backlog() -> None:
    """A worker's /metrics socket is bound by the launcher long before the worker serves
    (importing torch takes minutes on a slow VM): the scrapes of that time wait in the
    backlog and are gone when serving starts. A live scrape after them is answered at
    once, and a worker waiting for one scrape of its final values sees it delivered;
    without any scrape the wait ends at its bound."""
    import socket
    import threading
    import urllib.request

    from prometheus_client import CollectorRegistry

    from workloads.metrics import Scrapes, WorkerMetrics, serve

    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(128)
    port = lsock.getsockname()[1]
    stale = []
    for _ in range(40):  # scrapes that sent their request and gave up before serving
        c = socket.create_connection(("127.0.0.1", port))
        c.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        stale.append(c)
    m = WorkerMetrics("job0", 0)
    scrapes = Scrapes()
    server, _ = serve(m.registry, fd=lsock.detach(), scrapes=scrapes)
    try:
        for c in stale:
            c.close()
        from tests.waiting import wait_until

        wait_until(lambda: scrapes.started >= len(stale), what="the stale scrapes handled")
        m.iterations.inc(6)  # the final value
        mark = scrapes.started
        assert not scrapes.wait_after(mark, 0.2)  # nobody scraped since: the bound
        got: list[bytes] = []
        t = threading.Thread(target=lambda: got.append(urllib.request.urlopen(
            f"http://127.0.0.1:{port}/metrics", timeout=30).read()))
        t.start()
        assert scrapes.wait_after(mark, 30)
        t.join(30)
        assert b'lightpipe_worker_iterations_total{stage="0",training_job="job0"} 6.0' in got[0]
    finally:
        server.shutdown()
        server.server_close()
    # an unused registry serves without counting (no Scrapes given)
    server, port2 = serve(CollectorRegistry(), port=0)
    try:
        assert urllib.request.urlopen(f"http://127.0.0.1:{port2}/metrics", timeout=30).status == 200
    finally:
        server.shutdown()
        server.server_close()


@needs_prometheus
@pytest.mark.timeout(300)
def test_a_job_scraped_only_after_its_last_iteration_fills_every_worker_panel(
        tmp_path: Path) -> None:
    """A short job in a slow guest (user path, CI run 3 of 2026-11-26): its iterations all
    end between two scrapes, and Prometheus only ever sees its final values. Every
    dashboard query over worker series (the loss aside: shadow workers) must still have
    data; a rate() ratio there is 0/0 (NaN) and its panel stays empty."""
    pytest.importorskip("grafana_foundation_sdk")
    import time

    from testbed.metrics.query import query_range
    from testbed.monitor import dashboards as dash
    from workloads.metrics import serve

    m = WorkerMetrics("job0", 0)
    for _ in range(6):  # the whole job, done before anyone scrapes
        m.iteration.observe(0.2)
        m.iterations.inc()
        m.compute.inc(0.15)
        m.wait.inc(0.05)
        m.sent.inc(1000)
        m.received.inc(1000)
        m.bubble.set(0.25)
    server, port = serve(m.registry, port=0)
    try:
        with PrometheusServer(tmp_path, scrape_interval_s=0.5) as prom:
            start_s = time.time()
            prom.set_targets("workers", [(f"127.0.0.1:{port}", {})])
            wait_for(prom.url, "lightpipe_worker_iterations_total == 6", timeout_s=scaled(120))
            exprs = [(f"{d}: {q.title}", dash.substitute(q.expr, {}))
                     for d, board in dash.load_dashboards().items()
                     for q in dash.queries(d, board)
                     if q.kind == "panel" and "lightpipe_worker_" in q.expr
                     and "lightpipe_worker_loss" not in q.expr]
            assert any("Iteration time per job" in t for t, _ in exprs)

            def empty() -> list[str] | None:
                end_s = time.time()
                out = [t for t, e in exprs
                       if not any(v[1] not in ("NaN", "+Inf", "-Inf")
                                  for r in query_range(prom.url, e, start_s, end_s, 1.0)
                                  for v in r.get("values", []))]
                return out or None

            # poll until several scrapes of the same final values are stored: the case
            # a rate() ratio cannot show
            def samples() -> int:  # a range whose last step precedes the 1st sample: none
                got = query_range(prom.url, "lightpipe_worker_iterations_total", start_s,
                                  time.time(), 0.5)
                return len(got[0]["values"]) if got else 0

            wait_until(lambda: samples() >= 6 or None, "six samples of the final values",
                       timeout_s=120, interval_s=0.5)
            assert empty() is None, empty()
    finally:
        server.shutdown()
        server.server_close()


@needs_prometheus
@pytest.mark.timeout(300)
def test_fidelity_verdict_and_forwarder_slack_fill_their_panels(tmp_path: Path) -> None:
    """The run exporter's fidelity gauges and the link exporter's socket drops and timer
    slack, scraped by a real Prometheus: every dashboard query over them has data, the
    verdict reads 0 for an unfaithful run and the failed invariant's ok is 0."""
    pytest.importorskip("grafana_foundation_sdk")
    import time
    from types import SimpleNamespace

    from testbed.emu.fidelity import verdict
    from testbed.emu.scale import Scale
    from testbed.emu.slack import SlackHistogram
    from testbed.metrics.links import LinkExporter
    from testbed.monitor import dashboards as dash
    from testbed.monitor.exporter import FIDELITY_METRICS, RunExporter

    slack = SlackHistogram()
    for late_s in (0.00003, 0.00004, 0.0004):  # p99 in the 0.5 ms bucket: within
        slack.observe(late_s)
    d = {"rx_packets": 10, "rx_bytes": 100, "tx_packets": 10, "tx_bytes": 100,
         "tx_segments": 10, "queue_drops": 0, "loss_drops": 0, "down_drops": 0,
         "send_errors": 0, "socket_drops": 3, "queue_depth_bytes": 0, "vlans": {}}
    stats = {"directions": {"a_to_b": d, "b_to_a": d}, "timer_slack": slack.as_record()}
    link = SimpleNamespace(fibre=SimpleNamespace(u="A", v="B"), stats=lambda: stats)
    v = verdict(Scale(), [{"pair": "a~b", "expected_rtt_ms": 10.0,
                           "samples_ms": [10.1] * 20}], forwarder_stats=[stats])
    assert not v["faithful"]  # 6 of 20 frames dropped by the kernel
    run = RunExporter({"backend": "emu"})
    run.record_fidelity(v)
    run.start_serving()
    links = LinkExporter([link])
    links.start()
    try:
        with PrometheusServer(tmp_path, scrape_interval_s=0.5) as prom:
            start_s = time.time()
            lab = {"run": "r1", "scenario": "s1"}
            prom.set_targets("run", [(run.target, lab)])
            prom.set_targets("links", [(links.target, lab)])
            wait_for(prom.url, "lightpipe_fibre_timer_slack_seconds_count == 3",
                     timeout_s=scaled(120))
            wait_for(prom.url, "lightpipe_run_faithful == 0", timeout_s=scaled(60))
            for name in FIDELITY_METRICS:
                assert query(prom.url, name), name
            got = query(prom.url, "lightpipe_fidelity_invariant_ok == 0")
            assert {r["metric"]["invariant"] for r in got} == {"emulator_drops"}
            qs = [(name, q) for name, board in dash.load_dashboards().items()
                  for q in dash.queries(name, board) if q.kind == "panel" and any(
                      m in q.expr for m in ("lightpipe_run_faithful", "lightpipe_fidelity_",
                                            "lightpipe_fibre_socket_",
                                            "lightpipe_fibre_timer_"))]
            assert {q.title.split(" [")[0] for _, q in qs} == {
                "Faithful run (fidelity verdict)", "Fidelity invariants", "Drops",
                "Link emulator timer slack"}

            def empty() -> list[str] | None:
                end_s = time.time()
                out = [f"{n}: {q.title}" for n, q in qs
                       if dash.run_query(prom.url, q, lab, start_s - 5, end_s, 1.0) == 0]
                return out or None

            wait_until(lambda: None if empty() else True, "every fidelity panel has data",
                       timeout_s=60, interval_s=1.0)
    finally:
        links.stop()
        run.stop()


def test_a_runs_scrape_interval_grows_with_the_machines_slowness() -> None:
    """1 s on the reference machine, longer on a slower one (the user path's guest,
    slowness 20-27: every target timed out at 1 s), bounded; its labels set any
    Prometheus's interval and time-out for the run's targets; `grafana check` takes
    $__rate_interval as at least 4 scrape intervals."""
    from testbed.monitor import dashboards as dash
    from testbed.monitor.run import MAX_SCRAPE_S, run_scrape_interval_s, scrape_labels

    assert run_scrape_interval_s(1.0) == run_scrape_interval_s(1.7) == 1.0
    assert run_scrape_interval_s(20.4) == 5.0 and run_scrape_interval_s(26.6) == 7.0
    assert run_scrape_interval_s(50.0) == MAX_SCRAPE_S
    assert scrape_labels(5.0) == {"__scrape_interval__": "5s", "__scrape_timeout__": "5s"}
    assert scrape_labels(0.5)["__scrape_interval__"] == "500ms"
    assert dash.builtins_for({})["$__rate_interval"] == "10s"
    assert dash.builtins_for({"a": {"scrape_interval_s": "1"},
                              "b": {"scrape_interval_s": "7"},
                              "c": {"scrape_interval_s": "x"}})["$__rate_interval"] == "28s"
    expr = "rate(x[$__rate_interval])"
    assert dash.substitute(expr, {}, dash.builtins_for({"a": {"scrape_interval_s": "7"}})) \
        == "rate(x[28s])"
    assert dash.substitute(expr, {}) == "rate(x[10s])"


@needs_prometheus
@pytest.mark.timeout(120)
def test_a_targets_own_scrape_interval_labels_are_honoured(tmp_path: Path) -> None:
    """A real Prometheus (1 s in its configuration) scrapes a target labelled with
    scrape_labels(3) every 3 s, with a 3 s time-out, and keeps no __ label on the series."""
    from prometheus_client import CollectorRegistry, Gauge, start_http_server

    from testbed.monitor.run import scrape_labels

    reg = CollectorRegistry()
    Gauge("lp_probe_value", "a probe", registry=reg).set(1)
    server, _thread = start_http_server(0, addr="127.0.0.1", registry=reg)
    try:
        port = server.server_address[1]
        with PrometheusServer(tmp_path, scrape_interval_s=1.0) as prom:
            prom.set_targets("t", [(f"127.0.0.1:{port}", {"run": "r", **scrape_labels(3.0)})])
            prom.set_targets("u", [(f"127.0.0.1:{port}", {"run": "plain"})])
            got = wait_until(lambda: [t for t in targets(prom.url) if t["health"] == "up"]
                             if len([t for t in targets(prom.url) if t["health"] == "up"]) == 2
                             else None, "both targets up", timeout_s=scaled(60),
                             interval_s=0.5)
            by_run = {t["labels"]["run"]: t for t in got}
            assert by_run["r"]["scrapeInterval"] == "3s" and by_run["r"]["scrapeTimeout"] == "3s"
            assert by_run["plain"]["scrapeInterval"] == "1s"
            res = wait_for(prom.url, 'lp_probe_value{run="r"}', timeout_s=scaled(30))
            assert not any(k.startswith("__scrape") for k in res[0]["metric"])
    finally:
        server.shutdown()
