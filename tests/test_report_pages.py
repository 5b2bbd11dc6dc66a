"""Report pages read at a glance (issue 26): every PNG of a directory is on its page, a page
opens with what the run found and folds its raw fields, and the figures keep the rules
(legends of at most 6 short lines, no `_created` series, no silent all-zero panel, units,
reference lines labelled for what they are)."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
SCENARIOS = REPO / "scenarios"
LEGEND_MAX = 6


def pngs_on_page(run_dir: Path) -> None:
    """Every *.png at the top of run_dir is inlined on its report.html, byte for byte,
    with its file name in the caption."""
    html = (run_dir / "report.html").read_text()
    inlined = {base64.b64decode(m) for m in re.findall(r"src='data:image/png;base64,([^']+)'",
                                                       html)}
    pngs = sorted(run_dir.glob("*.png"))
    for png in pngs:
        assert png.read_bytes() in inlined, f"{png.name} is not on the page"
        assert f"(file: {png.name})" in html, png.name


def h2s(html: str) -> list[str]:
    return re.findall(r"<h2 id='s\d+'>([^<]*)</h2>", html)


def legend_sizes(fig: Any) -> list[int]:
    return [len(leg.get_texts()) for leg in [*fig.legends, *(ax.get_legend()
                                                                for ax in fig.axes)] if leg]


# ------------------------------------------------------------------ reproductions
def reproduced(tmp_path_factory: pytest.TempPathFactory, name: str, setting: str) -> Path:
    """`lightpipe reproduce NAME --quick --set SETTING --report`'s directory."""
    from testbed.cli.main import main

    out = tmp_path_factory.mktemp("repro") / name
    assert main(["reproduce", name, "--quick", "--out", str(out), "-q", "--set", setting,
                 "--report"]) == 0
    return out


@pytest.fixture(scope="module")
def routing_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return reproduced(tmp_path_factory, "routing", "seeds=1")


def test_routing_report_shows_its_figure_and_its_own_headline(routing_dir: Path) -> None:
    """Defect 1: routing.png was in the directory and the "figures" heading was empty; the
    headline's caption spoke of cba and bace."""
    assert (routing_dir / "routing.png").is_file()
    pngs_on_page(routing_dir)
    html = (routing_dir / "report.html").read_text()
    titles = h2s(html)
    assert titles[0] == "what this reproduction found", titles
    head = html.split("<h2 id='s1'>")[0]
    assert "cba" not in head and "bace" not in head
    assert "greedy against ECMP" in head


def test_routing_figure_legends_and_the_missing_ilp_said(routing_dir: Path) -> None:
    """Defect 8: the ILP bar of the large cases was missing without a word; 10 policies
    shared one legend."""
    from testbed.experiments.routing import NO_ILP_NOTE, cases, routing_figure

    rows = json.loads((routing_dir / "summary.json").read_text())["rows"]
    cs = cases(True)
    fig = routing_figure(rows, cs)
    assert max(legend_sizes(fig)) <= LEGEND_MAX
    no_ilp = [c.name for c in cs if not any(r["policy"] == "ilp" and r["case"] == c.name
                                             for r in rows)]
    assert no_ilp  # (the quick set has fabrics too large for the ILP)
    texts = [t.get_text() for ax in fig.axes for t in ax.texts] + \
        [t.get_text() for t in fig.texts]
    # one "no ILP" mark per missing bar (two rows of panels), and the note under the figure
    assert sum("no ILP" in t for t in texts) >= 2 * len(no_ilp), texts
    assert NO_ILP_NOTE in texts
    for ax in fig.axes:
        assert ax.get_xlabel() and ax.get_ylabel()
    import matplotlib.pyplot as plt

    plt.close(fig)


@pytest.fixture(scope="module")
def crosspipe_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return reproduced(tmp_path_factory, "crosspipe", "time_limit_s=2")


def test_crosspipe_reference_lines_are_what_their_labels_say(crosspipe_dir: Path) -> None:
    """Defect 8: crosspipe-opt-relaxed ran below the dashed "no-delay ideal". That line is
    (m+p-1)(F+B), the no-delay time of an unsplit schedule: a bound for unsplit,
    non-interleaved schedules only. The schedules below it must be split-backward or
    interleaved ones, each at or above its own lower bound, and the label must say so."""
    from testbed.report.repro_plots import SPLIT_BOUND_LABEL, UNSPLIT_IDEAL_LABEL

    summ = json.loads((crosspipe_dir / "summary.json").read_text())
    ideal = summ["no_delay_ideal_ms"]
    import csv

    rows = list(csv.DictReader((crosspipe_dir / "crosspipe.csv").open()))
    below = {r["schedule"] for r in rows if float(r["iteration_time_ms"]) < ideal - 1e-6}
    assert "crosspipe-opt-relaxed" in below  # (what the issue saw)
    for r in rows:
        assert float(r["iteration_time_ms"]) >= float(r["lower_bound_ms"]) - 1e-6, r
        if r["schedule"] in below:
            assert r["split_backward"] == "True" or r["schedule"].startswith("interleaved"), r
    assert "not a bound" in UNSPLIT_IDEAL_LABEL and "ideal" not in UNSPLIT_IDEAL_LABEL
    assert "split backward" in SPLIT_BOUND_LABEL


def test_crosspipe_figure_small_multiples_zb_h1_visible(crosspipe_dir: Path) -> None:
    """Defect 8: zb-h1 was hidden under crosspipe-opt-strict; 9 legend lines in one."""
    import csv

    import matplotlib.pyplot as plt

    from testbed.report.repro_plots import schedule_figure

    rows: list[dict[str, Any]] = []
    for r in csv.DictReader((crosspipe_dir / "crosspipe.csv").open()):
        if r["sweep"] == "latency":
            rows.append({**r, "latency_ms": float(r["latency_ms"]),
                         "iteration_time_ms": float(r["iteration_time_ms"]),
                         "lower_bound_ms": float(r["lower_bound_ms"]),
                         "split_backward": r["split_backward"] == "True"})
    labels = list(dict.fromkeys(r["schedule"] for r in rows))
    base = [x for x in labels if not x.startswith("crosspipe")]
    fig = schedule_figure(rows, "latency_ms", labels, "iteration_time_ms", "t", "latency (ms)",
                          json.loads((crosspipe_dir / "summary.json").read_text())
                          ["no_delay_ideal_ms"],
                          groups=[("traditional", base),
                                  ("CrossPipe", [x for x in labels if x not in base])])
    try:
        assert max(legend_sizes(fig)) <= LEGEND_MAX
        where = {line.get_label(): (i, line.get_marker(), line.get_linestyle())
                 for i, ax in enumerate(fig.axes) for line in ax.get_lines()}
        assert where["zb-h1"] != where["crosspipe-opt-strict"]
        styles = [(m, s) for lab, (i, m, s) in where.items() if i == 1 and
                  lab.startswith("crosspipe")]
        assert len(set(styles)) == len(styles)  # coinciding lines stay distinguishable
        for ax in fig.axes:
            assert "(ms)" in ax.get_xlabel() and "(ms)" in ax.get_ylabel()
    finally:
        plt.close(fig)
    pngs_on_page(crosspipe_dir)


# ------------------------------------------------------------------ runs and sweeps
@pytest.fixture(scope="module")
def sim_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A quickstart simulation at a load where nothing is blocked, one bit rate, plus a
    PNG a user put into the directory."""
    from testbed.cli.main import main
    from testbed.report.build import build_report

    tmp = tmp_path_factory.mktemp("sim")
    spec = yaml.safe_load((SCENARIOS / "quickstart.yaml").read_text())
    spec["workload"].update(requests=300, load_erlang=0.5, bitrate_gbps=[100])
    spec["events"] = []
    (tmp / "s.yaml").write_text(yaml.safe_dump(spec))
    out = tmp / "run"
    assert main(["sim", str(tmp / "s.yaml"), "--out", str(out), "-q"]) == 0
    assert main(["schedule", "--stages", "2", "--microbatches", "2", "--forward-ms", "1",
                 "--backward-ms", "2", "--gantt",
                 str(out / "gantt.png")]) == 0
    build_report(out)
    return out


def test_run_page_opens_with_findings_raw_fields_folded(sim_dir: Path) -> None:
    """Defect 2 (first screen): a table of ~50 raw fields, "workload" twice, placement and
    MFU settings listed for a lightpath-only run."""
    html = (sim_dir / "report.html").read_text()
    titles = h2s(html)
    assert titles[0] == "sim: what this run found", titles
    assert titles[-1] == "sim: scenario and every recorded field", titles
    raw = html.split(f"<h2 id='s{len(titles) - 1}'>")[1]
    assert raw.lstrip().split("</h2>")[1].lstrip().startswith("<details>")
    kv = re.findall(r"<tr><td>([^<]*)</td>", raw)
    assert kv.count("workload") == 1, kv
    pol = re.search(r"<tr><td>policies</td><td>([^<]*)</td>", raw)
    assert pol and pol.group(1) == "spectrum=first_fit", pol
    head = html.split("<h2 id='s1'>")[0]
    assert "blocking ratio" in head and "placement" not in head and "mfu" not in head


def test_no_empty_blocking_figures_and_zero_said(sim_dir: Path) -> None:
    """Defect 2, Fig. 5: "blocking per bit rate" was an empty box (one rate, nothing
    blocked); a flat zero line with no note."""
    html = (sim_dir / "report.html").read_text()
    assert "blocking ratio per requested bit rate" not in html
    assert "blocking ratio as requests arrive" not in html
    assert "No request was blocked: the blocking ratio is 0 throughout" in html


def test_every_png_of_a_run_directory_is_on_its_page(sim_dir: Path) -> None:
    assert (sim_dir / "gantt.png").is_file()
    pngs_on_page(sim_dir)


def test_sweep_page_headline_first_and_its_pngs(tmp_path: Path) -> None:
    from testbed.cli.main import main

    spec = yaml.safe_load((SCENARIOS / "quickstart.yaml").read_text())
    spec["workload"]["requests"] = 400
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(spec))
    out = tmp_path / "sw"
    assert main(["sweep", str(tmp_path / "s.yaml"), "--set", "workload.load_erlang=5,40",
                 "--set", "policy.spectrum=first_fit,best_fit", "--out", str(out), "-q",
                 "--report"]) == 0
    assert len(list(out.glob("*.png"))) == 2
    pngs_on_page(out)
    html = (out / "report.html").read_text()
    assert h2s(html)[0] == "what this sweep found"
    assert "lowest blocking_ratio" in html and "highest blocking_ratio" in html


# ------------------------------------------------------------------ figure rules
def test_figure_helpers_keep_legends_short_and_say_zero() -> None:
    import matplotlib.pyplot as plt

    from testbed.report import figures as F
    from testbed.report.repro_plots import sweep_plots

    lines = {f"line {i}": ([0.0, 1.0], [float(i), float(i)]) for i in range(12)}
    fig = F.series(lines, "t (s)", "y (count)", "twelve")
    assert max(legend_sizes(fig)) <= LEGEND_MAX
    assert any(t.get_text().startswith("others (") for t in fig.axes[0].get_legend().get_texts())
    plt.close(fig)
    fig = F.histograms({f"g{i}": [1.0, 2.0] for i in range(9)}, "x (s)", "nine")
    assert max(legend_sizes(fig)) <= LEGEND_MAX
    plt.close(fig)
    fig = F.bars(["100 Gbit/s"], [0.0], None, "blocking ratio", "zero")
    assert any("every value is 0" in t.get_text() for t in fig.axes[0].texts)
    plt.close(fig)
    fig = F.series({"a": ([0.0, 1.0], [0.0, 0.0])}, "t (s)", "y (count)", "zero")
    assert any("every value is 0" in t.get_text() for t in fig.axes[0].texts)
    plt.close(fig)
    rows = [{"policy": p, "case": "", "mean_interarrival_s": x, "common_iteration_time": 1.0}
            for p in ("sp-ff", "sp-ff-best", "cba", "joint") for x in (200.0, 600.0)]
    rows += [{"policy": p, "case": "small", "mean_interarrival_s": 300.0,
              "common_iteration_time": 1.0} for p in ("sp-ff", "cba", "cba-ilp")]
    fig = F.policy_panels(rows, [("common_iteration_time", "iteration time (s)", 1.0)], "cba")
    assert max(legend_sizes(fig)) <= LEGEND_MAX, [t.get_text() for t in fig.legends[0].texts]
    plt.close(fig)
    agg = [{"workload.load_erlang": str(x), "policy.spectrum": s, "blocking_ratio": "0.1"}
           for x in (1, 2) for s in "abcdefgh"]
    for fig, _cap in sweep_plots(agg, ["workload.load_erlang", "policy.spectrum"],
                                 "blocking_ratio"):
        assert max(legend_sizes(fig)) <= LEGEND_MAX
        for ax in fig.axes:
            assert ax.get_xlabel().endswith(")") and ax.get_ylabel().endswith(")"), \
                (ax.get_xlabel(), ax.get_ylabel())
        plt.close(fig)


def test_prometheus_charts_short_legends_no_created_zero_named(tmp_path: Path) -> None:
    """Defect 2, Figs. 5-14: a real Prometheus scrapes an exporter of LightPipe-like series
    (12 fibres with run/scenario labels, a counter with its _created timestamp, an
    all-zero gauge); the report's charts of that TSDB keep the figure rules."""
    from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

    from testbed.metrics.prometheus import find_binary
    from testbed.report.prom import prometheus_charts
    from tests.promrun import record_run

    if find_binary() is None:
        pytest.skip("needs the prometheus package")

    reg = CollectorRegistry()
    labels = ["run", "scenario", "component", "fibre", "direction"]
    used = Gauge("lightpipe_fibre_slots_used", "slots", labels, registry=reg)
    errors = Counter("lightpipe_capacity_errors", "errors", ["run"], registry=reg)
    zero = Gauge("lightpipe_jobs_active", "jobs", ["run"], registry=reg)
    for i in range(12):
        used.labels("run-1", "qs", "links", f"{i}-{i + 1}", "a_to_b").set(i + 1)
    errors.labels("run-1").inc(3)
    zero.labels("run-1").set(0)
    server, thread = start_http_server(0, addr="127.0.0.1", registry=reg)
    run = tmp_path / "run"
    try:
        record_run(run, "lp", {"component": "x"},
                   "count_over_time(lightpipe_fibre_slots_used[1h]) >= 3",
                   target=f"127.0.0.1:{server.server_port}")
    finally:
        server.shutdown()
        thread.join()
    figs, note = prometheus_charts(run)
    captions = " ".join(f.caption for f in figs)
    assert figs and "_created" not in captions
    assert "lightpipe_jobs_active" in note and "Zero throughout" in note
    assert "not drawn" not in note  # (the words of a section that failed)
    assert "lightpipe_jobs_active" not in captions
    slots = next(f for f in figs if "lightpipe_fibre_slots_used" in f.caption)
    svg = base64.b64decode(slots.uri.split(",", 1)[1]).decode()
    assert "run=" not in svg and "scenario=" not in svg and "component=" not in svg
    assert "others (7 series, mean)" in svg
    assert "fibre_slots_used (count)" in svg  # the unit on the y axis
