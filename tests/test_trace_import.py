"""`lightpipe trace import`: Philly, Alibaba PAI 2020 and Acme samples in their real column
layouts, mapped row by row against hand-computed jobs; errors; an import + sim run."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from testbed.errors import InputError
from testbed.traceimport import ImportOptions, import_trace, parse_buckets
from testbed.traceimport import reader as reader_mod
from testbed.traceimport.common import stage_split
from testbed.traceimport.reader import open_text

DATA = Path(__file__).resolve().parent / "data" / "traces"
PHILLY = DATA / "philly_cluster_job_log.json"
PAI_TASKS = DATA / "pai_task_table.csv"  # headerless, as released
PAI_JOBS = DATA / "pai_job_table.csv"  # headerless, as released
PAI_HEADER = DATA / "pai_task_table.header"
SEREN = DATA / "acme_trace_seren.csv"
KALOS = DATA / "acme_trace_kalos.csv"
LIGHTPIPE = str(Path(sys.executable).parent / "lightpipe")
TEN = ImportOptions(seconds_per_iteration=10.0)  # iterations = run seconds / 10


def rows(result) -> list[tuple]:  # type: ignore[no-untyped-def]
    """(source id, arrival_s, model, stages, gpus_per_stage, microbatches, iterations)."""
    return [(sid, j.arrival_s, j.model, j.stages, j.gpus_per_stage, j.microbatches,
             j.iterations) for sid, j in zip(result.source_ids, result.jobs, strict=True)]


# Hand-computed from the samples: arrival = submit - first submit in the file; GPUs ->
# stages = nodes (or ceil(GPUs / 8)) capped at 8 and cut to a divisor of the GPUs;
# model by GPUs (<=8 gpt3-6.7b, <=32 llama2-13b, <=128 llama2-70b, else gpt3-175b);
# microbatches = 4 x stages; iterations = run seconds / 10.
PHILLY_EXPECTED = [
    # 8 GPUs on m1, 01:00:30-02:00:30; submitted 01:00:00 (the first submission).
    ("application_1506638472019_10001", 0.0, "gpt3-6.7b", 1, 8, 4, 360),
    # Two attempts: 60 s on one server, then 7200 s on m3+m4 (16 GPUs, the last one's).
    ("application_1506638472019_10002", 300.0, "llama2-13b", 2, 8, 8, 726),
    ("application_1506638472019_10006", 1200.0, "gpt3-6.7b", 1, 1, 4, 120),
    # Listed last but submitted 01:25:00; an attempt without start_time adds nothing;
    # 8 + 4 GPUs on two servers -> 2 stages of 6.
    ("application_1506638472019_10012", 1500.0, "llama2-13b", 2, 6, 8, 60),
    ("application_1506638472019_10007", 1800.0, "llama2-13b", 4, 8, 16, 1440),
    ("application_1506638472019_10010", 3000.0, "gpt3-6.7b", 2, 1, 8, 30),
    ("application_1506638472019_10011", 3600.0, "llama2-70b", 8, 8, 32, 3600),
]
PAI_EXPECTED = [  # submissions from the job table (first: 990)
    ("4b3f04b66a525d2df903eb01", 0.0, "gpt3-6.7b", 1, 1, 4, 360),
    ("4b3f04b66a525d2df903eb02", 160.0, "gpt3-6.7b", 1, 1, 4, 60),   # 50 % -> 1 GPU
    ("4b3f04b66a525d2df903eb03", 1000.0, "gpt3-6.7b", 1, 4, 4, 720),  # CPU ps + 4 workers
    ("4b3f04b66a525d2df903eb07", 2000.0, "llama2-13b", 2, 8, 8, 720),  # 2 x 800 %
    ("4b3f04b66a525d2df903eb09", 3000.0, "gpt3-6.7b", 1, 2, 4, 10),   # 3 x 50 % -> 2
    ("4b3f04b66a525d2df903eb08", 4000.0, "gpt3-6.7b", 1, 1, 4, 30),   # 4 x 25 % = 1
    ("4b3f04b66a525d2df903eb11", 5010.0, "gpt3-6.7b", 1, 1, 4, 6),    # not in job table
    ("4b3f04b66a525d2df903eb12", 6000.0, "llama2-70b", 8, 8, 32, 3600),
]
SEREN_EXPECTED = [  # first submission 2023-03-01 00:00:00+08:00
    ("5778401", 0.0, "gpt3-6.7b", 1, 8, 4, 360),
    ("5778412", 300.0, "gpt3-6.7b", 1, 6, 4, 30),  # 16:05 UTC = 00:05 +08:00
    ("5778405", 600.0, "llama2-13b", 2, 8, 8, 720),
    ("5778406", 1200.0, "gpt3-6.7b", 1, 1, 4, 60),
    ("5778409", 1800.0, "llama2-70b", 8, 8, 32, 3600),
    ("5778410", 2400.0, "gpt3-175b", 8, 32, 32, 7200),  # 32 nodes, capped at 8 stages
    ("5778411", 3000.0, "llama2-13b", 3, 4, 12, 120),   # 3 nodes, 12 GPUs
]


def test_philly_row_by_row() -> None:
    res = import_trace("philly", PHILLY, TEN)
    assert rows(res) == PHILLY_EXPECTED
    assert res.read == 12
    assert dict(res.dropped) == {"failed": 1, "killed": 1, "unfinished": 1,
                                 "no run time": 1, "no GPU": 1}
    assert [j.job_id for j in res.jobs] == list(range(7))


def test_pai_row_by_row_with_job_table() -> None:
    res = import_trace("pai", PAI_TASKS, TEN, pai_jobs=PAI_JOBS)
    assert rows(res) == PAI_EXPECTED
    assert res.read == 12
    assert dict(res.dropped) == {"failed": 1, "unfinished": 2, "no GPU": 1}
    assert res.rounded_up == 2


def test_pai_tasks_only() -> None:
    """Without the job table: the first task launch stands for the submission (first:
    1000) and the tasks' status for the job's."""
    res = import_trace("pai", PAI_TASKS, TEN)
    arrivals = {sid: arr for sid, arr, *_ in rows(res)}
    assert arrivals == {"4b3f04b66a525d2df903eb01": 0.0, "4b3f04b66a525d2df903eb02": 200.0,
                        "4b3f04b66a525d2df903eb03": 1000.0, "4b3f04b66a525d2df903eb07": 2000.0,
                        "4b3f04b66a525d2df903eb09": 3000.0, "4b3f04b66a525d2df903eb08": 4000.0,
                        "4b3f04b66a525d2df903eb11": 5000.0, "4b3f04b66a525d2df903eb12": 6000.0}
    assert dict(res.dropped) == {"failed": 1, "unfinished": 2, "no GPU": 1}


def test_pai_header_line_and_header_file(tmp_path: Path) -> None:
    with_header = tmp_path / "tasks.csv"
    with_header.write_text(PAI_HEADER.read_text() + PAI_TASKS.read_text())
    want = rows(import_trace("pai", PAI_TASKS, TEN, pai_jobs=PAI_JOBS))
    assert rows(import_trace("pai", with_header, TEN, pai_jobs=PAI_JOBS)) == want
    assert rows(import_trace("pai", PAI_TASKS, TEN, header=PAI_HEADER,
                             pai_jobs=PAI_JOBS)) == want
    # A header file in another column order is followed.
    order = ["plan_gpu", "job_name", "task_name", "inst_num", "status", "start_time",
             "end_time", "plan_cpu", "plan_mem", "gpu_type"]
    src = list(csv.reader(PAI_TASKS.open()))
    idx = [PAI_HEADER.read_text().strip().split(",").index(c) for c in order]
    shuffled = tmp_path / "shuffled.csv"
    shuffled.write_text("".join(",".join(r[i] for i in idx) + "\n" for r in src))
    head = tmp_path / "shuffled.header"
    head.write_text(",".join(order) + "\n")
    assert rows(import_trace("pai", shuffled, TEN, header=head, pai_jobs=PAI_JOBS)) == want


def test_acme_seren_row_by_row() -> None:
    res = import_trace("acme", SEREN, TEN)
    assert rows(res) == SEREN_EXPECTED
    assert res.read == 13
    # FAILED, TIMEOUT, NODE_FAIL; CANCELLED; zero duration; CPU-only.
    assert dict(res.dropped) == {"failed": 3, "killed": 1, "no run time": 1, "no GPU": 1}


def test_acme_kalos_layout() -> None:
    """Kalos has more columns (mem_per_pod_GB, fail_time, stop_time) and string ids; the
    first submission is the failed job's (11:00:58), so the first kept one arrives at
    3600 s."""
    res = import_trace("acme", KALOS, TEN)
    assert rows(res) == [("dlc7ab8cd9ef0gh1", 3600.0, "llama2-70b", 8, 16, 32, 8640),
                         ("dlc2ij3kl4mn5op6", 5400.0, "gpt3-6.7b", 1, 8, 4, 360)]
    assert dict(res.dropped) == {"failed": 1, "killed": 1}


def test_default_iterations_from_simulated_iteration_time() -> None:
    """gpt3-6.7b, one stage of one H100, 4 micro-batches, 1F1B: no bubble, so an iteration
    is 4 x (forward + backward) = 12 forward passes (docs/jobs.md formulas, by hand)."""
    h, s, layers, vocab = 4096, 2048, 32, 50257
    layer = 2 * s * 12 * h * h + 4 * s * s * h
    forward_s = (layers * layer + 2 * s * h * vocab) / (989e12 * 0.4)
    iteration_s = 12 * forward_s
    assert iteration_s == pytest.approx(0.892734, rel=1e-5)
    res = import_trace("philly", PHILLY, ImportOptions())
    one_gpu = dict(zip(res.source_ids, res.jobs, strict=True))[
        "application_1506638472019_10006"]  # 1 GPU for 1200 s
    assert one_gpu.iterations == round(1200 / iteration_s) == 1344
    # A100 (312 TFLOP/s) is 989/312 times slower: fewer iterations for the same time.
    slow = import_trace("philly", PHILLY, ImportOptions(gpu="a100"))
    assert dict(zip(slow.source_ids, slow.jobs, strict=True))[
        "application_1506638472019_10006"].iterations == round(1200 / (iteration_s * 989 / 312))


@pytest.mark.parametrize("gpus,nodes,max_stages,want", [
    (8, None, 8, (1, 8)), (16, None, 8, (2, 8)), (12, 2, 8, (2, 6)), (7, None, 8, (1, 7)),
    (24, None, 8, (3, 8)), (30, 4, 8, (3, 10)), (256, 32, 8, (8, 32)), (13, 2, 8, (1, 13)),
    (64, 8, 4, (4, 16)), (2, 2, 8, (2, 1)), (1, 3, 8, (1, 1)),
])
def test_stage_split(gpus: int, nodes: int | None, max_stages: int,
                     want: tuple[int, int]) -> None:
    assert stage_split(gpus, nodes, ImportOptions(max_stages=max_stages)) == want


def test_filters_and_knobs() -> None:
    keep = import_trace("acme", SEREN, ImportOptions(seconds_per_iteration=10,
                                                     keep_failed=True, keep_killed=True))
    assert len(keep.jobs) == 11 and dict(keep.dropped) == {"no run time": 1, "no GPU": 1}
    big = import_trace("acme", SEREN, ImportOptions(seconds_per_iteration=10, min_gpus=8))
    assert [sid for sid, *_ in rows(big)] == ["5778401", "5778405", "5778409", "5778410",
                                             "5778411"]
    assert big.dropped["below --min-gpus"] == 2
    frac = import_trace("pai", PAI_TASKS, ImportOptions(seconds_per_iteration=10,
                                                        fractional="drop"), pai_jobs=PAI_JOBS)
    assert frac.dropped["fractional GPU"] == 2 and frac.rounded_up == 0
    # Window [1200, 3000) s after the first submission, arrivals counted from 1200.
    win = import_trace("philly", PHILLY, ImportOptions(seconds_per_iteration=10,
                                                       since_s=1200, until_s=3000))
    assert [(sid[-5:], arr) for sid, arr, *_ in rows(win)] == [
        ("10006", 0.0), ("10012", 300.0), ("10007", 600.0)]
    assert win.dropped["before --since"] == 2 and win.dropped["after --until"] == 2
    first = import_trace("philly", PHILLY, ImportOptions(seconds_per_iteration=10, limit=2))
    assert rows(first) == PHILLY_EXPECTED[:2] and first.dropped["over --limit"] == 5
    one = import_trace("philly", PHILLY, ImportOptions(seconds_per_iteration=10,
                                                       model="llama2-7b", microbatches=6))
    assert {j.model for j in one.jobs} == {"llama2-7b"}
    assert {j.microbatches for j in one.jobs} == {6}
    b = parse_buckets("4:llama2-7b,64:llama2-13b")
    assert b[-1][1] == "llama2-13b" and b[0] == (4.0, "llama2-7b")
    for text in ("x:llama2-7b", "8:", "8:a,4:b", "0:a"):
        with pytest.raises(InputError):
            parse_buckets(text)


def test_small_chunks_give_the_same_jobs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Streaming: a job object or CSV row cut across read chunks is read whole."""
    want = [rows(import_trace(f, p, TEN)) for f, p in (("philly", PHILLY), ("acme", SEREN))]
    monkeypatch.setattr(reader_mod, "_CHUNK", 7)
    got = [rows(import_trace(f, p, TEN)) for f, p in (("philly", PHILLY), ("acme", SEREN))]
    assert got == want


def test_philly_json_lines_form(tmp_path: Path) -> None:
    """One job object per line (no enclosing array) reads the same."""
    lines = tmp_path / "log.jsonl"
    lines.write_text("".join(json.dumps(j) + "\n" for j in json.loads(PHILLY.read_text())))
    assert rows(import_trace("philly", lines, TEN)) == PHILLY_EXPECTED


def _philly(tmp_path: Path, jobs: object) -> Path:
    p = tmp_path / "cluster_job_log"
    p.write_text(jobs if isinstance(jobs, str) else json.dumps(jobs, indent=4))
    return p


GOOD_JOB = {"status": "Pass", "vc": "v", "jobid": "j1", "user": "u",
            "submitted_time": "2017-10-07 01:00:00",
            "attempts": [{"start_time": "2017-10-07 01:00:01",
                          "end_time": "2017-10-07 02:00:01",
                          "detail": [{"ip": "m1", "gpus": ["gpu0"]}]}]}
SEREN_HEAD = SEREN.read_text().splitlines()[0]
SEREN_ROW = SEREN.read_text().splitlines()[1].split(",")


def _seren(tmp_path: Path, **change: str) -> Path:
    names = SEREN_HEAD.split(",")
    row = list(SEREN_ROW)
    for k, v in change.items():
        row[names.index(k)] = v
    p = tmp_path / "trace_seren.csv"
    p.write_text(f"{SEREN_HEAD}\n{','.join(SEREN_ROW)}\n{','.join(row)}\n")
    return p


def _pai(tmp_path: Path, **change: str) -> Path:
    names = PAI_HEADER.read_text().strip().split(",")
    first = PAI_TASKS.read_text().splitlines()[0]
    row = first.split(",")
    for k, v in change.items():
        row[names.index(k)] = v
    p = tmp_path / "pai_task_table.csv"
    p.write_text(f"{first}\n{','.join(row)}\n")
    return p


@pytest.mark.parametrize("case,want", [
    ("philly_time", "cluster_job_log: line 2 (job 1), jobid j1: submitted_time: expected a "
     "time like '2017-10-07 01:11:39', got 'yesterday'"),
    ("philly_status", "cluster_job_log: line 2 (job 1), jobid j1: status: expected Pass, "
     "Killed or Failed, got 'Done'"),
    ("philly_gpus", "jobid j1: attempts[0].detail[0]: expected {ip, gpus: [...]}"),
    ("philly_cut", "cluster_job_log: line 40 (job 2): bad JSON: Expecting ',' delimiter"),
    ("philly_scalar", "cluster_job_log: line 1 (job 1): expected a job object, got int"),
    ("pai_gpu", "pai_task_table.csv: row 2: plan_gpu: expected a number >= 0, got 'abc'"),
    ("pai_inst", "pai_task_table.csv: row 2: inst_num: expected a whole number >= 0, got "
     "'1.5'"),
    ("pai_status", "pai_task_table.csv: row 2: status: expected Terminated, Failed, Running "
     "or Waiting, got 'Done'"),
    ("pai_short", "pai_task_table.csv: row 2: plan_gpu: missing (the row has 8 of 10 "
     "columns)"),
    ("acme_gpus", "trace_seren.csv: row 3: gpu_num: expected a whole number >= 0, got "
     "'eight'"),
    ("acme_time", "trace_seren.csv: row 3: start_time: expected an ISO time like "
     "'2023-03-01 00:18:22+08:00', got '03/01/2023'"),
    ("acme_state", "trace_seren.csv: row 3: state: expected one of COMPLETED, FAILED"),
    ("acme_column", "trace_seren.csv: row 1: missing column 'gpu_num'"),
    ("acme_utf8", "trace_seren.csv: row 3: not UTF-8 text (byte 0xff)"),
])
def test_errors_name_file_row_column(tmp_path: Path, cli, case: str,  # type: ignore[no-untyped-def]
                                     want: str) -> None:
    fmt = case.split("_")[0]
    if case == "philly_time":
        path = _philly(tmp_path, [dict(GOOD_JOB, submitted_time="yesterday")])
    elif case == "philly_status":
        path = _philly(tmp_path, [dict(GOOD_JOB, status="Done")])
    elif case == "philly_gpus":
        bad_att = dict(GOOD_JOB["attempts"][0], detail=[{"ip": "m1", "gpus": 3}])
        path = _philly(tmp_path, [dict(GOOD_JOB, attempts=[bad_att])])
    elif case == "philly_cut":
        path = _philly(tmp_path, json.dumps([GOOD_JOB, GOOD_JOB], indent=4)[:-40])
    elif case == "philly_scalar":
        path = _philly(tmp_path, "[1]")
    elif case == "pai_gpu":
        path = _pai(tmp_path, plan_gpu="abc")
    elif case == "pai_inst":
        path = _pai(tmp_path, inst_num="1.5")
    elif case == "pai_status":
        path = _pai(tmp_path, status="Done")
    elif case == "pai_short":
        path = tmp_path / "pai_task_table.csv"
        first = PAI_TASKS.read_text().splitlines()[0]
        path.write_text(first + "\n" + ",".join(first.split(",")[:8]) + "\n")
    elif case == "acme_gpus":
        path = _seren(tmp_path, gpu_num="eight")
    elif case == "acme_time":
        path = _seren(tmp_path, start_time="03/01/2023")
    elif case == "acme_state":
        path = _seren(tmp_path, state="DONE")
    elif case == "acme_column":
        path = tmp_path / "trace_seren.csv"
        path.write_text(SEREN.read_text().replace(",gpu_num,", ",gpus,", 1))
    else:
        path = _seren(tmp_path)
        path.write_bytes(path.read_bytes()[:-20] + b"\xff" + path.read_bytes()[-19:])
    out = tmp_path / "jobs.csv"
    out.write_text("old\n")
    r = cli("trace", "import", "--format", fmt, str(path), "--out", str(out))
    assert r.code == 2, r
    line = r.err.strip()
    assert "\n" not in line and want in line, line
    assert str(path) in line
    assert out.read_text() == "old\n"  # nothing half-written


def test_refuses_links_fifos_and_oversize(tmp_path: Path, cli) -> None:  # type: ignore[no-untyped-def]
    link = tmp_path / "link.csv"
    link.symlink_to(SEREN)
    r = cli("trace", "import", "--format", "acme", str(link), "--out", str(tmp_path / "o.csv"))
    assert r.code == 2 and "is a symbolic link: refused" in r.err
    fifo = tmp_path / "fifo.csv"
    os.mkfifo(fifo)
    r = cli("trace", "import", "--format", "acme", str(fifo), "--out", str(tmp_path / "o.csv"))
    assert r.code == 2 and "not a regular file" in r.err
    with pytest.raises(InputError, match="too large"):
        with open_text(SEREN, max_bytes=100):
            pass
    r = cli("trace", "import", "--format", "acme", str(tmp_path / "none.csv"), "--out",
            str(tmp_path / "o.csv"))
    assert r.code == 2 and "none.csv: no such file" in r.err
    assert not (tmp_path / "o.csv").exists()


def test_cli_usage_errors(tmp_path: Path, cli) -> None:  # type: ignore[no-untyped-def]
    out = str(tmp_path / "o.csv")
    cases = [
        (["trace", "import", str(SEREN), "--out", out], "--format: required"),
        (["trace", "import", "--format", "acme", "--out", out], "FILE: required"),
        (["trace", "import", "--format", "acme", str(SEREN)], "--out: required"),
        (["trace", "import", "--format", "acme", str(SEREN), "--out", out, "--model", "gpt5"],
         "unknown model 'gpt5'"),
        (["trace", "import", "--format", "acme", str(SEREN), "--out", out, "--since", "2x"],
         "--since: expected seconds"),
        (["trace", "import", "--format", "acme", str(SEREN), "--out", out, "--min-gpus",
          "100000"], "no job left to write"),
        (["trace", "import", "--format", "acme", str(SEREN), "--out", out, "--pai-jobs",
          str(PAI_JOBS)], "--pai-jobs: only with --format pai"),
        (["trace", str(SEREN), "--check", "--format", "acme"], "--format: only with `lightpipe "
         "trace import"),
    ]
    for argv, want in cases:
        r = cli(*argv)
        assert r.code == 2 and want in r.err, (argv, r)
    assert not Path(out).exists()


def test_id_map_and_check(tmp_path: Path, cli) -> None:  # type: ignore[no-untyped-def]
    out, ids = tmp_path / "jobs.csv", tmp_path / "ids.csv"
    r = cli("trace", "import", "--format", "pai", str(PAI_TASKS), "--pai-jobs", str(PAI_JOBS),
            "--out", str(out), "--id-map", str(ids), "--seconds-per-iteration", "10")
    assert r.code == 0, r
    assert "read 12 jobs, kept 8 over 6000 s, dropped 4 (1 failed, 2 unfinished, 1 no GPU); "\
        "2 fractional-GPU jobs rounded up" in r.out
    got = list(csv.DictReader(out.open()))
    assert [(int(g["job_id"]), float(g["arrival_s"]), g["model"], int(g["stages"]),
             int(g["gpus_per_stage"]), int(g["microbatches"]), int(g["iterations"]))
            for g in got] == [(i, *e[1:]) for i, e in enumerate(PAI_EXPECTED)]
    assert [r["source_id"] for r in csv.DictReader(ids.open())] == [
        e[0] for e in PAI_EXPECTED]
    assert cli("trace", str(out), "--check").code == 0
    # The generate and check forms still work beside import.
    assert cli("trace", "--check", str(out)).code == 0


def test_import_then_sim_via_cli(tmp_path: Path) -> None:
    """`lightpipe trace import` then `lightpipe sim` on a pp_jobs scenario naming the
    imported trace (subprocesses). A job placed whole in one H100 DC runs for as long as
    the trace says it ran: the import's iteration time is the simulator's."""
    if not Path(LIGHTPIPE).exists():
        pytest.skip("console script not installed")
    jobs = tmp_path / "jobs.csv"
    res = subprocess.run([LIGHTPIPE, "trace", "import", "--format", "acme", str(SEREN),
                          "--out", str(jobs)], capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stderr
    assert "read 13 jobs, kept 7 over 3000 s, dropped 6" in res.stdout
    check = subprocess.run([LIGHTPIPE, "trace", str(jobs), "--check"], capture_output=True,
                           text=True, check=False)
    assert check.returncode == 0 and "ok (7 jobs over 3000 s)" in check.stdout
    spec = yaml.safe_load((DATA / "imported-study.yaml").read_text())
    shutil.copy(DATA / "imported-study.yaml", tmp_path / "study.yaml")
    sim = subprocess.run([LIGHTPIPE, "sim", str(tmp_path / "study.yaml"), "--out",
                          str(tmp_path / "run"), "--quiet"], capture_output=True, text=True,
                         check=False)
    assert sim.returncode == 0, sim.stderr
    gpu_of = {dc["name"]: dc["gpu"] for dc in spec["dcs"]}
    trace_run_s = {"5778401": 3600, "5778412": 300, "5778405": 7200, "5778406": 600,
                   "5778409": 36000, "5778410": 72000, "5778411": 1200}
    run_s = [trace_run_s[sid] for sid, *_ in SEREN_EXPECTED]
    done = list(csv.DictReader((tmp_path / "run" / "jobs.csv").open()))
    assert len(done) == 7 and all(d["blocked"] == "0" for d in done)
    whole = 0
    for d in done:
        dcs = set(d["placement"].split("|"))
        if len(dcs) == 1 and gpu_of[dcs.pop()] == "h100":
            whole += 1
            busy_s = float(d["end_s"]) - float(d["start_s"])
            assert abs(busy_s - run_s[int(d["job_id"])]) <= float(d["iteration_time_s"])
    assert whole >= 3
