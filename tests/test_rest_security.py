"""Security rules of the controller's REST API, each against a real server (no root).

Token always (0600 file, never on the command line), loopback unless a token file is
given, JSON-only bounded bodies, Host/Origin checks, layout controls limited to the
run's own, no half-committed state, and a burst of concurrent clients.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import threading
from pathlib import Path
from typing import Any

import pytest

from controllers import launcher
from controllers.apiguard import MAX_BODY_BYTES, json_depth
from controllers.controls import RunControls
from controllers.layout import LinkSpec, default_layout
from controllers.tokenfile import read_token, write_secret
from testbed.cli.main import main as cli_main
from testbed.emu.state import RunState, proc_start_ticks
from tests.restkit import TOKEN, assert_consistent, auth, raw, serve
from tests.test_controller_core import small_scenario

LP = json.dumps({"src_dc": "dc-a", "dst_dc": "dc-c", "slots": 2}).encode()


@pytest.fixture
def api(tmp_path: Path):  # type: ignore[no-untyped-def]
    with serve(tmp_path) as a:
        yield a


def _spec(tmp_path: Path) -> Path:
    from testbed.orchestrate.controller import write_spec

    return write_spec(small_scenario(), tmp_path / "s.yaml")


# ---- token ------------------------------------------------------------------------------
def test_generated_token_is_in_a_0600_file_and_required(tmp_path: Path) -> None:
    from testbed.orchestrate.ctl_process import start_controller

    ctl = start_controller(_spec(tmp_path), tmp_path / "c.db", timeout_s=60)
    try:
        tf = tmp_path / "c.token"
        assert stat.S_IMODE(os.stat(tf).st_mode) == 0o600
        assert ctl.token == read_token(tf) and ctl.token_file == tf
        cmdline = Path(f"/proc/{ctl.proc.pid}/cmdline").read_bytes()
        assert ctl.token.encode() not in cmdline and b"--token-file" not in cmdline
        assert ctl.request("POST", "/lightpaths", json.loads(LP))[0] == 201
        ctl.token = "wrong"
        assert ctl.request("POST", "/lightpaths", json.loads(LP))[0] == 401
        assert ctl.request("GET", "/health")[0] == 200
    finally:
        ctl.stop()


def test_token_file_readable_by_others_is_refused(tmp_path: Path) -> None:
    tf = tmp_path / "t"
    write_secret(tf, "s3cret")
    assert read_token(tf) == "s3cret"
    os.chmod(tf, 0o644)
    with pytest.raises(ValueError, match="readable by others"):
        read_token(tf)
    code = launcher.main(["--spec", str(_spec(tmp_path)), "--token-file", str(tf)])
    assert code == 2


def test_old_token_flag_and_non_loopback_bind_are_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = str(_spec(tmp_path))
    assert launcher.main(["--spec", spec, "--token", "abc"]) == 2
    err = capsys.readouterr().err
    assert "--token-file" in err and len(err.strip().splitlines()) == 1
    assert launcher.main(["--spec", spec, "--rest", "0.0.0.0:0"]) == 2
    err = capsys.readouterr().err
    assert "non-loopback" in err and len(err.strip().splitlines()) == 1
    assert cli_main(["controller", spec, "--rest-host", "0.0.0.0"]) == 2
    assert "--token-file" in capsys.readouterr().err
    assert cli_main(["controller", spec, "--token", "abc"]) == 2


# ---- Host, Origin, content type, sizes ---------------------------------------------------
def test_json_only_415_and_nothing_created(api: Any) -> None:
    for ctype in ("text/plain", "application/x-www-form-urlencoded", None):
        h = auth(json_body=False)
        if ctype:
            h["Content-Type"] = ctype
        status, reply = raw(api, "POST", "/lightpaths", LP, h)
        assert status == 415 and "application/json" in reply["error"]
    assert not api.core.rows


def test_foreign_origin_403_on_mutations(api: Any) -> None:
    for origin in ("http://evil.example", "null", "http://127.0.0.1.evil.example",
                   "http://127.0.0.1:1", f"https://127.0.0.1:{api.port}"):
        status, _ = raw(api, "POST", "/failures", json.dumps({"link": ["A", "B"]}).encode(),
                        auth({"Origin": origin}))
        assert status == 403
    status, _ = raw(api, "DELETE", "/lightpaths/1", None,
                    auth({"Sec-Fetch-Site": "cross-site"}, json_body=False))
    assert status == 403
    assert not api.core.net.is_failed("A", "B")
    same = f"http://127.0.0.1:{api.port}"
    assert raw(api, "POST", "/lightpaths", LP, auth({"Origin": same}))[0] == 201


def test_host_header_checked(api: Any) -> None:
    assert raw(api, "GET", "/health", headers={"Host": "evil.example"})[0] == 421
    assert raw(api, "POST", "/lightpaths", LP,
               auth({"Host": f"rebind.example:{api.port}"}))[0] == 421
    assert raw(api, "GET", "/health", headers={"Host": f"localhost:{api.port}"})[0] == 200
    status, _ = raw(api, "GET", "/health", skip_host=True)  # HTTP/1.1 without Host
    assert status == 400


def test_body_size_limit_413(api: Any) -> None:
    big = b'{"src_dc": "' + b"a" * (MAX_BODY_BYTES + 10) + b'"}'
    assert raw(api, "POST", "/lightpaths", big, auth())[0] == 413
    # chunked (no Content-Length): counted while it arrives
    conn = __import__("http.client").client.HTTPConnection(api.host, api.port, timeout=10)
    try:
        conn.putrequest("POST", "/lightpaths")
        for k, v in auth({"Transfer-Encoding": "chunked"}).items():
            conn.putheader(k, v)
        conn.endheaders()
        chunk = b"a" * 65536
        status = None
        try:
            for _ in range(MAX_BODY_BYTES // len(chunk) + 2):
                conn.send(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            conn.send(b"0\r\n\r\n")
        except OSError:
            pass  # the server answered and closed early
        status = conn.getresponse().status
        assert status == 413
    finally:
        conn.close()
    assert not api.core.rows


@pytest.mark.parametrize("body,why", [
    (b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nests deeper"),
    (b'{"a": ' + b'{"b": ' * 40 + b"1" + b"}" * 40 + b"}", "nests deeper"),
    (b'{"src_dc": "dc-a", "dst_dc": "dc-c", "slots": ' + b"9" * 5000 + b"}", "digits"),
    (b'{"src_dc": "dc-a", "dst_dc": "dc-c", "slots": -' + b"9" * 30 + b"}", "digits"),
    (b'{"src_dc": "dc-a", "dst_dc": "dc-c", "bitrate_gbps": NaN}', "not a JSON number"),
    (b"[1, 2]", "JSON object"),
    (b"\xff\xfe", "not UTF-8"),
    (b'{"src_dc": "dc-a", ', "not valid JSON"),
])
def test_hostile_json_is_400_never_500(api: Any, body: bytes, why: str) -> None:
    status, reply = raw(api, "POST", "/lightpaths", body, auth())
    assert status == 400 and why in reply["error"], reply
    assert raw(api, "GET", "/health")[0] == 200
    assert not api.core.rows


def test_json_depth_skips_strings() -> None:
    assert json_depth('{"a": "[[[[{{{", "b": [1, {"c": "\\"]"}]}') == 3


def test_slow_client_does_not_block_others(api: Any) -> None:
    """Slow clients (headers never finished) hold no worker: others are served."""
    slow = []
    for _ in range(50):
        s = socket.create_connection((api.host, api.port))
        s.sendall(b"POST /lightpaths HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        slow.append(s)
    try:
        assert raw(api, "GET", "/health", timeout_s=5)[0] == 200
        assert raw(api, "POST", "/lightpaths", LP, auth(), timeout_s=5)[0] == 201
    finally:
        for s in slow:
            s.close()


def test_stalled_headers_are_cut_off(tmp_path: Path) -> None:
    """A client that never finishes its headers is disconnected after the header
    time-out (here 0.5 s); uvicorn alone would keep it forever."""
    from controllers.api import RestApi
    from controllers.core import ControllerCore
    from controllers.store import Store

    sc = small_scenario()
    core = ControllerCore(sc, Store(tmp_path / "s.db"), layout=default_layout(sc))
    api = RestApi(core, port=0, token=TOKEN, header_timeout_s=0.5)
    api.serve()
    try:
        s = socket.create_connection((api.host, api.port))
        s.settimeout(20)
        s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        assert s.recv(100) == b""  # closed by the server, without an answer
        s.close()
        # a client that sends a whole request in time is answered (and kept alive)
        s = socket.create_connection((api.host, api.port))
        s.settimeout(20)
        s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert s.recv(100).startswith(b"HTTP/1.1 200")
        s.close()
    finally:
        api.close()


# ---- layout controls: only the run's own --------------------------------------------------
def _run_state(tmp_path: Path, prefix: str = "lp00ab") -> tuple[Path, RunState]:
    d = tmp_path / prefix
    d.mkdir()
    me = os.getpid()
    st = RunState(prefix, str(d), me, proc_start_ticks(me) or 0)
    st.save()
    return d, st


def _layout_with(control: str) -> dict[str, Any]:
    sc = small_scenario()
    lay = default_layout(sc)
    links = [LinkSpec(**{**lk.model_dump(), "control": control}) if lk.kind == "fibre"
             and i == len(lay.links) - 1 else lk for i, lk in enumerate(lay.links)]
    return lay.model_copy(update={"links": links}).model_dump()


def _put_layout(api: Any, layout: dict[str, Any]) -> tuple[int, Any]:
    return raw(api, "PUT", "/layout", json.dumps(layout).encode(), auth())


def test_free_netem_path_refused_without_run_state(tmp_path: Path) -> None:
    with serve(tmp_path, controls=RunControls(None)) as api:
        for control in ("netem:/etc/shadow", "/etc/passwd", "/tmp/x.sock"):
            status, reply = _put_layout(api, _layout_with(control))
            assert status == 422 and "control" in reply["error"], reply
        assert _put_layout(api, _layout_with(None))[0] == 200  # type: ignore[arg-type]


def test_controls_checked_against_the_run_state(tmp_path: Path) -> None:
    d, st = _run_state(tmp_path)
    outside = tmp_path / "lp00abf1.netem.json"
    desc = {"fibre": {"middle": "lp00abf1"}, "ns_pid": os.getpid(), "intf_u": "lp00abf1-eth0",
            "intf_v": "lp00abf1-eth1", "state_dir": str(d), "caps_mbps": {}, "seed": 1}
    outside.write_text(json.dumps(desc))
    good = d / "lp00abf1.netem.json"
    good.write_text(json.dumps(desc))
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(d / "lp00abf2.sock"))
    (d / "lp00abf3.sock").write_text("not a socket")
    (d / "lp00abf4.netem.json").symlink_to("/etc/passwd")
    foreign_pid = dict(desc, ns_pid=1)
    (d / "lp00abf5.netem.json").write_text(json.dumps(
        {**foreign_pid, "fibre": {"middle": "lp00abf5"}, "intf_u": "lp00abf5-eth0",
         "intf_v": "lp00abf5-eth1"}))
    try:
        with serve(tmp_path, controls=RunControls(d)) as api:
            refused = [f"netem:{outside}", f"netem:{d}/../{outside.name}",
                       f"netem:{d}/lp00abf4.netem.json", f"netem:{d}/lp00abf5.netem.json",
                       f"{d}/lp00abf3.sock", "/etc/shadow", f"netem:{d}/state.json",
                       f"netem:{good}"]  # its ns_pid is not (yet) a recorded node
            for control in refused:
                status, reply = _put_layout(api, _layout_with(control))
                assert status == 422, (control, reply)
            st.add_proc(os.getpid(), "middle-shell", "lp00abf1")  # now the run's node
            for control in (f"netem:{good}", f"{d}/lp00abf2.sock"):
                status, reply = _put_layout(api, _layout_with(control))
                assert status == 200, (control, reply)
            # a refused layout changed nothing: the last good one stands
            status, lay = raw(api, "GET", "/layout", headers=auth(json_body=False))
            assert lay["links"][-1]["control"] == f"{d}/lp00abf2.sock"
            assert _put_layout(api, _layout_with("netem:/etc/shadow"))[0] == 422
            status, lay = raw(api, "GET", "/layout", headers=auth(json_body=False))
            assert lay["links"][-1]["control"] == f"{d}/lp00abf2.sock"
    finally:
        sock.close()


# ---- all or nothing -----------------------------------------------------------------------
class FailingSouthbound:
    """A southbound whose switches refuse the next `fail` syncs (then accept)."""

    def __init__(self, fail: int) -> None:
        self.fail = fail

    def sync(self, desired: dict[int, dict[tuple, object]]) -> None:
        if self.fail > 0:
            self.fail -= 1
            raise RuntimeError("switch connection lost")


def test_failed_rule_install_rolls_the_lightpath_back(tmp_path: Path) -> None:
    with serve(tmp_path) as api:
        api.core.southbound = FailingSouthbound(fail=1)
        status, reply = raw(api, "POST", "/lightpaths", LP, auth())
        assert status == 503 and "rules" in reply["error"]
        assert not api.core.rows and not api.core.net.lightpaths
        assert not api.core.store.lightpaths()
        status, lp = raw(api, "POST", "/lightpaths", LP, auth())
        assert status == 201 and lp["slots"] == [0, 1]  # the spectrum was given back
        assert_consistent(api)


def test_bad_layout_then_lightpath_is_201_and_consistent(tmp_path: Path) -> None:
    """The reproduced defect: a layout naming a free netem path, then POST /lightpaths
    gave a 500 with the lightpath committed. Now the layout is refused and the
    lightpath is set up cleanly."""
    with serve(tmp_path, controls=RunControls(None)) as api:
        assert _put_layout(api, _layout_with("netem:/nonexistent"))[0] == 422
        status, lp = raw(api, "POST", "/lightpaths", LP, auth())
        assert status == 201, lp
        assert_consistent(api)


# ---- many clients at once -----------------------------------------------------------------
def test_200_concurrent_requests_leave_a_consistent_state(api: Any) -> None:
    results: list[int] = []
    errors: list[BaseException] = []
    lock = threading.Lock()
    gate = threading.Barrier(200)

    def one(i: int) -> None:
        try:
            gate.wait(30)
            kind = i % 5
            if kind in (0, 1):
                body = json.dumps({"src_dc": ["dc-a", "dc-b"][i % 2], "dst_dc": "dc-c",
                                   "slots": 1 + i % 3}).encode()
                status, _ = raw(api, "POST", "/lightpaths", body, auth(), timeout_s=60)
            elif kind == 2:
                status, _ = raw(api, "DELETE", f"/lightpaths/{1 + i % 20}", None,
                                auth(json_body=False), timeout_s=60)
            elif kind == 3:
                path = "/failures" if i % 2 else "/repairs"
                status, _ = raw(api, "POST", path, json.dumps({"link": ["A", "B"]}).encode(),
                                auth(), timeout_s=60)
            else:
                status, _ = raw(api, "GET", "/spectrum", None, auth(json_body=False),
                                timeout_s=60)
            with lock:
                results.append(status)
        except BaseException as exc:  # a reset or time-out is a failure of the test
            with lock:
                errors.append(exc)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(200)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors[:3]
    assert len(results) == 200 and all(s < 500 for s in results), sorted(set(results))
    assert 201 in results
    assert_consistent(api)


def test_unknown_token_never_reaches_a_handler(api: Any) -> None:
    for method, path in (("POST", "/lightpaths"), ("PUT", "/layout"), ("POST", "/jobs"),
                         ("DELETE", "/jobs/1"), ("POST", "/failures")):
        h = {"Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}x"}
        assert raw(api, method, path, b"{oops", h)[0] == 401  # 401 before parsing
