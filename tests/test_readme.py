"""The README, run as a newcomer would: every command in its code blocks is either run here
(in README order, in a scratch directory, `lightpipe` on PATH as `make setup` puts it) or
named in COVERED with the reason it is not (a VM, the suite itself, a long emulation that
another test runs). A command added to the README without an entry here fails the test."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.waiting import scaled

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
# The venv that runs these tests (make test's .venv, or another Python's venv as CI's
# user-install step gives it): its own `lightpipe`, not always the checkout's .venv.
BIN = next((b for b in (Path(sys.executable).parent, ROOT / ".venv" / "bin")
            if (b / "lightpipe").exists()), ROOT / ".venv" / "bin")

FAST = "run by test_readme_commands_without_root"
SLOW = "run by test_readme_slow_commands (slow: make test, not make test-fast)"
SLOW_ONE_SEED = ("run by test_readme_slow_commands with one seed (every case at its full "
                 "size, once); the many-seed run is measured by bench/bench_reproduce.py")
AS_ROOT = "run by test_readme_monitor_steps_as_root"
VM = "needs Vagrant and a VM: tests/vm/user_path.sh (docs/vm.md)"
LONG_EMU = "a long emulation (root): "

COVERED: dict[str, str] = {
    # the user's path: a VM
    "cd vagrant && vagrant up": VM,
    "vagrant ssh -c 'lightpipe run scenarios/monitor-demo.yaml'": VM,
    "vagrant ssh -c 'sudo cat /etc/lightpipe/grafana-admin-password'": VM,
    "vagrant ssh -c 'lightpipe emu scenarios/quickstart.yaml'": VM,
    # quick start
    "make demo": FAST,
    "make test": "the suite itself (this test is part of it)",
    # validation example ($ lines: command and its output)
    "lightpipe validate broken.yaml": FAST,
    # simulation, sweeps, plans
    "lightpipe sim scenarios/quickstart.yaml --out runs/sim": FAST,
    "lightpipe sweep scenarios/quickstart.yaml --set workload.load_erlang=10,20,40 "
    "--set policy.spectrum=first_fit,best_fit --seeds 5 --out runs/sweep": FAST,
    "lightpipe plan scenarios/quickstart.yaml --out runs/plan.json": FAST,
    "lightpipe sweep scenarios/quickstart.yaml --set workload.load_erlang=10,20,40 "
    "--seeds 4 --out runs/sweep-ray --ray-address local": SLOW,
    "ray start --head --num-cpus 8 --include-dashboard false":
        "starts a Ray cluster that outlives the command: tests/test_sweep_ray.py runs "
        "sweeps on a running cluster",
    "lightpipe sweep ... --ray-address HOST:PORT": "a placeholder for the address above",
    # schedules and reproductions
    "lightpipe schedule --stages 4 --microbatches 8 --forward-ms 10 --backward-ms 20 "
    "--activation-mb 50 --latency-ms 0,20,0 --bandwidth-gbps 400,100,400 "
    "--schedule crosspipe-opt --memory-cap 4 --json --trace t.json --gantt g.png": FAST,
    "lightpipe reproduce crosspipe --out runs/crosspipe": SLOW,
    "lightpipe reproduce geopipe --out runs/geopipe": FAST,
    "lightpipe run scenarios/cba-nsfnet.yaml --backend sim --out runs/cba": FAST,
    "lightpipe plan scenarios/cba-nsfnet.yaml --out runs/cba-plan.json": FAST,
    "lightpipe reproduce cba --out runs/repro-cba": SLOW_ONE_SEED,
    "lightpipe reproduce bace --out runs/repro-bace": SLOW_ONE_SEED,
    "lightpipe route --clos 32x64 --hosts-per-leaf 8 --jobs 16 --ring-size 16 --seed 1 "
    "--policy greedy --json": FAST,
    "lightpipe route --clos 4x8 --hosts-per-leaf 4 --jobs 4 --ring-size 6 --policy ilp "
    "--fail spine0-leaf1": FAST,
    "lightpipe reproduce routing --out runs/repro-routing": SLOW_ONE_SEED,
    "python bench/bench_routing.py": SLOW,
    # emulation (root)
    "sudo lightpipe run scenarios/routing-leafspine.yaml --backend both --out runs/route":
        LONG_EMU + "tests/test_routing_emu.py runs this scenario on both backends",
    "sudo lightpipe emu scenarios/quickstart.yaml --out runs/emu":
        LONG_EMU + "tests/test_emu_net.py, tests/test_controller_replay.py",
    "sudo lightpipe emu scenarios/quickstart.yaml --out runs/emu --hold":
        LONG_EMU + "tests/test_emu_net.py holds a network and runs `exec` in it",
    "sudo lightpipe exec dc-a-h0 -- iperf3 -s -D": LONG_EMU + "tests/test_emu_net.py",
    "sudo lightpipe fault fiber_cut 1 3": LONG_EMU + "tests/test_faultctl.py",
    "sudo lightpipe clean": "removes leftovers of every dead run on the machine: "
                            "tests/test_security_clean.py runs it on its own leftovers",
    "curl -s -H \"Authorization: Bearer $TOKEN\" -XPOST $URL/lightpaths "
    "-d '{\"src_dc\": \"dc-a\", \"dst_dc\": \"dc-d\", \"bitrate_gbps\": 400}'":
        LONG_EMU + "the controller's REST API: tests/test_controller_api.py",
    "curl -s -H \"Authorization: Bearer $TOKEN\" -XPOST $URL/jobs "
    "-d '{\"model\": \"llama2-7b\", \"stages\": 4, \"gpus_per_stage\": 32, "
    "\"policy\": \"cba\"}'": LONG_EMU + "tests/test_controller_jobs.py",
    "sudo lightpipe run scenarios/calib-latency-1f1b.yaml --backend both --out runs/calib":
        LONG_EMU + "tests/test_workers_emu.py runs the calibration scenarios",
    # dashboards
    "sudo lightpipe monitor up": AS_ROOT,
    "sudo lightpipe monitor status": AS_ROOT,
    "sudo lightpipe emu scenarios/monitor-demo.yaml --out runs/demo-emu": AS_ROOT,
    "lightpipe grafana check --url http://127.0.0.1:9090": AS_ROOT,
    "sudo lightpipe monitor serve runs/demo-emu": AS_ROOT,
    "sudo lightpipe monitor down": AS_ROOT,
    "GF_PATHS_PROVISIONING=$PWD/grafana/provisioning "
    "LIGHTPIPE_GRAFANA_DASHBOARDS=$PWD/grafana/dashboards grafana server "
    "--homepath /usr/share/grafana":
        "Grafana cannot be installed on these machines (README, Dashboards); its "
        "provisioning is checked as files by tests/test_grafana.py",
    # reports
    "lightpipe report runs/sim": FAST,
    "lightpipe reproduce cba --quick --out runs/cba-quick --report": FAST,
    "lightpipe reproduce outage --quick --out runs/outage": FAST,
    "lightpipe report runs/cba-quick --open": FAST,
}


def readme_commands(text: str) -> list[str]:
    """Every command of the README's shell code blocks (YAML and INI blocks are data), in
    order: continuation lines joined, trailing comments dropped, `$ ` prompts removed."""
    out = []
    for m in re.finditer(r"^( *)```(\w*)\n(.*?)^\1```", text, re.S | re.M):
        if m.group(2) in ("yaml", "ini", "json"):
            continue
        body = re.sub(r"\\\n\s*", "", m.group(3))
        for line in body.splitlines():
            line = line.strip()
            if m.group(2) == "" and not line.startswith("$ ") and any(
                    c.startswith("$ ") for c in body.splitlines()):
                continue  # the output of a `$ ` example
            line = re.sub(r"\s+#\s.*$", "", line.removeprefix("$ ")).strip()
            if line:
                out.append(" ".join(line.split()) if "'" not in line else line)
    return out


def test_every_readme_command_is_run_or_named() -> None:
    cmds = readme_commands(README.read_text())
    normal = [" ".join(c.split()) for c in cmds]
    missing = [c for c in normal if c not in COVERED]
    assert not missing, "README commands no test runs (add them to COVERED):\n" + \
        "\n".join(missing)
    stale = [c for c in COVERED if c not in normal]
    assert not stale, f"COVERED names commands the README no longer has: {stale}"
    assert "make demo" in normal and "make test" in normal  # the README's two commands
    assert not any(".venv/bin/lightpipe " in c for c in cmds), "one way to call lightpipe"


def _scratch(tmp_path: Path) -> dict[str, str]:
    """A newcomer's directory: the checkout's scenarios and bench at hand, `lightpipe` on
    PATH (this checkout's), no browser to open."""
    for name in ("scenarios", "bench", "grafana"):
        (tmp_path / name).symlink_to(ROOT / name)
    return {**os.environ, "PATH": f"{BIN}:{os.environ.get('PATH', '')}", "BROWSER": "true",
            "LIGHTPIPE_MONITOR_DIR": str(tmp_path / "monitor")}


def _sh(cmd: str, cwd: Path, env: dict[str, str], timeout_s: float = 600
        ) -> subprocess.CompletedProcess[str]:
    res = subprocess.run(["bash", "-c", cmd], cwd=cwd, env=env, capture_output=True,
                         text=True, timeout=scaled(timeout_s))
    assert res.returncode == 0, f"{cmd}\nexit {res.returncode}\n{res.stdout[-2000:]}" \
        f"\n{res.stderr[-2000:]}"
    return res


def _commands_for(kind: str) -> list[str]:
    return [" ".join(c.split()) for c in readme_commands(README.read_text())
            if COVERED.get(" ".join(c.split())) == kind]


def _chains(commands: list[str]) -> list[list[str]]:
    """The commands split into chains that share nothing: a command that names what an
    earlier one wrote (`report runs/sim` after `sim ... --out runs/sim`) joins that one's
    chain, after it; the others stand alone. Each chain keeps the README's order and runs in
    its own scratch directory, so that pytest-xdist can run the chains side by side."""
    chains: list[list[str]] = []
    owner: dict[str, int] = {}  # output path -> its chain
    for cmd in commands:
        words = cmd.split()
        outs = [words[i + 1] for i, w in enumerate(words[:-1]) if w == "--out"]
        used = {owner[w] for w in words if w in owner and w not in outs}
        if len(used) > 1:
            raise AssertionError(f"{cmd!r} reads the outputs of two chains: merge them")
        idx = used.pop() if used else len(chains)
        if idx == len(chains):
            chains.append([])
        chains[idx].append(cmd)
        owner.update(dict.fromkeys(outs, idx))
    return chains


def _fast_chains() -> list[list[str]]:
    return _chains(_commands_for(FAST))


def test_readme_quick_commands_are_all_run() -> None:
    """Every quick command of the README is in exactly one chain, in the README's order."""
    commands = _commands_for(FAST)
    chains = _fast_chains()
    assert len(commands) >= 12
    assert sorted(c for ch in chains for c in ch) == sorted(commands)
    for ch in chains:
        assert ch == [c for c in commands if c in ch]
    assert ["lightpipe sim scenarios/quickstart.yaml --out runs/sim",
            "lightpipe report runs/sim"] in chains


@pytest.mark.parametrize("chain", _fast_chains(), ids=lambda ch: " ".join(ch[0].split()[:3]))
def test_readme_commands_without_root(tmp_path: Path, chain: list[str]) -> None:
    """The README's quick commands, each chain in its order, each exit 0 (and the outputs
    it quotes); a report it asks for is written."""
    env = _scratch(tmp_path)
    for cmd in chain:
        if cmd == "make demo":  # into the scratch directory, not the checkout's runs/
            res = _sh(f"make -s -C {shlex.quote(str(ROOT))} demo "
                      f"OUT={shlex.quote(str(tmp_path / 'runs' / 'demo'))}", tmp_path, env)
            assert "1. Spectrum policies on scenarios/quickstart.yaml" in res.stdout
            assert "lightpipe run scenarios/quickstart.yaml --backend both" in res.stdout
            assert "cd vagrant && vagrant up" in res.stdout
        elif cmd == "lightpipe validate broken.yaml":
            _validate_example(tmp_path, env)
        else:
            _sh(cmd, tmp_path, env)
        words = cmd.split()
        if words[:2] == ["lightpipe", "report"]:
            assert (tmp_path / words[2] / "report.html").is_file(), cmd


def _validate_example(tmp_path: Path, env: dict[str, str]) -> None:
    """`$ lightpipe validate broken.yaml` prints the line the README quotes: broken.yaml is
    the README's scenario with dc-b on a node NSFNET does not have."""
    text = README.read_text()
    spec = yaml.safe_load(re.search(r"```yaml\n(.*?)```", text, re.S).group(1))
    spec["dcs"][1]["node"] = "x"
    (tmp_path / "broken.yaml").write_text(yaml.safe_dump(spec))
    res = subprocess.run(["bash", "-c", "lightpipe validate broken.yaml"], cwd=tmp_path,
                         env=env, capture_output=True, text=True, timeout=scaled(60))
    quoted = re.search(r"^\$ lightpipe validate broken.yaml\n(.*)$", text, re.M).group(1)
    assert res.returncode == 2 and res.stderr.strip() == quoted


def _slow_chains() -> list[list[str]]:
    return _chains(_commands_for(SLOW) + _commands_for(SLOW_ONE_SEED))


# Rough time of each slow chain (its first command) on a busy 2-core machine (make test of
# 3373bb0, lanes side by side), for tests/conftest.py's longest-first order; others 60 s.
SLOW_COST_S = {"lightpipe reproduce crosspipe": 95, "lightpipe reproduce routing": 80,
               "lightpipe sweep scenarios/quickstart.yaml": 65}


def _slow_params() -> list[Any]:
    return [pytest.param(ch, id=" ".join(ch[0].split()[:3]), marks=pytest.mark.cost(
        SLOW_COST_S.get(" ".join(ch[0].split()[:3]), 60))) for ch in _slow_chains()]


def test_readme_slow_commands_are_all_run() -> None:
    """Every slow command of the README is in exactly one chain (each runs on its own, so
    that pytest-xdist spreads them: in one test they took 935 s of one worker, CI of
    380e161, the parallel lane's tail); each one-seed command is a reproduction that takes
    seeds."""
    commands = _commands_for(SLOW) + _commands_for(SLOW_ONE_SEED)
    assert len(commands) >= 6
    assert sorted(c for ch in _slow_chains() for c in ch) == sorted(commands)
    from testbed.cli.reproduce_cmd import options, resolve

    one_seed = _commands_for(SLOW_ONE_SEED)
    assert len(one_seed) == 3
    for cmd in one_seed:
        assert cmd.startswith("lightpipe reproduce ") and "--quick" not in cmd, cmd
        assert "seeds" in options(resolve(cmd.split()[2])), cmd


@pytest.mark.slow
@pytest.mark.parametrize("chain", _slow_params())
def test_readme_slow_commands(tmp_path: Path, chain: list[str]) -> None:
    """The full reproductions, the routing benchmark and the sweep on a Ray instance it
    starts, as the README runs them (cba, bace and routing with one seed: every case at its
    full size, once; 20 seeds of routing took 575 s of a 2-core machine's make test, and
    bench/bench_reproduce.py measures the README's own seeds); what each names with --out
    is written."""
    env = _scratch(tmp_path)
    for cmd in chain:
        one_seed = COVERED[cmd] == SLOW_ONE_SEED
        _sh(cmd + " --set seeds=1" if one_seed else cmd, tmp_path, env, timeout_s=900)
        words = cmd.split()
        for out in (words[i + 1] for i, w in enumerate(words[:-1]) if w == "--out"):
            assert (tmp_path / out).exists(), (cmd, out)
            if words[:2] == ["lightpipe", "reproduce"]:
                summary = json.loads((tmp_path / out / "summary.json").read_text())
                assert isinstance(summary, dict) and summary, cmd
                manifest = json.loads((tmp_path / out / "manifest.json").read_text())
                assert manifest["options"] == ({"seeds": 1} if one_seed else {}), cmd
        if words[:3] == ["lightpipe", "reproduce", "routing"]:  # every full-size case
            from testbed.experiments.routing import cases

            ran = {r["case"] for r in summary["rows"]}
            assert ran == {c.name for c in cases(quick=False)}, ran


@pytest.mark.root
def test_readme_monitor_steps_as_root(tmp_path: Path) -> None:
    """The Dashboards section's steps in order: monitor up and status, the monitor-demo
    emulation, grafana check (exit 0, one summary line), serve (until Ctrl-C), down."""
    if os.geteuid() != 0:
        pytest.skip("needs root (the emulation)")
    for tool in ("mnexec", "prometheus"):
        if shutil.which(tool) is None:
            pytest.skip(f"needs {tool}")
    env = _scratch(tmp_path)
    cmds = _commands_for(AS_ROOT)
    url = None
    try:
        for cmd in cmds:
            cmd = cmd.removeprefix("sudo ")  # (root already; sudo may be absent)
            if cmd == "lightpipe monitor up":
                res = _sh(f"{cmd} --json", tmp_path, env)  # (its port: 9090 may be taken)
                url = json.loads(res.stdout)["url"]
            elif cmd == "lightpipe monitor status":
                res = _sh(cmd, tmp_path, env)
                assert f"prometheus up at {url}" in res.stdout
                assert "runs being scraped now: none (an emulation run registers" in res.stdout
            elif cmd.startswith("lightpipe grafana check"):
                assert url is not None
                res = _sh(cmd.replace("http://127.0.0.1:9090", url), tmp_path, env)
                last = res.stdout.splitlines()[-1]
                assert re.match(r"grafana check of run demo-emu-\d{8}T\d{6}Z: \d+ queries "
                                r"with data, 0 empty but expected, 5 empty because the run "
                                r"cannot produce them: ", last), last
            elif cmd.startswith("lightpipe monitor serve"):
                _serve_until_ctrl_c(cmd, tmp_path, env)
            else:
                _sh(cmd, tmp_path, env)
    finally:
        subprocess.run(["bash", "-c", "lightpipe monitor down"], cwd=tmp_path, env=env,
                       capture_output=True, timeout=scaled(60))


def _serve_until_ctrl_c(cmd: str, cwd: Path, env: dict[str, str]) -> None:
    proc = subprocess.Popen(["bash", "-c", f"exec {cmd} --port 0"], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        assert line.startswith("serving runs/demo-emu/prometheus/data at http://"), line
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(scaled(60)) == 0
    err = proc.stderr.read() if proc.stderr else ""
    assert "WARNING" not in err, err  # (it warned of a "skipped" TSDB it had copied whole)
