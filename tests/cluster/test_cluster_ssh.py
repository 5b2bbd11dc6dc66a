"""The machine check over real SSH: Dropbear servers on this host's loopback stand in for
the cluster's machines (root, opt-in; tests/cluster/run.sh fetches Dropbear).

Each server runs in a mount namespace of its own where root's home is an overlay: the real
/root below, the test's `.ssh/authorized_keys` above, writes kept in the test's directory
(so the test's key is the only one authorized and the real /root is never changed), with a
host key made for the test and password logins off; it listens on 127.0.0.x at a free
port and is stopped by its own PID.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from testbed.cli.main import main
from testbed.cluster.remote import check_cluster, check_machine
from testbed.cluster.spec import load_cluster
from testbed.emu.state import ProcRecord, descendants, kill_procs, proc_start_ticks
from tests.waiting import wait_until

pytestmark = [pytest.mark.root, pytest.mark.slow]

DROPBEAR_ROOT = os.environ.get("LIGHTPIPE_DROPBEAR_ROOT", "")  # a dpkg -x tree
SPEC = str(Path(__file__).resolve().parents[2] / "scenarios" / "quickstart.yaml")
VENV = str(Path(sys.executable).parent.parent)


def _tool(rel: str, name: str) -> str | None:
    if DROPBEAR_ROOT and Path(DROPBEAR_ROOT, rel).is_file():
        return str(Path(DROPBEAR_ROOT, rel))
    return shutil.which(name)


DROPBEAR = _tool("usr/sbin/dropbear", "dropbear")
DROPBEARKEY = _tool("usr/bin/dropbearkey", "dropbearkey")


def _why_skip() -> str | None:
    if os.geteuid() != 0:
        return "needs root (a mount namespace per server)"
    if DROPBEAR is None or DROPBEARKEY is None:
        return "needs Dropbear (tests/cluster/run.sh fetches it; LIGHTPIPE_DROPBEAR_ROOT)"
    if shutil.which("ssh") is None or shutil.which("ssh-keygen") is None:
        return "needs the OpenSSH client"
    return None


WHY = _why_skip()
need = pytest.mark.skipif(WHY is not None, reason=WHY or "")


def _env() -> dict[str, str]:
    env = dict(os.environ)
    if DROPBEAR_ROOT:
        libs = {str(p.parent) for p in Path(DROPBEAR_ROOT).glob("usr/lib/**/libtom*.so*")}
        env["LD_LIBRARY_PATH"] = ":".join(sorted(libs))
    return env


def _free_port(address: str) -> int:
    with socket.socket() as s:
        s.bind((address, 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    address: str
    port: int
    hostkey: Path
    proc: subprocess.Popen[bytes]

    def known_hosts_line(self) -> str:
        assert DROPBEARKEY is not None
        out = subprocess.run([DROPBEARKEY, "-y", "-f", str(self.hostkey)], env=_env(),
                             capture_output=True, text=True, check=True).stdout
        key = next(ln for ln in out.splitlines() if ln.startswith("ssh-"))
        return f"[{self.address}]:{self.port} {' '.join(key.split()[:2])}\n"

    def stop(self) -> None:
        """End the server and every process it started: the per-connection children and
        their sessions (setsid'd, so not its process group) outlive a SIGTERM to the
        listener while a client still holds its connection (a killed driver's agents)."""
        if self.proc.poll() is None:
            kill_procs([ProcRecord(p, t, "dropbear") for p in descendants(self.proc.pid)
                        if (t := proc_start_ticks(p)) is not None], grace_s=5.0)
            self.proc.wait(timeout=10)


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[Callable[..., Server]]:
    """start(address, port=None, hostkey=None, netns=None, env=None, private_netns=False)
    -> a Dropbear server trusting tmp/id.pub; with netns it runs in that network namespace
    (a stand-in machine with its own root namespace), with env its sessions get those
    variables too, with private_netns its /run/netns is a tmpfs of its own (a run's named
    namespace, the same name on every machine, is that machine's own)."""
    os.chmod(tmp_path, 0o700)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f",
                    str(tmp_path / "id")], check=True)
    upper, work = tmp_path / "upper", tmp_path / "work"
    (upper / ".ssh").mkdir(parents=True, mode=0o700)
    work.mkdir()
    shutil.copy(tmp_path / "id.pub", upper / ".ssh" / "authorized_keys")
    (upper / ".ssh" / "authorized_keys").chmod(0o600)
    started: list[Server] = []

    def start(address: str, port: int | None = None, hostkey: Path | None = None,
              netns: str | None = None, env: dict[str, str] | None = None,
              private_netns: bool = False) -> Server:
        assert DROPBEAR is not None and DROPBEARKEY is not None
        port = port or (_free_port(address) if netns is None else 2222)
        if hostkey is None:
            hostkey = tmp_path / f"hostkey-{address}-{port}-{len(started)}"
            subprocess.run([DROPBEARKEY, "-t", "ed25519", "-f", str(hostkey)], env=_env(),
                           capture_output=True, check=True)
        script = (("mount -t tmpfs lp-harness /run/netns && " if private_netns else "")
                  + f"mount -t overlay lp-harness -o lowerdir=/root,upperdir={upper},"
                  f"workdir={work} /root && exec {DROPBEAR} -F -E -s -m "
                  f"{'-e ' if env else ''}-r {hostkey} -p {address}:{port} "
                  f"-P {tmp_path}/pid-{address}-{port}")
        inside = ["ip", "netns", "exec", netns] if netns else []
        proc = subprocess.Popen([*inside, "unshare", "--mount", "--propagation", "private",
                                 "sh", "-c", script], env={**_env(), **(env or {})},
                                stdout=subprocess.DEVNULL,
                                stderr=open(tmp_path / f"log-{address}-{port}", "ab"))
        server = Server(address, port, hostkey, proc)
        started.append(server)
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection((address, port), timeout=1).close()
                return server
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise AssertionError((tmp_path / f"log-{address}-{port}").read_text()
                                         ) from None
                time.sleep(0.05)

    try:
        yield start
    finally:
        for s in started:
            s.stop()


def _cluster_file(tmp_path: Path, machines: list[dict[str, Any]], **ssh: Any) -> Path:
    import yaml

    f = tmp_path / "cluster.yaml"
    f.write_text(yaml.safe_dump({"name": "harness", "venv": VENV,
                                 "ssh": {"key": "id", "known_hosts": "known_hosts",
                                         "connect_timeout_s": 5, **ssh},
                                 "machines": machines}))
    return f


@need
def test_two_machines_checked_over_ssh(servers: Callable[..., Server], tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    a, b = servers("127.0.0.1"), servers("127.0.0.2")
    (tmp_path / "known_hosts").write_text(a.known_hosts_line() + b.known_hosts_line())
    f = _cluster_file(tmp_path, [
        {"name": "m1", "address": a.address, "port": a.port},
        {"name": "m2", "address": b.address, "port": b.port, "venv": "/nonexistent/venv"}])
    t0 = time.monotonic()
    one, two = check_cluster(load_cluster(f))
    took_s = time.monotonic() - t0
    with capsys.disabled():
        print(f"\ncheck of 2 machines over ssh, side by side: {took_s:.2f} s")
    assert one.ok, one.line()
    assert set(one.tools) == {"ip", "tc", "ovs-vswitchd", "ovs-vsctl", "mnexec"}
    assert (one.root, one.venv, one.vxlan, one.underlay_dev) == ("yes", "ok", "yes", "lo")
    assert one.line().startswith("m1 (127.0.0.1): ok (kernel ")
    assert two.reachable and not two.ok
    assert "no venv (bin/python) at the venv path" in two.problems
    code = main(["cluster", "check", "--cluster", str(f), SPEC])
    out, err = capsys.readouterr()
    assert code == 1
    assert "crossing fibres:" in out and "check m1 (127.0.0.1): ok" in out
    assert err.startswith("lightpipe: error: machine m2 (127.0.0.2): ") and "no venv" in err
    assert err.count("\n") == 1


@need
def test_host_keys_strict_accept_new_and_changed(servers: Callable[..., Server],
                                                 tmp_path: Path) -> None:
    a = servers("127.0.0.1")
    (tmp_path / "known_hosts").write_text("")
    f = _cluster_file(tmp_path, [{"name": "m1", "address": a.address, "port": a.port}])
    strict = load_cluster(f)
    res = check_machine(strict, strict.machines[0])
    assert not res.reachable and "host key not known" in res.line()
    f = _cluster_file(tmp_path, [{"name": "m1", "address": a.address, "port": a.port}],
                      host_key_checking="accept-new")
    trusting = load_cluster(f)
    assert check_machine(trusting, trusting.machines[0]).ok
    found = subprocess.run(["ssh-keygen", "-F", f"[127.0.0.1]:{a.port}", "-f",
                            str(tmp_path / "known_hosts")], capture_output=True, check=False)
    assert found.returncode == 0  # recorded (hashed where ssh_config says HashKnownHosts)
    # The same address and port with another host key: refused, even with accept-new.
    a.stop()
    servers("127.0.0.1", port=a.port)
    res = check_machine(trusting, trusting.machines[0])
    assert not res.reachable and "host key changed" in res.line()


@need
def test_unknown_client_key_refused(servers: Callable[..., Server], tmp_path: Path) -> None:
    a = servers("127.0.0.1")
    (tmp_path / "known_hosts").write_text(a.known_hosts_line())
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f",
                    str(tmp_path / "other")], check=True)
    f = _cluster_file(tmp_path, [{"name": "m1", "address": a.address, "port": a.port,
                                  "key": "other"}])
    c = load_cluster(f)
    res = check_machine(c, c.machines[0])
    assert not res.reachable and "authentication refused" in res.line()


@need
def test_stopping_a_server_ends_its_live_sessions(servers: Callable[..., Server],
                                                  tmp_path: Path) -> None:
    """A client still connected (a killed driver's agent, a hung command) kept Dropbear's
    per-connection child and its session after the listener's SIGTERM: the harness left
    them behind. stop() ends the server's whole tree."""
    srv = servers("127.0.0.1")
    (tmp_path / "known_hosts").write_text(srv.known_hosts_line())
    mark = f"lp-harness-{os.getpid()}-{time.monotonic_ns()}"
    client = subprocess.Popen(
        ["ssh", "-i", str(tmp_path / "id"), "-p", str(srv.port), "-o", "BatchMode=yes",
         "-o", f"UserKnownHostsFile={tmp_path / 'known_hosts'}", "root@127.0.0.1",
         f"exec sh -c 'sleep 300; :' {mark}"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    try:
        def session() -> list[int]:
            return [p for p in descendants(srv.proc.pid)
                    if mark.encode() in _cmdline(p)]

        wait_until(lambda: bool(session()), "the session's command running", timeout_s=30)
        tree = descendants(srv.proc.pid)
        assert len(tree) >= 3, tree  # listener, connection child, the session's command
        srv.stop()
        assert all(proc_start_ticks(p) is None for p in tree), \
            [(p, _cmdline(p)) for p in tree if proc_start_ticks(p) is not None]
        assert client.wait(timeout=30) != 0  # its connection went with the server
    finally:
        if client.poll() is None:
            client.kill()
            client.wait()


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""
