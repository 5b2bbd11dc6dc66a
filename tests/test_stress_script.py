"""scripts/stress.py: how a round splits into lanes, and how a lane's failures are read."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("stress", REPO / "scripts" / "stress.py")
assert _spec and _spec.loader
stress = importlib.util.module_from_spec(_spec)
sys.modules["stress"] = stress  # its dataclass looks its module up
_spec.loader.exec_module(stress)


def test_default_round_is_the_two_lanes_of_make_test() -> None:
    lanes = stress.lane_selections([], 2)
    assert lanes == {"-serial": ["-m", "stress and serial", "tests"],
                     "-other": ["-m", "stress and not serial", "tests"]}
    assert stress.lane_selections([], 1) == {"": ["-m", "stress", "tests"]}
    assert stress.lane_selections(["tests/test_x.py"], 2) == {"": ["tests/test_x.py"]}
    # The two lanes split `-m stress` by the `serial` mark, as make test's lanes do (a
    # round of 5 on 2026-11-28 ran 245 tests in two lanes, as one lane had).


def test_failures_and_a_missing_report_are_named(tmp_path: Path) -> None:
    junit = tmp_path / "r.xml"
    junit.write_text(
        '<testsuites><testsuite><testcase classname="tests.test_a" name="test_ok"/>'
        '<testcase classname="tests.test_a" name="test_bad">'
        '<failure message="assert 1 == 2">trace</failure></testcase>'
        '<testcase classname="tests.test_b" name="test_err"><error>boom\nmore</error>'
        "</testcase></testsuite></testsuites>")
    total, found = stress.failures_of(junit, 3)
    assert total == 3
    assert [(f.round_no, f.test, f.cause) for f in found] == [
        (3, "tests.test_a::test_bad", "assert 1 == 2"),
        (3, "tests.test_b::test_err", "boom")]
    total, found = stress.failures_of(tmp_path / "absent.xml", 1)
    assert total == 0 and found[0].test == "(whole round)"
