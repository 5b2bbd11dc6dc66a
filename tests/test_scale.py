"""Scale: the one reader of bandwidth_divisor / time_factor (spec sections and records)."""

from __future__ import annotations

import ast
import json
import math
import typing
from pathlib import Path

import pytest

from testbed.emu.scale import Scale
from testbed.errors import InputError, RuntimeFailure

ROOT = Path(__file__).resolve().parent.parent
FACTORS = ("time_factor", "bandwidth_divisor")


def test_record_round_trip_and_defaults() -> None:
    s = Scale(bandwidth_divisor=250.0, time_factor=4.0)
    assert Scale.of_record(s.as_record(), "network.json") == s
    assert Scale.of_record({}, "network.json") == Scale()
    assert Scale.of_record({"time_factor": 2}, "x") == Scale(1.0, 2.0)
    assert Scale.of(None) == Scale()
    assert s.real_s(s.emulated_s(1.25)) == pytest.approx(1.25)
    assert s.real_ms(s.delay_ms(3.0)) == pytest.approx(3.0)


@pytest.mark.parametrize("bad", [
    {"time_factor": 0}, {"time_factor": -1.0}, {"time_factor": math.inf},
    {"time_factor": math.nan}, {"time_factor": "2"}, {"time_factor": True},
    {"time_factor": 2e6}, {"bandwidth_divisor": 0.5}, {"bandwidth_divisor": 1e10},
    {"bandwidth_divisor": [1]}])
def test_bad_record_names_where_and_which(bad: dict[str, object]) -> None:
    with pytest.raises(RuntimeFailure) as err:
        Scale.of_record(bad, "network.json")
    (key,) = bad
    assert str(err.value).startswith(f"network.json: {key} ")


def test_job_plan_carries_the_run_scale() -> None:
    from testbed.schedule import PipelineProblem, build_schedule
    from workloads.plan import JobPlan, scaled_plan

    prob = PipelineProblem.uniform(2, 2, 10.0, 20.0, activation_mb=1.0)
    scale = Scale(bandwidth_divisor=100.0, time_factor=3.0)
    plan = scaled_plan("j", prob, build_schedule("gpipe", prob), scale, iterations=2)
    assert plan.scale == scale
    assert JobPlan.from_dict(json.loads(plan.to_json())).scale == scale
    with pytest.raises(InputError):
        JobPlan.from_dict({**json.loads(plan.to_json()), "time_factor": 0})


def _reads_by_name(tree: ast.AST) -> list[int]:
    """Lines that read a factor out of a mapping by its name: x["time_factor"],
    x.get("time_factor"), getattr(x, "time_factor")."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
            key = node.slice
        elif isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(
                node.func, "id", "")
            idx = {"get": 0, "getattr": 1}.get(name)
            if idx is None or len(node.args) <= idx:
                continue
            key = node.args[idx]
        else:
            continue
        if isinstance(key, ast.Constant) and key.value in FACTORS:
            out.append(node.lineno)
    return out


def test_no_module_reads_the_factors_by_name_but_scale() -> None:
    """Records and spec sections are read through Scale.of / Scale.of_record only
    (issue 28: fault_cmd, the exporter, the report and JobPlan once read them by name)."""
    found = {}
    for top in ("testbed", "controllers", "workloads"):
        for path in sorted((ROOT / top).rglob("*.py")):
            if path.relative_to(ROOT).as_posix() == "testbed/emu/scale.py":
                continue
            lines = _reads_by_name(ast.parse(path.read_text(), str(path)))
            if lines:
                found[path.relative_to(ROOT).as_posix()] = lines
    assert not found, found
    # the check sees each form it forbids
    for src in ('x["time_factor"]', 'x.get("bandwidth_divisor")',
                'getattr(em, "time_factor", 1.0)'):
        assert _reads_by_name(ast.parse(src)), src


def test_record_bounds_are_the_specs() -> None:
    """Scale.of_record refuses what the spec refuses (the bounds are written twice so that
    a worker importing Scale does not import pydantic and the spec)."""
    from testbed.emu import scale
    from testbed.spec.models import EmulationSpec

    def bound(name: str, kind: str) -> float:
        field = EmulationSpec.model_fields[name]
        meta = list(field.metadata)
        for arm in typing.get_args(field.annotation):  # time_factor: a number or "auto"
            for m in getattr(arm, "__metadata__", ()):
                meta += [m, *getattr(m, "metadata", ())]  # a Field(...) holds its bounds
        return next(getattr(m, kind) for m in meta if getattr(m, kind, None) is not None)

    assert bound("bandwidth_divisor", "le") == scale.MAX_BANDWIDTH_DIVISOR
    assert bound("time_factor", "le") == scale.MAX_TIME_FACTOR
    assert bound("bandwidth_divisor", "ge") == 1 and bound("time_factor", "gt") == 0
