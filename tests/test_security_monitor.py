"""Attacks on the long-lived monitor and a run's Prometheus by another local user (issue
27, findings 4, 5, 6, 12), and `lightpipe monitor up --foreground` as a service (issue 22).

Each attack test creates a second user (useradd) and removes it (userdel -r). The
monitor runs as root, like LightPipe; the directories an attacker must reach live in
a /var/tmp directory open to every user (a pytest tmp_path is 0700 and would hide them).
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ENTRY = "import sys; from testbed.cli.main import main; sys.exit(main(sys.argv[1:]))"
PROMETHEUS = shutil.which("prometheus")

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (a second user, chown)"),
    pytest.mark.skipif(PROMETHEUS is None, reason="needs prometheus"),
    pytest.mark.skipif(shutil.which("useradd") is None, reason="needs useradd"),
]


@dataclass
class User:
    """A throw-away local user."""

    name: str
    uid: int
    gid: int

    def run(self, *argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["runuser", "-u", self.name, "--", *argv],
                              capture_output=True, text=True, timeout=60)


@pytest.fixture
def other_user() -> Iterator[User]:
    name = f"lpm{secrets.token_hex(3)}"
    subprocess.run(["useradd", "-m", "-s", "/bin/sh", name], check=True)
    try:
        pw = pwd.getpwnam(name)
        yield User(name, pw.pw_uid, pw.pw_gid)
    finally:
        subprocess.run(["userdel", "-r", name], capture_output=True)


@pytest.fixture
def open_base() -> Iterator[Path]:
    """A directory every user may traverse and none but root may write (like /var/lib)."""
    base = Path(tempfile.mkdtemp(prefix="lpmon-test-", dir="/var/tmp"))
    base.chmod(0o755)
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _cli(*args: str, umask: int | None = None, timeout: float = 120
         ) -> subprocess.CompletedProcess[str]:
    pre = (lambda: os.umask(umask)) if umask is not None else None
    return subprocess.run([sys.executable, "-c", ENTRY, *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout, preexec_fn=pre)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


@contextlib.contextmanager
def _monitor(mdir: Path, *extra: str) -> Iterator[dict]:
    res = _cli("monitor", "up", "--dir", str(mdir), "--port", "0", "--json", *extra)
    assert res.returncode == 0, res.stderr
    try:
        yield json.loads(res.stdout)
    finally:
        _cli("monitor", "down", "--dir", str(mdir))


def _one_line_error(res: subprocess.CompletedProcess[str], code: int = 2) -> str:
    assert res.returncode == code, (res.returncode, res.stdout, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    return lines[0]


# ---- finding 4: no lifecycle API ----------------------------------------------------------
def test_other_user_cannot_quit_or_reload_the_monitor_or_a_runs_prometheus(
        other_user: User, open_base: Path) -> None:
    from testbed.metrics.prometheus import PrometheusServer

    run = PrometheusServer(open_base / "run")
    run.start()
    try:
        with _monitor(open_base / "m") as st:
            for url in (st["url"], run.url):
                for path in ("/-/quit", "/-/reload"):
                    res = other_user.run("curl", "-s", "-o", "/dev/null", "-w", "%{http_code}",
                                         "-X", "POST", f"{url}{path}")
                    assert res.stdout != "200", f"{url}{path} answered 200 to {other_user.name}"
                assert _ready(url)
            assert "--web.enable-lifecycle" not in Path(f"/proc/{st['pid']}/cmdline").read_text()
            assert run.proc is not None and run.proc.poll() is None
    finally:
        run.stop()


def test_monitor_reloads_by_sighup_to_its_verified_pid(open_base: Path) -> None:
    """A changed configuration reaches the running monitor by SIGHUP (no HTTP reload);
    a PID file naming another process is never signalled."""
    from testbed.errors import RuntimeFailure
    from testbed.monitor.server import Monitor

    mdir = open_base / "m"
    with _monitor(mdir) as st:
        again = _cli("monitor", "up", "--dir", str(mdir), "--scrape-interval-s", "2", "--json")
        assert again.returncode == 0, again.stderr
        assert json.loads(again.stdout)["pid"] == st["pid"]
        end = time.monotonic() + 30
        cfg = ""
        while time.monotonic() < end and "scrape_interval: 2s" not in cfg:
            with urllib.request.urlopen(f"{st['url']}/api/v1/status/config") as r:
                cfg = json.loads(r.read())["data"]["yaml"]
            time.sleep(0.2)
        assert "scrape_interval: 2s" in cfg
        sleeper = subprocess.Popen(["sleep", "300"])
        try:
            with pytest.raises(RuntimeFailure, match="not prometheus"):
                Monitor(mdir).reload(sleeper.pid)
            assert sleeper.poll() is None
        finally:
            sleeper.kill()
            sleeper.wait()


# ---- finding 5: the monitor's directory -----------------------------------------------------
def test_umask_000_leaves_nothing_another_user_can_write(other_user: User,
                                                         open_base: Path) -> None:
    """Under umask 000 the old monitor made its dir, targets/ and prometheus.yml
    world-writable; another user then forged a run and rewrote the config."""
    from testbed.metrics.query import wait_for
    from testbed.monitor.server import Monitor

    mdir = open_base / "lib" / "m"  # lib/ is made too, like /var/lib/lightpipe
    res = _cli("monitor", "up", "--dir", str(mdir), "--port", "0", "--json", umask=0)
    assert res.returncode == 0, res.stderr
    try:
        st = json.loads(res.stdout)
        assert stat.S_IMODE(os.stat(mdir.parent).st_mode) == 0o755
        for p in (mdir, mdir / "targets", mdir / "data", mdir / "prometheus.yml",
                  mdir / "prometheus.log", mdir / "monitor.json"):
            s = os.lstat(p)
            assert not s.st_mode & 0o022, f"{p} mode {stat.S_IMODE(s.st_mode):04o}"
            assert not s.st_mode & 0o007, f"{p} is open to others"
        assert os.stat(mdir).st_uid == 0 and os.stat(mdir / "targets").st_uid == 0
        for target in (mdir / "targets" / "run-forged.json", mdir / "prometheus.yml"):
            w = other_user.run("sh", "-c", f"echo '[]' > {target}")
            assert w.returncode != 0, f"{other_user.name} wrote {target}"
        assert "[]" not in (mdir / "prometheus.yml").read_text()
        # Where the prometheus user exists it runs the server, and still reads the runs.
        try:
            prom_uid: int | None = pwd.getpwnam("prometheus").pw_uid
        except KeyError:
            prom_uid = None
        if prom_uid is not None:
            assert os.stat(f"/proc/{st['pid']}").st_uid == prom_uid
        addr = st["url"].split("://")[1]
        Monitor(mdir).register("selfscrape", [(addr, {"run": "selfscrape"})])
        assert wait_for(st["url"], 'up{run="selfscrape"} == 1', timeout_s=30)
    finally:
        _cli("monitor", "down", "--dir", str(mdir))


def test_a_given_dir_that_others_control_is_refused(other_user: User,
                                                   open_base: Path) -> None:
    writable = open_base / "writable"
    writable.mkdir()
    writable.chmod(0o777)
    theirs = open_base / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, other_user.uid, other_user.gid)
    link = open_base / "link"
    ours = open_base / "ours"
    ours.mkdir()
    link.symlink_to(ours)
    os.lchown(link, other_user.uid, other_user.gid)
    for d, why in ((writable, "writable"), (theirs, f"owned by {other_user.name}"),
                   (link, "symlink owned by")):
        try:
            line = _one_line_error(_cli("monitor", "up", "--dir", str(d), "--port", "0"))
            assert str(d) in line and why in line
        finally:
            _cli("monitor", "down", "--dir", str(d))
        assert not (d / "prometheus.yml").exists()


def test_the_log_is_not_written_through_a_planted_symlink(open_base: Path) -> None:
    victim = open_base / "victim"
    victim.write_text("root's file\n")
    victim.chmod(0o600)
    mdir = open_base / "m"
    mdir.mkdir(mode=0o750)
    (mdir / "prometheus.log").symlink_to(victim)
    try:
        line = _one_line_error(_cli("monitor", "up", "--dir", str(mdir), "--port", "0"), 1)
        assert "prometheus.log" in line
    finally:
        _cli("monitor", "down", "--dir", str(mdir))
    assert victim.read_text() == "root's file\n"


def test_registrations_of_other_users_are_not_trusted(other_user: User,
                                                      open_base: Path) -> None:
    mdir = open_base / "m"
    with _monitor(mdir):
        forged = mdir / "targets" / "run-forged.json"
        forged.write_text("[]")
        os.chown(forged, other_user.uid, other_user.gid)
        res = _cli("monitor", "status", "--dir", str(mdir), "--json")
        assert res.returncode == 0 and json.loads(res.stdout)["runs"] == []
        # targets/ opened to others later: a run no longer registers there
        from testbed.errors import InputError
        from testbed.monitor.server import Monitor, running_monitor

        assert running_monitor(mdir) is not None
        (mdir / "targets").chmod(0o777)
        assert running_monitor(mdir) is None
        with pytest.raises(InputError, match="writable"):
            Monitor(mdir).register("r1", [("127.0.0.1:9", {"run": "r1"})])
        (mdir / "targets").chmod(0o750)


# ---- finding 6: `monitor down` and the PID file -----------------------------------------------
def test_down_never_kills_a_process_that_is_not_its_prometheus(other_user: User,
                                                               open_base: Path) -> None:
    """A PID file naming another user's Prometheus (other data dir) or a process whose
    binary merely starts with 'prometheus' (node exporter): refused, both live on."""
    theirs = open_base / "theirs"
    theirs.mkdir()
    (theirs / "prometheus.yml").write_text("global: {}\n")
    (theirs / "data").mkdir()
    os.chown(theirs / "data", other_user.uid, other_user.gid)
    exporter = theirs / "prometheus-node-exporter"
    shutil.copy("/bin/sleep", exporter)
    ids = {"user": other_user.uid, "group": other_user.gid, "extra_groups": []}
    procs = [
        subprocess.Popen([str(PROMETHEUS), f"--config.file={theirs / 'prometheus.yml'}",
                          f"--storage.tsdb.path={theirs / 'data'}",
                          f"--web.listen-address=127.0.0.1:{_free_port()}"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **ids),
        subprocess.Popen([str(exporter), "300"], **ids)]
    try:
        mdir = open_base / "m"
        mdir.mkdir(mode=0o750)
        for p in procs:
            (mdir / "prometheus.pid").write_text(f"{p.pid}\n")
            down = _cli("monitor", "down", "--dir", str(mdir))
            assert p.poll() is None, f"monitor down killed pid {p.pid}"
            line = _one_line_error(down, 1)
            assert f"not stopping pid {p.pid}" in line
            assert not (mdir / "prometheus.pid").exists()
            (mdir / "prometheus.pid").write_text(f"{p.pid}\n")
            st = _cli("monitor", "status", "--dir", str(mdir))
            assert st.returncode == 1 and "stale PID file" in st.stdout
    finally:
        for p in procs:
            p.kill()
            p.wait()


# ---- finding 12: --listen ----------------------------------------------------------------------
def test_listen_must_be_an_ip_literal_and_the_url_is_the_one_bound(tmp_path: Path) -> None:
    try:
        for args in (("monitor", "up", "--dir", str(tmp_path / "m"), "--port", "0"),
                     ("monitor", "serve", str(tmp_path), "--port", "0")):
            for bad in ("", "localhost", "127.0.0.1 ", "0"):
                line = _one_line_error(_cli(*args, "--listen", bad))
                assert line.startswith("lightpipe: error: --listen:"), line
    finally:
        _cli("monitor", "down", "--dir", str(tmp_path / "m"))
    assert not (tmp_path / "m").exists()
    with _monitor(tmp_path / "m", "--listen", "127.0.0.2") as st:
        assert st["url"].startswith("http://127.0.0.2:")
        assert _ready(st["url"])
        assert not _ready(st["url"].replace("127.0.0.2", "127.0.0.1"))


# ---- issue 22: the monitor as a service ---------------------------------------------------------
def test_foreground_serves_registers_and_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    from testbed.metrics.query import wait_for
    from testbed.monitor.server import running_monitor

    mdir, port = tmp_path / "m", _free_port()
    proc = subprocess.Popen([sys.executable, "-c", ENTRY, "monitor", "up", "--foreground",
                             "--dir", str(mdir), "--port", str(port)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # printed once ready
        url = f"http://127.0.0.1:{port}"
        assert line.startswith(f"prometheus up at {url} (pid "), (line, proc.stderr)
        prom_pid = int(line.split("(pid ")[1].split(")")[0])
        assert _ready(url)
        assert int((mdir / "prometheus.pid").read_text()) == prom_pid
        assert _cli("monitor", "status", "--dir", str(mdir)).returncode == 0
        again = _cli("monitor", "up", "--dir", str(mdir), "--json")
        assert json.loads(again.stdout)["pid"] == prom_pid  # found, not started twice
        twice = _cli("monitor", "up", "--foreground", "--dir", str(mdir), "--port",
                     str(_free_port()))
        assert "already runs" in _one_line_error(twice, 1)
        mon = running_monitor(mdir)  # what every run does
        assert mon is not None
        mon.register("fg-run", [(f"127.0.0.1:{port}", {"run": "fg-run"})])
        assert wait_for(url, 'up{run="fg-run"} == 1', timeout_s=30)
        mon.unregister("fg-run")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, proc.stderr.read() if proc.stderr else ""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert not (mdir / "prometheus.pid").exists()
    assert not Path(f"/proc/{prom_pid}").exists()
    assert not _ready(url)


def test_foreground_exit_status_is_prometheus_s(tmp_path: Path) -> None:
    """Prometheus killed under the supervisor: it exits 128+9 (systemd's on-failure
    restarts it) and leaves no PID file."""
    mdir = tmp_path / "m"
    proc = subprocess.Popen([sys.executable, "-c", ENTRY, "monitor", "up", "--foreground",
                             "--dir", str(mdir), "--port", str(_free_port()), "--json"],
                            cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        lines = []
        for line in proc.stdout:  # `--json`: the status, printed once ready
            lines.append(line)
            if line == "}\n":
                break
        st = json.loads("".join(lines))
        assert st["running"] and Path(f"/proc/{st['pid']}").exists()
        os.kill(st["pid"], signal.SIGKILL)
        assert proc.wait(60) == 128 + signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert not (mdir / "prometheus.pid").exists()


def test_foreground_port_is_strict(tmp_path: Path) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        line = _one_line_error(_cli("monitor", "up", "--foreground", "--dir",
                                    str(tmp_path / "m"), "--port", str(port)))
    assert f"127.0.0.1:{port} is taken by pid {os.getpid()}" in line
    assert not (tmp_path / "m" / "prometheus.pid").exists()
    line = _one_line_error(_cli("monitor", "up", "--foreground", "--dir",
                                str(tmp_path / "m"), "--port", "0"))
    assert "--port" in line


def test_root_runs_find_the_default_monitor_without_a_flag(monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    from testbed.monitor.server import Monitor

    monkeypatch.delenv("LIGHTPIPE_MONITOR_DIR", raising=False)
    assert Monitor().dir == Path("/var/lib/lightpipe/prometheus")
