"""Fibre control channels a layout may name: only the current run's own, checked on disk.

A layout link's `control` tells the controller (root, in an emulation) where to set a
lightpath's capacity: a forwarder's unix socket, or `netem:<descriptor>` whose
descriptor names a namespace process the controller enters to run tc. Both come from
`PUT /layout`, so neither a path nor a PID is trusted as given: a control must be a
file that the run wrote in its own state directory (`testbed.emu.state`, given to the
controller as `--run-state`), named after one of the run's fibre nodes, owned by us,
and a netem descriptor's process must be that fibre node as the run recorded it
(PID, start time and name in state.json). Without a run state every control is refused.
"""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path
from typing import Any

NETEM_PREFIX = "netem:"
MAX_DESCRIPTOR_BYTES = 64 * 1024


class ControlRefused(ValueError):
    """A control channel that is not the run's own (one line, names the control)."""


class RunControls:
    """Checks control channels against one run's state directory (None: refuse all)."""

    def __init__(self, state_dir: str | Path | None) -> None:
        self.state_dir = Path(state_dir).resolve() if state_dir else None

    def _file(self, control: str, path_text: str, suffix: str) -> tuple[Path, str]:
        """The control's path inside the state dir and its fibre node name."""
        if self.state_dir is None:
            raise ControlRefused(f"control {control!r}: refused, the controller was started "
                                 "without the run's state (--run-state)")
        prefix = self.state_dir.name
        path = Path(path_text)
        m = re.fullmatch(re.escape(prefix) + r"f[0-9]{1,5}", path.name.removesuffix(suffix))
        if (not path.is_absolute() or path.parent.resolve() != self.state_dir
                or not path.name.endswith(suffix) or m is None):
            raise ControlRefused(f"control {control!r}: not a fibre control of this run "
                                 f"(expected {self.state_dir}/{prefix}f<N>{suffix})")
        return self.state_dir / path.name, m.group(0)

    @staticmethod
    def _owned(control: str, path: Path, want: int) -> os.stat_result:
        try:
            st = os.lstat(path)
        except OSError as exc:
            raise ControlRefused(f"control {control!r}: {exc.strerror}") from None
        if stat.S_IFMT(st.st_mode) != want:
            raise ControlRefused(f"control {control!r}: not a "
                                 f"{'socket' if want == stat.S_IFSOCK else 'regular file'}")
        if st.st_uid != os.geteuid():
            raise ControlRefused(f"control {control!r}: owned by another user")
        return st

    def check(self, control: str) -> None:
        """Raise ControlRefused unless `control` is one of this run's fibre controls."""
        if control.startswith(NETEM_PREFIX):
            self.netem_descriptor(control)
            return
        path, _ = self._file(control, control, ".sock")
        self._owned(control, path, stat.S_IFSOCK)

    def netem_descriptor(self, control: str) -> dict[str, Any]:
        """The validated descriptor of a `netem:<path>` control (read afresh)."""
        path, middle = self._file(control, control.removeprefix(NETEM_PREFIX), ".netem.json")
        st = self._owned(control, path, stat.S_IFREG)
        if st.st_size > MAX_DESCRIPTOR_BYTES:
            raise ControlRefused(f"control {control!r}: descriptor larger than "
                                 f"{MAX_DESCRIPTOR_BYTES} bytes")
        try:
            desc = json.loads(path.read_bytes())
        except (OSError, ValueError) as exc:
            raise ControlRefused(f"control {control!r}: unreadable descriptor: {exc}") from None
        if not isinstance(desc, dict) or not isinstance(desc.get("fibre"), dict):
            raise ControlRefused(f"control {control!r}: not a netem descriptor")
        assert self.state_dir is not None
        run_dir = desc.get("state_dir")
        if (desc["fibre"].get("middle") != middle or not isinstance(run_dir, str)
                or Path(run_dir).resolve() != self.state_dir):
            raise ControlRefused(f"control {control!r}: descriptor of another fibre or run")
        for key in ("intf_u", "intf_v"):
            if not (isinstance(desc.get(key), str)
                    and re.fullmatch(re.escape(middle) + r"-eth[0-9]{1,3}", desc[key])):
                raise ControlRefused(f"control {control!r}: {key} is not an interface of "
                                     f"{middle}")
        pid = desc.get("ns_pid")
        if type(pid) is not int or not self._recorded(pid, middle):
            raise ControlRefused(f"control {control!r}: ns_pid {pid!r} is not the run's "
                                 f"node {middle}")
        return desc

    def _recorded(self, pid: int, name: str) -> bool:
        """Whether pid is the run's live fibre node `name` (state.json: role, name and
        start time as recorded)."""
        from testbed.emu.state import RunState, proc_start_ticks

        assert self.state_dir is not None
        try:
            st = RunState.load(self.state_dir)
        except (OSError, ValueError, TypeError, KeyError):
            return False
        return any(p.pid == pid and p.name == name and p.role == "middle-shell"
                   and proc_start_ticks(pid) == p.start_ticks for p in st.procs)


def check_layout_controls(layout: Any, controls: RunControls) -> None:
    """ValueError naming the first link whose control is not the run's own."""
    for i, link in enumerate(layout.links):
        if link.control is not None:
            try:
                controls.check(link.control)
            except ControlRefused as exc:
                raise ValueError(f"links.{i}.control: {exc}") from None
