"""The rough edges a new user hit (issue 15), one test each."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from testbed.io.atomic import atomic_write_json, staged_dir
from tests.waiting import scaled, wait_until

REPO = Path(__file__).resolve().parent.parent
SCENARIOS = REPO / "scenarios"
LIGHTPIPE = str(Path(sys.executable).parent / "lightpipe")
ENV = {**os.environ, "PYTHONPATH": str(REPO)}
PY_LEAKS = re.compile(r"Traceback|NoneType|unexpected keyword|\.partial|[A-Z][a-z]+Error:")


def small_quickstart(tmp_path: Path, requests: int = 500) -> Path:
    spec = yaml.safe_load((SCENARIOS / "quickstart.yaml").read_text())
    spec["workload"]["requests"] = requests
    path = tmp_path / "qs.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


# ------------------------------------------------------------------ record permissions
def test_records_get_ordinary_permissions(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    old = os.umask(0o022)
    try:
        out = tmp_path / "run"
        assert cli("sim", str(small_quickstart(tmp_path)), "--out", str(out), "-q").code == 0
    finally:
        os.umask(old)
    assert stat.S_IMODE(out.stat().st_mode) == 0o755
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in out.iterdir()}
    assert modes and all(m == 0o644 for m in modes.values()), modes


def test_records_follow_the_umask_and_secrets_stay_private(tmp_path: Path) -> None:
    old = os.umask(0o027)
    try:
        with staged_dir(tmp_path / "r") as stage:
            atomic_write_json(stage / "a.json", {"x": 1})
            atomic_write_json(stage / "network.json", {"token": "s"}, mode=0o600)
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "r").stat().st_mode) == 0o750
    assert stat.S_IMODE((tmp_path / "r" / "a.json").stat().st_mode) == 0o640
    assert stat.S_IMODE((tmp_path / "r" / "network.json").stat().st_mode) == 0o600


def test_network_json_with_token_is_private() -> None:
    from testbed.orchestrate.run import secret_mode as _secret

    assert _secret({"controller": {"rest_url": "u", "token": "t"}}) == 0o600
    assert _secret({"controller": None}) is None


# ------------------------------------------------------------------ sweep --set with a list
def test_sweep_set_splits_values_outside_brackets() -> None:
    from testbed.experiments.sweep import parse_set, split_values

    assert split_values("1,2") == ["1", "2"]
    assert split_values("[100,200],[400]") == ["[100,200]", "[400]"]
    assert parse_set("workload.bitrate_gbps=[100, 200],[400]") == \
        ("workload.bitrate_gbps", [[100, 200], [400]])
    assert parse_set("policy.spectrum=first_fit,best_fit")[1] == ["first_fit", "best_fit"]


@pytest.mark.slow
def test_sweep_set_with_a_list_value_runs(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "sw"
    r = cli("sweep", str(small_quickstart(tmp_path, 400)), "--set",
            "workload.bitrate_gbps=[100,200],[400]", "--out", str(out), "-q")
    assert r.code == 0, r.err
    rows = (out / "sweep.csv").read_text().splitlines()
    assert len(rows) == 3
    assert (out / "blocking_ratio_vs_bitrate_gbps.png").is_file()
    assert not (out / "blocking_vs_load.png").exists()


# ------------------------------------------------------------------ errors in user terms
@pytest.mark.parametrize("argv,expect", [
    (["reproduce", "cba", "--set", "nonsense=3", "--out", "{tmp}/x"],
     "cba has no set-up value 'nonsense'; valid: seeds, jobs"),
    (["reproduce", "cba", "--set", "seed=3", "--out", "{tmp}/x"], "did you mean seeds?"),
    (["sim", str(SCENARIOS / "quickstart.yaml"), "--out", "/proc/nope"],
     "--out: cannot write /proc/nope"),
    (["validate", "{tmp}/empty.yaml"], "the file is empty"),
    (["validate", "{tmp}/typo.yaml"], "workload.load_erlangs: unknown key (did you mean "
     "load_erlang?)"),
    (["validate", "{tmp}/badtopo.yaml"], "row 2: no length_km"),
    (["trace", "--check", "{tmp}/trace.csv"], "unknown model 'gpt3-6.7bb'; did you mean "
     "gpt3-6.7b"),
    (["reproduce", "nosuch", "--out", "{tmp}/x"], "valid: crosspipe, geopipe, cba, bace"),
])
def test_errors_are_one_line_in_user_terms(cli, tmp_path: Path, argv: list[str],  # type: ignore[no-untyped-def]
                                           expect: str) -> None:
    (tmp_path / "empty.yaml").write_text("")
    text = (SCENARIOS / "quickstart.yaml").read_text()
    (tmp_path / "typo.yaml").write_text(text.replace("load_erlang", "load_erlangs"))
    (tmp_path / "topo.csv").write_text("u,v,length_km\na,b\n")
    spec = yaml.safe_load(text)
    spec["topology"] = {"file": str(tmp_path / "topo.csv")}
    for dc in spec["dcs"]:
        dc["node"] = "a"
    (tmp_path / "badtopo.yaml").write_text(yaml.safe_dump(spec))
    (tmp_path / "trace.csv").write_text(
        "job_id,arrival_s,model,stages,gpus_per_stage,microbatches,iterations\n"
        "1,0,gpt3-6.7bb,4,8,16,100\n")
    r = cli(*[a.replace("{tmp}", str(tmp_path)) for a in argv])
    assert r.code == 2, (r.out, r.err)
    assert r.err.count("\n") == 1 and r.err.startswith("lightpipe: error:"), r.err
    assert expect in r.err, r.err
    assert not PY_LEAKS.search(r.err), r.err


@pytest.mark.parametrize("topo,expect", [
    ("nope.csv", "topology.file: 'sub/nope.csv': no such file"),
    ("bad.csv", "topology.file: sub/bad.csv: row 2: no length_km"),
])
def test_topology_file_errors_show_the_path_as_given(tmp_path: Path, topo: str,
                                                     expect: str) -> None:
    sub = tmp_path / "sub"
    sub.mkdir()
    (sub / "bad.csv").write_text("u,v,length_km\n1,2\n")
    text = (SCENARIOS / "quickstart.yaml").read_text()
    (sub / "spec.yaml").write_text(re.sub(r"(?m)^topology:.*$", f"topology: {{file: {topo}}}",
                                          text))
    res = subprocess.run([LIGHTPIPE, "validate", "sub/spec.yaml"], capture_output=True,
                         text=True, env=ENV, cwd=tmp_path, timeout=120)
    assert res.returncode == 2, res.stderr
    assert res.stderr.count("\n") == 1 and expect in res.stderr, res.stderr
    assert str(tmp_path) not in res.stderr, res.stderr


def test_trace_check_accepts_a_scenarios_own_models(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    trace = tmp_path / "t.csv"
    r = cli("trace", str(SCENARIOS / "pp-jobs.yaml"), "--out", str(trace))
    assert r.code == 0, r.err
    assert cli("trace", "--check", str(trace)).code == 0


# ------------------------------------------------------------------ consistent console
def test_sim_and_run_backend_sim_print_the_same_summary(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    spec = small_quickstart(tmp_path)
    a = cli("sim", str(spec), "--out", str(tmp_path / "a"), "-q")
    shutil.rmtree(tmp_path / "a")  # the same path, so that both summaries name it
    b = cli("run", str(spec), "--backend", "sim", "--out", str(tmp_path / "a"), "-q")
    assert a.code == b.code == 0

    def norm(text: str) -> list[str]:
        return [ln for ln in text.splitlines()
                if not ln.startswith("lightpipe: running") and "wall_s" not in ln]

    assert norm(a.out) == norm(b.out)
    for words in ("on the sim backend", "blocking_ratio:", "records: ", "next: lightpipe report"):
        assert words in a.out
    readme = (tmp_path / "a" / "README.md").read_text()
    assert "`requests.csv`" in readme and "`manifest.json`" in readme


def test_progress_off_a_terminal_says_each_phase_once(tmp_path: Path) -> None:
    res = subprocess.run([LIGHTPIPE, "sim", str(small_quickstart(tmp_path, 2000)), "--out",
                          str(tmp_path / "r")], capture_output=True, text=True, env=ENV,
                         timeout=300)
    assert res.returncode == 0, res.stderr
    assert res.stderr.count("simulating requests (") == 1
    assert res.stderr.count("simulating requests: done in") == 1
    quiet = subprocess.run([LIGHTPIPE, "sim", str(small_quickstart(tmp_path, 200)), "--out",
                            str(tmp_path / "q"), "-q"], capture_output=True, text=True, env=ENV,
                           timeout=300)
    assert quiet.returncode == 0 and quiet.stderr == ""


def test_progress_bar_names_the_point() -> None:
    import io

    from rich.console import Console
    from rich.progress import Progress as RichProgress

    from testbed.progress import _Rich

    buf = io.StringIO()
    with RichProgress(console=Console(file=buf, force_terminal=True)) as bar:
        task = bar.add_task("cba: load points", total=4)
        p = _Rich(bar, task, "cba: load points")
        p.describe("1 job / 200 s, sp-ff, seed 1")
        assert bar.tasks[0].description == "cba: load points: 1 job / 200 s, sp-ff, seed 1"


def test_schedule_reproductions_weight_exact_solves() -> None:
    """crosspipe's CP-SAT solves dominate its run: they weigh their time limit, the list
    schedules a few ms; geopipe (no solver) weighs every step the same."""
    from testbed.experiments.schedules import EXACT_SCHEDULES, HEURISTIC_STEP_S, step_weight

    assert EXACT_SCHEDULES == ("crosspipe-opt",)
    assert step_weight("crosspipe-opt", {"time_limit_s": 5}) == 5.0
    assert step_weight("crosspipe-opt", {}) == 5.0  # crosspipe()'s default limit
    for name in ("gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "crosspipe-greedy", "geopipe"):
        assert step_weight(name, {}) == HEURISTIC_STEP_S
    assert step_weight("crosspipe-opt", {"time_limit_s": 5}) >= 100 * HEURISTIC_STEP_S


def test_weighted_progress_says_eta_unknown_until_a_heavy_step_ends() -> None:
    import io

    from rich.console import Console
    from rich.progress import Progress as RichProgress

    from testbed.progress import _eta_column, _Weighted

    col = _eta_column()
    with RichProgress(console=Console(file=io.StringIO(), force_terminal=True)) as bar:
        weights = [0.005, 0.005, 5.0, 0.005, 5.0]
        task = bar.add_task("crosspipe sweep", total=sum(weights), steps="0/5",
                            eta_known=False)
        p = _Weighted(bar, task, "crosspipe sweep", weights)
        p.advance()
        p.advance()
        t = bar.tasks[0]
        assert t.fields["steps"] == "2/5" and t.completed == pytest.approx(0.01)
        assert col.render(t).plain == "ETA unknown"
        p.advance()  # the first exact solve ends: from now on an estimate
        t = bar.tasks[0]
        assert t.fields["steps"] == "3/5" and t.completed == pytest.approx(5.01)
        assert col.render(t).plain != "ETA unknown"


def test_weighted_progress_off_a_terminal_names_steps_and_solves(capsys) -> None:  # type: ignore[no-untyped-def]
    from testbed.progress import weighted

    with weighted([0.005] * 3 + [5.0], "crosspipe sweep", False, "1 exact solves") as bar:
        for _ in range(4):
            bar.advance()
    err = capsys.readouterr().err
    assert "crosspipe sweep (4 steps, 1 exact solves) ..." in err
    assert err.count("crosspipe sweep: done in") == 1


def test_capped_emulation_and_hold_say_why() -> None:
    from testbed.cli.summary import capped

    notes = capped({"backend": "emu", "requests": 50}, 20000)
    assert notes and "first 50 of the spec's 20000" in notes[0] and "max_requests" in notes[0]
    assert "skipped" in capped({"backend": "emu", "held": True}, None)[0]
    assert capped({"backend": "sim", "requests": 20000}, 20000) == []


# ------------------------------------------------------------------ setup installs the tools
def test_setup_installs_every_documented_tool() -> None:
    text = (REPO / "scripts" / "setup.sh").read_text()
    body = re.search(r"SYS_PKGS=\(([^)]*)\)", text, re.S)
    tests_only = re.search(r"TEST_PKGS=\(([^)]*)\)", text, re.S)
    assert body is not None and tests_only is not None
    pkgs = set(body.group(1).split())
    assert {"iputils-ping", "iperf3", "iproute2", "curl", "prometheus", "mininet",
            "openvswitch-switch", "util-linux"} <= pkgs
    # the browser the report's tests drive: where the archive has it (Debian's names)
    assert {"chromium", "chromium-driver", "shellcheck"} <= set(tests_only.group(1).split())
    # every tool a documented `lightpipe exec` example runs comes from one of them
    docs = "\n".join(p.read_text() for p in [REPO / "README.md", *(REPO / "docs").glob("*.md")])
    tools = set(re.findall(r"lightpipe exec (?:--network \S+ )?\S+ -- ([a-z][\w.-]*)\s", docs))
    assert tools, "no documented exec example found"
    provided = {"ping": "iputils-ping", "iperf3": "iperf3", "ip": "iproute2", "tc": "iproute2",
                "curl": "curl", "ss": "iproute2", "python": None, "sh": None}
    for tool in tools:
        assert tool in provided, f"documented tool {tool} not mapped to a package"
        if provided[tool]:
            assert provided[tool] in pkgs, tool


# ------------------------------------------------------------------ clean --dry-run
def test_clean_dry_run_agrees_with_clean(cli, tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from testbed.emu.state import RunState, proc_start_ticks

    monkeypatch.setenv("LIGHTPIPE_STATE_DIR", str(tmp_path / "state"))
    prefix = "lp%04x" % (os.getpid() & 0xFFFF)
    d = tmp_path / "state" / prefix
    d.mkdir(parents=True)
    RunState(prefix, str(d), os.getpid(), proc_start_ticks(os.getpid()) or 0).save()
    dry = cli("clean", prefix, "--dry-run")
    assert dry.code == 0 and f"would keep {prefix}: run is live" in dry.out, dry.out
    real = cli("clean", prefix)
    assert real.code == 0 and f"kept {prefix}" in real.out and d.exists()


# ------------------------------------------------------------------ controller
def test_controller_prints_url_and_keeps_its_db_out_of_the_cwd(tmp_path: Path) -> None:
    pytest.importorskip("os_ken")
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    env = {**ENV, "XDG_STATE_HOME": str(tmp_path / "xdg")}
    proc = subprocess.Popen([LIGHTPIPE, "controller", str(SCENARIOS / "quickstart.yaml"),
                             "--port", "0", "--rest-port", "0"], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # the ports the controller bound (0: any free)
        m = re.search(r"REST API at http://127\.0\.0\.1:(\d+) .*OpenFlow 1\.3 on "
                      r"tcp:127\.0\.0\.1:(\d+)", line)
        assert m and int(m[1]) > 0 and int(m[2]) > 0 and m[1] != m[2], line
        with socket.socket() as s:  # the OpenFlow port is really held by the controller
            with pytest.raises(OSError):
                s.bind(("127.0.0.1", int(m[2])))
        wait_until((tmp_path / "xdg" / "lightpipe" / "controller.db").exists,
                   "the controller's database under XDG_STATE_HOME", interval_s=0.2,
                   alive=lambda: None if proc.poll() is None else "the controller exited")
        assert list(cwd.iterdir()) == []
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(scaled(30))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("which", ["--port", "--rest-port"])
def test_controller_names_a_taken_port(cli, which: str) -> None:  # type: ignore[no-untyped-def]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        taken = s.getsockname()[1]
        ports = {"--port": 0, "--rest-port": 0}
        ports[which] = taken
        r = cli("controller", str(SCENARIOS / "quickstart.yaml"), "--port",
                str(ports["--port"]), "--rest-port", str(ports["--rest-port"]))
    assert r.code == 2 and f"127.0.0.1:{taken} is in use" in r.err and which in r.err


# ------------------------------------------------------------------ held emulation (root)
ROOT = os.geteuid() == 0
HAVE_EMU = all(shutil.which(t) for t in ("mnexec", "iperf3", "ovs-vsctl", "ping", "unshare"))


@pytest.mark.root
@pytest.mark.slow
@pytest.mark.skipif(not (ROOT and HAVE_EMU), reason="needs root, Mininet, Open vSwitch, ping")
@pytest.mark.parametrize("sig", ["INT", "TERM"])
def test_held_emulation_from_a_non_interactive_shell(tmp_path: Path, sig: str) -> None:
    """Started in the background of `sh -c` (SIGINT ignored there), a held emulation lets
    `exec HOST -- ping OTHER-HOST-NAME` resolve and reach the host, and stops cleanly on
    SIGINT and SIGTERM: the README's quickstart for SIGINT, a two-DC network with the same
    host names for SIGTERM (a held quickstart took 89-133 s of a busy 2-core machine)."""
    out = tmp_path / "hold"
    log = tmp_path / "hold.log"
    pidfile = tmp_path / "pid"
    spec = SCENARIOS / "quickstart.yaml"
    if sig == "TERM":
        spec = tmp_path / "two-dc.yaml"
        spec.write_text(yaml.safe_dump({
            "name": "hold-two-dc",
            "topology": {"links": [{"u": "A", "v": "B", "length_km": 1000}]},
            "dcs": [{"name": "dc-a", "node": "A", "gpus": 8},
                    {"name": "dc-d", "node": "B", "gpus": 8}],
            "workload": {"kind": "lightpath_requests"},
            "emulation": {"bandwidth_divisor": 10000}}))
    # (--probe-seconds 0.5: the verification's iperf3 per lightpath is not what is tested)
    subprocess.run(["sh", "-c", f"{LIGHTPIPE} emu {spec} --out {out} --probe-seconds 0.5 "
                    f"--hold > {log} 2>&1 & echo $! > {pidfile}"], env=ENV, check=True)
    pid = int(pidfile.read_text())
    try:
        wait_until(lambda: log.exists() and "holding" in log.read_text(),
                   "the emulation to say it is holding", timeout_s=240, interval_s=0.5,
                   alive=lambda: None if _alive(pid) else log.read_text()[-2000:])
        text = log.read_text()
        assert "holding" in text, text[-2000:]
        assert "it skips the lightpath_requests workload" in text  # --hold says what it skips
        ignored = int(re.search(r"SigIgn:\s*([0-9a-f]+)", Path(f"/proc/{pid}/status")
                                .read_text()).group(1), 16)
        assert not ignored & (1 << (signal.SIGINT - 1)), "SIGINT still ignored"
        ping = subprocess.run([LIGHTPIPE, "exec", "dc-a-h0", "--network", str(out), "--",
                               "ping", "-c", "2", "-W", "3", "dc-d-h0"], env=ENV,
                              capture_output=True, text=True, timeout=60)
        assert ping.returncode == 0, ping.stdout + ping.stderr
        assert "PING dc-d-h0 (10." in ping.stdout and " 0% packet loss" in ping.stdout
        os.kill(pid, getattr(signal, f"SIG{sig}"))
        wait_until(lambda: not _alive(pid), f"the held emulation to stop on SIG{sig}",
                   timeout_s=120, interval_s=0.2)
        summary = json.loads((out / "summary.json").read_text())
        assert summary["held"] is True
        prefix = json.loads((out / "network.json").read_text())["prefix"]
        netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert prefix not in netns
    finally:
        if _alive(pid):
            os.kill(pid, signal.SIGTERM)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie of ours is not alive
        return Path(f"/proc/{pid}/status").read_text().find("State:\tZ") < 0
    except OSError:
        return False
