"""Channels to the link emulators: the one part of the controller core that knows testbed.emu.

`ForwarderChannel` is the `controllers.caps.CapacityChannel` the controller process uses:
a lightpath's capacity goes to a fibre's user-space forwarder over its control socket
(`testbed.emu.forwarder`), or, for a netem-mode fibre (control "netem:<descriptor>"), to
an HTB class in the fibre's middle namespace (`NetemChannel`). Both import the emulator's
modules inside their functions (`ForwarderChannel` when it is made, once, at the
controller's start), so importing this module loads nothing of testbed.emu.
"""

from __future__ import annotations

from typing import Any

from controllers.controls import RunControls


class NetemChannel:
    """CapacityChannel for netem-mode fibres: the layout's control is "netem:<descriptor>"
    (written by testbed.emu.links.NetemLink.write_descriptor); the per-lightpath cap is an
    HTB class + flower VLAN filter in the fibre's middle namespace (tc through mnexec)."""

    def __init__(self, controls: RunControls | None = None) -> None:
        self.links: dict[str, Any] = {}
        self.controls = controls

    def link(self, control: str) -> Any:
        import json
        from pathlib import Path

        from testbed.emu.links import NetemLink

        if self.controls is not None:  # the run's own descriptor, naming the run's node
            desc = self.controls.netem_descriptor(control)
        else:
            desc = json.loads(Path(control.removeprefix(NetemLink.NETEM_CONTROL)).read_text())
        got = self.links.get(control)
        if got is None:
            got = self.links[control] = NetemLink.from_descriptor(desc)
        else:  # the delay calibration may have changed the fibre's delay since
            got.refresh_correction(desc)
        return got

    def set_cap(self, control: str, vid: int, rate_mbps: float | None) -> None:
        link = self.link(control)
        if link.caps_mbps.get(vid) == rate_mbps:
            return  # already so (e.g. the emulator's start-up caps): no tc rebuild
        if _under_eventlet():
            # pyroute2's netlink sockets hang under eventlet's monkey-patching (the os-ken
            # controller process): send the requests from a plain child process.
            import subprocess
            import sys

            path = control.removeprefix("netem:")
            argv = [sys.executable, "-m", "testbed.emu.links", "--descriptor", path,
                    "--vlan", str(vid)] + (["--remove"] if rate_mbps is None
                                           else ["--rate-mbps", repr(rate_mbps)])
            r = subprocess.run(argv, capture_output=True, text=True, check=False)
            if r.returncode != 0:
                raise RuntimeError(f"netem cap VLAN {vid}: {r.stderr.strip()[-300:]}")
            if rate_mbps is None:
                link.caps_mbps.pop(vid, None)
            else:
                link.caps_mbps[vid] = rate_mbps
            return
        try:
            link.set_cap(vid, rate_mbps)
        except Exception as exc:  # RuntimeFailure from tc
            raise RuntimeError(str(exc)) from None


def _under_eventlet() -> bool:
    import sys

    patcher = getattr(sys.modules.get("eventlet"), "patcher", None)
    return bool(patcher is not None and patcher.is_monkey_patched("socket"))


class ForwarderChannel:
    """CapacityChannel over the emulator's control socket (testbed.emu.forwarder), or
    tc/HTB for netem-mode fibres (control "netem:<descriptor>")."""

    def __init__(self, controls: RunControls | None = None) -> None:
        """controls: accept only the run's own control channels (the controller process
        always gives one); None trusts every control (in-process use and tests).

        The forwarder's client is imported here, when the controller starts: imported
        at the first cap instead (8 ms), it held the interpreter in a caps thread while
        the first set-up's rules went out, and made that set-up the slowest of all."""
        from testbed.emu.forwarder import control_request

        self._request = control_request
        self.netem = NetemChannel(controls)
        self.controls = controls

    def set_cap(self, control: str, vid: int, rate_mbps: float | None) -> None:
        if control.startswith("netem:"):
            self.netem.set_cap(control, vid, rate_mbps)
            return
        if self.controls is not None:
            self.controls.check(control)

        req: dict[str, Any] = ({"vlan": vid, "remove": True} if rate_mbps is None
                               else {"vlan": vid, "rate_mbps": rate_mbps})
        reply = self._request(control, req, timeout_s=2.0)
        if not reply.get("ok", True):
            raise RuntimeError(f"forwarder {control}: {reply}")

