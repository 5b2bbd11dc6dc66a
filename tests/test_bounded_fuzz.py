"""Hostile inputs under a 1 GiB memory cap: every one exits 2 with one line on stderr."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from .conftest import ROOT, SCENARIOS
from .test_bounded_input import HEADER, alias_bomb, trace_scenario

MEMORY_CAP_BYTES = 1 << 30

# Runs in a child process: cap the address space, then run `lightpipe ARGV` for each case
# in turn, capturing stderr; prints {case: [exit code, stderr]} as JSON.
DRIVER = r"""
import io, json, resource, sys
cap = int(sys.argv[1])
resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
if sys.argv[2] == "pure":
    import yaml
    del yaml.CSafeLoader  # the fallback path: PyYAML's pure-Python SafeLoader
from testbed.cli.main import main
from testbed.spec import yamlsafe
cases = json.loads(sys.stdin.read())
out = {"_loader": yamlsafe.BoundedLoader.__mro__[1].__name__}
for name, argv in cases.items():
    err = io.StringIO()
    sys.stderr, saved = err, sys.stderr
    try:
        code = main(argv)
    except BaseException as exc:  # noqa: BLE001 - reported to the test, which fails
        code = f"raised {type(exc).__name__}"
    finally:
        sys.stderr = saved
    out[name] = [code, err.getvalue()]
print(json.dumps(out))
"""


def hostile_cases(tmp: Path) -> dict[str, list[str]]:
    """name -> lightpipe argv, each expected to exit 2 with one line."""
    quick = (SCENARIOS / "quickstart.yaml").read_text()
    files: dict[str, str | bytes] = {
        "bomb_name": alias_bomb("name"),
        "bomb_description": "name: x\n" + alias_bomb("description"),
        "deep_lists": "name: " + "[" * 20000 + "]" * 20000 + "\n",
        "deep_maps": "name: " + "{a: " * 20000 + "1" + "}" * 20000 + "\n",
        "deep_block": "name: x\ndescription:\n" + "- " * 20000 + "x\n",
        "digits_5000": quick.replace("seed: ", "seed: " + "7" * 5000 + " #", 1)
        if "seed: " in quick else "name: x\nversion: " + "7" * 5000 + "\n",
        "float_5000": "name: x\noptical: {slot_ghz: " + "9" * 5000 + ".5}\n",
        "latin1": quick.replace("quickstart", "caf\xe9").encode("latin-1"),
        "invalid_utf8": b"\xff\xfe" + quick.encode(),
        "duplicate_key": quick + "\nname: again\n",
        "slots_true": quick.replace("slots: 80,", "slots: true,"),
        "slots_text": quick.replace("slots: 80,", "slots: '80',"),
        "too_large": quick + "#" + "x" * (2 << 20) + "\n",
        "recursive_alias": "name: &a [*a]\n",
        "binary": bytes(range(256)) * 64,
        "nul_bytes": quick.replace("name:", "na\0me:"),
    }
    spec = yaml.safe_load(quick)
    fifo = tmp / "fifo.csv"
    os.mkfifo(fifo)
    for name, target in (("topology_dev_zero", "/dev/zero"), ("topology_fifo", str(fifo))):
        files[name] = yaml.safe_dump({**spec, "topology": {"file": target}})
    cases: dict[str, list[str]] = {}
    for name, text in files.items():
        p = tmp / f"{name}.yaml"
        if isinstance(text, bytes):
            p.write_bytes(text)
        else:
            p.write_text(text)
        cases[name] = ["validate", str(p)]
    cases["spec_is_fifo"] = ["validate", str(fifo)]
    cases["spec_is_dev_zero"] = ["validate", "/dev/zero"]
    for name, row in (("trace_microbatches_1e12", "0,0,gpt3-6.7b,4,8,1000000000000,500\n"),
                      ("trace_arabic_digits", "0,0,gpt3-6.7b,4,8,\u0661\u0662,500\n"),
                      ("trace_iterations_5000_digits", "0,0,gpt3-6.7b,4,8,16," + "9" * 5000
                       + "\n")):
        d = tmp / name
        d.mkdir()
        spec_path = trace_scenario(d, HEADER + row)
        cases[name + "_check"] = ["trace", "--check", str(d / "t.csv")]
        cases[name + "_validate"] = ["validate", str(spec_path)]
        cases[name + "_sim"] = ["sim", str(spec_path), "--out", str(d / "out")]
    cases["trace_is_fifo"] = ["trace", "--check", str(fifo)]
    huge = tmp / "huge_field.csv"
    huge.write_text(HEADER + '0,0,"' + "x" * 200_000 + '",4,8,16,500\n')
    cases["trace_huge_field"] = ["trace", "--check", str(huge)]
    # A lightpath-request trace that turns Latin-1 after its first row (read as a stream).
    req = tmp / "req.csv"
    req.write_bytes(b"arrival_s,holding_s,src,dst,bitrate_gbps\n0,1,1,2,100\n1,1,caf\xe9,2,100\n")
    cases["request_trace_latin1"] = ["validate", str(write_spec(
        tmp / "req.yaml", {**spec, "workload": {"kind": "lightpath_requests",
                                                "trace": str(req)}}))]
    return cases


def write_spec(path: Path, spec: dict) -> Path:
    path.write_text(yaml.safe_dump(spec))
    return path


def run_capped(cases: dict[str, list[str]], loader: str) -> dict[str, list]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1",
           "OPENBLAS_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", DRIVER, str(MEMORY_CAP_BYTES), loader],
                          input=json.dumps(cases), capture_output=True, text=True,
                          timeout=600, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("loader", ["libyaml", "pure"])
def test_hostile_inputs_exit_2_one_line_under_memory_cap(tmp_path: Path, loader: str) -> None:
    if loader == "libyaml" and not yaml.__with_libyaml__:
        pytest.skip("PyYAML built without libyaml")
    cases = hostile_cases(tmp_path)
    results = run_capped(cases, loader)
    assert results.pop("_loader") == ("CSafeLoader" if loader == "libyaml" else "SafeLoader")
    assert set(results) == set(cases)  # every case ran (an empty answer passed before)
    bad = {name: res for name, res in results.items()
           if res[0] != 2 or res[1].count("\n") != 1
           or not res[1].startswith("lightpipe: error: ") or "Traceback" in res[1]}
    assert not bad, bad
    for name in cases:
        if name.endswith("_sim"):
            assert not (tmp_path / name.removesuffix("_sim") / "out").exists()


def test_mutated_specs_never_crash_under_memory_cap(tmp_path: Path) -> None:
    """Seeded byte mutations of a bundled scenario: valid (0) or refused in one line (2)."""
    rng = random.Random(17)
    base = (SCENARIOS / "pp-jobs.yaml").read_bytes()
    cases: dict[str, list[str]] = {}
    for i in range(60):
        data = bytearray(base)
        for _ in range(rng.randint(1, 8)):
            pos = rng.randrange(len(data))
            op = rng.random()
            if op < 0.4:
                data[pos] = rng.randrange(256)
            elif op < 0.7:
                del data[pos:pos + rng.randint(1, 20)]
            else:
                data[pos:pos] = rng.choice([b"&a ", b"*a", b"[", b"{", b"\xe9", b"99999" * 20,
                                            b": ", b"\n", b"true", b"!!python/object "])
        p = tmp_path / f"m{i}.yaml"
        p.write_bytes(bytes(data))
        cases[f"m{i}"] = ["validate", str(p)]
    results = run_capped(cases, "libyaml" if yaml.__with_libyaml__ else "pure")
    results.pop("_loader")
    assert set(results) == set(cases)  # every mutation ran (an empty answer passed before)
    bad = {name: res for name, res in results.items()
           if res[0] not in (0, 2) or (res[0] == 2 and res[1].count("\n") != 1)}
    assert not bad, bad
    # the seeded mutations reach the refusal path (not all of them are harmless)
    assert sum(res[0] == 2 for res in results.values()) >= 10, results
