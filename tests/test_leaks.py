"""tests/leaks.py: a namespace left behind is traced to the tests running when it was made."""

from __future__ import annotations

import os
from pathlib import Path

from tests.leaks import leaked, namespaces, read_windows, record_window


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
