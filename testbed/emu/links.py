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
import uuid
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import testbed
from testbed.emu.forwarder import control_request, default_queue_bytes
from testbed.emu.plan import FibrePlan
from testbed.errors import RuntimeFailure

log = logging.getLogger(__name__)
MTU_BYTES = 1514


class LinkEmulator:
    """Base: a fibre's emulator living in the middle node (namespace of pid ns_pid)."""

    mode = "none"
    counters = False  # keeps user-space counters that stats() reports
    control: str | None = None  # control socket of a user-space emulator process
    # Per-pass delay the calibration (testbed.emu.calibrate) takes off the fibre's
    # configured delay, for the processing time of the path around it (None: not set).
    correction_ms: float | None = None

    def __init__(self, fibre: FibrePlan, ns_pid: int, intf_u: str, intf_v: str,
                 caps_mbps: dict[int, float], state_dir: Path, seed: int = 1) -> None:
        self.fibre = fibre
        self.ns_pid = ns_pid
        self.intf_u, self.intf_v = intf_u, intf_v
        self.caps_mbps = dict(caps_mbps)
        self.state_dir = state_dir
        self.seed = seed
        self.pid: int | None = None
        # Per lightpath (VLAN id): a further correction for that path's own processing
        # time (its DCs' ends), where the emulator can delay lightpaths apart.
        self.vlan_corrections_ms: dict[int, float] = {}

    def start(self) -> None:
        raise NotImplementedError

    def wait_ready(self, timeout_s: float = 20.0) -> None:
        return None

    def stop(self) -> None:
        return None

    def terminate(self) -> None:
        """Ask the emulator to stop without waiting (teardown signals every link first)."""
        return None

    def set_cap(self, vlan: int, rate_mbps: float | None) -> None:
        raise NotImplementedError

    def emulated_delay_ms(self, vlan: int | None = None) -> float:
        """The one-way delay the emulator runs at (for a lightpath's frames): configured
        less the correction (less the lightpath's own)."""
        extra = self.vlan_corrections_ms.get(vlan, 0.0) if vlan is not None else 0.0
        return max(0.0, self.fibre.delay_ms - (self.correction_ms or 0.0) - extra)

    def set_delay_correction(self, correction_ms: float) -> None:
        """Run at the configured delay less correction_ms (>= 0), from now on."""
        raise NotImplementedError

    def set_vlan_correction(self, vlan: int, correction_ms: float) -> bool:
        """Run the lightpath's frames correction_ms (either sign) shorter than the fibre's
        other traffic; False where this emulator cannot (no such lightpath here)."""
        return False

    def set_queue(self, vlan: int, rate_mbps: float, limit_bytes: int) -> bool:
        """Give a lightpath's cap a queue of limit_bytes; False where the emulator has no
        per-lightpath queue (netem)."""
        return False

    def control_address(self) -> str | None:
        """How another process (the SDN controller) re-shapes this fibre, if it can."""
        return None

    def stats(self) -> dict[str, object]:
        """Counters per direction and lightpath ({"directions": {}} without counters)."""
        return {"directions": {}}

    def describe(self) -> dict[str, object]:
        return {"mode": self.mode, "rate_mbps": self.fibre.rate_mbps,
                "delay_ms": self.fibre.delay_ms,
                "emulated_delay_ms": round(self.emulated_delay_ms(), 4),
                "loss": self.fibre.loss,
                "caps_mbps": {str(k): v for k, v in self.caps_mbps.items()}}


class ForwarderLink(LinkEmulator):
    """A testbed.emu.forwarder process in the middle namespace."""

    mode = "userspace"
    counters = True
    proc: subprocess.Popen[bytes] | None = None

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
        assert self.proc is not None, "start() first"
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
        raise RuntimeFailure(f"forwarder of fibre {self.fibre.u}-{self.fibre.v} did not come "
                             f"up within {timeout_s:.0f} s (see {self.state_dir}/"
                             f"{self.fibre.middle}.log)")

    def terminate(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()

    def control_address(self) -> str | None:
        return self.control

    def set_queue(self, vlan: int, rate_mbps: float, limit_bytes: int) -> bool:
        self.request({"vlan": vlan, "rate_mbps": rate_mbps, "limit_bytes": limit_bytes})
        return True

    def stop(self) -> None:
        proc = self.proc
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

    def set_delay_correction(self, correction_ms: float) -> None:
        delay = max(0.0, self.fibre.delay_ms - max(0.0, correction_ms))
        reply = self.request({"cmd": "set", "delay_ms": delay})
        if not reply.get("ok"):
            raise RuntimeFailure(f"forwarder of fibre {self.fibre.u}-{self.fibre.v} refused "
                                 f"delay {delay} ms: {reply.get('error')}")
        self.correction_ms = max(0.0, correction_ms)

    def set_vlan_correction(self, vlan: int, correction_ms: float) -> bool:
        reply = self.request({"cmd": "vlan_delay", "vlan": vlan,
                              "correction_ms": correction_ms})
        if not reply.get("ok"):
            return False
        self.vlan_corrections_ms[vlan] = correction_ms
        return True


def netem_limit_packets(rate_mbps: float, delay_ms: float) -> int:
    """netem queue in packets: the bandwidth-delay product (both ways) plus a queue."""
    bdp_bytes = default_queue_bytes(rate_mbps, delay_ms)
    return max(1000, math.ceil(2 * bdp_bytes / MTU_BYTES))


def htb_burst_bytes(rate_mbps: float) -> int:
    """HTB burst: >= 15 kB at 1 Gbit/s (measured), scaled with the rate."""
    return max(15_000, int(rate_mbps * 1e6 / 8 / 1000 * 2))


ETH_P_ALL = 0x0003
ETH_P_8021Q = 0x8100
INGRESS = 0xFFFF0000


@dataclass(frozen=True)
class Dev:
    """An interface named in a request, resolved to its index when the request is sent."""

    name: str

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class TcOp:
    """One netlink tc request: IPRoute.tc(command, kind, index=<dev>, **args)."""

    command: str
    kind: str
    dev: str
    args: dict[str, Any]

    def __str__(self) -> str:
        def show(v: Any) -> str:
            if isinstance(v, dict):
                return "{" + " ".join(f"{k}={show(x)}" for k, x in v.items()) + "}"
            if isinstance(v, list):
                return "[" + " ".join(show(x) for x in v) + "]"
            if isinstance(v, int) and not isinstance(v, bool) and v >= 0x10000:
                return f"{v >> 16:x}:{v & 0xFFFF:x}"
            return str(v)

        return f"{self.command} {self.kind} dev {self.dev} " + " ".join(
            f"{k}={show(v)}" for k, v in self.args.items())


def bytes_per_s(rate_mbps: float) -> int:
    return max(1, round(rate_mbps * 1e6 / 8))


# A lightpath's HTB class (minor) and netem leaf (major) in a netem-mode fibre follow from
# its VLAN id (2..4094), so that a process that did not build the tree finds them.
VLAN_CLASS_BASE = 0x1000


def vlan_class_minor(vlan: int) -> int:
    """HTB class minor (1:minor) of a lightpath's cap class."""
    return VLAN_CLASS_BASE + int(vlan)


def vlan_leaf_handle(vlan: int) -> int:
    """Handle (major:0) of the netem leaf under a lightpath's cap class."""
    return vlan_class_minor(vlan) << 16


class NetemLink(LinkEmulator):
    """Kernel emulation: mirred between the two veths, HTB (fibre + per-VLAN caps), netem."""

    mode = "netem"
    overhead_ms: float | None = None  # None: measured (netem_overhead_ms)

    def netem_delay_ms(self) -> float:
        """The fibre's delay less the calibration's correction where one was set, else
        less this machine's per-pass netem overhead over lo (at most half): the start-up
        guess, before the path is measured."""
        d = self.fibre.delay_ms
        if self.correction_ms is not None:
            return max(0.0, d - self.correction_ms)
        if self.overhead_ms is None:
            self.overhead_ms = netem_overhead_ms()
        return max(d / 2, d - self.overhead_ms)

    def emulated_delay_ms(self, vlan: int | None = None) -> float:
        extra = self.vlan_corrections_ms.get(vlan, 0.0) if vlan is not None else 0.0
        return max(0.0, self.netem_delay_ms() - extra)

    def _netem_args(self, vlan: int | None = None) -> dict[str, Any]:
        """tc change arguments of a netem leaf (the fibre's, or a lightpath's own)."""
        f = self.fibre
        args: dict[str, Any] = {"delay": max(0, round(self.emulated_delay_ms(vlan) * 1000)),
                                "limit": netem_limit_packets(f.rate_mbps, f.delay_ms)}
        if f.loss:
            args["loss"] = f.loss * 100
        return args

    def _change_leaves(self, pick: Any, args_of: Any) -> int:
        """tc change every netem leaf of both directions that pick(handle) accepts, with
        args_of(handle); how many were changed."""
        from pyroute2.netlink.exceptions import NetlinkError

        from testbed.emu.netns import iproute_in

        f = self.fibre
        changed = 0
        try:
            with iproute_in(f"/proc/{self.ns_pid}/ns/net") as ipr:
                for dev in (self.intf_u, self.intf_v):
                    found = ipr.link_lookup(ifname=dev)
                    if not found:
                        raise RuntimeFailure(f"middle node {f.middle}: no interface {dev}")
                    for q in ipr.get_qdiscs(index=found[0]):
                        if q.get_attr("TCA_KIND") != "netem" or not pick(q["handle"]):
                            continue
                        try:
                            ipr.tc("change", "netem", index=found[0], handle=q["handle"],
                                   parent=q["parent"], **args_of(q["handle"]))
                        except NetlinkError as exc:
                            raise RuntimeFailure(f"tc change netem in middle node "
                                                 f"{f.middle} ({dev}): {exc}") from None
                        changed += 1
        except OSError as exc:
            raise RuntimeFailure(f"middle node {f.middle} (pid {self.ns_pid}): {exc}") from None
        return changed

    def set_delay_correction(self, correction_ms: float) -> None:
        """Change the delay of every netem leaf of both directions in place (tc change:
        the HTB tree and the lightpath classes that another process, the controller, may
        have added stay), and record the correction in the descriptor for that process."""
        self.correction_ms = max(0.0, correction_ms)
        by_leaf = {vlan_leaf_handle(v): v for v in self.vlan_corrections_ms}
        if not self._change_leaves(lambda _h: True,
                                   lambda h: self._netem_args(by_leaf.get(h))):
            raise RuntimeFailure(f"middle node {self.fibre.middle}: no netem qdisc to change")
        self._update_descriptor()

    def set_vlan_correction(self, vlan: int, correction_ms: float) -> bool:
        """Give the lightpath's own netem leaf (under its cap class) correction_ms less
        delay than the fibre's other traffic; False where the lightpath has no class here."""
        old = self.vlan_corrections_ms.get(vlan)
        self.vlan_corrections_ms[vlan] = correction_ms
        leaf = vlan_leaf_handle(vlan)
        if not self._change_leaves(lambda h: h == leaf, lambda _h: self._netem_args(vlan)):
            if old is None:
                del self.vlan_corrections_ms[vlan]
            else:
                self.vlan_corrections_ms[vlan] = old
            return False
        self._update_descriptor()
        return True

    def _update_descriptor(self) -> None:
        """Rewrite the corrections in the descriptor file, if one was written (read,
        change those fields, write: its caps may be the controller's)."""
        import json

        from testbed.io.atomic import atomic_write_text

        path = self.state_dir / f"{self.fibre.middle}.netem.json"
        if not path.exists():
            return
        d = json.loads(path.read_text())
        d["correction_ms"] = self.correction_ms
        d["vlan_corrections_ms"] = {str(k): v for k, v in self.vlan_corrections_ms.items()}
        atomic_write_text(path, json.dumps(d))

    def refresh_correction(self, descriptor: dict[str, object]) -> None:
        """Take the corrections of a (re-read) descriptor: the calibration may have
        changed them after this object was built from it."""
        c = descriptor.get("correction_ms")
        self.correction_ms = None if c is None else float(c)  # type: ignore[arg-type]
        per_vlan = descriptor.get("vlan_corrections_ms") or {}
        self.vlan_corrections_ms = {int(k): float(v)  # type: ignore[union-attr]
                                    for k, v in per_vlan.items()}  # type: ignore[union-attr]

    def tc_ops(self) -> list[TcOp]:
        """The netlink tc requests that set up both directions (pure: tested without root).

        Per direction src -> dst: an ingress qdisc on src whose u32 match-all filter
        redirects (mirred) to dst; on dst an HTB tree: 1:1 at the fibre rate, 1:2 (default)
        and one class per lightpath VLAN at its cap (minor VLAN_CLASS_BASE + VLAN id), each
        with a netem leaf (delay less the lightpath's own correction, loss, limit). The
        VLAN filter is `basic` + `meta(vlan_tag)`: after the ingress redirect the tag is
        skb metadata, which u32 cannot see.
        """
        f = self.fibre
        ops: list[TcOp] = []
        loss_pct = f.loss * 100

        def netem(dst: str, parent: int, handle: int, rate_mbps: float,
                  vlan: int | None = None) -> TcOp:
            args: dict[str, Any] = {"parent": parent, "handle": handle << 16,
                                    "delay": max(0, round(self.emulated_delay_ms(vlan) * 1000)),
                                    "limit": netem_limit_packets(rate_mbps, f.delay_ms)}
            if loss_pct:
                args["loss"] = loss_pct
            return TcOp("add", "netem", dst, args)

        for src, dst in ((self.intf_u, self.intf_v), (self.intf_v, self.intf_u)):
            for name in (src, dst):
                if not name or len(name) > 15 or not all(c.isalnum() or c in "-_"
                                                         for c in name):
                    raise ValueError(f"unsafe interface name {name!r}")
            ops.append(TcOp("add", "ingress", src, {"handle": INGRESS}))
            ops.append(TcOp("add-filter", "u32", src, {
                "parent": INGRESS, "prio": 1, "protocol": ETH_P_ALL, "target": 0x10000,
                "keys": ["0x0/0x0+0"],
                "action": {"kind": "mirred", "direction": "egress", "action": "redirect",
                           "ifindex": Dev(dst)}}))
            rate = bytes_per_s(f.rate_mbps)
            burst = htb_burst_bytes(f.rate_mbps)
            ops.append(TcOp("add", "htb", dst, {"handle": 0x10000, "default": 2, "r2q": 100}))
            ops.append(TcOp("add-class", "htb", dst, {
                "parent": 0x10000, "handle": 0x10001, "rate": rate, "ceil": rate,
                "burst": burst, "cburst": burst}))
            ops.append(TcOp("add-class", "htb", dst, {
                "parent": 0x10001, "handle": 0x10002, "rate": rate, "ceil": rate,
                "burst": burst, "cburst": burst}))
            ops.append(netem(dst, 0x10002, 2, f.rate_mbps))
            for vlan, cap in sorted(self.caps_mbps.items()):
                cid = vlan_class_minor(vlan)
                crate = bytes_per_s(min(cap, f.rate_mbps))
                cb = htb_burst_bytes(cap)
                ops.append(TcOp("add-class", "htb", dst, {
                    "parent": 0x10001, "handle": 0x10000 | cid, "rate": crate, "ceil": crate,
                    "burst": cb, "cburst": cb}))
                ops.append(netem(dst, 0x10000 | cid, cid, cap, vlan))
                ops.append(TcOp("add-filter", "basic", dst, {
                    "parent": 0x10000, "prio": 10, "protocol": ETH_P_8021Q,
                    "classid": 0x10000 | cid,
                    "match": [{"kind": "meta", "object": {"kind": "vlan_tag", "opnd": "eq"},
                               "value": int(vlan)}]}))
        return ops

    def script(self) -> str:
        """The requests as text, one per line (logs, tests)."""
        return "".join(f"{op}\n" for op in self.tc_ops())

    def _apply(self, ops: list[TcOp], clear: bool = False) -> None:
        """Send the requests through netlink inside the middle node's namespace."""
        from pyroute2.netlink.exceptions import NetlinkError

        from testbed.emu.netns import iproute_in

        try:
            with iproute_in(f"/proc/{self.ns_pid}/ns/net") as ipr:
                index: dict[str, int] = {}

                def idx(dev: str) -> int:
                    if dev not in index:
                        found = ipr.link_lookup(ifname=dev)
                        if not found:
                            raise RuntimeFailure(f"middle node {self.fibre.middle}: no "
                                                 f"interface {dev}")
                        index[dev] = int(found[0])
                    return index[dev]

                if clear:
                    for dev in (self.intf_u, self.intf_v):
                        for kind, handle in (("htb", 0x10000), ("ingress", INGRESS)):
                            with contextlib.suppress(NetlinkError):
                                ipr.tc("del", kind, index=idx(dev), handle=handle)
                for op in ops:
                    args = dict(op.args)
                    action = args.get("action")
                    if isinstance(action, dict) and isinstance(action.get("ifindex"), Dev):
                        args["action"] = {**action, "ifindex": idx(action["ifindex"].name)}
                    try:
                        ipr.tc(op.command, op.kind, index=idx(op.dev), **args)
                    except NetlinkError as exc:
                        raise RuntimeFailure(f"tc in middle node {self.fibre.middle}: {op}: "
                                             f"{exc}") from None
        except OSError as exc:
            raise RuntimeFailure(f"middle node {self.fibre.middle} (pid {self.ns_pid}): "
                                 f"{exc}") from None

    def start(self) -> None:
        self._apply(self.tc_ops())

    NETEM_CONTROL = "netem:"  # a layout `control` naming a descriptor file: "netem:<path>"

    def descriptor(self) -> dict[str, object]:
        """What another process (the SDN controller) needs to re-shape this fibre."""
        from dataclasses import asdict

        self.netem_delay_ms()  # measures overhead_ms once, here, for the controller too
        return {"fibre": asdict(self.fibre), "ns_pid": self.ns_pid, "intf_u": self.intf_u,
                "intf_v": self.intf_v, "caps_mbps": {str(k): v for k, v in
                                                     self.caps_mbps.items()},
                "state_dir": str(self.state_dir), "seed": self.seed,
                "overhead_ms": self.overhead_ms, "correction_ms": self.correction_ms,
                "vlan_corrections_ms": {str(k): v for k, v in self.vlan_corrections_ms.items()}}

    def control_address(self) -> str | None:
        return self.write_descriptor()

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
        link = cls(fibre, int(d["ns_pid"]), str(d["intf_u"]), str(d["intf_v"]),  # type: ignore[call-overload]
                   caps, Path(str(d["state_dir"])), seed=int(d["seed"]))  # type: ignore[call-overload]
        if d.get("overhead_ms") is not None:  # as measured by the process that built it
            link.overhead_ms = float(d["overhead_ms"])  # type: ignore[arg-type]
        link.refresh_correction(d)
        return link

    def set_cap(self, vlan: int, rate_mbps: float | None) -> None:
        if rate_mbps is None:
            self.caps_mbps.pop(vlan, None)
        else:
            self.caps_mbps[vlan] = rate_mbps
        # Rebuild both directions (a few requests; caps change rarely).
        self._apply(self.tc_ops(), clear=True)


LINK_CLASSES: dict[str, type[LinkEmulator]] = {"userspace": ForwarderLink, "netem": NetemLink}


def shell_quote(argv: list[str]) -> str:
    return " ".join(shlex.quote(a) for a in argv)


def main(argv: list[str] | None = None) -> int:
    """python -m testbed.emu.links --descriptor D --vlan V (--rate-mbps R | --remove):
    change one lightpath cap of a netem fibre and update its descriptor (used by the
    controller process, where pyroute2 cannot run under eventlet)."""
    import argparse
    import json

    from testbed.io.atomic import atomic_write_text

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("--descriptor", type=Path, required=True)
    ap.add_argument("--vlan", type=int, required=True)
    grp = ap.add_mutually_exclusive_group(required=True)
    grp.add_argument("--rate-mbps", type=float)
    grp.add_argument("--remove", action="store_true")
    args = ap.parse_args(argv)
    link = NetemLink.from_descriptor(json.loads(args.descriptor.read_text()))
    try:
        link.set_cap(args.vlan, None if args.remove else args.rate_mbps)
    except RuntimeFailure as exc:
        print(str(exc), file=sys.stderr)
        return 1
    atomic_write_text(args.descriptor, json.dumps(link.descriptor()))
    return 0


if __name__ == "__main__":
    sys.exit(main())


NETEM_CAL_DELAY_MS = 2.0  # netem delay on lo when measuring its overhead


@cache
def netem_overhead_ms() -> float:
    """How much later than its configured delay a netem pass delivers here, as an RTT
    measurement sees it (timer lateness + stack), per pass: (median RTT over lo with
    netem delay D on lo - 2 D) / 2. ~0.03 ms on hardware, ~1 ms under QEMU's software
    emulation; NetemLink takes it off each fibre's delay. LIGHTPIPE_NETEM_OVERHEAD_MS
    overrides (0 turns the compensation off)."""
    env = os.environ.get("LIGHTPIPE_NETEM_OVERHEAD_MS")
    if env:
        try:
            return max(0.0, float(env))
        except ValueError:
            log.warning("LIGHTPIPE_NETEM_OVERHEAD_MS=%r is not a number: ignored", env)
    from testbed.envprobe import netem_available

    if not netem_available():
        return 0.0
    from pyroute2 import netns

    from testbed.emu.netns import iproute_in
    from testbed.emu.probes import icmp_ping

    ns = f"lpcal{uuid.uuid4().hex[:8]}"
    netns.create(ns)
    try:
        with iproute_in(f"/run/netns/{ns}") as ipr:
            lo = ipr.link_lookup(ifname="lo")[0]
            ipr.link("set", index=lo, state="up")
            ipr.tc("add", "netem", index=lo, handle="1:",
                   delay=int(NETEM_CAL_DELAY_MS * 1000))
        rtts = [r for r in icmp_ping(f"/run/netns/{ns}", "127.0.0.1", count=20,
                                     interval_s=0.01) if r is not None]
    finally:
        with contextlib.suppress(OSError):
            netns.remove(ns)
    if len(rtts) < 10:
        return 0.0
    rtts.sort()
    median = rtts[len(rtts) // 2]
    over = max(0.0, (median - 2 * NETEM_CAL_DELAY_MS) / 2)
    log.info("netem overhead here: %.3f ms per pass (lo RTT %.3f ms at %.1f ms delay)",
             over, median, NETEM_CAL_DELAY_MS)
    return over
