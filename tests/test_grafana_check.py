"""`lightpipe grafana check`: which empty queries a run cannot produce (decided from what
the run is: its lightpipe_run_info), which are empty but expected, and the summary line."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from testbed.monitor import dashboards as dash
from testbed.monitor.producible import why_none_can, why_not
from testbed.monitor.run import run_info
from testbed.spec import parse_scenario
from tests.test_monitor_emu import HONESTLY_EMPTY
from tests.waiting import scaled

ROOT = Path(__file__).resolve().parent.parent
ENTRY = "import sys; from testbed.cli.main import main; sys.exit(main(sys.argv[1:]))"
pytest.importorskip("grafana_foundation_sdk")


def _facts(name: str) -> dict[str, str]:
    """The labels Prometheus keeps of the run's lightpipe_run_info (it drops empty ones)."""
    spec = parse_scenario(yaml.safe_load((ROOT / "scenarios" / f"{name}.yaml").read_text()))
    info = run_info(spec, backend="emu", link_mode="userspace", datapath="user")
    return {**{k: v for k, v in info.items() if v}, "run": f"{name}-x", "scenario": name}


def _unproducible(facts: dict[str, str]) -> dict[str, str]:
    """'dashboard: kind title' -> reason, for every query these facts cannot produce."""
    out = {}
    for name, d in dash.load_dashboards().items():
        for q in dash.queries(name, d):
            why = why_not(q.expr, facts)
            if why:
                out[f"{name}: {q.kind} {q.title}"] = why
    return out


def test_monitor_demo_cannot_produce_exactly_the_honestly_empty_panels() -> None:
    """From monitor-demo's own facts (no routing policy, no leaf-spine, shadow workers):
    the panels the root test finds empty (HONESTLY_EMPTY), no more, no fewer."""
    got = _unproducible(_facts("monitor-demo"))
    listed = {k for k in got
              if any(k.startswith(f"{d}: panel {t}") for d, t in HONESTLY_EMPTY)}
    assert listed == set(got), f"not in HONESTLY_EMPTY: {set(got) - listed}"
    for d, t in HONESTLY_EMPTY:
        assert any(k.startswith(f"{d}: panel {t}") for k in got), (d, t)
    assert "shadow-mode workers train no model" in got["workers: panel Training loss [A]"]
    assert all("routing policy" in why for k, why in got.items() if k.startswith("routing"))


def test_netem_links_cannot_fill_the_forwarders_counter_panels() -> None:
    """netem fibres (the VM) keep no LightPipe counters: the per-fibre and per-lightpath
    traffic panels and the fibre variable are named, the controller's are not."""
    demo = _facts("monitor-demo")
    netem = _unproducible(demo | {"link_mode": "netem"})
    extra = {k: why for k, why in netem.items() if k not in _unproducible(demo)}
    titles = {k.rsplit(" [", 1)[0] for k in extra}
    assert titles == {"optical: variable fibre", "optical: panel Per-fibre throughput",
                      "optical: panel Per-lightpath throughput", "optical: panel Queue depth",
                      "optical: panel Drops", "optical: panel Link emulator timer slack"}, titles
    assert all("netem" in why for why in extra.values())
    assert not any("Active lightpaths" in k or "Slot" in k for k in extra)


def test_what_a_run_cannot_produce_follows_from_the_run() -> None:
    """Not a list per scenario name: a routing scenario can fill the routing panels, a
    lightpath_requests scenario no worker panel, static forwarding no controller panel."""
    assert not any(k.startswith("routing: panel") for k in
                   _unproducible(_facts("routing-leafspine")))
    quick = _unproducible(_facts("quickstart"))
    assert "workers: panel Bytes sent [A]" in quick
    assert "lightpath_requests workload" in quick["workers: panel Bytes sent [A]"]
    assert "no fibre cut" in quick["overview: annotation Fibre cuts"]  # (fibre_up == 0)
    assert "overview: annotation Fibre cuts" not in _unproducible(_facts("monitor-demo"))
    static = _facts("monitor-demo") | {"forwarding": "static"}
    assert "static forwarding" in (why_not("lightpipe_fibre_up{run=~\"x\"}", static) or "")
    # the same demo with a model-mode run beside it: the loss panel is expected again
    demo = _facts("monitor-demo")
    loss = "lightpipe_worker_loss{run=~\"$run\"}"
    assert why_none_can(loss, {"a": demo}) is not None
    assert why_none_can(loss, {"a": demo, "b": demo | {"run": "b", "workers": "model"}}) is None
    # an older run without the labels: nothing is excused
    old = {k: v for k, v in demo.items() if k not in ("routing", "dc_fabric", "workers",
                                                       "events")}
    assert why_not(loss, old) is None
    assert why_none_can(loss, {}) is None


def test_check_names_what_the_run_cannot_produce_and_prints_one_summary(
        tmp_path: Path) -> None:
    """Against a real Prometheus holding a registered monitor-demo run (no network, so
    its workers' panels are empty but expected: exit 1): routing and loss panels are
    n/a with the reason, the rest EMPTY, and one summary line counts them."""
    if shutil.which("prometheus") is None:
        pytest.skip("prometheus not installed")
    from testbed.metrics.query import wait_for
    from testbed.monitor.run import RunMonitor

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-c", ENTRY, *args], cwd=ROOT,
                              capture_output=True, text=True, timeout=scaled(120))

    mdir = tmp_path / "monitor"
    up = cli("monitor", "up", "--dir", str(mdir), "--port", "0", "--json")
    assert up.returncode == 0, up.stderr
    url = json.loads(up.stdout)["url"]
    try:
        spec = parse_scenario(yaml.safe_load((ROOT / "scenarios/monitor-demo.yaml")
                                             .read_text()))
        stage = tmp_path / ".run.partial"
        stage.mkdir()
        mon = RunMonitor(spec, stage, tmp_path / "run1", monitor_dir=mdir).start()
        try:
            wait_for(url, f'lightpipe_run_info{{run="{mon.run_id}"}}', timeout_s=scaled(120))
            chk = cli("grafana", "check", "--url", url, "--run", mon.run_id,
                      "--since-s", "300")
        finally:
            mon.stop()
    finally:
        cli("monitor", "down", "--dir", str(mdir))
    lines = chk.stdout.splitlines()
    assert chk.returncode == 1, chk.stdout + chk.stderr
    na = [ln for ln in lines if ln.startswith("n/a")]
    assert any("routing: panel Per-job bottleneck rate" in ln and "no routing policy" in ln
               for ln in na), na
    assert any("workers: panel Training loss" in ln and "shadow-mode" in ln for ln in na)
    assert any(re.match(r"EMPTY +0 +workers: panel Bytes sent \[A\]$", ln) for ln in lines)
    assert re.search(r"^ok +1 +overview: panel Runs \[A\]$", chk.stdout, re.M)
    (summary,) = [ln for ln in lines if ln.startswith("grafana check of ")]
    assert summary == lines[-1]
    n_ok = sum(ln.startswith("ok ") for ln in lines)
    n_empty = sum(ln.startswith("EMPTY") for ln in lines)
    assert summary.startswith(f"grafana check of run {mon.run_id}: {n_ok} queries with data, "
                              f"{n_empty} empty but expected (FAILED), {len(na)} empty "
                              "because the run cannot produce them: ")
    assert "shadow-mode workers train no model" in summary
