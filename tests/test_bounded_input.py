"""Bounded input: hostile spec/trace/topology files exit 2 with one line, within memory."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from testbed.spec.load import _short
from testbed.spec.yamlsafe import BoundedLoader, load_bounded_yaml

from .conftest import SCENARIOS

QUICK = (SCENARIOS / "quickstart.yaml").read_text()


def alias_bomb(key: str) -> str:
    """Nested lists of aliases 9 levels deep (9**9 'lol's) under `key`: a few hundred bytes."""
    doc = 'x0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n'
    for i in range(1, 9):
        doc += f"x{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]\n"
    return doc + f"{key}: [" + ",".join(["*a8"] * 9) + "]\n"


def _one_line_exit2(res) -> None:  # type: ignore[no-untyped-def]
    assert res.code == 2, res.err
    assert res.err.count("\n") == 1 and res.err.startswith("lightpipe: error: "), res.err
    assert "Traceback" not in res.err


def test_libyaml_loader_used_where_installed() -> None:
    if yaml.__with_libyaml__:
        assert issubclass(BoundedLoader, yaml.CSafeLoader)
    else:
        assert issubclass(BoundedLoader, yaml.SafeLoader)
    assert load_bounded_yaml("a: [1, 2]\nb: {c: x}\n") == {"a": [1, 2], "b": {"c": "x"}}


def test_spec_size_limit_before_parsing(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    big = tmp_path / "big.yaml"
    big.write_text(QUICK + "# " + "x" * (1 << 20) + "\n")
    res = cli("validate", str(big))
    _one_line_exit2(res)
    assert "too large" in res.err and "1048576" in res.err


@pytest.mark.parametrize("key", ["name", "description"])
def test_alias_bomb_refused(cli, tmp_path: Path, key: str) -> None:  # type: ignore[no-untyped-def]
    p = tmp_path / "bomb.yaml"
    p.write_text(alias_bomb(key))
    assert p.stat().st_size < 800
    res = cli("validate", str(p))
    _one_line_exit2(res)
    assert "expands to more than" in res.err


def test_error_message_does_not_serialise_huge_values() -> None:
    # The same shared-reference structure the YAML constructor builds from an alias bomb.
    value: list[object] = ["lol"] * 9
    for _ in range(9):
        value = [value] * 9
    shown = _short(value)
    assert len(shown) <= 60 and shown.startswith("[[[")
    assert _short(10 ** 5000).startswith("an integer of")


@pytest.mark.parametrize("text, words", [
    # LightPipe's own words and the position: PyYAML 6.0.4 stops deep nesting itself
    # ("exceeded maximum nesting depth") before LightPipe's check ("nested deeper than").
    ("name: " + "[" * 20000 + "]" * 20000 + "\n", "invalid YAML: line 1, column"),
    # Deeper than LightPipe's own limit but within PyYAML's: LightPipe's check speaks.
    ("name: " + "[" * 150 + "]" * 150 + "\n", "nested deeper than"),
    ("name: x\nversion: " + "1" * 5000 + "\n", "number too long"),
    (QUICK + "\nname: other\n", "duplicate key 'name'"),
    ("name: x\ntopology: {library: nsfnet, library: usnet}\n", "duplicate key 'library'"),
    ("a: &a [*a]\n", "invalid YAML"),
])
def test_hostile_yaml_one_line(cli, tmp_path: Path, text: str, words: str) -> None:  # type: ignore[no-untyped-def]
    p = tmp_path / "bad.yaml"
    p.write_text(text)
    res = cli("validate", str(p))
    _one_line_exit2(res)
    assert words in res.err


def test_latin1_and_invalid_utf8(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    p = tmp_path / "latin1.yaml"
    p.write_bytes(QUICK.replace("quickstart", "caf\xe9").encode("latin-1"))
    res = cli("validate", str(p))
    _one_line_exit2(res)
    assert "not UTF-8" in res.err


def test_bool_for_int_refused(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    p = tmp_path / "slots.yaml"
    assert "slots: 80," in QUICK
    p.write_text(QUICK.replace("slots: 80,", "slots: true,", 1))
    res = cli("validate", str(p))
    _one_line_exit2(res)
    assert "optical.slots" in res.err


HEADER = "job_id,arrival_s,model,stages,gpus_per_stage,microbatches,iterations\n"
GOOD_ROW = "0,0,gpt3-6.7b,4,8,16,500\n"


def trace_scenario(tmp_path: Path, trace_text: str | bytes, name: str = "t.csv") -> Path:
    """pp-jobs.yaml with its workload read from a trace file next to it."""
    trace = tmp_path / name
    if isinstance(trace_text, bytes):
        trace.write_bytes(trace_text)
    else:
        trace.write_text(trace_text)
    spec = yaml.safe_load((SCENARIOS / "pp-jobs.yaml").read_text())
    spec["workload"] = {"kind": "pp_jobs", "trace": name}
    spec["events"] = []
    p = tmp_path / "spec.yaml"
    p.write_text(yaml.safe_dump(spec))
    return p


def test_regular_files_only(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    spec = yaml.safe_load(QUICK)
    fifo = tmp_path / "fifo.csv"
    os.mkfifo(fifo)
    for target in ("/dev/zero", str(fifo), str(tmp_path)):
        spec["topology"] = {"file": target}
        p = tmp_path / "topo.yaml"
        p.write_text(yaml.safe_dump(spec))
        res = cli("validate", str(p))  # a FIFO with no writer would block a plain open()
        _one_line_exit2(res)
        assert "topology.file" in res.err and ("not a regular file" in res.err
                                               or "directory" in res.err)
    res = cli("trace", "--check", str(fifo))
    _one_line_exit2(res)
    res = cli("validate", str(fifo))
    _one_line_exit2(res)


@pytest.mark.parametrize("row, words", [
    ("0,0,gpt3-6.7b,4,8,1000000000000,500\n", "microbatches: must be in 1..100000"),
    ("0,0,gpt3-6.7b,4,8,\u0661\u0662,500\n", "expected an integer (digits 0-9)"),
    ("0,0,gpt3-6.7b,2000,8,16,500\n", "stages: must be in 1..1024"),
    ("0,\u0661,gpt3-6.7b,4,8,16,500\n", "expected a time"),
    ("0,0,gpt3-6.7b,4,8,16," + "9" * 5000 + "\n", "expected an integer"),
])
def test_trace_fields_bounded(cli, tmp_path: Path, row: str, words: str) -> None:  # type: ignore[no-untyped-def]
    trace = tmp_path / "t.csv"
    trace.write_text(HEADER + row)
    res = cli("trace", "--check", str(trace))
    _one_line_exit2(res)
    assert words in res.err
    spec = trace_scenario(tmp_path, HEADER + row)
    for argv in (("validate", str(spec)), ("sim", str(spec), "--out", str(tmp_path / "o"))):
        res = cli(*argv)
        _one_line_exit2(res)
        assert words in res.err
    assert not (tmp_path / "o").exists()


def test_validate_reads_the_trace(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    spec = trace_scenario(tmp_path, HEADER + GOOD_ROW)
    res = cli("validate", str(spec))
    assert res.code == 0 and "trace 1 rows" in res.out, res.err
    spec = trace_scenario(tmp_path, HEADER + GOOD_ROW.replace("gpt3-6.7b", "nope"))
    res = cli("validate", str(spec))
    _one_line_exit2(res)
    assert "unknown model 'nope'" in res.err
    latin1 = (HEADER + GOOD_ROW).replace("gpt3", "caf\xe9").encode("latin-1")
    spec = trace_scenario(tmp_path, latin1)
    _one_line_exit2(cli("validate", str(spec)))


def test_spec_hash_covers_file_contents_not_paths(tmp_path: Path) -> None:
    from testbed.runs.records import spec_hash
    from testbed.spec import load_scenario

    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    h_a = spec_hash(load_scenario(trace_scenario(a, HEADER + GOOD_ROW)))
    h_b = spec_hash(load_scenario(trace_scenario(b, HEADER + GOOD_ROW)))
    assert h_a == h_b  # same contents at another absolute path
    edited = GOOD_ROW.replace(",500", ",501")
    h_c = spec_hash(load_scenario(trace_scenario(b, HEADER + edited)))
    assert h_c != h_b
