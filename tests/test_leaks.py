"""tests/leaks.py: a namespace left behind is traced to the tests running when it was made."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.leaks import leaked, main, namespaces, read_windows, record_window


def test_a_left_namespace_names_the_tests_running_then(tmp_path: Path) -> None:
    runs = tmp_path / "netns"
    runs.mkdir()
    for name, made in (("lpold0", 50.0), ("lp1234", 105.0), ("lp5678", 300.0)):
        (runs / name).touch()
        os.utime(runs / name, (made, made))
    w = str(tmp_path / "windows")
    record_window(w, "tests/test_a.py::test_one", 100.0, 110.0)
    record_window(w, "tests/test_b.py::test_two", 104.0, 104.5)
    record_window(w, "tests/test_c.py::test_three", 120.0, 130.0)
    with (tmp_path / "windows").open("a") as fh:
        fh.write("garbage line\n")
    windows = read_windows(Path(w))
    assert [n for _a, _b, n in windows] == ["tests/test_a.py::test_one",
                                            "tests/test_b.py::test_two",
                                            "tests/test_c.py::test_three"]
    now = namespaces(runs)
    assert set(now) == {"lpold0", "lp1234", "lp5678"}
    lines = leaked({"lpold0"}, windows, now)
    assert len(lines) == 2
    assert lines[0].startswith("namespace lp1234 (made ")
    assert lines[0].endswith("tests running then: tests/test_a.py::test_one, "
                             "tests/test_b.py::test_two")
    assert lines[1].endswith("no test was running (a lane's own set-up?)")
    assert leaked(set(now), windows, now) == []
    assert namespaces(tmp_path / "absent") == {}


def test_a_left_run_directory_is_named_as_one(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """`--state-before` also names run directories left in the state root (a run whose
    `clean` did not happen), with the tests running at their last write."""
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    (state / "lpaaaa").mkdir()
    before_ns, before_state = tmp_path / "ns", tmp_path / "st"
    before_ns.write_text("")
    import tests.leaks

    # Not /run/netns: the root lanes beside this test make namespaces there.
    monkeypatch.setattr(tests.leaks, "NETNS_DIR", tmp_path / "netns")
    before_state.write_text("lpaaaa\n")
    (state / "lpbbbb").mkdir()
    (state / "lpbbbb" / ".state.json.4242.abcd.tmp").touch()
    made = (state / "lpbbbb").stat().st_mtime
    w = str(tmp_path / "windows")
    record_window(w, "tests/test_x.py::test_kill", made - 1, made + 1)
    monkeypatch.setenv("LIGHTPIPE_STATE_DIR", str(state))
    monkeypatch.setenv("LIGHTPIPE_TEST_STRICT_LEAKS", "1")
    assert main([str(before_ns), w, "--state-before", str(before_state)]) == 1
    out = capsys.readouterr().out
    assert out.startswith("leaks: run state directory lpbbbb (made ") and \
        out.rstrip().endswith("tests running then: tests/test_x.py::test_kill"), out
    assert "lpaaaa" not in out
    (state / "lpbbbb" / ".state.json.4242.abcd.tmp").unlink()
    (state / "lpbbbb").rmdir()
    assert main([str(before_ns), w, "--state-before", str(before_state)]) == 0
    assert "no namespace or run directory left behind" in capsys.readouterr().out
