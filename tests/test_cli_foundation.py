"""Golden CLI tests of the foundation subcommands: validate, schema, topologies, env, trace."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from testbed.topologies import library_names, load_library, summary

from .conftest import SCENARIOS


def test_validate_ok_and_bad(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    r = cli("validate", str(SCENARIOS / "quickstart.yaml"))
    assert r.code == 0 and "ok" in r.out
    bad = tmp_path / "bad.yaml"
    bad.write_text((SCENARIOS / "quickstart.yaml").read_text().replace('node: "6"', 'node: "x"'))
    r = cli("validate", str(bad))
    assert r.code == 2
    assert r.err.strip().endswith(
        "dcs[1].node: unknown node 'x' (topology nsfnet has 1..14)")
    assert len(r.err.strip().splitlines()) == 1


def test_missing_file_and_bad_flag(cli) -> None:  # type: ignore[no-untyped-def]
    r = cli("validate", "/nonexistent/spec.yaml")
    assert r.code == 2 and "no such file" in r.err
    r = cli("topologies", "--bogus")
    assert r.code == 2 and "unknown option --bogus" in r.err


def test_schema_is_json_schema(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    r = cli("schema")
    schema = json.loads(r.out)
    assert r.code == 0 and schema["title"] == "LightPipe scenario"
    assert {"topology", "dcs", "workload"} <= set(schema["properties"])
    out = tmp_path / "schema.json"
    assert cli("schema", "--out", str(out)).code == 0
    assert json.loads(out.read_text()) == schema


def test_schema_accepts_bundled_scenarios() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    import yaml

    from testbed.spec import scenario_json_schema

    schema = scenario_json_schema()
    paths = sorted(SCENARIOS.glob("*.yaml"))
    assert {"quickstart.yaml", "pp-jobs.yaml"} <= {p.name for p in paths}  # not vacuous
    for path in paths:
        jsonschema.validate(yaml.safe_load(path.read_text()), schema)
    # and the schema does refuse: a scenario without its topology is not valid
    broken = yaml.safe_load((SCENARIOS / "quickstart.yaml").read_text())
    del broken["topology"]
    with pytest.raises(jsonschema.ValidationError, match="topology"):
        jsonschema.validate(broken, schema)


def test_topologies_list_and_show(cli) -> None:  # type: ignore[no-untyped-def]
    r = cli("topologies", "--json")
    rows = {row["name"]: row for row in json.loads(r.out)}
    assert rows["nsfnet"]["nodes"] == 14 and rows["nsfnet"]["fibres"] == 22
    for name in ("usnet", "cost239", "jpn12"):
        assert name in rows
    r = cli("topologies", "nsfnet")
    assert (r.code == 0 and "13   14 150" in r.out.replace("  ", " ").replace("  ", " ")) or \
        "150" in r.out
    assert cli("topologies", "arpanet").code == 2
    assert cli("topologies", "--draw", "x.png").code == 2


def test_topologies_draw(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    png = tmp_path / "nsf.png"
    r = cli("topologies", "nsfnet", "--draw", str(png))
    assert r.code == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("name,nodes,fibres", [("nsfnet", 14, 22), ("nsfnet21", 14, 21),
                                               ("usnet", 24, 43), ("cost239", 11, 26),
                                               ("jpn12", 12, 17)])
def test_library_sizes(name: str, nodes: int, fibres: int) -> None:
    assert name in library_names()
    info = summary(load_library(name))
    assert (info["nodes"], info["fibres"], info["connected"]) == (nodes, fibres, True)
    assert info["source"]


def test_nsfnet_matches_shared_reference() -> None:
    """The bundled NSFNET is the 22-link DeepRMSA variant, fibre for fibre."""
    # a copy of shared/data/nsfnet_chen_22.csv kept in the repository: the test read it
    # from beside the checkout and skipped where it was absent (every CI clone)
    ref = Path(__file__).resolve().parent / "data" / "nsfnet_chen_22.csv"
    rows = [line.split(",") for line in ref.read_text().splitlines()[2:] if line.strip()]
    expected = {(u, v): float(km) for u, v, km in rows}
    got = {(f.u, f.v): f.length_km for f in load_library("nsfnet").fibres}
    assert got == expected


def test_env_json(cli) -> None:  # type: ignore[no-untyped-def]
    r = cli("env", "--json")
    info = json.loads(r.out)
    assert r.code == 0
    assert {"root", "netem", "ovs_kernel_datapath", "prometheus", "torch",
            "emulation_possible"} <= set(info)


def test_trace_generate_and_check(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "jobs.csv"
    r = cli("trace", str(SCENARIOS / "pp-jobs.yaml"), "--out", str(out))
    assert r.code == 0 and out.exists()
    r = cli("trace", str(out), "--check")
    assert r.code == 0 and "200 jobs" in r.out
    # Generated twice with the same seed: identical.
    out2 = tmp_path / "jobs2.csv"
    cli("trace", str(SCENARIOS / "pp-jobs.yaml"), "--out", str(out2))
    assert out.read_text() == out2.read_text()
    r = cli("trace", str(SCENARIOS / "quickstart.yaml"), "--out", str(out))
    assert r.code == 2 and "workload.kind" in r.err


def test_console_script_runs() -> None:
    exe = Path(sys.executable).parent / "lightpipe"
    if not exe.exists():
        pytest.skip("console script not installed")
    res = subprocess.run([str(exe), "--version"], capture_output=True, text=True, check=False)
    assert res.returncode == 0 and res.stdout.startswith("lightpipe ")
    res = subprocess.run([str(exe)], capture_output=True, text=True, check=False)
    assert res.returncode == 2


def test_run_auto_falls_back_to_sim_with_reason() -> None:
    from testbed.cli.run_cmd import choose_backend
    from testbed.spec import load_scenario

    # pp-jobs' fibres are too fast for one machine at its bandwidth divisor.
    names, why = choose_backend("auto", load_scenario(SCENARIOS / "pp-jobs.yaml"))
    assert names == ["sim"] and "simulation" in why
    assert choose_backend("sim", load_scenario(SCENARIOS / "quickstart.yaml"))[0] == ["sim"]
    assert choose_backend("both", load_scenario(SCENARIOS / "quickstart.yaml"))[0] == \
        ["sim", "emu"]


def test_sigusr1_prints_every_threads_stack_and_the_command_goes_on() -> None:
    """`kill -USR1` on a command that seems stuck: every thread's stack on its stderr, and
    it goes on (main() registers it for every command)."""
    import signal
    import time

    code = ("import faulthandler, signal, sys, threading, time\n"
            "from testbed.cli.main import main\n"
            "assert main(['validate', sys.argv[1]]) == 0\n"
            "threading.Thread(target=time.sleep, args=(60,), name='helper', daemon=True)"
            ".start()\n"
            "print('ready', flush=True)\n"
            "sys.stdin.readline()\n"
            "print('went on', flush=True)\n")
    p = subprocess.Popen([sys.executable, "-c", code, str(SCENARIOS / "quickstart.yaml")],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None and p.stdin is not None
        assert "ok" in p.stdout.readline()  # validate's line
        assert p.stdout.readline().strip() == "ready"
        p.send_signal(signal.SIGUSR1)
        time.sleep(0.5)  # the dump is written by the signal handler, then the process waits
        p.stdin.write("\n")
        p.stdin.flush()
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 0 and out.strip() == "went on"
    assert err.count("hread 0x") >= 2  # "Current thread" (main) and "Thread" (helper)
    assert "File \"<string>\"" in err and "in _bootstrap" in err
