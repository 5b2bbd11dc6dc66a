"""testbed.io.trusted's Unix socket helpers: a private bind, and "ours" proved without links."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from testbed.io.trusted import bind_private_socket, own_socket


def test_a_private_socket_is_ours_and_nothing_else_is(tmp_path: Path) -> None:
    path = tmp_path / "s.sock"
    assert own_socket(path) is None
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        old = os.umask(0)  # even with a permissive umask the socket comes out 0600
        try:
            bind_private_socket(s, path)
        finally:
            os.umask(old)
        assert (os.lstat(path).st_mode & 0o777) == 0o600
        assert os.umask(old) == old  # the caller's umask is back
        assert own_socket(path) is True
        link = tmp_path / "link.sock"
        link.symlink_to(path)
        assert own_socket(link) is False  # a link to our socket is not our socket
    (tmp_path / "file").write_text("x")
    assert own_socket(tmp_path / "file") is False
