"""Link emulators for one fibre's middle namespace: the user-space forwarder, or netem + HTB.

Both give the fibre its rate, a bounded FIFO with tail drop, a constant one-way delay,
optional random loss, and a cap per lightpath (802.1Q VLAN id).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import testbed
from testbed.emu.forwarder import control_request, default_queue_bytes
from testbed.emu.plan import FibrePlan
from testbed.errors import RuntimeFailure

log = logging.getLogger(__name__)
MTU_BYTES = 1514


class LinkEmulator:
    """Base: a fibre's emulator living in the middle node (namespace of pid ns_pid)."""

    mode = "none"

    def __init__(self, fibre: FibrePlan, ns_pid: int, intf_u: str, intf_v: str,
                 caps_mbps: dict[int, float], state_dir: Path, seed: int = 1) -> None:
        self.fibre = fibre
        self.ns_pid = ns_pid
        self.intf_u, self.intf_v = intf_u, intf_v
        self.caps_mbps = dict(caps_mbps)
        self.state_dir = state_dir
        self.seed = seed
        self.pid: int | None = None

    def start(self) -> None:
        raise NotImplementedError

    def wait_ready(self) -> None:
        return None

    def stop(self) -> None:
        return None

    def set_cap(self, vlan: int, rate_mbps: float | None) -> None:
        raise NotImplementedError

    def describe(self) -> dict[str, object]:
        return {"mode": self.mode, "rate_mbps": self.fibre.rate_mbps,
                "delay_ms": self.fibre.delay_ms, "loss": self.fibre.loss,
                "caps_mbps": {str(k): v for k, v in self.caps_mbps.items()}}


class ForwarderLink(LinkEmulator):
    """A testbed.emu.forwarder process in the middle namespace."""

    mode = "userspace"

    @property
    def control(self) -> str:
        return str(self.state_dir / f"{self.fibre.middle}.sock")

    def start(self) -> None:
        f = self.fibre
        argv = ["mnexec", "-a", str(self.ns_pid), sys.executable, "-m",
                "testbed.emu.forwarder", "--if-a", self.intf_u, "--if-b", self.intf_v,
                "--rate-mbps", repr(f.rate_mbps), "--delay-ms", repr(f.delay_ms),
                "--loss", repr(f.loss), "--seed", str(self.seed), "--control", self.control,
                "--name", f"{f.u}-{f.v}"]
        for vlan, rate in sorted(self.caps_mbps.items()):
            argv += ["--vlan", f"{vlan}={rate!r}"]
        env = {**os.environ,
               "PYTHONPATH": str(Path(testbed.__file__).resolve().parent.parent)}
        log_path = self.state_dir / f"{f.middle}.log"
        with open(log_path, "ab") as logf:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=logf, stderr=logf,
                                    env=env, start_new_session=True)
        self.proc = proc
        self.pid = proc.pid  # mnexec execs the interpreter: same pid

    def wait_ready(self, timeout_s: float = 20.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                tail = (self.state_dir / f"{self.fibre.middle}.log").read_text()[-400:]
                raise RuntimeFailure(f"forwarder of fibre {self.fibre.u}-{self.fibre.v} "
                                     f"exited: {tail.strip()}")
            with contextlib.suppress(OSError, ValueError):
                if control_request(self.control, {"cmd": "ping"}, timeout_s=1.0).get("ok"):
                    return
            time.sleep(0.05)
        raise RuntimeFailure(f"forwarder of fibre {self.fibre.u}-{self.fibre.v} not ready")

    def stop(self) -> None:
        proc = getattr(self, "proc", None)
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=2)

    def request(self, req: dict[str, object]) -> dict[str, object]:
        return control_request(self.control, req)

    def set_cap(self, vlan: int, rate_mbps: float | None) -> None:
        req: dict[str, object] = ({"vlan": vlan, "remove": True} if rate_mbps is None
                                  else {"vlan": vlan, "rate_mbps": rate_mbps})
        reply = self.request(req)
        if not reply.get("ok"):
            raise RuntimeFailure(f"forwarder refused {req}: {reply.get('error')}")
        if rate_mbps is None:
            self.caps_mbps.pop(vlan, None)
        else:
            self.caps_mbps[vlan] = rate_mbps

    def stats(self) -> dict[str, object]:
        return dict(self.request({"cmd": "stats"}).get("stats", {}))  # type: ignore[call-overload]


def netem_limit_packets(rate_mbps: float, delay_ms: float) -> int:
    """netem queue in packets: the bandwidth-delay product (both ways) plus a queue."""
    bdp_bytes = default_queue_bytes(rate_mbps, delay_ms)
    return max(1000, math.ceil(2 * bdp_bytes / MTU_BYTES))


def htb_burst_bytes(rate_mbps: float) -> int:
    """HTB burst: >= 15 kB at 1 Gbit/s (measured), scaled with the rate."""
    return max(15_000, int(rate_mbps * 1e6 / 8 / 1000 * 2))


class NetemLink(LinkEmulator):
    """Kernel emulation: mirred between the two veths, HTB (fibre + per-VLAN caps), netem."""

    mode = "netem"

    def _tc(self, script: str) -> None:
        r = subprocess.run(["mnexec", "-a", str(self.ns_pid), "tc", "-batch", "-"],
                           input=script, capture_output=True, text=True, check=False)
        if r.returncode != 0:
            raise RuntimeFailure(f"tc in middle node {self.fibre.middle}: {r.stderr.strip()}")

    def script(self) -> str:
        """The tc batch that sets up both directions (pure: tested without root)."""
        f = self.fibre
        lines = []
        limit = netem_limit_packets(f.rate_mbps, f.delay_ms)
        loss = f" loss {f.loss * 100:.4f}%" if f.loss else ""
        for src, dst in ((self.intf_u, self.intf_v), (self.intf_v, self.intf_u)):
            for name in (src, dst):
                if not all(c.isalnum() or c in "-_" for c in name):
                    raise ValueError(f"unsafe interface name {name!r}")
            lines.append(f"qdisc add dev {src} handle ffff: ingress")
            lines.append(f"filter add dev {src} parent ffff: protocol all prio 1 u32 "
                         f"match u32 0 0 action mirred egress redirect dev {dst}")
            rate = f"{f.rate_mbps:.6f}mbit"
            burst = htb_burst_bytes(f.rate_mbps)
            lines.append(f"qdisc add dev {dst} root handle 1: htb default 2 r2q 100")
            lines.append(f"class add dev {dst} parent 1: classid 1:1 htb rate {rate} "
                         f"burst {burst} cburst {burst}")
            lines.append(f"class add dev {dst} parent 1:1 classid 1:2 htb rate {rate} "
                         f"ceil {rate} burst {burst} cburst {burst}")
            lines.append(f"qdisc add dev {dst} parent 1:2 handle 2: netem delay "
                         f"{f.delay_ms:.6f}ms limit {limit}{loss}")
            for i, (vlan, cap) in enumerate(sorted(self.caps_mbps.items())):
                cid = 10 + i
                crate = f"{min(cap, f.rate_mbps):.6f}mbit"
                cb = htb_burst_bytes(cap)
                lines.append(f"class add dev {dst} parent 1:1 classid 1:{cid} htb rate "
                             f"{crate} ceil {crate} burst {cb} cburst {cb}")
                lines.append(f"qdisc add dev {dst} parent 1:{cid} handle {cid}: netem delay "
                             f"{f.delay_ms:.6f}ms limit {netem_limit_packets(cap, f.delay_ms)}"
                             f"{loss}")
                # The tag is skb metadata after the ingress redirect: flower reads it there.
                lines.append(f"filter add dev {dst} parent 1: protocol 802.1Q prio 10 flower "
                             f"vlan_id {vlan} classid 1:{cid}")
        return "\n".join(lines) + "\n"

    def start(self) -> None:
        self._tc(self.script())

    NETEM_CONTROL = "netem:"  # a layout `control` naming a descriptor file: "netem:<path>"

    def descriptor(self) -> dict[str, object]:
        """What another process (the SDN controller) needs to re-shape this fibre."""
        from dataclasses import asdict

        return {"fibre": asdict(self.fibre), "ns_pid": self.ns_pid, "intf_u": self.intf_u,
                "intf_v": self.intf_v, "caps_mbps": {str(k): v for k, v in
                                                     self.caps_mbps.items()},
                "state_dir": str(self.state_dir), "seed": self.seed}

    def write_descriptor(self) -> str:
        """Write the descriptor next to the run state; return the layout control string."""
        import json

        path = self.state_dir / f"{self.fibre.middle}.netem.json"
        path.write_text(json.dumps(self.descriptor()))
        return self.NETEM_CONTROL + str(path)

    @classmethod
    def from_descriptor(cls, d: dict[str, object]) -> NetemLink:
        fibre = FibrePlan(**d["fibre"])  # type: ignore[arg-type]
        caps = {int(k): float(v) for k, v in d["caps_mbps"].items()}  # type: ignore[union-attr]
        return cls(fibre, int(d["ns_pid"]), str(d["intf_u"]), str(d["intf_v"]),  # type: ignore[call-overload]
                   caps, Path(str(d["state_dir"])), seed=int(d["seed"]))  # type: ignore[call-overload]

    def set_cap(self, vlan: int, rate_mbps: float | None) -> None:
        if rate_mbps is None:
            self.caps_mbps.pop(vlan, None)
        else:
            self.caps_mbps[vlan] = rate_mbps
        # Rebuild both directions (a few tc lines; caps change rarely).
        for dev in (self.intf_u, self.intf_v):
            subprocess.run(["mnexec", "-a", str(self.ns_pid), "tc", "qdisc", "del", "dev", dev,
                            "root"], check=False, capture_output=True)
            subprocess.run(["mnexec", "-a", str(self.ns_pid), "tc", "qdisc", "del", "dev", dev,
                            "ingress"], check=False, capture_output=True)
        self._tc(self.script())


def shell_quote(argv: list[str]) -> str:
    return " ".join(shlex.quote(a) for a in argv)
