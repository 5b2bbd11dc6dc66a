"""What the monitor may trust: its listen address, its directories, its port, its user.

* `check_listen`: an IP literal only (an empty string would bind every interface).
* `safe_dir`: a directory LightPipe creates gets the given mode whatever the umask and
  belongs to the running user; one it is given is refused when it is group- or
  world-writable or owned by another user than this one or root (InputError, exit 2).
* `port_holder`: who holds a TCP port (for a strict port's one-line error).
* `prometheus_user`: the unprivileged `prometheus` user to run the monitor as (root
  only, where every directory above the monitor's lets that user through).
"""

from __future__ import annotations

import errno
import ipaddress
import logging
import os
import pwd
import socket
import stat
from pathlib import Path

from testbed.errors import InputError

log = logging.getLogger(__name__)


def check_listen(host: str, field: str = "--listen") -> str:
    """The IP literal to listen on (normalised); InputError for anything else."""
    if not host:
        raise InputError(field, "'' is not an IP address (an empty address binds every "
                         "interface); use 127.0.0.1, 0.0.0.0 or another IP literal")
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        raise InputError(field, f"{host!r} is not an IP address literal "
                         "(e.g. 127.0.0.1, 0.0.0.0, ::1)") from None


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def check_dir_stat(path: Path, st: os.stat_result, field: str) -> None:
    """Refuse a directory not owned by this user or root, or writable by others."""
    me = os.geteuid()
    if not stat.S_ISDIR(st.st_mode):
        raise InputError(field, f"{path} is not a directory")
    if st.st_uid not in (me, 0):
        raise InputError(field, f"{path} is owned by {_user(st.st_uid)}, not by "
                         f"{_user(me)} or root; refused")
    if st.st_mode & 0o022:
        raise InputError(field, f"{path} is group- or world-writable "
                         f"(mode {stat.S_IMODE(st.st_mode):04o}); refused "
                         f"(chmod go-w {path})")


def safe_dir(path: Path, mode: int, field: str = "--dir", *, group: int | None = None
             ) -> Path:
    """Create `path` with `mode` (and `group`) if it is missing, else check it (see the
    module docstring). A symlink is followed only when root or this user owns it."""
    path = Path(path)
    try:
        lst = os.lstat(path)
    except FileNotFoundError:
        lst = None
    if lst is None:
        make_parents(path)
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:  # raced: check what is there now
            return safe_dir(path, mode, field, group=group)
        if group is not None:
            os.chown(path, -1, group)
        os.chmod(path, mode)  # not the umask's choice
        log.debug("created %s mode %04o", path, mode)
    elif stat.S_ISLNK(lst.st_mode) and lst.st_uid not in (os.geteuid(), 0):
        raise InputError(field, f"{path} is a symlink owned by {_user(lst.st_uid)}; "
                         "not followed")
    st = os.stat(path)
    check_dir_stat(path, st, field)
    if group is not None and st.st_gid != group and st.st_uid == os.geteuid():
        os.chown(path, -1, group)
        os.chmod(path, stat.S_IMODE(st.st_mode) | (mode & 0o7070))
    return path


def make_parents(path: Path) -> None:
    """Create the missing directories above `path` 0755 whatever the umask."""
    missing = [d for d in Path(path).absolute().parents if not os.path.lexists(d)]
    for d in reversed(missing):
        try:
            os.mkdir(d, 0o755)
        except FileExistsError:
            continue
        os.chmod(d, 0o755)


def port_holder(host: str, port: int) -> str | None:
    """None when host:port can be bound now, else who holds it ("pid 123 (prometheus)",
    or the error when no process of ours can be named)."""
    fam = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(fam, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))  # no SO_REUSEADDR: any socket on the port is a holder
            return None
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                return exc.strerror or str(exc)
    return _socket_owner(port) or "a process this user cannot see"


def _socket_owner(port: int) -> str | None:
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if len(f) > 9 and int(f[1].rsplit(":", 1)[1], 16) == port and f[9] != "0":
                inodes.add(f"socket:[{f[9]}]")
    if not inodes:
        return None
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") in inodes:
                    comm = Path(f"/proc/{pid}/comm").read_text().strip()
                    return f"pid {pid} ({comm})"
            except OSError:
                continue
    return None


def prometheus_user(dir: Path) -> tuple[int, int] | None:
    """(uid, gid) of the `prometheus` system user to run the monitor as, or None: not
    root, no such user, or a directory above `dir` that others cannot traverse (the
    server could not reach its files; it then runs as this user, logged)."""
    if os.geteuid() != 0:
        return None
    try:
        pw = pwd.getpwnam("prometheus")
    except KeyError:
        log.info("no 'prometheus' user: the monitor runs as root")
        return None
    if pw.pw_uid == 0:
        return None
    for d in Path(dir).resolve().parents:
        st = os.stat(d)
        if not (st.st_mode & 0o001 or (st.st_gid == pw.pw_gid and st.st_mode & 0o010)
                or st.st_uid == pw.pw_uid):
            log.info("%s is closed to the prometheus user (mode %04o): the monitor runs "
                     "as root", d, stat.S_IMODE(st.st_mode))
            return None
    return pw.pw_uid, pw.pw_gid


def chown_tree(top: Path, uid: int, gid: int) -> None:
    """Give `top` and everything under it (links themselves, never followed) to uid:gid."""
    os.lchown(top, uid, gid)
    for root, dirs, files in os.walk(top):
        for name in dirs + files:
            os.lchown(os.path.join(root, name), uid, gid)
