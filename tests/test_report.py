"""`lightpipe report`: each kind of directory renders, opens in headless Chromium, loads
every figure, logs no console error and fetches nothing; screenshots kept as artefacts."""

from __future__ import annotations

import base64
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from testbed.topologies import library_names, load_library
from testbed.topologies.layout import min_distance, spread_layout

REPO = Path(__file__).resolve().parent.parent
SCENARIOS = REPO / "scenarios"
# CI keeps this folder as the run's artefacts (LIGHTPIPE_ARTIFACTS overrides it)
ARTIFACTS = Path(os.environ.get("LIGHTPIPE_ARTIFACTS", REPO / "test-artifacts")) / "report"

sys.path.insert(0, str(Path(__file__).resolve().parent))
import browser  # noqa: E402

from tests.waiting import scaled  # noqa: E402

need_browser = pytest.mark.skipif(not browser.available(),
                                  reason="needs chromium, chromium-driver and selenium "
                                  "(scripts/setup.sh)")


def check_in_browser(report: Path, name: str, min_figures: int) -> browser.PageCheck:
    """The page's figures all loaded with a size, no console errors, no requests."""
    assert report.is_file() and report.stat().st_size > 10_000
    html = report.read_text()
    assert not re.search(r"""(src|href)=['"]?(https?:|//)""", html), "external reference"
    page = browser.inspect(report, ARTIFACTS, name)
    assert len(page.images) >= min_figures, page.images
    broken = [i for i in page.images if not (i["loaded"] and i["width"] > 0 and i["height"] > 0
                                             and i["shown"] > 0)]
    assert not broken, broken
    assert all(i["src"].startswith("data:image/") for i in page.images)
    errors = [e for e in page.console if e.get("level") in ("SEVERE", "ERROR")]
    assert not errors, errors
    assert page.requests == [], page.requests
    for shot in page.screenshots:
        assert shot.stat().st_size > 5_000
    return page


def test_layout_never_overlaps_nodes() -> None:
    """The NSFNET drawing overlapped nodes 9, 12, 13 and 14; no library topology may."""
    names = library_names()
    assert "nsfnet" in names  # not vacuous
    for name in names:
        pos = spread_layout(load_library(name).graph())
        assert min_distance(pos) >= 0.2, name


def test_report_of_a_non_run_is_one_line(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    r = cli("report", str(tmp_path))
    assert r.code == 2 and r.err.count("\n") == 1 and "no LightPipe run" in r.err
    r = cli("report", str(tmp_path / "nope"))
    assert r.code == 2 and "is not a directory" in r.err


@need_browser
@pytest.mark.slow
def test_report_sim_lightpaths(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    spec = yaml.safe_load((SCENARIOS / "quickstart.yaml").read_text())
    spec["workload"]["requests"] = 3000
    spec["events"] = [{"at_s": 50, "kind": "fiber_cut", "link": ["9", "12"]}]
    path = tmp_path / "qs.yaml"
    path.write_text(yaml.safe_dump(spec))
    out = tmp_path / "run"
    r = cli("sim", str(path), "--out", str(out), "-q", "--report")
    assert r.code == 0, r.err
    assert f"report: {out}/report.html" in r.out
    page = check_in_browser(out / "report.html", "sim-lightpaths", 5)
    html = (out / "report.html").read_text()
    for words in ("Which slots of each fibre are occupied", "against simulated time",
                  "cut by a scenario event", "Wider requests need more contiguous slots",
                  "spec sha256"):
        assert words in html, words
    assert "quickstart" in page.title


@need_browser
def test_report_sim_jobs_with_engine_timeline(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "pp"
    assert cli("sim", str(SCENARIOS / "pp-jobs.yaml"), "--out", str(out), "-q").code == 0
    r = cli("report", str(out))
    assert r.code == 0 and r.out.strip() == f"report: {out}/report.html"
    check_in_browser(out / "report.html", "sim-jobs", 4)
    html = (out / "report.html").read_text()
    assert "as the schedule engine times it" in html  # the engine's Gantt
    assert "blocked share" in html


@need_browser
def test_report_sim_jobs_spectrum_from_lightpaths_csv(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """pp_jobs runs record their lightpaths (lightpaths.csv); the report draws the spectrum
    (slots x fibre at the busiest instant, slots x time on the busiest fibre) from it."""
    spec = yaml.safe_load((SCENARIOS / "cba-nsfnet.yaml").read_text())
    spec["workload"]["jobs"] = 80
    path = tmp_path / "cba.yaml"
    path.write_text(yaml.safe_dump(spec))
    out = tmp_path / "cba"
    assert cli("sim", str(path), "--out", str(out), "-q").code == 0
    assert (out / "lightpaths.csv").read_text().count("\n") > 10
    assert cli("report", str(out)).code == 0
    check_in_browser(out / "report.html", "sim-jobs-spectrum", 6)
    html = (out / "report.html").read_text()
    assert "Which slots of each fibre are occupied" in html
    assert "against simulated time" in html
    assert "not drawn" not in html


@need_browser
@pytest.mark.slow
@pytest.mark.parametrize("name,sets", [
    ("crosspipe", []),
    ("geopipe", []),
    ("cba", ["seeds=2", "jobs=12"]),
    ("bace", ["seeds=2", "jobs=12"]),
])
def test_report_reproduction(reproduced, name: str, sets: list[str]) -> None:  # type: ignore[no-untyped-def]
    """The quick reproduction's report (the run its tables' tests read too)."""
    r = reproduced(name, *sets)
    out = r.out
    assert r.code == 0, r.stderr
    assert "(paper: " in r.stdout  # the headline against the paper's
    assert f"report: {out}/report.html" in r.stdout
    man = json.loads((out / "manifest.json").read_text())
    assert man["reproduction"] == name and man["lightpipe_version"]
    assert (out / "README.md").read_text().count("- `") >= 4
    check_in_browser(out / "report.html", f"reproduce-{name}", 1)
    html = (out / "report.html").read_text()
    assert "what this reproduction found" in html
    from tests.test_report_pages import pngs_on_page

    pngs_on_page(out)


@need_browser
@pytest.mark.slow
def test_report_sweep_with_categorical_field(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    spec = yaml.safe_load((SCENARIOS / "quickstart.yaml").read_text())
    spec["workload"]["requests"] = 600
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(spec))
    out = tmp_path / "sw"
    r = cli("sweep", str(path), "--set", "workload.load_erlang=5,20", "--set",
            "policy.spectrum=first_fit,best_fit", "--out", str(out), "-q", "--report")
    assert r.code == 0, r.err
    assert (out / "blocking_ratio_vs_load_erlang.png").is_file()
    assert (out / "blocking_ratio_vs_spectrum.png").is_file()
    check_in_browser(out / "report.html", "sweep", 2)
    assert "bars: the values are categories" in (out / "report.html").read_text()


def test_prometheus_series_from_a_real_tsdb(tmp_path: Path) -> None:
    """A real Prometheus records a TSDB (scraping itself); the report serves a copy of it
    with a temporary Prometheus and charts the series."""
    from testbed.metrics.prometheus import find_binary
    from testbed.report.prom import find_tsdb, prometheus_figures
    from tests.promrun import record_run

    if find_binary() is None or find_binary("promtool") is None:
        pytest.skip("needs the prometheus package")
    run = tmp_path / "run"
    # Ready when the TSDB holds several scrapes of itself (not after a guessed sleep: the
    # first scrape of a busy machine's Prometheus came late).
    record_run(run, "self", {"component": "prometheus"},
               'count_over_time(up{component="prometheus"}[1h]) >= 5')
    assert find_tsdb(run) is not None
    before = sorted(p.name for p in (run / "prometheus" / "data").iterdir())
    figs = prometheus_figures(run)
    assert figs and all(f.uri.startswith("data:image/svg+xml;base64,") for f in figs)
    assert sorted(p.name for p in (run / "prometheus" / "data").iterdir()) == before
    empty = tmp_path / "no-tsdb"
    empty.mkdir()
    assert prometheus_figures(empty) == []  # absent: no charts, no error


ROOT = os.geteuid() == 0
HAVE_EMU = all(shutil.which(t) for t in ("mnexec", "iperf3", "ovs-vsctl"))


@need_browser
@pytest.mark.root
@pytest.mark.slow
@pytest.mark.skipif(not (ROOT and HAVE_EMU), reason="needs root, Mininet and Open vSwitch")
def test_report_emulation_of_pp_jobs_timelines_side_by_side(tmp_path: Path) -> None:
    """A real pp_jobs emulation (2 jobs of PyTorch workers across emulated DCs): one
    figure per job with the engine's and the workers' timelines side by side."""
    out = tmp_path / "emu"
    import yaml

    data = yaml.safe_load((SCENARIOS / "calib-latency-1f1b.yaml").read_text())
    data["emulation"]["worker_iterations"] = 3  # the figures, not the agreement, are tested
    spec = tmp_path / "calib.yaml"
    spec.write_text(yaml.safe_dump(data))
    res = subprocess.run([str(Path(sys.executable).parent / "lightpipe"), "emu",
                          str(spec), "--out", str(out),
                          "--report", "-q"], capture_output=True, text=True, timeout=600,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert res.returncode == 0, res.stderr[-2000:]
    summ = json.loads((out / "summary.json").read_text())
    assert all(w["pipeline"]["forward_ms"] for w in summ["worker_jobs"])
    check_in_browser(out / "report.html", "emu-pp-jobs", 3)
    import html as htmllib

    html = htmllib.unescape((out / "report.html").read_text())
    assert len(summ["worker_jobs"]) == 2
    for w in summ["worker_jobs"]:
        assert f"job {w['job']}: the schedule engine's timeline of this job's pipeline " \
            "(left) beside what its emulated workers did" in html, w["job"]
    assert "not drawn" not in html


@need_browser
@pytest.mark.root
@pytest.mark.slow
@pytest.mark.skipif(not (ROOT and HAVE_EMU), reason="needs root, Mininet and Open vSwitch")
def test_report_of_a_run_on_both_backends(tmp_path: Path) -> None:
    """One quickstart run on both backends (the emulation replays 10 requests): the page of
    both, then the emulation's own page (`lightpipe report DIR/emu`). One run for both
    pages: an emulation of the quickstart costs ~50 s of CPU on a 2-core machine."""
    spec = yaml.safe_load((SCENARIOS / "quickstart.yaml").read_text())
    spec["workload"]["requests"] = 1000
    spec["emulation"]["max_requests"] = 10
    path = tmp_path / "qs.yaml"
    path.write_text(yaml.safe_dump(spec))
    out = tmp_path / "both"
    lightpipe = str(Path(sys.executable).parent / "lightpipe")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    res = subprocess.run([lightpipe, "run", str(path), "--backend", "both", "--out", str(out),
                          "--report"],
                         capture_output=True, text=True, timeout=scaled(600), env=env)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.count("agreement with sim: 10/10") == 1
    # the emulation says why it replays fewer requests than the spec asks
    assert "replayed the first 10 of the spec's 1000 requests" in res.stdout
    assert f"report: {out}/report.html" in res.stdout
    # off a terminal each phase of the emulation is said once, not silence
    for said in ("emu: build:", "emu: verify:", "iperf3 per lightpath (", "emu: replay:",
                 "emu: teardown:"):
        assert res.stderr.count(said) == 1, (said, res.stderr[-2000:])
    for sub in ("", "sim", "emu"):
        assert (out / sub / "README.md").is_file()
    check_in_browser(out / "report.html", "both", 8)
    html = (out / "report.html").read_text()
    assert "sim: scenario and every recorded field" in html \
        and "emu: scenario and every recorded field" in html
    from tests.test_report_pages import h2s, pngs_on_page

    # issue 26: both findings first, the raw fields last
    titles = h2s(html)
    assert titles[:2] == ["sim: what this run found", "emu: what this run found"], titles
    assert titles[-2:] == ["sim: scenario and every recorded field",
                           "emu: scenario and every recorded field"], titles

    # the emulation's own page
    emu = out / "emu"
    res = subprocess.run([lightpipe, "report", str(emu)], capture_output=True, text=True,
                         timeout=scaled(300), env=env)
    assert res.returncode == 0 and res.stdout.strip() == f"report: {emu}/report.html", \
        res.stderr[-2000:]
    check_in_browser(emu / "report.html", "emu", 4)
    html = (emu / "report.html").read_text()
    assert "TCP goodput measured with iperf3" in html
    # issue 26: the first screen is what the run found, against the simulator; the raw
    # fields (each once, only the policies that matter) come last behind a fold; the
    # Prometheus charts have no _created series and no silent all-zero panel
    titles = h2s(html)
    assert titles[0] == "emu: what this run found", titles
    head = html.split("<h2 id='s1'>")[0]
    assert "the simulator on the same requests" in head
    raw = html.split(f"<h2 id='s{len(titles) - 1}'>")[1]
    assert "<details>" in raw and re.findall(r"<tr><td>([^<]*)</td>", raw).count(
        "workload") == 1
    assert "placement=" not in raw and "mfu=" not in raw
    assert "_created" not in html.split("Zero throughout")[0]
    assert "blocking ratio per requested bit rate" not in html  # (one rate: no empty box)
    pngs_on_page(emu)


def test_emulation_sections_read_the_workers_records(tmp_path: Path) -> None:
    """The workers' trace.json and iterations.csv (as workloads writes them) become the
    measured timeline and the distribution of measured iterations."""
    from testbed.emu.scale import Scale
    from testbed.orchestrate.jobs import iterations_csv
    from testbed.orchestrate.results import chrome_trace
    from testbed.report.sections import _emu_sections

    stages = []
    for s in range(3):
        recs = []
        for it in range(4):
            t = it * 1.0 + s * 0.1
            recs.append({"type": "iteration", "iteration": it, "warmup": it == 0,
                         "ops": [["F0", t, t + 0.2], ["B0", t + 0.4, t + 0.8]],
                         "waits": [["act", t + 0.2, t + 0.4]], "sent_bytes": 1000})
        stages.append(recs)
    (tmp_path / "trace.json").write_text(json.dumps(chrome_trace({"0": stages})))
    (tmp_path / "iterations.csv").write_text(iterations_csv({"0": stages}, Scale()))
    secs = _emu_sections(tmp_path, None)
    caps = [f.caption for s in secs for f in s.figures]
    assert any("measured iteration of the real PyTorch workers" in c for c in caps)
    assert any("What the emulated workers of job 0 actually did" in c for c in caps)


def _worker_records_from_engine(timing, factor: float, iterations: int, t0: float):  # type: ignore[no-untyped-def]
    """Worker records (the format workloads write) that replay the engine's ops at
    `factor` x the engine's time, with a wait before each op after a stage's first."""
    period_s = timing.iteration_time_ms / 1e3 * factor
    n = max(o.stage for o in timing.ops) + 1
    stages: list[list[dict]] = [[] for _ in range(n)]
    for it in range(iterations):
        base = t0 + it * period_s
        for s in range(n):
            mine = sorted((o for o in timing.ops if o.stage == s), key=lambda o: o.start_ms)
            ops = [[f"{o.action.kind}{o.action.microbatch}", base + o.start_ms / 1e3 * factor,
                    base + o.end_ms / 1e3 * factor] for o in mine]
            waits = [["act", a[2], b[1]] for a, b in itertools.pairwise(ops) if b[1] > a[2]]
            stages[s].append({"type": "iteration", "iteration": it, "warmup": it == 0,
                              "ops": ops, "waits": waits, "sent_bytes": 1000})
    return stages


@need_browser
def test_emulation_timelines_side_by_side_for_every_job(tmp_path: Path) -> None:
    """Per emulated job, the engine's timeline and the workers' measured one in one figure
    (two panels, one time scale); capped at MAX_TIMELINE_JOBS with a note of the rest."""
    from testbed.emu.scale import Scale
    from testbed.orchestrate.jobs import iterations_csv, pipeline_record
    from testbed.orchestrate.results import chrome_trace
    from testbed.report.build import build_report
    from testbed.report.sections import MAX_TIMELINE_JOBS, _emu_sections
    from testbed.schedule import PipelineProblem, build_schedule, time_schedule

    factor = 4.0
    records, workers = {}, []
    jobs = MAX_TIMELINE_JOBS + 2
    for j in range(jobs):
        prob = PipelineProblem.uniform(3 + j % 2, 4, 10.0 + j, 20.0, latency_ms=5.0 * j,
                                       bandwidth_gbps=8.0, activation_mb=1.0)
        timing = time_schedule(prob, build_schedule("1f1b", prob), check_memory_cap=False)
        records[f"job{j}"] = _worker_records_from_engine(timing, factor, 3, 100.0)
        workers.append({"job": f"job{j}", "schedule": "1f1b", "time_factor": factor,
                        "pipeline": pipeline_record(prob)})
    (tmp_path / "trace.json").write_text(json.dumps(chrome_trace(records)))
    (tmp_path / "iterations.csv").write_text(iterations_csv(records, Scale(time_factor=factor)))
    (tmp_path / "summary.json").write_text(json.dumps({"backend": "emu",
                                                       "worker_jobs": workers}))
    (sec,) = _emu_sections(tmp_path, None)
    side = [f for f in sec.figures if "beside what its emulated workers did" in f.caption]
    assert [f.caption.split(":")[0] for f in side] == [
        f"job job{j}" for j in range(MAX_TIMELINE_JOBS)]
    assert f"{jobs - MAX_TIMELINE_JOBS} more job(s) left out" in sec.text
    # one time scale: the measured iteration (wall / factor) is the engine's iteration
    svg = base64.b64decode(side[1].uri.split(",", 1)[1]).decode()
    eng = re.search(r"schedule engine: ([\d.]+) ms", svg)
    meas = re.search(r"iteration 1: ([\d.]+) ms \(wall / 4\)", svg)
    assert eng and meas and abs(float(eng[1]) - float(meas[1])) < 0.2, (eng, meas)
    check_in_browser(build_report(tmp_path), "emu-timelines", MAX_TIMELINE_JOBS + 1)
