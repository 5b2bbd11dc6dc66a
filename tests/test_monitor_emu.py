"""Every dashboard query against live data (root): the bundled monitor-demo scenario (two
jobs, a fibre cut and repair, SDN controller) runs against the long-lived Prometheus,
then every panel, template variable and annotation query of every dashboard is run
through Prometheus's HTTP API with the variables substituted, and must return data."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.emu_skip import emulation_skip_reason
from tests.waiting import scaled, wait_until

ROOT = Path(__file__).resolve().parent.parent
ENTRY = "import sys; from testbed.cli.main import main; sys.exit(main(sys.argv[1:]))"

pytestmark = [pytest.mark.root, pytest.mark.timeout(600)]

# (dashboard, panel title prefix) -> why it has no data in monitor-demo.
HONESTLY_EMPTY = {
    ("routing", "Per-job bottleneck rate"): "per-flow routing of DC fabrics (issue 12b) is "
    "not part of monitor-demo (no leaf-spine fabric, no routing policy)",
    ("routing", "Flows moved per re-route"): "as above: no routing policy re-routes flows",
    ("routing", "Path computation time"): "as above: no routing policy computes paths",
    ("workers", "Training loss"): "shadow-mode workers train no model, so report no loss "
    "(model mode: tests/test_metrics.py)",
}


def _skip_reason() -> str | None:
    return emulation_skip_reason(modules=(
        ("os_ken", "needs os-ken (the scenario uses the SDN controller)"),
        ("grafana_foundation_sdk", "needs grafana-foundation-sdk")))


def _cli(env: dict[str, str], *args: str, timeout: float = 120
         ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", ENTRY, *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_every_dashboard_query_has_data_after_a_run(tmp_path: Path) -> None:
    why = _skip_reason()
    if why:
        pytest.skip(why)
    from testbed.monitor import dashboards as dash

    env = {**os.environ, "LIGHTPIPE_MONITOR_DIR": str(tmp_path / "monitor"),
           "PYTHONPATH": str(ROOT)}
    up = _cli(env, "monitor", "up", "--port", "0", "--json")
    assert up.returncode == 0, up.stderr
    url = json.loads(up.stdout)["url"]
    try:
        t0 = time.time()
        out = tmp_path / "runs" / "demo"
        res = _cli(env, "emu", "scenarios/monitor-demo.yaml", "--out", str(out), "-q",
                   timeout=480)
        assert res.returncode == 0, res.stderr[-2000:]
        summary = json.loads((out / "summary.json").read_text())
        assert all(j["ok"] for j in summary["worker_jobs"]) and len(summary["worker_jobs"]) == 2
        assert [e["kind"] for e in summary["events"]] == ["fiber_cut", "fiber_repair"]
        # timed from the start of training (worker start-up does not count), so the cut
        # lands while the jobs iterate and after Prometheus has scraped the lightpaths
        assert summary["events_clock"] == "training" and summary["events_clock_offset_s"] > 0
        prom = summary["prometheus"]
        assert prom["url"] == url and prom["monitor_url"] == url
        assert f"prometheus: run {prom['run']}, data in {prom['tsdb']} and at {url}" in res.stdout
        assert json.loads((out / "network.json").read_text())["prometheus"]["run"] == prom["run"]
        assert prom["tsdb"] == str(out.resolve() / "prometheus" / "data")
        assert any((out / "prometheus" / "data").iterdir())  # the run's own TSDB, final dir
        assert not list((tmp_path / "monitor" / "targets").glob("run-*.json"))  # unregistered
        end = time.time() + 1
        empty, checked = [], 0
        # Each dashboard twice: every variable on All (".*"), then each variable on the
        # first value its own query lists (as Grafana picks by default), in order.
        for name, d in dash.load_dashboards().items():
            picked = {"run": prom["run"], "scenario": "monitor-demo"}
            for v in d["templating"]["list"]:
                if v["name"] not in picked:
                    got = dash.variable_values(url, v["query"], picked)
                    assert got, f"{name}: variable {v['name']} lists nothing"
                    picked[v["name"]] = sorted(got)[0]
            assert picked.keys() == {v["name"] for v in d["templating"]["list"]}
            for values in ({"run": prom["run"], "scenario": "monitor-demo"}, picked):
                for q in dash.queries(name, d):
                    n = dash.run_query(url, q, values, t0 - 5, end)
                    checked += 1
                    listed = any(name == dn and q.title.startswith(t)
                                 for dn, t in HONESTLY_EMPTY)
                    if n == 0 and not listed:
                        empty.append(f"{name} {values}: {q.kind} {q.title}: {q.expr}")
                    if listed:
                        assert n == 0, f"{name}: {q.title} has data now: drop it from the list"
        assert checked > 100
        assert not empty, "queries without data:\n" + "\n".join(empty)
        # the CLI names exactly those as impossible for this run, from the run's own facts,
        # and exits 0 (issue 26: it exited 1 on them, with no summary)
        chk = _cli(env, "grafana", "check", "--url", url, "--run", prom["run"])
        assert chk.returncode == 0, chk.stdout[-3000:]
        na = [ln for ln in chk.stdout.splitlines() if ln.startswith("n/a")]
        assert all(any(f"{d}: panel {t}" in ln for d, t in HONESTLY_EMPTY) for ln in na), na
        assert all(any(f"{d}: panel {t}" in ln for ln in na) for d, t in HONESTLY_EMPTY), na
        assert chk.stdout.splitlines()[-1].startswith(f"grafana check of run {prom['run']}: ")
        assert " 0 empty but expected, " in chk.stdout.splitlines()[-1]
        # series carry run and scenario; the training job has its own label
        from testbed.metrics.query import query

        got = query(url, f'last_over_time(lightpipe_worker_iterations_total{{run="{prom["run"]}"}}'
                    "[1h])")
        assert {r["metric"]["training_job"] for r in got} == {"job0", "job1"}
        assert {r["metric"]["job"] for r in got} == {"lightpipe"}
        assert {r["metric"]["scenario"] for r in got} == {"monitor-demo"}
        # the controller's fibre names are the link exporter's (one fibre variable)
        sel = f'{{run="{prom["run"]}"}}[1h]'
        ctl = {r["metric"]["fibre"] for r in query(url, f"last_over_time(lightpipe_fibre_up{sel})")}
        links = {r["metric"]["fibre"]
                 for r in query(url, f"last_over_time(lightpipe_fibre_tx_bytes_total{sel})")}
        assert ctl == links and len(ctl) == 3
    finally:
        _cli(env, "monitor", "down")


def test_held_lightpath_requests_run_is_scraped(tmp_path: Path) -> None:
    """A held run of a lightpath_requests scenario (no long-lived Prometheus): its own
    Prometheus scrapes the controller, the link emulators and the run exporter, and
    network.json names it; after Ctrl-C the TSDB is in the final run directory."""
    why = _skip_reason()
    if why:
        pytest.skip(why)
    import signal

    from testbed.metrics.query import wait_for

    env = {**os.environ, "LIGHTPIPE_MONITOR_DIR": str(tmp_path / "no-monitor"),
           "PYTHONPATH": str(ROOT)}
    out = tmp_path / "held"
    proc = subprocess.Popen([sys.executable, "-c", ENTRY, "emu", "scenarios/quickstart.yaml",
                             "--out", str(out), "--hold", "-q"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until((out / "network.json").exists, "the held run to write network.json",
                   timeout_s=240, interval_s=0.5, alive=lambda: None if proc.poll() is None
                   else proc.communicate()[1][-2000:])
        prom = json.loads((out / "network.json").read_text())["prometheus"]
        assert prom["monitor_url"] is None and prom["url"] == prom["run_url"]
        for comp in ("controller", "links", "run"):
            got = wait_for(prom["url"], f'up{{run="{prom["run"]}", component="{comp}"}} == 1',
                           timeout_s=scaled(120))
            assert got[0]["metric"]["scenario"] == "quickstart"
        wait_for(prom["url"], f'lightpipe_fibre_slots_used{{run="{prom["run"]}"}}',
                 timeout_s=scaled(120))
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-2000:]
    assert any((out / "prometheus" / "data").iterdir())
    assert json.loads((out / "summary.json").read_text())["prometheus"]["run"] == prom["run"]
