"""Issue 27 (findings 1 and 7): `lightpipe report` and `monitor serve` read a run directory
that another local user made, as root, and leak or exhaust nothing.

Each test builds the hostile directory a second local user (created here with useradd,
removed with userdel -r) could make, runs the command in a subprocess with a timeout (a
hang fails the test instead of hanging the suite) and checks that the root-only secret
the test planted never reaches report.html, and that the page says what it skipped."""

from __future__ import annotations

import csv
import json
import os
import secrets
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
LIGHTPIPE = Path(sys.executable).parent / "lightpipe"
ROOT = os.geteuid() == 0
HAVE_USERADD = shutil.which("useradd") is not None and shutil.which("userdel") is not None

pytestmark = [pytest.mark.root,
              pytest.mark.skipif(not (ROOT and HAVE_USERADD),
                                 reason="needs root and useradd (a second local user)")]

ENV = {**os.environ, "PYTHONPATH": str(REPO)}
HANG_GUARD_S = 120  # a command still running after this is hung (or reading forever)


@pytest.fixture
def other_user(tmp_path: Path) -> Iterator[tuple[int, int]]:
    """A second local user (uid, gid), removed afterwards."""
    name = f"lpsr{secrets.token_hex(4)}"
    home = tmp_path / "home"
    subprocess.run(["useradd", "-m", "-d", str(home), "-s", "/usr/sbin/nologin", name],
                   check=True, capture_output=True)
    try:
        pw = subprocess.run(["id", "-u", name], check=True, capture_output=True, text=True)
        gr = subprocess.run(["id", "-g", name], check=True, capture_output=True, text=True)
        yield int(pw.stdout), int(gr.stdout)
    finally:
        subprocess.run(["userdel", "-r", name], capture_output=True)


@pytest.fixture
def secret(tmp_path: Path) -> tuple[Path, str]:
    """A root-only file (0600, root's, in a 0700 directory of root) and its marker."""
    vault = tmp_path / "vault"
    vault.mkdir(mode=0o700)
    mark = f"LPSECRET{secrets.token_hex(8)}"
    path = vault / "secret"
    path.write_text(f"lightpath,goodput_ratio,{mark}\n{mark},0.5,{mark}\n")
    path.chmod(0o600)
    return path, mark


def give(path: Path, uid: int, gid: int) -> None:
    """The whole tree to uid:gid (links themselves, not their targets), as if they made it."""
    os.lchown(path, uid, gid)
    for root, dirs, files in os.walk(path):
        for n in dirs + files:
            os.lchown(os.path.join(root, n), uid, gid)
    # the user's own directories are not readable by others (not needed by the attack)


def emu_run(d: Path) -> Path:
    """A finished emulation run directory with the files the report reads."""
    d.mkdir(parents=True)
    (d / "manifest.json").write_text(json.dumps({"backend": "emu", "status": "finished",
                                                 "scenario": "hostile"}))
    (d / "summary.json").write_text(json.dumps({"backend": "emu", "wall_s": 1.0}))
    (d / "probes.csv").write_text("lightpath,goodput_ratio\nlp0,0.95\n")
    return d


def report(d: Path, *pre: str, env: dict[str, str] | None = None
           ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*pre, str(LIGHTPIPE), "report", str(d)], capture_output=True,
                          text=True, timeout=HANG_GUARD_S, env=env or ENV)


def page(d: Path) -> str:
    return (d / "report.html").read_text()


def assert_skipped(d: Path, res: subprocess.CompletedProcess[str], name: str,
                   why: str) -> None:
    html = page(d)
    assert "skipped inputs" in html, res.stderr[-2000:]
    assert f"{d}/{name}" in html and why in html, html[:3000]
    assert "input(s) skipped" in res.stdout
    assert name in res.stderr and why in res.stderr  # the log line


# ---- finding 1: links to a root-only file are not followed, never embedded -------------
@pytest.mark.parametrize("name", ["probes.csv", "summary.json"])
def test_emu_run_link_to_root_only_file(tmp_path: Path, other_user: tuple[int, int],
                                        secret: tuple[Path, str], name: str) -> None:
    target, mark = secret
    if name == "summary.json":  # a JSON secret, the summary table would show its values
        target.write_text(json.dumps({"backend": "emu", "token": mark}))
    d = emu_run(tmp_path / "run")
    (d / name).unlink()
    (d / name).symlink_to(target)
    give(d, *other_user)
    res = report(d)
    assert res.returncode == 0, res.stderr[-2000:]
    assert mark not in page(d)
    assert_skipped(d, res, name, "a symbolic link: not followed")


def test_reproduction_markdown_link(tmp_path: Path, other_user: tuple[int, int],
                                    secret: tuple[Path, str]) -> None:
    target, mark = secret
    d = tmp_path / "repro"
    d.mkdir()
    (d / "summary.json").write_text(json.dumps({"experiment": "other", "reproduces": "x"}))
    (d / "table.md").symlink_to(target)
    (d / "x\x1b]2;owned\x07.md").symlink_to(target)  # a name that drives a terminal
    give(d, *other_user)
    res = report(d)
    assert res.returncode == 0, res.stderr[-2000:]
    assert mark not in page(d)
    assert_skipped(d, res, "table.md", "a symbolic link: not followed")
    assert "\x1b" not in res.stderr and "x?]2;owned?.md" in res.stderr


def test_sweep_mean_link(tmp_path: Path, other_user: tuple[int, int],
                         secret: tuple[Path, str]) -> None:
    target, mark = secret
    d = tmp_path / "sweep"
    d.mkdir()
    (d / "sweep.json").write_text(json.dumps({"points": 1, "seeds": 1, "metric": "m",
                                              "set": {"a": [1]}}))
    (d / "sweep_mean.csv").symlink_to(target)
    give(d, *other_user)
    res = report(d)
    assert res.returncode == 0, res.stderr[-2000:]
    assert mark not in page(d)
    assert_skipped(d, res, "sweep_mean.csv", "a symbolic link: not followed")


def test_both_run_with_a_linked_subdirectory(tmp_path: Path, other_user: tuple[int, int],
                                             secret: tuple[Path, str]) -> None:
    """`sim/` a link to a directory of root's: not entered."""
    target, mark = secret
    rootrun = emu_run(tmp_path / "rootrun")
    shutil.copy(target, rootrun / "probes.csv")
    d = tmp_path / "both"
    emu_run(d / "emu")
    (d / "sim").symlink_to(rootrun)
    give(d, *other_user)
    res = report(d)
    assert res.returncode == 0, res.stderr[-2000:]
    assert mark not in page(d) + res.stdout + res.stderr
    assert_skipped(d, res, "sim", "a symbolic link: not followed")


def test_files_not_of_the_directory_owner(tmp_path: Path, other_user: tuple[int, int],
                                          secret: tuple[Path, str]) -> None:
    """A hard link to root's file (possible where fs.protected_hardlinks is 0) and a file
    of a third user are refused in a directory of the second user."""
    target, mark = secret
    d = emu_run(tmp_path / "run")
    (d / "probes.csv").unlink()
    os.link(target, d / "probes.csv")  # root's file, 2 links
    (d / "summary.json").write_text(json.dumps({"backend": "emu", "token": mark}))
    give(d, *other_user)
    os.lchown(d / "probes.csv", 0, 0)
    os.lchown(d / "summary.json", 65534, 65534)  # nobody's
    res = report(d)
    assert res.returncode == 0, res.stderr[-2000:]
    assert mark not in page(d)
    assert_skipped(d, res, "probes.csv", "hard links")
    assert_skipped(d, res, "summary.json", "owned by uid 65534")


# ---- finding 7: devices, FIFOs, huge inputs --------------------------------------------
def limited(mem_bytes: int):  # type: ignore[no-untyped-def]
    """preexec_fn: an address-space limit, so a runaway read fails instead of eating RAM."""
    import resource

    def set_limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (mem_bytes, mem_bytes))

    return set_limit


@pytest.mark.parametrize("how", ["link", "device"])
def test_summary_dev_zero(tmp_path: Path, other_user: tuple[int, int], how: str) -> None:
    d = emu_run(tmp_path / "run")
    (d / "summary.json").unlink()
    if how == "link":
        (d / "summary.json").symlink_to("/dev/zero")
    else:  # a device node itself (what fstat must refuse, link or not)
        os.mknod(d / "summary.json", 0o644 | 0o020000, os.makedev(1, 5))
    give(d, *other_user)
    res = subprocess.run([str(LIGHTPIPE), "report", str(d)], capture_output=True, text=True,
                         timeout=HANG_GUARD_S, env=ENV, preexec_fn=limited(3 << 30))
    assert res.returncode == 0, res.stderr[-2000:]
    why = "a symbolic link" if how == "link" else "a character device, not a regular file"
    assert_skipped(d, res, "summary.json", why)


def test_manifest_fifo_does_not_hang(tmp_path: Path, other_user: tuple[int, int]) -> None:
    d = emu_run(tmp_path / "run")
    (d / "manifest.json").unlink()
    os.mkfifo(d / "manifest.json")
    give(d, *other_user)
    res = report(d)  # (a hang is a TimeoutExpired: the test fails, the suite goes on)
    assert res.returncode == 0, res.stderr[-2000:]  # summary.json says emu
    assert_skipped(d, res, "manifest.json", "a FIFO, not a regular file")


def test_million_row_probes_are_capped(tmp_path: Path, other_user: tuple[int, int]) -> None:
    """1M probe rows (the review's run took 12 GB and had not ended after 580 s): the read
    stops at CSV_MAX_ROWS, the table at TABLE_MAX_ROWS, the bars become a histogram."""
    d = emu_run(tmp_path / "run")
    with open(d / "probes.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["lightpath", "goodput_ratio"])
        w.writerows((f"lp{i}", 0.9) for i in range(1_000_000))
    give(d, *other_user)
    res = subprocess.run([str(LIGHTPIPE), "report", str(d)], capture_output=True, text=True,
                         timeout=HANG_GUARD_S, env=ENV, preexec_fn=limited(3 << 30))
    assert res.returncode == 0, res.stderr[-2000:]
    from testbed.io.bounded import CSV_MAX_ROWS
    from testbed.report.readers import TABLE_MAX_ROWS

    html = page(d)
    assert html.count("<tr><td>lp") == TABLE_MAX_ROWS
    assert f"only its first {CSV_MAX_ROWS} rows read" in html
    assert f"iperf3 goodput of {CSV_MAX_ROWS} emulated lightpaths" in html or \
        f"{CSV_MAX_ROWS} lightpaths: their distribution" in html


def _wal_run(tmp_path: Path, other_user: tuple[int, int]) -> Path:
    d = emu_run(tmp_path / "run")
    wal = d / "prometheus" / "data" / "wal"
    wal.mkdir(parents=True)
    (wal / "00000000").symlink_to("/dev/zero")
    give(d, *other_user)
    return d


def _in_small_tmp(tmp_path: Path, cmd: str) -> subprocess.CompletedProcess[str]:
    """cmd with TMPDIR a private 64 MiB tmpfs (a copy of /dev/zero cannot fill the disk);
    prints what TMPDIR holds afterwards after a line 'TMPDIR:'."""
    tmp = tmp_path / "tmpdir"
    tmp.mkdir()
    script = (f"mount -t tmpfs -o size=64m lpsr-tmp {tmp} && {cmd}; rc=$?; "
              f"echo TMPDIR:; ls -A {tmp}; exit $rc")
    return subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                           script], capture_output=True, text=True, timeout=HANG_GUARD_S,
                          env={**ENV, "TMPDIR": str(tmp)})


@pytest.mark.skipif(shutil.which("prometheus") is None or shutil.which("unshare") is None,
                    reason="needs prometheus and unshare")
def test_report_wal_link_to_dev_zero(tmp_path: Path, other_user: tuple[int, int]) -> None:
    d = _wal_run(tmp_path, other_user)
    res = _in_small_tmp(tmp_path, f"{LIGHTPIPE} report {d}")
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.split("TMPDIR:", 1)[1].strip() == ""  # nothing left behind
    html = page(d)
    assert f"{d}/prometheus/data/wal/00000000" in html
    assert "a symbolic link: not followed" in html


@pytest.mark.skipif(shutil.which("prometheus") is None or shutil.which("unshare") is None,
                    reason="needs prometheus and unshare")
def test_monitor_serve_wal_link_to_dev_zero(tmp_path: Path,
                                            other_user: tuple[int, int]) -> None:
    d = _wal_run(tmp_path, other_user)
    code = ("from testbed.monitor.serve import serving\n"
            f"with serving({str(d)!r}) as s:\n"
            "    print('served', s.port if hasattr(s, 'port') else s)\n")
    res = _in_small_tmp(tmp_path, f"{sys.executable} -c \"{code}\"")
    assert res.returncode == 0, res.stderr[-2000:]
    assert "served" in res.stdout
    assert res.stdout.split("TMPDIR:", 1)[1].strip() == ""
    assert "wal/00000000" in res.stderr and "symbolic link" in res.stderr


def test_tsdb_copy_limit_and_cleanup(tmp_path: Path, other_user: tuple[int, int]) -> None:
    """A TSDB larger than the copy limit is refused (counted as read) and the partial copy
    is the caller's to remove; the report's copy is removed on that error too."""
    from testbed.errors import InputError
    from testbed.io.bounded import DirReader, copy_tree

    d = emu_run(tmp_path / "run")
    data = d / "prometheus" / "data"
    (data / "wal").mkdir(parents=True)
    (data / "wal" / "00000000").write_bytes(b"\0" * 300_000)
    (data / "wal" / "00000001").write_bytes(b"\0" * 300_000)
    give(d, *other_user)
    with DirReader.open(data) as src, pytest.raises(InputError, match="copy limit"):
        copy_tree(src, tmp_path / "copy", "RUNDIR", max_bytes=500_000)
    with DirReader.open(data) as src:
        assert copy_tree(src, tmp_path / "copy2", "RUNDIR") == 600_000
    assert (tmp_path / "copy2" / "wal").stat().st_mode & 0o777 == 0o700


def test_fifo_where_the_lock_goes_does_not_hang(tmp_path: Path,
                                                other_user: tuple[int, int]) -> None:
    """A run that says "running" with a FIFO where its lock file goes: the status check
    does not open it (it is no LightPipe lock) and the report refuses the unfinished run."""
    parent = tmp_path / "shared"
    parent.mkdir()
    d = emu_run(parent / "run")
    (d / "manifest.json").write_text(json.dumps({"backend": "emu", "status": "running",
                                                 "pid": 1}))
    os.mkfifo(parent / ".run.lightpipe-lock")
    give(parent, *other_user)
    res = report(d)
    assert res.returncode == 2 and "did not finish" in res.stderr, res.stderr[-2000:]


def test_hostile_numbers_in_records_stay_bounded(tmp_path: Path,
                                                 other_user: tuple[int, int]) -> None:
    """Slot indices of 10**9, times of +-1e300 (requests.csv) and a stage of 10**9 in a
    worker trace: the spectrum and the timelines are drawn within their limits and say
    so, instead of allocating 10**9 slots or ticks."""
    d = tmp_path / "sim"
    d.mkdir()
    (d / "manifest.json").write_text(json.dumps({"backend": "sim", "status": "finished"}))
    (d / "summary.json").write_text(json.dumps({"backend": "sim"}))
    (d / "requests.csv").write_text(
        "id,arrival_s,holding_s,bitrate,accepted,path,first_slot,slots\n"
        "0,0,10,100,1,1-2-3,1000000000,4\n1,-1e300,1e300,100,1,1-2,0,4\n"
        "2,1,5,100,1,1-2,2,2\n")
    e = tmp_path / "emu"
    emu_run(e)
    pipe = {"forward_ms": [1.0, 1.0], "backward_ms": [2.0, 2.0], "hops": [[1.0, 10.0]],
            "activation_mb": 1.0, "microbatches": 2}
    (e / "summary.json").write_text(json.dumps({"backend": "emu", "worker_jobs": [
        {"job": "0", "schedule": "1f1b", "time_factor": 1.0, "pipeline": pipe}]}))
    (e / "trace.json").write_text(json.dumps({"traceEvents": [
        {"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "job 0"}},
        {"ph": "X", "pid": 1, "tid": 10**9, "ts": 0, "dur": 5, "name": "F0",
         "args": {"iteration": 0}}]}))
    give(d, *other_user)
    give(e, *other_user)
    for run, words in ((d, "the spectrum drawn for the first 4096 slots only"),
                       (e, "no span on a stage 0..1023")):
        res = subprocess.run([str(LIGHTPIPE), "report", str(run)], capture_output=True,
                             text=True, timeout=HANG_GUARD_S, env=ENV,
                             preexec_fn=limited(3 << 30))
        assert res.returncode == 0, res.stderr[-2000:]
        assert words in page(run), run
