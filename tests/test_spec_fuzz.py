"""Property tests: random garbage specs give a one-line SpecError, never a traceback."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from testbed.cli.main import main
from testbed.errors import SpecError
from testbed.spec import parse_scenario

from .conftest import load_yaml

scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=20))
json_like = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=10), inner, max_size=4)),
    max_leaves=12)

BASE = load_yaml("quickstart.yaml")
JOBS = load_yaml("pp-jobs.yaml")


def _paths(d: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix] if prefix else []
    if isinstance(d, dict):
        for k, v in d.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(d, list):
        for i, v in enumerate(d):
            out += _paths(v, (*prefix, i))
    return out


def _replace(d: Any, path: tuple[Any, ...], value: Any) -> Any:
    d = copy.deepcopy(d)
    node = d
    for p in path[:-1]:
        node = node[p]
    node[path[-1]] = value
    return d


def _check(data: Any) -> bool:
    """Accepted (True), or refused with a one-line SpecError (False); anything else fails."""
    try:
        parse_scenario(data)
    except SpecError as exc:
        line = exc.line()
        assert line and "\n" not in line
        assert "Traceback" not in line
        return False
    return True


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from([BASE, JOBS]), st.data(), json_like)
def test_replacing_any_field_with_garbage(base: dict[str, Any], data: st.DataObject,
                                          garbage: Any) -> None:
    path = data.draw(st.sampled_from(_paths(base)))
    _check(_replace(base, path, garbage))


@settings(max_examples=200, deadline=None)
@given(json_like)
def test_whole_spec_garbage(garbage: Any) -> None:
    # Garbage of at most 12 leaves can never be a scenario (topology, dcs and workload are
    # required): it must be refused, not just "not crash" (a parser that accepted anything
    # passed the old form of this test).
    assert not _check(garbage), garbage


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(max_size=200))
def test_cli_validate_random_text(tmp_path: Path, text: str) -> None:
    spec = tmp_path / "fuzz.yaml"
    spec.write_text(text, encoding="utf-8")
    import contextlib
    import io

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(["validate", str(spec)])
    assert code == 2
    lines = err.getvalue().strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("lightpipe: error: ")
