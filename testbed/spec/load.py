"""Load a scenario from YAML (or a dict) into validated objects, with one-line errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from testbed.errors import InputError, SpecError
from testbed.spec.check import check_scenario
from testbed.spec.models import Scenario

_UNION_TAGS = {"lightpath_requests", "pp_jobs"}


def load_scenario(path: str | Path) -> Scenario:
    """Read, parse and fully validate a scenario file; paths inside become absolute."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError("", "no such file", source=str(p)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError("", f"cannot read: {exc}", source=str(p)) from None
    data = parse_yaml(text, source=str(p))
    return parse_scenario(data, base_dir=p.resolve().parent, source=str(p))


def parse_yaml(text: str, source: str = "<spec>") -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise SpecError("", f"invalid YAML: {where}{problem}", source=source) from None


def parse_scenario(data: Any, base_dir: Path | None = None, source: str | None = None) -> Scenario:
    """Validate a decoded spec (dict) into a Scenario, then run the cross-field checks."""
    if not isinstance(data, dict):
        raise SpecError("(root)", f"expected a mapping of keys, got {type(data).__name__}",
                        source=source)
    try:
        scenario = Scenario.model_validate(data)
    except ValidationError as exc:
        path, message = format_validation_error(exc)
        raise SpecError(path, message, source=source) from None
    if base_dir is not None:
        scenario = _absolute_paths(scenario, base_dir)
    try:
        check_scenario(scenario)
    except InputError as exc:
        raise SpecError(exc.path, exc.message, source=source) from None
    return scenario


def _absolute_paths(scenario: Scenario, base_dir: Path) -> Scenario:
    updates: dict[str, Any] = {}
    if scenario.topology.file and not Path(scenario.topology.file).is_absolute():
        updates["topology"] = scenario.topology.model_copy(
            update={"file": str(base_dir / scenario.topology.file)})
    trace = getattr(scenario.workload, "trace", None)
    if trace and not Path(trace).is_absolute():
        updates["workload"] = scenario.workload.model_copy(
            update={"trace": str(base_dir / trace)})
    return scenario.model_copy(update=updates) if updates else scenario


def loc_to_path(loc: tuple[int | str, ...]) -> str:
    """('dcs', 1, 'node') -> 'dcs[1].node', dropping union-member tags pydantic inserts."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in _UNION_TAGS or "[" in part or part.startswith("function-"):
            continue
        else:
            out += f".{part}" if out else part
    return out or "(root)"


def format_validation_error(exc: ValidationError) -> tuple[str, str]:
    """The most specific error of a ValidationError as (field path, message)."""
    errors = exc.errors(include_url=False)
    # Union members each report an error; the deepest location is the most useful one.
    best = max(errors, key=lambda e: len([p for p in e["loc"] if not _is_tag(p)]))
    path = loc_to_path(best["loc"])
    kind = best["type"]
    if kind == "extra_forbidden":
        return path, "unknown key"
    if kind == "missing":
        return path, "required key missing"
    if kind in ("union_tag_invalid", "union_tag_not_found"):
        ctx = best.get("ctx", {})
        field = ctx.get("discriminator", "kind").strip("'")
        expected = ctx.get("expected_tags") or ", ".join(repr(t) for t in sorted(_UNION_TAGS))
        got = ctx.get("tag")
        what = f"unknown {field} {got!r}" if got is not None else "required key missing"
        return f"{path}.{field}", f"{what} (one of: {expected})"
    msg = best["msg"]
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    msg = _plain(msg)
    if kind not in ("value_error", "assertion_error") and "input" in best:
        shown = _short(best["input"])
        msg = f"{msg} (got {shown})"
    return path, msg


_PHRASES = (
    ("Input should be greater than or equal to ", "must be >= "),
    ("Input should be greater than ", "must be > "),
    ("Input should be less than or equal to ", "must be <= "),
    ("Input should be less than ", "must be < "),
    ("Input should be a valid integer, got a number with a fractional part",
     "must be an integer"),
    ("Input should be a valid integer, unable to parse string as an integer",
     "must be an integer"),
    ("Input should be ", "must be "),
    ("String should have at most ", "must have at most "),
    ("String should have at least ", "must have at least "),
    ("List should have at most ", "must have at most "),
    ("List should have at least ", "must have at least "),
    ("String should match pattern ", "must match "),
)


def _plain(msg: str) -> str:
    """Shorten pydantic's wording into 'must be ...' phrases."""
    for old, new in _PHRASES:
        if msg.startswith(old):
            return new + msg[len(old):]
    return msg[0].lower() + msg[1:] if msg else msg


def _is_tag(part: int | str) -> bool:
    return isinstance(part, str) and (part in _UNION_TAGS or "[" in part)


def _short(value: Any) -> str:
    try:
        text = json.dumps(value, default=str)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def scenario_json_schema() -> dict[str, Any]:
    """JSON Schema of the scenario format, for editors."""
    schema = Scenario.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "LightPipe scenario"
    return schema
