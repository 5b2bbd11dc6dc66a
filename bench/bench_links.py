"""Link accuracy of both link modes side by side: the user-space forwarder (here) and
netem + HTB (in a VM with Debian's kernel, through tests/vm/run.sh).

    sudo .venv/bin/python bench/bench_links.py                     # userspace here, netem in the VM
    sudo .venv/bin/python bench/bench_links.py --mode userspace    # one mode, this kernel
    sudo .venv/bin/python bench/bench_links.py --mode netem --json out.json   # (inside the VM)

Per case: RTT over 50 pings (median, p99, worst, each minus 2 x delay) and TCP goodput /
rate (iperf3, receiver side, after a warm-up). Rates stay low (<= 50 Mbit/s) so that the
VM's software emulation (TCG) is not the bottleneck.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

CASES = ((10.0, 5.0), (20.0, 10.0), (50.0, 20.0))  # (rate_mbps, one-way delay_ms)
PINGS = 50


def measure(mode: str) -> list[dict[str, Any]]:
    import platform

    from testbed.emu.linkbench import LinkTestbed

    rows = []
    for rate, delay in CASES:
        with LinkTestbed(rate, delay, link_mode=mode) as lt:
            rtts = sorted(r for r in _pings(lt) if r is not None)
            res = lt.iperf(seconds=5.0, warmup_s=1.5)
        rows.append({"mode": mode, "kernel": platform.release(), "rate_mbps": rate,
                     "delay_ms": delay, "pings": len(rtts),
                     "rtt_median_ms": rtts[len(rtts) // 2] if rtts else None,
                     "rtt_p99_ms": rtts[min(len(rtts) - 1, int(0.99 * len(rtts)))]
                     if rtts else None,
                     "rtt_max_ms": rtts[-1] if rtts else None,
                     "goodput_mbps": res.goodput_mbps,
                     "goodput_ratio": res.goodput_mbps / rate})
    return rows


def _pings(lt: Any) -> list[float | None]:
    from testbed.emu.linkbench import IP_B
    from testbed.emu.probes import icmp_ping

    return icmp_ping(f"/proc/{lt.pid('a')}/ns/net", IP_B, count=PINGS, interval_s=0.02)


def in_vm() -> list[dict[str, Any]]:
    """Run this script with --mode netem inside the VM harness; return its rows."""
    out = Path(tempfile.mkdtemp(prefix="lp-bench-vm-"))
    env = {**os.environ, "LIGHTPIPE_VM_OUT": str(out),
           "PYTHONPATH": os.environ.get("PYTHONPATH", str(REPO))}
    cmd = ["bash", str(REPO / "tests" / "vm" / "run.sh"), "--cmd",
           f"python bench/bench_links.py --mode netem --json {out}/netem.json"]
    r = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, check=False)
    path = out / "netem.json"
    if r.returncode != 0 or not path.exists():
        raise SystemExit(f"the VM run failed ({r.returncode}): {r.stdout[-1500:]}"
                         f"{r.stderr[-1500:]}")
    return list(json.loads(path.read_text()))


def table(rows: list[dict[str, Any]]) -> str:
    head = (f"{'mode':<10} {'kernel':<16} {'rate':>5} {'delay':>6} {'rtt_med-2d':>10} "
            f"{'p99-2d':>7} {'max-2d':>7} {'goodput/rate':>12}")
    lines = [head]
    for r in sorted(rows, key=lambda x: (x["rate_mbps"], x["delay_ms"], x["mode"])):
        two_d = 2 * r["delay_ms"]

        def over(key: str, two_d: float = two_d, r: dict[str, Any] = r) -> str:
            return "-" if r[key] is None else f"{r[key] - two_d:+.2f}"

        lines.append(f"{r['mode']:<10} {r['kernel'][:16]:<16} {r['rate_mbps']:>5.0f} "
                     f"{r['delay_ms']:>6.1f} {over('rtt_median_ms'):>10} "
                     f"{over('rtt_p99_ms'):>7} {over('rtt_max_ms'):>7} "
                     f"{r['goodput_ratio']:>12.3f}")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=["both", "userspace", "netem"], default="both")
    ap.add_argument("--json", type=Path, help="also write the rows here")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("bench_links needs root (namespaces)", file=sys.stderr)
        return 2
    if args.mode == "both":
        rows = measure("userspace") + in_vm()
    else:
        rows = measure(args.mode)
    print(f"== link accuracy: RTT over {PINGS} pings minus 2 x delay (ms), TCP goodput/rate "
          "(target 0.90-0.97) ==")
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
