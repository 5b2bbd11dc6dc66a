"""Issue 27, findings 10 and 11, reproduced: numbers that reach the fault channel's timers
are bounded (spec, socket, CLI), and `lightpipe fault --network DIR` trusts no
network.json, state directory, socket file or server that is not root's or the running
user's, and prints no terminal control characters from a reply. The attacks that need
a second local user create one (useradd) and remove it (userdel -r)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from testbed.errors import InputError, RuntimeFailure
from testbed.io.bounded import read_owned_nofollow_bytes
from testbed.io.terminal import safe_line, safe_text
from testbed.orchestrate.faultctl import (
    MAX_FAULT_WALL_S,
    SOCKET_NAME,
    FaultServer,
    parse_request,
    request_fault,
)
from testbed.spec import Scenario, parse_scenario

from .test_faultctl import _raw, controller, quick, short_dir  # noqa: F401 (fixtures)

ESCAPES = "\x1b]0;owned\x07\x1b[2J\x1b[31m\x9b1m\u202e"
BAD_CHARS = ("\x1b", "\x07", "\x9b", "\u202e")
SYSTEM_PYTHON = "/usr/bin/python3"  # the other user cannot run root's own interpreter


def _clean(text: str) -> bool:
    return not any(c in text for c in BAD_CHARS)


# ---- finding 10: numbers that reach timers ----------------------------------------------
@pytest.mark.parametrize("event,field", [
    ({"kind": "controller_kill", "down_s": 1e300}, "down_s"),
    ({"kind": "prometheus_kill", "down_s": 86_401}, "down_s"),
    ({"kind": "link_flap", "link": ["1", "3"], "period_s": 1e300, "count": 1}, "period_s"),
    ({"kind": "link_flap", "link": ["1", "3"], "period_s": 1, "count": 10**6}, "count"),
    ({"kind": "wavelength_loss", "link": ["1", "3"], "first_slot": 10**30, "slots": 1},
     "first_slot"),
])
def test_huge_durations_and_counts_are_refused_naming_the_field(
        quick: Scenario, event: dict[str, Any], field: str) -> None:  # noqa: F811
    with pytest.raises(InputError) as info:
        parse_request(json.dumps(event).encode(), quick)
    assert info.value.path == field, info.value.line()


def test_scenario_spec_bounds_event_times(quickstart: dict[str, Any]) -> None:
    for event, field in (({"at_s": 1e300, "kind": "fiber_cut", "link": ["1", "3"]}, "at_s"),
                         ({"at_s": 1, "kind": "controller_kill", "down_s": 1e12}, "down_s")):
        quickstart["events"] = [event]
        with pytest.raises(InputError) as info:
            parse_scenario(quickstart)
        assert info.value.path == f"events[0].{field}", info.value.line()
    quickstart["events"] = [{"at_s": 1, "kind": "fiber_cut", "link": ["1", "3"]}] * 1001
    with pytest.raises(InputError) as info:
        parse_scenario(quickstart)
    assert info.value.path == "events", info.value.line()


def test_wall_clock_span_is_bounded_by_the_time_factor(quickstart: dict[str, Any]) -> None:
    quickstart["emulation"] = {"time_factor": 1000.0}
    slow = parse_scenario(quickstart)
    ok = parse_request(b'{"kind": "controller_kill", "down_s": 86}', slow)
    assert ok.down_s == 86.0
    with pytest.raises(InputError) as info:  # 87 s x 1000 > one day of wall clock
        parse_request(b'{"kind": "controller_kill", "down_s": 87}', slow)
    assert info.value.path == "down_s" and f"{MAX_FAULT_WALL_S:g} s" in info.value.message


@pytest.fixture
def served(quick: Scenario, short_dir: Path, controller: Any) -> Iterator[tuple[Path, Any]]:  # noqa: F811
    """The fault channel of a held run: a real injector and in-process SDN controller."""
    from testbed.orchestrate.faultctl import apply_timeout_s
    from testbed.orchestrate.faults import FaultInjector

    inj = FaultInjector([], scale=1.0, client=controller).start()
    path = short_dir / SOCKET_NAME
    with FaultServer(path, quick, lambda ev: inj.apply_now(ev, apply_timeout_s(ev, 1.0))):
        yield path, inj
    inj.stop()


def test_huge_duration_on_the_socket_is_answered_and_the_server_goes_on(
        served: tuple[Path, Any]) -> None:
    path, inj = served
    # Before the fix: the flap's cut was applied, its repair planned 5e299 s later, the
    # answer's wait overflowed (empty reply) and the fibre stayed down for good.
    for req, field in (({"kind": "link_flap", "link": ["1", "3"], "period_s": 1e300,
                         "count": 1}, "period_s"),
                       ({"kind": "controller_kill", "down_s": 1e300}, "down_s")):
        reply = _raw(path, json.dumps(req).encode() + b"\n")
        assert reply["ok"] is False and reply["error"]["field"] == field, reply
    assert inj.rows == []  # nothing was applied
    row = request_fault(path, {"kind": "fiber_cut", "link": ["1", "3"]}, 30)
    assert row["applied"] and row["target"] == "1-3"  # and the channel still serves


@pytest.fixture
def held(short_dir: Path, served: tuple[Path, Any], monkeypatch: pytest.MonkeyPatch,  # noqa: F811
         tmp_path: Path) -> Path:
    """What `lightpipe emu --hold` leaves: a live run state (this process) in the state
    root, its network.json naming the served channel."""
    from testbed.emu.state import new_state
    from testbed.io.atomic import atomic_write_json

    monkeypatch.setenv("LIGHTPIPE_STATE_DIR", str(short_dir))
    st = new_state("lp" + os.urandom(2).hex())
    sock = Path(st.state_dir) / SOCKET_NAME
    os.rename(served[0], sock)  # the served socket, moved into the run's state directory
    out = tmp_path / "held"
    out.mkdir()
    atomic_write_json(out / "network.json", {"prefix": st.prefix, "state_dir": st.state_dir,
                                             "time_factor": 1.0, "fault_socket": str(sock)})
    return out


@pytest.mark.parametrize("argv,option", [
    (["controller_kill", "--down-s", "1e12"], "--down-s"),
    (["prometheus_kill", "--down-s", "inf"], "--down-s"),
    (["link_flap", "1", "3", "--period-s", "1e300", "--count", "2"], "--period-s"),
    (["link_flap", "1", "3", "--period-s", "1", "--count", "100000000"], "--count"),
    (["wavelength_loss", "1", "3", "--first-slot", str(10**30), "--slots", "1"],
     "--first-slot"),
])
def test_cli_refuses_huge_numbers_with_one_line(cli: Any, held: Path, argv: list[str],
                                                option: str) -> None:
    res = cli("fault", *argv, "--network", str(held))
    lines = res.err.strip().splitlines()
    assert res.code == 2 and len(lines) == 1 and f"{option}: " in lines[0], (argv, res.err)


# ---- finding 11: whose network.json, socket and server ----------------------------------
def test_reply_strings_are_printed_without_control_characters(cli: Any, held: Path) -> None:
    # The run's own refusal quotes the request's fibre name back.
    res = cli("fault", "fiber_cut", f"1{ESCAPES}", "3", "--network", str(held))
    assert res.code == 2 and "no fibre" in res.err and _clean(res.err), repr(res.err)
    assert "\\u001b]0;owned" in res.err  # shown, made visible


def _answering_server(path: Path, reply: bytes) -> tuple[socket.socket, list[bytes]]:
    """A server of this user at `path` that answers `reply` to one request."""
    import threading

    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(str(path))
    srv.listen(1)
    got: list[bytes] = []

    def serve() -> None:
        conn, _ = srv.accept()
        with conn:
            conn.settimeout(10)
            got.append(conn.recv(4096))
            conn.sendall(reply)

    threading.Thread(target=serve, daemon=True).start()
    return srv, got


@pytest.mark.parametrize("as_json", [False, True])
def test_a_hostile_row_is_printed_without_control_characters(
        cli: Any, held: Path, as_json: bool) -> None:
    net = json.loads((held / "network.json").read_text())
    sock = Path(net["fault_socket"])
    sock.unlink()  # the run's channel replaced by one that answers escape sequences
    row = {"kind": "fiber_cut", "target": ESCAPES, "applied": True, "note": ESCAPES + "\x7f"}
    srv, got = _answering_server(sock, json.dumps({"ok": True, "row": row}).encode() + b"\n")
    with srv:
        res = cli("fault", "fiber_cut", "1", "3", "--network", str(held),
                  *(["--json"] if as_json else []))
    assert got and res.code == 0, res.err
    assert _clean(res.out) and "\x7f" not in res.out, repr(res.out)
    if as_json:  # still JSON, the escapes kept as JSON escapes
        assert json.loads(res.out)["note"] == ESCAPES + "\x7f"
    else:
        assert res.out.startswith("fault: fiber_cut \\u001b]0;owned\\u0007")


def test_terminal_escapes_control_characters_only() -> None:
    assert safe_text("a\tb\nc") == "a\tb\nc"
    assert safe_line("a\tb\nc\rd") == "a\\tb\\nc\\rd"
    assert safe_text("dc-a h0 ü ✓") == "dc-a h0 ü ✓"
    assert _clean(safe_text(ESCAPES)) and _clean(safe_line(ESCAPES))
    assert json.loads('"' + safe_line(ESCAPES) + '"') == ESCAPES  # valid JSON escapes


def test_nofollow_reader_refuses_links_fifos_and_foreign_files(tmp_path: Path) -> None:
    real = tmp_path / "real.json"
    real.write_text("{}")
    assert read_owned_nofollow_bytes(real, "f", 100) == b"{}"
    link = tmp_path / "link.json"
    link.symlink_to(real)
    with pytest.raises(InputError, match="symbolic link"):
        read_owned_nofollow_bytes(link, "f", 100)
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    with pytest.raises(InputError, match="not a regular file"):  # and it did not block
        read_owned_nofollow_bytes(fifo, "f", 100)
    with pytest.raises(InputError, match="owned by uid"):
        read_owned_nofollow_bytes(real, "f", 100, owners=(os.geteuid() + 12345,))
    with pytest.raises(InputError, match="too large"):
        read_owned_nofollow_bytes(real, "f", 1)


# ---- a second local user -----------------------------------------------------------------
@dataclass
class OtherUser:
    name: str
    uid: int
    gid: int
    home: Path  # a directory of theirs (not a home: none is created)


@pytest.fixture
def other_user() -> Iterator[OtherUser]:
    if os.geteuid() != 0 or shutil.which("useradd") is None:
        pytest.skip("needs root and useradd (creates a second local user)")
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        pytest.skip(f"needs {SYSTEM_PYTHON} for the other user's server")
    name = "lpsf" + os.urandom(4).hex()
    subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
                   check=True, capture_output=True)
    try:
        import pwd

        pw = pwd.getpwnam(name)
        home = Path(tempfile.mkdtemp(prefix="lpsf-", dir="/tmp"))
        os.chmod(home, 0o755)
        os.chown(home, pw.pw_uid, pw.pw_gid)
        try:
            yield OtherUser(name, pw.pw_uid, pw.pw_gid, home)
        finally:
            shutil.rmtree(home, ignore_errors=True)
    finally:
        subprocess.run(["userdel", "-r", name], check=False, capture_output=True)


# The other user's server: listens (on a socket it binds, or on one it is given), answers
# escape sequences, and prints what it was sent.
SERVER = r"""
import json, socket, sys
arg = sys.argv[1]
if arg.isdigit():
    s = socket.socket(fileno=int(arg))
else:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(arg)
s.listen(1)
print("ready", flush=True)
s.settimeout(60)
c, _ = s.accept()
c.settimeout(30)
row = {"kind": "fiber_cut", "target": sys.argv[2], "applied": True, "note": sys.argv[2]}
got = b""
try:
    c.sendall(json.dumps({"ok": True, "row": row}).encode() + b"\n")
    while True:
        chunk = c.recv(4096)
        if not chunk:
            break
        got += chunk
except OSError:
    pass
print(json.dumps(got.decode("utf-8", "replace")), flush=True)
"""


def _serve_as(user: OtherUser, where: str | socket.socket) -> subprocess.Popen[str]:
    """The other user's server process, once it listens."""
    fds: tuple[int, ...] = ()
    arg = str(where)
    if isinstance(where, socket.socket):
        fds, arg = (where.fileno(),), str(where.fileno())
    proc = subprocess.Popen([SYSTEM_PYTHON, "-c", SERVER, arg, ESCAPES], user=user.uid,
                            group=user.gid, extra_groups=[], pass_fds=fds, cwd="/",
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    if proc.stdout.readline().strip() != "ready":
        proc.kill()
        pytest.fail(f"the other user's server did not start: {proc.communicate()[1]}")
    return proc


def _sent_to(proc: subprocess.Popen[str]) -> str:
    """What the other user's server was sent (it exits once the client is gone)."""
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    sent: str = json.loads(out.strip().splitlines()[-1])
    return sent


@pytest.mark.root
def test_socket_of_another_user_is_not_used(other_user: OtherUser) -> None:
    path = other_user.home / SOCKET_NAME
    proc = _serve_as(other_user, str(path))
    try:
        with pytest.raises(RuntimeFailure, match="owned by uid"):
            request_fault(path, {"kind": "fiber_cut", "link": ["1", "3"]}, 30)
        # It was not even connected to: connect now so that the server ends.
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.connect(str(path))
    finally:
        sent = _sent_to(proc)
    assert sent == ""


@pytest.fixture
def foreign_server(other_user: OtherUser, held: Path) -> Iterator[subprocess.Popen[str]]:
    """The held run's socket file (root's, in root's state directory) served by a
    process of the other user: it was handed the bound socket and called listen()."""
    net = json.loads((held / "network.json").read_text())
    sock_path = Path(net["fault_socket"])
    sock_path.unlink()
    bound = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    bound.bind(str(sock_path))
    with bound:
        proc = _serve_as(other_user, bound)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.connect(str(sock_path))
            proc.communicate(timeout=60)


@pytest.mark.root
def test_server_of_another_user_gets_nothing(cli: Any, held: Path,
                                             foreign_server: subprocess.Popen[str]) -> None:
    res = cli("fault", "fiber_cut", "1", "3", "--network", str(held))
    assert res.code == 1 and "served by uid" in res.err, (res.out, res.err)
    assert _clean(res.out + res.err), repr(res.out + res.err)
    assert _sent_to(foreign_server) == ""  # the request never left


@pytest.mark.root
def test_network_json_of_another_user_is_refused(cli: Any, held: Path,
                                                 other_user: OtherUser,
                                                 foreign_server: subprocess.Popen[str]
                                                 ) -> None:
    theirs = other_user.home / "run"
    theirs.mkdir()
    shutil.copy(held / "network.json", theirs / "network.json")
    for p in (theirs, theirs / "network.json"):
        os.chown(p, other_user.uid, other_user.gid)
    res = cli("fault", "fiber_cut", "1", "3", "--network", str(theirs))
    lines = res.err.strip().splitlines()
    assert res.code == 2 and len(lines) == 1 and "owned by uid" in lines[0], res.err
    assert _clean(res.out + res.err)
    # `lightpipe exec` (which enters a host's namespaces by network.json's PID) likewise.
    res = cli("exec", "dc-a-h0", "--network", str(theirs), "--", "true")
    assert res.code == 2 and "owned by uid" in res.err, res.err
    # Nor through a link to it, from a directory of root's.
    (held / "network.json").unlink()
    (held / "network.json").symlink_to(theirs / "network.json")
    res = cli("fault", "fiber_cut", "1", "3", "--network", str(held))
    assert res.code == 2 and "symbolic link" in res.err, res.err


# ---- the same principle elsewhere: every number that reaches a timer or a loop -----------
@pytest.mark.timeout(60)
@pytest.mark.parametrize("argv,option", [
    (["route", "--fat-tree", "100000"], "--fat-tree"),  # hung building the graph
    (["route", "--clos", "100000x100000", "--jobs", "2"], "--clos"),
    (["route", "--clos", "2x2", "--hosts-per-leaf", "100000000", "--jobs", "2"],
     "--hosts-per-leaf"),
    (["route", "--clos", "2x2", "--jobs", "2", "--policy", "sa", "--time-budget-s", "nan"],
     "--time-budget-s"),
    (["route", "--clos", "2x2", "--jobs", "2", "--policy", "sa", "--max-moves", "10" * 8],
     "--max-moves"),
    (["grafana", "check", "--url", "http://127.0.0.1:9", "--since-s", "inf"], "--since-s"),
    (["monitor", "up", "--scrape-interval-s", "nan"], "--scrape-interval-s"),
])
def test_cli_numbers_are_bounded(cli: Any, argv: list[str], option: str) -> None:
    res = cli(*argv)
    lines = res.err.strip().splitlines()
    assert res.code == 2 and len(lines) == 1 and f"{option}: " in lines[0], (argv, res.err)


def test_sweep_processes_are_bounded(cli: Any, tmp_path: Path) -> None:
    res = cli("sweep", str(Path("scenarios/quickstart.yaml").resolve()), "--set",
              "workload.seed=1", "--jobs", "100000", "--out", str(tmp_path / "s"))
    assert res.code == 2 and "--jobs: must be 1..256" in res.err, res.err


def test_fibre_emulator_control_numbers_are_bounded() -> None:
    from testbed.emu.forwarder import MAX_DELAY_MS, bounded

    assert bounded("delay_ms", 20, 0.0, MAX_DELAY_MS) == 20.0
    for bad in (1e300, float("nan"), float("inf"), -1, "1e400", True, None, [1]):
        with pytest.raises(ValueError, match="delay_ms"):
            bounded("delay_ms", bad, 0.0, MAX_DELAY_MS)


def test_controller_layout_rates_are_bounded() -> None:
    from pydantic import ValidationError

    from controllers.layout import Layout

    base = {"switches": [{"name": "s1", "dpid": 1, "kind": "dc", "dc": "dc-a"}]}
    Layout.model_validate(base)
    for extra in ({"mbps_per_gbps": 1e300}, {"mbps_per_gbps": 0}):
        with pytest.raises(ValidationError, match="mbps_per_gbps"):
            Layout.model_validate({**base, **extra})


def test_log_lines_carry_no_control_characters() -> None:
    import logging

    from testbed.io.terminal import SafeFormatter

    record = logging.LogRecord("x", logging.WARNING, __file__, 1, "peer said %s", (ESCAPES,),
                               None)
    assert _clean(SafeFormatter("%(message)s").format(record))
