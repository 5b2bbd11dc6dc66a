"""Mininet Cluster Edition's tunnel against LightPipe's, on the same two stand-in machines
(root, opt-in): figures for docs/cluster.md, "Why not Mininet Cluster Edition".

Mininet's RemoteLink joins two servers with `ssh -o Tunnel=Ethernet -w 9:9 DEST 'echo @'`
(a tap device on each side, frames inside the SSH connection) and moves each tap into its
node's namespace. The same is done here between the harness's two stand-in machines
(OpenSSH's server in the second one's namespace, with `PermitTunnel ethernet`), beside the
VXLAN tunnel testbed.cluster.tunnel plans for the same pair, and both are measured alike:
RTT over 40 pings, TCP goodput at a fibre's emulated rate (200 Mbit/s, 3 s, iperf3), and
for SSH the CPU time of its two processes. The harness's OpenSSH server runs in a mount
namespace of its own, where /etc (a `sshd` privilege-separation user) and /run (its
/run/sshd) are overlays: nothing of the machine's own files changes.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import test_cluster_tunnel as tunnel_harness
from test_cluster_tunnel import UNDERLAY, WHY, Pair, sh

from testbed.emu.state import descendants

pytestmark = [pytest.mark.root, pytest.mark.slow]
pair_fixture = tunnel_harness.pair  # the two stand-in machines, with their VXLAN tunnels

OPENSSH_ROOT = os.environ.get("LIGHTPIPE_OPENSSH_ROOT", "")  # a dpkg -x tree
SSHD = str(Path(OPENSSH_ROOT, "usr/sbin/sshd")) if OPENSSH_ROOT else shutil.which("sshd")
TAP_NET = ("192.168.78.1", "192.168.78.2")
VX_NET = ("192.168.77.1", "192.168.77.2")
RATE = "200M"  # quickstart's fibres run at 200-300 Mbit/s emulated


def _why_skip() -> str | None:
    if WHY is not None:
        return WHY
    if SSHD is None or not Path(SSHD).is_file():
        return "needs OpenSSH's sshd (tests/cluster/run.sh fetches it; LIGHTPIPE_OPENSSH_ROOT)"
    if shutil.which("iperf3") is None or shutil.which("ssh") is None:
        return "needs iperf3 and the OpenSSH client"
    return None


need = pytest.mark.skipif(_why_skip() is not None, reason=_why_skip() or "")


def _cpu_s(pids: list[int]) -> float:
    ticks = 0
    for p in pids:
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        ticks += int(fields[11]) + int(fields[12])  # utime + stime
    return ticks / os.sysconf("SC_CLK_TCK")


@pytest.fixture
def ssh_tap(pair_fixture: Pair, tmp_path: Path) -> Iterator[tuple[Pair, list[int]]]:
    """Mininet's RemoteLink between the pair's machines: taps in both inner namespaces."""
    pair = pair_fixture
    os.chmod(tmp_path, 0o700)
    for name in ("id", "hostkey"):
        sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / name))
    shutil.copy(tmp_path / "id.pub", tmp_path / "authorized_keys")
    host_pub = " ".join((tmp_path / "hostkey.pub").read_text().split()[:2])
    (tmp_path / "known_hosts").write_text(f"[{UNDERLAY[1]}]:2222 {host_pub}\n")
    for d in ("etc-up", "etc-work", "run-up/sshd", "run-work"):
        (tmp_path / d).mkdir(parents=True)
    (tmp_path / "run-up/sshd").chmod(0o755)
    passwd = Path("/etc/passwd").read_text()
    if not re.search(r"^sshd:", passwd, re.M):
        passwd += "sshd:x:64999:65534::/run/sshd:/usr/sbin/nologin\n"
    (tmp_path / "etc-up/passwd").write_text(passwd)
    (tmp_path / "sshd_config").write_text(
        f"Port 2222\nListenAddress {UNDERLAY[1]}\nHostKey {tmp_path}/hostkey\n"
        f"AuthorizedKeysFile {tmp_path}/authorized_keys\nPermitRootLogin prohibit-password\n"
        "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\n"
        f"StrictModes no\nPermitTunnel ethernet\nPidFile {tmp_path}/sshd.pid\n")
    script = (f"mount -t overlay lp-h-etc -o lowerdir=/etc,upperdir={tmp_path}/etc-up,"
              f"workdir={tmp_path}/etc-work /etc && mount -t overlay lp-h-run -o "
              f"lowerdir=/run,upperdir={tmp_path}/run-up,workdir={tmp_path}/run-work /run "
              f"&& exec {SSHD} -D -e -f {tmp_path}/sshd_config")
    server = subprocess.Popen(["ip", "netns", "exec", pair.outer["mb"], "unshare", "--mount",
                               "--propagation", "private", "sh", "-c", script],
                              stdout=subprocess.DEVNULL,
                              stderr=open(tmp_path / "sshd.log", "wb"))
    client: subprocess.Popen[str] | None = None
    try:
        deadline = time.monotonic() + 10
        while "listening" not in (tmp_path / "sshd.log").read_text():
            assert server.poll() is None and time.monotonic() < deadline, \
                (tmp_path / "sshd.log").read_text()
            time.sleep(0.05)
        client = subprocess.Popen(
            ["ip", "netns", "exec", pair.outer["ma"], "ssh", "-p", "2222", "-o",
             "BatchMode=yes", "-o", f"UserKnownHostsFile={tmp_path}/known_hosts", "-i",
             str(tmp_path / "id"), "-o", "IdentitiesOnly=yes", "-o", "Tunnel=ethernet",
             "-w", "9:9", f"root@{UNDERLAY[1]}", "echo @; exec sleep 600"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert client.stdout is not None
        assert client.stdout.read(1) == "@", client.stderr
        for m, addr in zip(("ma", "mb"), TAP_NET, strict=True):
            sh("ip", "-n", pair.outer[m], "link", "set", "tap9", "netns", pair.inner[m])
            sh("ip", "-n", pair.inner[m], "addr", "add", f"{addr}/24", "dev", "tap9")
            sh("ip", "-n", pair.inner[m], "link", "set", "tap9", "up")
        yield pair, [client.pid, *descendants(server.pid)]
    finally:
        for p in (client, server):
            if p is not None and p.poll() is None:
                p.terminate()
                p.wait(timeout=10)


def _rtts_ms(ns: str, addr: str, count: int) -> list[float]:
    out = sh("ip", "netns", "exec", ns, "ping", "-n", "-c", str(count), "-i", "0.05", addr)
    return [float(x) for x in re.findall(r"time=([\d.]+) ms", out)]


def _goodput_mbps(pair: Pair, addr: str) -> float:
    server = subprocess.Popen(["ip", "netns", "exec", pair.inner["mb"], "iperf3", "-s", "-1",
                               "-B", addr, "-p", "5299"], stdout=subprocess.DEVNULL)
    try:
        time.sleep(0.5)
        out = sh("ip", "netns", "exec", pair.inner["ma"], "nice", "-n", "10", "iperf3", "-c",
                 addr, "-p", "5299", "-t", "3", "-b", RATE, "-J")
        return float(json.loads(out)["end"]["sum_received"]["bits_per_second"]) / 1e6
    finally:
        server.wait(timeout=20)


@need
def test_ssh_tap_against_vxlan(ssh_tap: tuple[Pair, list[int]]) -> None:
    pair, ssh_pids = ssh_tap
    t = pair.tunnels[0]
    for m, addr in zip(("ma", "mb"), VX_NET, strict=True):
        sh("ip", "-n", pair.inner[m], "addr", "add", f"{addr}/24", "dev", pair.end_device(t, m))
    n = 40
    tap_rtt = _rtts_ms(pair.inner["ma"], TAP_NET[1], n)
    vx_rtt = _rtts_ms(pair.inner["ma"], VX_NET[1], n)
    assert len(tap_rtt) == len(vx_rtt) == n  # both carry frames
    cpu0 = _cpu_s(ssh_pids)
    tap_mbps = _goodput_mbps(pair, TAP_NET[1])
    ssh_cpu_s = _cpu_s(ssh_pids) - cpu0
    vx_mbps = _goodput_mbps(pair, VX_NET[1])

    def fig(xs: list[float]) -> str:
        xs = sorted(xs)
        return (f"median {statistics.median(xs):.3f}, p90 {xs[int(0.9 * len(xs))]:.3f}, "
                f"worst {xs[-1]:.3f} ms")

    load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    print(f"\nload {load}; RTT over {n} pings: ssh tap {fig(tap_rtt)}; vxlan {fig(vx_rtt)}")
    print(f"TCP at {RATE}bit/s for 3 s: ssh tap {tap_mbps:.0f} Mbit/s received "
          f"(ssh + sshd CPU {ssh_cpu_s:.2f} s, {ssh_cpu_s / (tap_mbps * 3 / 8e3):.1f} s per "
          f"GB); vxlan {vx_mbps:.0f} Mbit/s")
    assert tap_mbps > 0 and vx_mbps > 0
