"""A bridge is ready when its management socket accepts connections, not when the file
exists: ovs-vswitchd binds (the file appears) before it listens."""

from __future__ import annotations

import socket
from pathlib import Path

from testbed.emu.network import _listening


def test_a_socket_bound_but_not_listening_is_not_ready(tmp_path: Path) -> None:
    path = tmp_path / "br0.mgmt"
    assert not _listening(path)  # no file yet
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as srv:
        srv.bind(str(path))
        assert path.exists() and not _listening(path)
        srv.listen(1)
        assert _listening(path)


def test_a_regular_file_is_not_a_ready_socket(tmp_path: Path) -> None:
    path = tmp_path / "br0.mgmt"
    path.write_text("")
    assert not _listening(path)
