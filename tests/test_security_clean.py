"""Issue 27, killing and deleting: `lightpipe clean` touches only what LightPipe can prove
is its own. Each test reproduces an attack by a second local user (made with useradd,
removed with userdel -r) or a planted file, and failed before the fix.

Every `clean` here names its run prefix or its --dir and runs under a private
LIGHTPIPE_STATE_DIR: the machine is shared, and the old code's "orphan" logic would have
destroyed other people's namespaces. Commands run in a subprocess with a timeout, so a
hang fails the test instead of hanging it."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import pwd
import shutil
import signal
import stat
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
LIGHTPIPE = [sys.executable, "-c", "import sys; from testbed.cli.main import main; "
             "sys.exit(main(sys.argv[1:]))"]
ROOT = os.geteuid() == 0
need_root = pytest.mark.skipif(not ROOT or not shutil.which("useradd"),
                               reason="needs root and useradd")
need_mininet = pytest.mark.skipif(not ROOT or not shutil.which("mnexec"),
                                  reason="needs root and mnexec (Debian mininet)")
HANG_S = 60  # a command that has not answered by then hangs (it answers in ~1 s)
USERNS_SLEEP = ["unshare", "-r", "-n", "sh", "-c", "echo ready; exec sleep 300"]


def lp(*args: str, state: Path | None = None, timeout: float = HANG_S
       ) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    if state is not None:
        env["LIGHTPIPE_STATE_DIR"] = str(state)
    return subprocess.run([*LIGHTPIPE, *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout)


def start_ticks(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])


def ready(argv: list[str]) -> subprocess.Popen[str]:
    """Start argv (a shell that prints a line once set up, then execs): returned once the
    line is read, so the process is in place without any sleep."""
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                         start_new_session=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "ready", argv
    return p


@dataclass
class User:
    name: str
    uid: int
    gid: int
    procs: list[subprocess.Popen[str]] = field(default_factory=list)

    def start(self, argv: list[str]) -> subprocess.Popen[str]:
        """argv as this user, every step an exec (the PID is the process itself); it must
        print 'ready' once set up."""
        p = ready(["setpriv", f"--reuid={self.uid}", f"--regid={self.gid}", "--clear-groups",
                   *argv])
        self.procs.append(p)
        return p

    def give(self, path: Path) -> Path:
        os.chown(path, self.uid, self.gid, follow_symlinks=False)
        return path


@pytest.fixture
def other_user() -> Iterator[User]:
    name = "lpsc" + os.urandom(3).hex()
    subprocess.run(["useradd", "-m", name], check=True, capture_output=True)
    pw = pwd.getpwnam(name)
    user = User(name, pw.pw_uid, pw.pw_gid)
    try:
        yield user
    finally:
        for p in user.procs:
            with contextlib.suppress(ProcessLookupError):
                p.kill()
            p.wait()
        for _ in range(100):  # /etc/passwd may be locked by a useradd elsewhere: again
            r = subprocess.run(["userdel", "-r", name], capture_output=True, text=True)
            if r.returncode in (0, 6) and name not in Path("/etc/passwd").read_text():
                break
            import time

            time.sleep(0.1)
        else:
            pytest.fail(f"userdel -r {name}: {r.stderr.strip()}")


def userns_works(user: User) -> bool:
    r = subprocess.run(["setpriv", f"--reuid={user.uid}", f"--regid={user.gid}",
                        "--clear-groups", "unshare", "-r", "-n", "true"], capture_output=True)
    return r.returncode == 0


def new_prefix(state: Path) -> str:
    while True:
        p = "lp" + os.urandom(2).hex()
        if not (state / p).exists() and not Path("/run/netns", p).exists():
            return p


def state_root(tmp_path: Path) -> Path:
    d = tmp_path / "state"
    d.mkdir(mode=0o700, exist_ok=True)
    return d


def dead_owner() -> tuple[int, int]:
    """A PID and start time of a process that has ended (a run's dead owner)."""
    p = subprocess.Popen(["sh", "-c", "exit 0"])
    ticks = start_ticks(p.pid)
    p.wait()
    return p.pid, ticks


def write_state(state: Path, prefix: str, **fields: object) -> Path:
    d = state / prefix
    d.mkdir(mode=0o700)
    pid, ticks = dead_owner()
    data = {"prefix": prefix, "state_dir": str(d), "owner_pid": pid,
            "owner_start_ticks": ticks, "netns": None, "procs": [], "ns_inodes": [],
            "out_dir": None, "phase": "up", **fields}
    (d / "state.json").write_text(json.dumps(data))
    return d


def alive(p: subprocess.Popen[str]) -> bool:
    return p.poll() is None


# ------------------------------------------------------------------ finding 2
@need_root
def test_recorded_inode_of_another_users_namespace_does_not_get_it_killed(
        tmp_path: Path, other_user: User) -> None:
    """The state of a dead run names namespace inode numbers that now belong to another
    user's processes (the kernel reuses them): clean must not kill those processes, nor
    trust a 'reference' that is a symlink to them or a plain file."""
    if not userns_works(other_user):
        pytest.skip("unprivileged user namespaces are off")
    victims = [other_user.start(USERNS_SLEEP)
               for _ in range(3)]
    idents = [os.stat(f"/proc/{v.pid}/ns/net") for v in victims]
    assert os.stat("/proc/self/ns/net").st_ino not in {s.st_ino for s in idents}
    state = state_root(tmp_path)
    # as state.json recorded them before (bare inode numbers) ...
    old = write_state(state, new_prefix(state), ns_inodes=[s.st_ino for s in idents])
    # ... and as a forged state of today's format: identities, a symlink, a plain file
    forged = write_state(state, new_prefix(state), held={
        f"h{i}": [s.st_dev, s.st_ino] for i, s in enumerate(idents)})
    (forged / "ns").mkdir()
    (forged / "ns" / "h0").symlink_to(f"/proc/{victims[0].pid}/ns/net")
    (forged / "ns" / "h1").write_text("")
    for d in (old, forged):
        dry = lp("clean", d.name, "--dry-run", state=state)
        assert dry.returncode == 0, dry.stderr
        assert not any(str(v.pid) in dry.stdout for v in victims), dry.stdout
        real = lp("clean", d.name, state=state)
        assert real.returncode == 0, real.stderr
        assert all(alive(v) for v in victims), real.stdout
        assert f"removed run {d.name} (0 processes)" in real.stdout, real.stdout
        assert not d.exists()


KILLED_RUN = """
import signal, sys
from testbed.emu.linkbench import LinkTestbed
lt = LinkTestbed(rate_mbps=10, delay_ms=1)
lt.start()
print(lt.prefix, flush=True)
signal.pause()
"""


def run_processes(state_dir: Path) -> list[int]:
    """Every process of a live run: the recorded ones and all inside their namespaces."""
    st = json.loads((state_dir / "state.json").read_text())
    pids = {p["pid"] for p in st["procs"]}
    spaces = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            s = os.stat(f"/proc/{pid}/ns/net")
            spaces.add((s.st_dev, s.st_ino))
    home = os.stat("/proc/self/ns/net")
    spaces.discard((home.st_dev, home.st_ino))
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                s = os.stat(entry / "ns" / "net")
                if (s.st_dev, s.st_ino) in spaces:
                    pids.add(int(entry.name))
    return sorted(pids)


@need_mininet
@pytest.mark.root
def test_killed_run_then_another_users_namespaces_clean_kills_none_of_them(
        tmp_path: Path, other_user: User) -> None:
    """The reported attack: a run is SIGKILLed with all its processes, another user then
    starts `unshare -r -n sleep` processes (the kernel hands out the freed namespace
    numbers again), and `clean PREFIX` must kill none of them."""
    if not userns_works(other_user):
        pytest.skip("unprivileged user namespaces are off")
    state = state_root(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(REPO), "LIGHTPIPE_STATE_DIR": str(state)}
    owner = subprocess.Popen([sys.executable, "-c", KILLED_RUN], cwd=REPO, env=env,
                             stdout=subprocess.PIPE, text=True, start_new_session=True)
    prefix = ""
    try:
        assert owner.stdout is not None
        prefix = owner.stdout.readline().strip()
        assert prefix.startswith("lp"), prefix
        pids = run_processes(state / prefix)
        recorded = json.loads((state / prefix / "state.json").read_text())
        assert len(recorded["procs"]) >= 3
    except BaseException:
        owner.kill()
        owner.wait()
        if prefix:
            lp("clean", prefix, "--force", state=state)
        raise
    owner.kill()
    owner.wait()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for pid in pids:  # (reaped by init: wait until each is gone, not for a time)
        with contextlib.suppress(OSError):
            fd = os.pidfd_open(pid)
            try:
                import select

                select.select([fd], [], [], HANG_S)
            finally:
                os.close(fd)
    theirs = [other_user.start(USERNS_SLEEP)
              for _ in range(12)]
    dry = lp("clean", prefix, "--dry-run", state=state)
    assert dry.returncode == 0 and not any(f"process {t.pid} " in dry.stdout
                                           for t in theirs), dry.stdout
    real = lp("clean", prefix, state=state)
    assert real.returncode == 0, real.stderr
    assert all(alive(t) for t in theirs), real.stdout
    assert f"removed run {prefix}" in real.stdout, real.stdout
    assert not (state / prefix).exists()
    assert f"{state}/" not in Path("/proc/self/mountinfo").read_text()  # refs released


# ------------------------------------------------------------------ finding 3
@need_root
def test_clean_leaves_a_namespace_named_like_a_run_alone(tmp_path: Path) -> None:
    """`ip netns add lpbeef` by someone else, with a process inside, is not LightPipe's:
    neither a clean of that prefix nor one without the state dir that holds a real run
    of that name may delete it or kill in it."""
    state = state_root(tmp_path)
    name = new_prefix(state)
    subprocess.run(["ip", "netns", "add", name], check=True)
    inside = ready(["ip", "netns", "exec", name, "sh", "-c", "echo ready; exec sleep 300"])
    try:
        for args in ((name, "--dry-run"), (name,)):
            r = lp("clean", *args, state=state)
            assert r.returncode == 0, r.stderr
            assert f"left namespace {name} alone" in r.stdout, r.stdout
            assert Path("/run/netns", name).exists() and alive(inside)
        # A run kept under another LIGHTPIPE_STATE_DIR: not an orphan to a clean without it.
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir(mode=0o700)
        write_state(elsewhere, name, netns=name)
        r = lp("clean", name, state=state)
        assert r.returncode == 0 and Path("/run/netns", name).exists() and alive(inside)
    finally:
        inside.kill()
        inside.wait()
        subprocess.run(["ip", "netns", "del", name], check=False)


@need_root
def test_clean_with_its_state_dir_removes_a_held_run_and_dry_run_lists_it_all(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The proof that works: a run holding its namespaces (bind mounts in its state dir).
    --dry-run lists each process (pid, command, why), namespace and file and touches
    nothing; clean then kills exactly those and releases the references."""
    from testbed.emu.netns import enter_new_named, leave_netns
    from testbed.emu.state import new_state

    state = state_root(tmp_path)
    monkeypatch.setenv("LIGHTPIPE_STATE_DIR", str(state))
    prefix = new_prefix(state)
    st = new_state(prefix)
    st.netns = prefix
    leave_netns(enter_new_named(prefix, lambda path: st.hold_netns("netns", path)))
    try:
        node = ready(["unshare", "-n", "sh", "-c", "echo ready; exec sleep 300"])
        st.add_proc(node.pid, "host-shell", "h1")
        st.hold_netns("h1", f"/proc/{node.pid}/ns/net")
        extra = ready(["nsenter", f"--net=/proc/{node.pid}/ns/net", "sh", "-c",
                       "echo ready; exec sleep 301"])
        in_named = ready(["ip", "netns", "exec", prefix, "sh", "-c",
                          "echo ready; exec sleep 302"])
        pid0, ticks0 = dead_owner()
        st.owner_pid, st.owner_start_ticks = pid0, ticks0
        st.save()
        dry = lp("clean", prefix, "--dry-run", state=state)
        assert dry.returncode == 0, dry.stderr
        out = dry.stdout
        assert f"would kill process {node.pid} (sleep 300) of run {prefix}: recorded as " \
               "host-shell, PID and start time match" in out, out
        assert f"would kill process {extra.pid} (sleep 301) of run {prefix}: inside the " \
               f"run's namespace h1 (held by {state / prefix / 'ns' / 'h1'})" in out, out
        assert f"would kill process {in_named.pid} (sleep 302)" in out, out
        assert f"would delete namespace {prefix} of run {prefix}" in out, out
        assert f"would release namespace reference {state / prefix / 'ns' / 'netns'}" in out
        assert f"would remove state directory {state / prefix}" in out, out
        assert all(alive(p) for p in (node, extra, in_named))
        assert Path("/run/netns", prefix).exists() and (state / prefix).exists()
        real = lp("clean", prefix, state=state)
        assert real.returncode == 0, real.stderr
        for p in (node, extra, in_named):
            assert p.wait(timeout=HANG_S) in (-signal.SIGTERM, -signal.SIGKILL)
        assert not Path("/run/netns", prefix).exists() and not (state / prefix).exists()
        assert f"{state}/" not in Path("/proc/self/mountinfo").read_text()
    finally:
        with contextlib.suppress(OSError):
            lp("clean", prefix, "--force", state=state)
        subprocess.run(["ip", "netns", "del", prefix], check=False, capture_output=True)


@need_root
def test_a_run_dir_or_state_file_not_provably_ours_is_left_alone(
        tmp_path: Path, other_user: User) -> None:
    """A run directory owned by another user, or whose state.json is a link or a FIFO,
    proves nothing: the recorded process (PID and start time right) is not killed, and a
    FIFO does not hang clean."""
    state = state_root(tmp_path)
    target = ready(["sh", "-c", "echo ready; exec sleep 300"])
    try:
        rec = [{"pid": target.pid, "start_ticks": start_ticks(target.pid), "role": "x",
                "name": ""}]
        theirs = write_state(state, new_prefix(state), procs=rec)
        other_user.give(theirs)
        other_user.give(theirs / "state.json")
        linked = write_state(state, new_prefix(state), procs=rec)
        real = linked / "state.json"
        real.rename(tmp_path / "elsewhere.json")
        real.symlink_to(tmp_path / "elsewhere.json")
        fifo = write_state(state, new_prefix(state))
        (fifo / "state.json").unlink()
        os.mkfifo(fifo / "state.json")
        for d in (theirs, linked, fifo):
            r = lp("clean", d.name, state=state)
            assert r.returncode == 0, r.stderr
            assert alive(target), r.stdout
        assert theirs.exists() and "skipped" in lp("clean", theirs.name, state=state).stdout
    finally:
        target.kill()
        target.wait()


def test_a_run_killed_in_its_first_state_write_is_cleaned_and_one_in_it_kept(
        tmp_path: Path) -> None:
    """A run SIGKILLed between creating its first `.state.json.PID.XXXX.tmp` and filling
    it leaves a directory with only that file, empty (CI of 2026-11-29): `clean` removes
    it, its writer being gone. While the writer named in the file's name lives, the run
    is kept, as a live run is."""
    state = state_root(tmp_path)
    dead = new_prefix(state)
    code = ("import os, signal, sys\n"
            "from testbed.emu import state\n"
            "os.fchmod = lambda fd, mode: os.kill(os.getpid(), signal.SIGKILL)\n"
            "state.new_state(sys.argv[1])\n")
    r = subprocess.run([sys.executable, "-c", code, dead], cwd=REPO, capture_output=True,
                       env={**os.environ, "PYTHONPATH": str(REPO),
                            "LIGHTPIPE_STATE_DIR": str(state)}, timeout=HANG_S)
    assert r.returncode == -signal.SIGKILL, r.stderr
    left = list((state / dead).iterdir())
    assert len(left) == 1 and left[0].name.startswith(".state.json.") \
        and left[0].name.endswith(".tmp") and left[0].stat().st_size == 0, left
    writer = ready(["sh", "-c", "echo ready; exec sleep 300"])
    try:
        busy = state / new_prefix(state)
        busy.mkdir(mode=0o700)
        (busy / f".state.json.{writer.pid}.x1y2z3.tmp").touch()
        r = lp("clean", dead, state=state)
        assert r.returncode == 0 and f"removed run {dead}" in r.stdout, (r.stdout, r.stderr)
        assert not (state / dead).exists()
        for args in (("--dry-run",), ()):
            r = lp("clean", busy.name, *args, state=state)
            assert r.returncode == 0, r.stderr
            assert f"first state is still being written by pid {writer.pid}" in r.stdout, \
                r.stdout
            assert busy.is_dir() and alive(writer)
    finally:
        writer.kill()
        writer.wait()
    r = lp("clean", busy.name, state=state)
    assert r.returncode == 0 and not busy.exists(), (r.stdout, r.stderr)


# ------------------------------------------------------------------ finding 8
def test_a_fifo_named_like_a_lock_hangs_neither_clean_nor_its_dry_run(
        tmp_path: Path) -> None:
    d = tmp_path / "d"
    d.mkdir()
    os.mkfifo(d / ".x.lightpipe-lock")
    (d / ".x.4000000.ab.partial").mkdir()
    for args in (("--dry-run",), ()):
        r = lp("clean", "--dir", str(d), *args)
        assert r.returncode == 0, r.stderr
    assert stat.S_ISFIFO(os.lstat(d / ".x.lightpipe-lock").st_mode)
    assert (d / ".x.4000000.ab.partial").is_dir()


def small_spec(tmp_path: Path) -> Path:
    import yaml

    spec = yaml.safe_load((REPO / "scenarios" / "quickstart.yaml").read_text())
    spec["workload"]["requests"] = 50
    path = tmp_path / "qs.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_a_fifo_next_to_a_partial_does_not_hang_sim_out(tmp_path: Path) -> None:
    d = tmp_path / "d"
    d.mkdir()
    os.mkfifo(d / ".y.lightpipe-lock")
    (d / ".y.4000000.ab.partial").mkdir()
    r = lp("sim", str(small_spec(tmp_path)), "--out", str(d / "r"), "-q")
    assert r.returncode == 0, r.stderr
    assert (d / "r" / "manifest.json").is_file()


def test_the_outs_own_lock_must_be_a_regular_file_not_a_link_or_fifo(
        tmp_path: Path) -> None:
    """A lock planted as a symlink would have had root truncate and write the file it
    points to; as a FIFO it is no lock. Both: one-line error naming it, exit 2."""
    d = tmp_path / "d"
    d.mkdir()
    precious = tmp_path / "precious"
    precious.write_text("keep me\n")
    (d / ".r.lightpipe-lock").symlink_to(precious)
    os.mkfifo(d / ".s.lightpipe-lock")
    for name in ("r", "s"):
        r = lp("sim", str(small_spec(tmp_path)), "--out", str(d / name), "-q")
        assert r.returncode == 2, (r.returncode, r.stderr)
        assert r.stderr.count("\n") == 1 and "lock file" in r.stderr, r.stderr
        assert not (d / name).exists()
    assert precious.read_text() == "keep me\n"


# ------------------------------------------------------------------ finding 9
@need_root
def test_clean_dir_in_a_shared_sticky_dir_touches_only_provably_own_leftovers(
        tmp_path: Path, other_user: User) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    thesis = shared / ".thesis.4000000.v2.partial"
    thesis.mkdir()
    (thesis / "chapter1.tex").write_text("work of months\n")
    photos = shared / ".photos.old-4000001"
    photos.mkdir()
    (photos / "a.jpg").write_text("jpeg\n")
    their_lock = shared / ".thesis.lightpipe-lock"
    their_lock.write_text("4000000\n")  # their own 'proof' is not ours
    for p in (thesis, thesis / "chapter1.tex", photos, photos / "a.jpg", their_lock):
        other_user.give(p)
    mine = shared / ".notes.4000002.v2.partial"  # root's own, named alike, no LightPipe lock
    mine.mkdir()
    for args in (("--dry-run",), ()):
        r = lp("clean", "--dir", str(shared), *args)
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == "clean: nothing to clean", r.stdout
    assert (thesis / "chapter1.tex").read_text() == "work of months\n"
    assert (photos / "a.jpg").is_file() and not (shared / "photos").exists()
    assert their_lock.exists() and mine.is_dir()


@need_root
def test_clean_dir_still_removes_its_own_proven_leftovers_there(tmp_path: Path) -> None:
    """In the same shared directory, what a killed LightPipe writer left (its lock lists
    its PID) is still removed, and a replaced run is put back."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    pid, _ = dead_owner()
    (shared / f".r.{pid}.ab.partial").mkdir()
    (shared / f".q.old-{pid}").mkdir()
    (shared / f".q.old-{pid}" / "manifest.json").write_text("{}")
    for name in ("r", "q"):
        (shared / f".{name}.lightpipe-lock").write_text(f"{pid}\n")
    dry = lp("clean", "--dir", str(shared), "--dry-run")
    assert dry.returncode == 0 and "listed in .r.lightpipe-lock" in dry.stdout, dry.stdout
    r = lp("clean", "--dir", str(shared))
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in shared.iterdir()) == ["q"], r.stdout
    assert (shared / "q" / "manifest.json").is_file()


# ------------------------------------------------------------------ given directories
@need_root
def test_given_directories_writable_by_others_or_theirs_are_refused(
        tmp_path: Path, other_user: User) -> None:
    loose = tmp_path / "loose"
    loose.mkdir()
    loose.chmod(0o777)  # world-writable, not sticky
    (loose / ".r.4000000.ab.partial").mkdir()
    (loose / ".r.lightpipe-lock").write_text("4000000\n")
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    other_user.give(theirs)
    for d, why in ((loose, "world-writable"), (theirs, f"uid {other_user.uid}")):
        r = lp("clean", "--dir", str(d))
        assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
        assert r.stderr.count("\n") == 1 and "--dir" in r.stderr and why in r.stderr
    assert (loose / ".r.4000000.ab.partial").is_dir()
    group = tmp_path / "gstate"
    group.mkdir()
    group.chmod(0o770)
    other = tmp_path / "ostate"
    other.mkdir(mode=0o700)
    other_user.give(other)
    for d, why in ((group, "group-writable"), (other, f"uid {other_user.uid}")):
        r = lp("clean", "lp0000", state=d)
        assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
        assert r.stderr.count("\n") == 1 and "LIGHTPIPE_STATE_DIR" in r.stderr \
            and why in r.stderr, r.stderr


def test_state_dirs_lightpipe_makes_are_private(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from testbed.emu.state import new_state

    monkeypatch.setenv("LIGHTPIPE_STATE_DIR", str(tmp_path / "a" / "state"))
    old = os.umask(0)
    try:
        st = new_state("lp" + os.urandom(2).hex())
    finally:
        os.umask(old)
    for d in (tmp_path / "a" / "state", Path(st.state_dir)):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700, d
    assert stat.S_IMODE((Path(st.state_dir) / "state.json").stat().st_mode) == 0o600
    shutil.rmtree(st.state_dir)


def test_directories_and_records_made_under_umask_000_are_not_writable_by_others(
        tmp_path: Path) -> None:
    """Under umask 000 the old code made --out's parents, the run directory and its files
    world-writable: another user could then plant links for root's later writes."""
    out = tmp_path / "a" / "b" / "r"
    code = ("import os, sys; os.umask(0); from testbed.cli.main import main; "
            "sys.exit(main(sys.argv[1:]))")
    r = subprocess.run([sys.executable, "-c", code, "sim", str(small_spec(tmp_path)),
                        "--out", str(out), "-q"], cwd=REPO, capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=HANG_S)
    assert r.returncode == 0, r.stderr
    for d in (tmp_path / "a", tmp_path / "a" / "b", out):
        assert stat.S_IMODE(d.stat().st_mode) & 0o022 == 0, (d, oct(d.stat().st_mode))
    files = [p for p in out.rglob("*") if p.is_file()]
    assert files and all(stat.S_IMODE(p.stat().st_mode) & 0o022 == 0 for p in files), \
        {p.name: oct(p.stat().st_mode) for p in files}


@need_root
def test_a_run_namespace_is_held_before_it_is_named(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A kill between naming and holding left /run/netns/<prefix> that no run could prove
    its own (CI, 2026-11-28: lp1d84). The hold comes first; a failed hold names nothing
    and leaves the thread in its own namespace; teardown deletes a name only when held."""
    from testbed.emu.netns import enter_new_named, leave_netns
    from testbed.emu.nsref import held, ns_ident, release_all
    from testbed.emu.state import named_is_held, new_state

    state = state_root(tmp_path)
    monkeypatch.setenv("LIGHTPIPE_STATE_DIR", str(state))
    home = ns_ident("/proc/thread-self/ns/net")
    prefix = new_prefix(state)
    seen: list[bool] = []

    def refuse(path: str) -> None:
        seen.append(Path("/run/netns", prefix).exists())
        raise OSError(errno.EPERM, "refused")

    with pytest.raises(OSError, match="refused"):
        enter_new_named(prefix, refuse)
    assert seen == [False] and not Path("/run/netns", prefix).exists()
    assert ns_ident("/proc/thread-self/ns/net") == home

    st = new_state(prefix)

    def hold(path: str) -> None:
        seen.append(Path("/run/netns", prefix).exists())
        st.hold_netns("netns", path)

    back = enter_new_named(prefix, hold)
    inside = ns_ident("/proc/thread-self/ns/net")
    leave_netns(back)
    try:
        assert seen == [False, False] and ns_ident("/proc/thread-self/ns/net") == home
        assert ns_ident(Path("/run/netns", prefix)) == inside != home
        assert held(Path(st.state_dir)) == {"netns": inside}
        assert named_is_held(Path(st.state_dir), prefix)
        # a namespace the run does not hold is not its own
        other = new_prefix(state)
        subprocess.run(["ip", "netns", "add", other], check=True)
        try:
            assert not named_is_held(Path(st.state_dir), other)
        finally:
            subprocess.run(["ip", "netns", "del", other], check=False)
    finally:
        subprocess.run(["ip", "netns", "del", prefix], check=False)
        release_all(Path(st.state_dir))
