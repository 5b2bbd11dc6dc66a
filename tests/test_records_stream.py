"""Results never lost (issue 17): records streamed, runs killed at random points, one
writer per --out, a swap that never leaves no directory, leftovers cleaned, spec hash."""

from __future__ import annotations

import csv
import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from testbed.io.outdir import find_leftovers, install_dir, lock_path
from testbed.runs.rundir import read_records, run_status
from tests.waiting import wait_until

REPO = Path(__file__).resolve().parent.parent
SCENARIOS = REPO / "scenarios"
ENV = {**os.environ, "PYTHONPATH": str(REPO)}
LIGHTPIPE = [sys.executable, "-c", "import sys; from testbed.cli.main import main; "
             "sys.exit(main(sys.argv[1:]))"]
JOBS_COLUMNS = ["job_id", "model", "stages", "gpus_per_stage", "microbatches", "iterations",
                "arrival_s", "start_s", "end_s", "placement", "lightpaths", "schedule",
                "iteration_time_s", "bubble_ratio", "wait_s", "jct_s", "energy_kwh",
                "cost_usd", "blocked", "reason"]


def many_jobs(tmp_path: Path, jobs: int = 15_000) -> Path:
    """pp-jobs with enough jobs that a sim runs for a few seconds."""
    spec = yaml.safe_load((SCENARIOS / "pp-jobs.yaml").read_text())
    spec["workload"]["jobs"] = jobs
    path = tmp_path / "many.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def long_sim(tmp_path: Path, requests: int = 50_000_000) -> Path:
    """quickstart with so many requests (generated lazily, memory flat) that a sim runs
    for minutes: it is killed long before it ends."""
    spec = yaml.safe_load((SCENARIOS / "quickstart.yaml").read_text())
    spec["workload"]["requests"] = requests
    path = tmp_path / "long.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def lines_of(path: Path) -> int:
    try:
        with path.open("rb") as fh:
            return sum(1 for _ in fh)
    except FileNotFoundError:
        return 0


def start_sim(spec: Path, out: Path, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen([*LIGHTPIPE, "sim", str(spec), "--out", str(out), "-q", *extra],
                            cwd=REPO, env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def wait_for(proc: subprocess.Popen[str], cond, what: str) -> None:  # type: ignore[no-untyped-def]
    """Poll until cond() (no wall-clock assertion: a generous bound against a hang)."""

    def ended() -> str | None:
        if proc.poll() is None:
            return None
        return f"sim ended (rc {proc.returncode}): {proc.stderr.read() if proc.stderr else ''}"

    wait_until(cond, what, timeout_s=120, interval_s=0.01, alive=ended)


def manifest_of(out: Path) -> dict | None:  # type: ignore[type-arg]
    try:
        return json.loads((out / "manifest.json").read_text())
    except (OSError, ValueError):
        return None


def check_partial(out: Path, pid: int) -> tuple[int, int]:
    """A killed run: manifest says running (run_status: killed, its pid); every complete
    line of each record file parses with the header's columns."""
    m = manifest_of(out)
    assert m is not None and m["status"] == "running" and m["pid"] == pid
    st = run_status(out)
    assert st["status"] == "killed" and st["pid"] == pid
    counts = []
    for name in ("jobs.csv", "lightpaths.csv"):
        path = out / name
        if not path.exists():  # killed before the streams were opened
            counts.append(0)
            continue
        raw = path.read_text()
        header = raw.split("\n", 1)[0].split(",")
        assert raw.endswith("\n") or "\n" in raw  # the header at least is whole
        rows = read_records(path)
        complete = raw.count("\n") - 1
        assert len(rows) == complete  # a torn last line, if any, is dropped
        with path.open(newline="") as fh:
            for row in list(csv.reader(fh))[1:complete + 1]:
                assert len(row) == len(header), (name, row)
        counts.append(len(rows))
    jobs = read_records(out / "jobs.csv")
    assert list(jobs[0].keys()) == JOBS_COLUMNS if jobs else True
    assert all(r["job_id"].isdigit() and r["blocked"] in ("0", "1") for r in jobs)
    return counts[0], counts[1]


# ------------------------------------------------------------------ kill tests (sim)
def test_sim_killed_at_random_points_leaves_valid_partial_records(tmp_path: Path) -> None:
    spec = many_jobs(tmp_path)
    rng = random.Random(17)
    points = [0, *sorted(rng.randrange(50, 3000) for _ in range(3))]
    seen = []
    for i, rows in enumerate(points):
        out = tmp_path / f"run{i}"
        proc = start_sim(spec, out)
        wait_for(proc, lambda out=out: (manifest_of(out) or {}).get("status") == "running",
                 "the running manifest")
        if rows:
            wait_for(proc, lambda out=out, rows=rows: lines_of(out / "jobs.csv") > rows,
                     f"{rows} job records")
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        jobs, _lps = check_partial(out, proc.pid)
        assert jobs >= rows
        seen.append(jobs)
        assert not (out / "summary.json").exists()
        # readers say so in one line, no traceback
        rep = subprocess.run([*LIGHTPIPE, "report", str(out)], cwd=REPO, env=ENV,
                             capture_output=True, text=True)
        assert rep.returncode == 2 and rep.stderr.count("\n") == 1, rep.stderr
        assert "did not finish" in rep.stderr and f"pid {proc.pid}" in rep.stderr
        # Killed at once (rows == 0), the run may not have opened its record files yet:
        # then the line says there are none rather than naming jobs.csv.
        named = "jobs.csv" if (out / "jobs.csv").exists() else "no records"
        assert named in rep.stderr and "Traceback" not in rep.stderr
    assert seen[-1] > 0
    # a killed run is a run: replacing it needs --force, which says it did not finish
    out = tmp_path / "run1"
    again = subprocess.run([*LIGHTPIPE, "sim", str(many_jobs(tmp_path, 300)), "--out",
                            str(out), "-q"], cwd=REPO, env=ENV, capture_output=True,
                           text=True)
    assert again.returncode == 2 and "killed, not finished" in again.stderr
    forced = subprocess.run([*LIGHTPIPE, "sim", str(many_jobs(tmp_path, 300)), "--out",
                             str(out), "-q", "--force"], cwd=REPO, env=ENV,
                            capture_output=True, text=True)
    assert forced.returncode == 0, forced.stderr
    assert run_status(out)["status"] == "finished"
    assert len(read_records(out / "jobs.csv")) == 300


def test_lightpath_sim_killed_keeps_its_requests(tmp_path: Path) -> None:
    out = tmp_path / "r"
    proc = start_sim(long_sim(tmp_path), out)
    wait_for(proc, lambda: lines_of(out / "requests.csv") > 20_000, "streamed requests")
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert manifest_of(out)["status"] == "running"  # type: ignore[index]
    rows = read_records(out / "requests.csv")
    assert len(rows) >= 20_000
    assert [int(r["id"]) for r in rows[:100]] == list(range(100))
    assert all(r["accepted"] in ("0", "1") and r["holding_s"] for r in rows)


def test_finished_run_keeps_the_layout_readers_expect(tmp_path: Path) -> None:
    out = tmp_path / "r"
    res = subprocess.run([*LIGHTPIPE, "sim", str(many_jobs(tmp_path, 400)), "--out",
                          str(out), "-q"], cwd=REPO, env=ENV, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    m = manifest_of(out)
    assert m is not None and m["status"] == "finished" and m["ended_unix_s"] >= \
        m["started_unix_s"]
    # pp-jobs has network events: the jobs they hit, iteration by iteration (docs/faults.md)
    assert m["records"] == ["summary.json", "jobs.csv", "lightpaths.csv", "fault_iterations.csv"]
    ids = [int(r["job_id"]) for r in read_records(out / "jobs.csv")]
    assert ids == sorted(ids) and len(ids) == 400  # rewritten whole, sorted, at the end
    lps = read_records(out / "lightpaths.csv")
    assert [float(r["setup_s"]) for r in lps] == sorted(float(r["setup_s"]) for r in lps)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["many.yaml", "r"]  # no lock left


def test_torn_last_line_is_ignored_by_the_readers(tmp_path: Path) -> None:
    from testbed.report.readers import read_csv

    path = tmp_path / "jobs.csv"
    path.write_text("a,b\n1,2\n3,4\n5,")
    assert read_records(path) == read_csv(path) == [{"a": "1", "b": "2"}, {"a": "3", "b": "4"}]
    path.write_text("a,")
    assert read_records(path) == read_csv(path) == []


def test_failed_run_says_failed_and_keeps_its_records(tmp_path: Path) -> None:
    from testbed.runs.rundir import run_dir
    from testbed.spec import load_scenario

    scen = load_scenario(SCENARIOS / "quickstart.yaml")
    out = tmp_path / "r"
    with pytest.raises(RuntimeError), run_dir(out, scen, "sim") as rd:
        s = rd.stream("requests.csv", ["id", "x"])
        s.write([0, "a"])
        raise RuntimeError("boom")
    m = manifest_of(out)
    assert m is not None and m["status"] == "failed" and "boom" in m["error"]
    assert read_records(out / "requests.csv") == [{"id": "0", "x": "a"}]
    assert run_status(out)["status"] == "failed"


def test_bad_input_mid_run_leaves_the_previous_run(tmp_path: Path) -> None:
    from testbed.errors import InputError
    from testbed.runs.rundir import run_dir
    from testbed.spec import load_scenario

    scen = load_scenario(SCENARIOS / "quickstart.yaml")
    out = tmp_path / "r"
    with run_dir(out, scen, "sim") as rd:
        (rd.path / "summary.json").write_text("{\"first\": 1}")
    with pytest.raises(InputError), run_dir(out, scen, "sim") as rd:
        (rd.path / "summary.json").write_text("{}")
        raise InputError("workload.trace", "bad row")
    assert json.loads((out / "summary.json").read_text()) == {"first": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r"]


# ------------------------------------------------------------------ one writer per --out
def test_second_run_on_one_out_is_refused_naming_the_first(tmp_path: Path) -> None:
    spec = long_sim(tmp_path)
    out = tmp_path / "r"
    first = start_sim(spec, out)
    try:
        wait_for(first, lambda: (manifest_of(out) or {}).get("status") == "running",
                 "the first run to start")
        for extra in ((), ("--force",)):
            second = subprocess.run([*LIGHTPIPE, "sim", str(spec), "--out", str(out), "-q",
                                     *extra], cwd=REPO, env=ENV, capture_output=True,
                                    text=True)
            assert second.returncode == 2, second.stderr
            assert second.stderr.count("\n") == 1
            assert f"live run (pid {first.pid})" in second.stderr, second.stderr
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        ".r.lightpipe-lock", "long.yaml", "r"]
    assert manifest_of(out)["pid"] == first.pid  # type: ignore[index]


def test_simultaneous_runs_never_leave_two_directories(tmp_path: Path) -> None:
    """Three `sim --force` started together on one --out, twice: each either wins or is
    refused in one line naming a live PID; one directory remains, finished, nothing else."""
    spec = many_jobs(tmp_path, 2000)
    out = tmp_path / "r"
    for _ in range(2):
        procs = [start_sim(spec, out, "--force") for _ in range(3)]
        results = [(p.wait(), p.stderr.read() if p.stderr else "") for p in procs]
        assert any(rc == 0 for rc, _ in results), results
        for rc, err in results:
            assert rc == 0 or (rc == 2 and err.count("\n") == 1 and "live run (pid" in err), err
        assert sorted(p.name for p in tmp_path.iterdir()) == ["many.yaml", "r"]
        assert run_status(out)["status"] == "finished"
        assert len(read_records(out / "jobs.csv")) == 2000


def test_lock_is_taken_even_when_the_check_raced(tmp_path: Path) -> None:
    """Both runs passed check_out: the lock itself refuses the second (exit 2 path)."""
    from testbed.errors import InputError
    from testbed.io.outdir import out_lock

    target = (tmp_path / "r").resolve()
    code = ("import sys, time; from pathlib import Path; from testbed.io.outdir import out_lock\n"
            "with out_lock(Path(sys.argv[1])):\n    print('held', flush=True)\n"
            "    time.sleep(600)\n")
    holder = subprocess.Popen([sys.executable, "-c", code, str(target)], env=ENV,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(InputError, match=f"pid {holder.pid}"), out_lock(target):
            pass
    finally:
        holder.kill()
        holder.wait()
    with out_lock(target):  # the kernel dropped the dead holder's lock
        assert lock_path(target).read_text().strip() == str(os.getpid())
    assert not lock_path(target).exists()


# ------------------------------------------------------------------ the final swap
# As a writer does it: under --out's lock (which lists the writer's PID: the proof that
# `clean` later needs), with the staging directory named after the writer's PID.
KILL_BETWEEN = """
import os, signal, sys
from pathlib import Path
from testbed.io.outdir import install_dir, out_lock
new, target, exchange = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3] == "1"
with out_lock(target):
    stage = new.with_name(new.name.replace("999999999", str(os.getpid())))
    os.rename(new, stage)
    install_dir(stage, target, use_exchange=exchange,
                between=lambda: os.kill(os.getpid(), signal.SIGKILL))
"""


def _two_runs(tmp_path: Path) -> tuple[Path, Path]:
    old, new = tmp_path / "out", tmp_path / ".out.999999999.abc.partial"
    old.mkdir()
    (old / "manifest.json").write_text('{"run": "old"}')
    new.mkdir()
    (new / "manifest.json").write_text('{"run": "new"}')
    return new, old


def test_kill_between_the_renames_never_leaves_no_out(tmp_path: Path) -> None:
    new, target = _two_runs(tmp_path)
    r = subprocess.Popen([sys.executable, "-c", KILL_BETWEEN, str(new), str(target), "1"],
                         env=ENV)
    assert r.wait() == -signal.SIGKILL
    assert json.loads((target / "manifest.json").read_text()) == {"run": "new"}
    left = find_leftovers([tmp_path], depth=0)  # the replaced run, owner dead; its lock
    assert [x.path.name for x in left] == [f".out.{r.pid}.abc.partial", ".out.lightpipe-lock"]


def test_fallback_swap_rolls_back_an_exception_and_clean_restores_after_a_kill(
        tmp_path: Path) -> None:
    new, target = _two_runs(tmp_path)

    def boom() -> None:
        raise RuntimeError("between the renames")

    with pytest.raises(RuntimeError):
        install_dir(new, target, use_exchange=False, between=boom)
    assert json.loads((target / "manifest.json").read_text()) == {"run": "old"}
    r = subprocess.run([sys.executable, "-c", KILL_BETWEEN, str(new), str(target), "0"],
                       env=ENV)
    assert r.returncode == -signal.SIGKILL
    assert not target.exists()  # what RENAME_EXCHANGE avoids; clean puts it back
    res = subprocess.run([*LIGHTPIPE, "clean", "--dir", str(tmp_path)], cwd=REPO, env=ENV,
                         capture_output=True, text=True)
    assert res.returncode == 0 and "restored replaced run" in res.stdout, res.stdout
    assert json.loads((target / "manifest.json").read_text()) == {"run": "old"}


# ------------------------------------------------------------------ lightpipe clean
def named(stdout: str) -> list[str]:
    """The file names `lightpipe clean` names, one per line."""
    return sorted(next(w for w in line.split() if "/" in w).rsplit("/", 1)[1]
                  for line in stdout.splitlines())


def test_clean_removes_stale_staging_and_dry_run_lists_the_same(tmp_path: Path) -> None:
    spec = long_sim(tmp_path)
    out = tmp_path / "res" / "r"
    res = subprocess.run([*LIGHTPIPE, "sim", str(many_jobs(tmp_path, 200)), "--out", str(out),
                          "-q"], cwd=REPO, env=ENV, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    kills = []
    for _ in range(3):  # each kill of a --force run leaves the replaced run beside it ...
        proc = start_sim(spec, out, "--force")
        wait_for(proc, lambda proc=proc: (manifest_of(out) or {}).get("pid") == proc.pid,
                 "the new run in place")
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        kills.append(proc.pid)
        hidden = [p.name for p in (tmp_path / "res").iterdir() if p.name.endswith(".partial")]
        assert len(hidden) == 1 and f".r.{proc.pid}." in hidden[0]  # ... the next removes it
    (tmp_path / "res" / ".r.old-999999999").mkdir()  # an old-style leftover, whose
    with (tmp_path / "res" / ".r.lightpipe-lock").open("a") as fh:  # writer's PID the
        fh.write("999999999\n")  # lock lists (the proof that it is LightPipe's)
    stale = sorted(x.path.name for x in find_leftovers([tmp_path]))
    assert len(stale) == 3 and sum(f".r.{kills[-1]}." in s for s in stale) == 1
    # a live run's staging is not stale
    live = start_sim(long_sim(tmp_path), tmp_path / "res" / "live")
    try:
        wait_for(live, lambda: (manifest_of(tmp_path / "res" / "live") or {}).get(
            "status") == "running", "the live run")
        dry = subprocess.run([*LIGHTPIPE, "clean", "--dir", str(tmp_path), "--dry-run"],
                             cwd=REPO, env=ENV, capture_output=True, text=True)
        assert dry.returncode == 0
        assert named(dry.stdout) == stale and ".live." not in dry.stdout, dry.stdout
        assert all(line.startswith("clean: would remove") for line in dry.stdout.splitlines())
        real = subprocess.run([*LIGHTPIPE, "clean", "--dir", str(tmp_path)], cwd=REPO,
                              env=ENV, capture_output=True, text=True)
        assert real.returncode == 0
        assert named(real.stdout) == stale
        assert all(line.startswith("clean: removed") for line in real.stdout.splitlines())
        assert sorted(p.name for p in (tmp_path / "res").iterdir()) == [
            ".live.lightpipe-lock", "live", "r"]
    finally:
        live.send_signal(signal.SIGKILL)
        live.wait()
    assert manifest_of(out)["pid"] == kills[-1]  # type: ignore[index]  (partial run kept)
    again = subprocess.run([*LIGHTPIPE, "clean", "--dir", str(tmp_path)], cwd=REPO,
                           env=ENV, capture_output=True, text=True)
    assert again.stdout.strip() == \
        f"clean: removed lock file {tmp_path}/res/.live.lightpipe-lock (no live owner, " \
        f"{len(str(live.pid)) + 1} bytes)"


# ------------------------------------------------------------------ spec hash
def test_spec_hash_covers_topology_file_contents_not_its_path(tmp_path: Path) -> None:
    from testbed.runs.records import spec_hash
    from testbed.spec import load_scenario

    spec = yaml.safe_load((SCENARIOS / "quickstart.yaml").read_text())
    csv_text = (REPO / "testbed" / "topologies" / "data" / "nsfnet.csv").read_text()
    hashes = []
    for sub, text in (("a", csv_text), ("b", csv_text), ("c", csv_text.replace("1", "2", 1))):
        d = tmp_path / sub
        d.mkdir()
        (d / "topo.csv").write_text(text)
        spec["topology"] = {"file": str(d / "topo.csv")}
        (d / "s.yaml").write_text(yaml.safe_dump(spec))
        hashes.append(spec_hash(load_scenario(d / "s.yaml")))
    assert hashes[0] == hashes[1] != hashes[2]
