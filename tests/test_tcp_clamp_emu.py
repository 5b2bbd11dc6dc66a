"""Root test: a route's locked cwnd clamps the first connection to a peer only once the
kernel's TCP metrics cache holds that peer (testbed.emu.tcp_tuning.prime_window_clamps)."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time

import pytest

pytestmark = [pytest.mark.root, pytest.mark.serial]

need_root = pytest.mark.skipif(
    os.geteuid() != 0 or not all(shutil.which(t) for t in ("mnexec", "iperf3", "ss")),
    reason="needs root, mnexec (Debian mininet), iperf3 and ss")
CLAMP_SEGMENTS = 40  # well under the path's BDP (100 Mbit/s x 20 ms: 165 segments)


def _max_cwnd_during_iperf(lt, seconds: float = 3.0) -> int:  # type: ignore[no-untyped-def]
    """The largest cwnd `ss` shows for host a's connections to b while iperf3 runs."""
    from testbed.emu.linkbench import IP_B

    seen = [0]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            out = subprocess.run(["mnexec", "-a", str(lt.pid("a")), "ss", "-tin", "dst", IP_B],
                                 capture_output=True, text=True, check=False).stdout
            for tok in out.split():
                if tok.startswith("cwnd:"):
                    seen[0] = max(seen[0], int(tok[5:]))
            time.sleep(0.05)

    t = threading.Thread(target=sample)
    t.start()
    try:
        lt.iperf(seconds=seconds, warmup_s=0.5, port=5231)
    finally:
        done.set()
        t.join()
    return seen[0]


@need_root
def test_primed_clamp_holds_the_first_connection() -> None:
    from testbed.emu.linkbench import IP_A, IP_B, LinkTestbed
    from testbed.emu.tcp_tuning import cached_cwnd_clamps, prime_window_clamps
    from testbed.orchestrate.launch import Host

    with LinkTestbed(100.0, 10.0) as lt:
        a = Host("a", IP_A, None, ("mnexec", "-a", str(lt.pid("a"))))
        b = Host("b", IP_B, None, ("mnexec", "-a", str(lt.pid("b"))))
        for h, peer in ((a, IP_B), (b, IP_A)):
            subprocess.run([*h.prefix, "ip", "route", "replace", f"{peer}/32", "dev",
                            lt.nodes[lt.fibre.roadm_u if h is a else lt.fibre.roadm_v]
                            .defaultIntf().name, "cwnd", "lock", str(CLAMP_SEGMENTS)],
                           check=True)
        # no cache entry yet: the route's lock does not reach a fresh connection
        assert IP_B not in cached_cwnd_clamps(a)
        unclamped = _max_cwnd_during_iperf(lt)
        subprocess.run([*a.prefix, "ip", "tcp_metrics", "flush", "all"], check=True)
        subprocess.run([*b.prefix, "ip", "tcp_metrics", "flush", "all"], check=True)
        primed = prime_window_clamps([(a, b)])
        assert primed == {"a": 1, "b": 1}
        assert cached_cwnd_clamps(a) == {IP_B: CLAMP_SEGMENTS}
        assert cached_cwnd_clamps(b) == {IP_A: CLAMP_SEGMENTS}
        for h in (a, b):  # the hosts' own setting is back: no connection seeds the next
            assert subprocess.run([*h.prefix, "sysctl", "-n", "net.ipv4.tcp_no_metrics_save"],
                                  capture_output=True, text=True).stdout.strip() == "1"
        clamped = _max_cwnd_during_iperf(lt)
    assert unclamped > CLAMP_SEGMENTS, unclamped
    assert 0 < clamped <= CLAMP_SEGMENTS, clamped
