"""Load a scenario from YAML (or a dict) into validated objects, with one-line errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from testbed.errors import InputError, SpecError
from testbed.io.bounded import SPEC_MAX_BYTES, read_bounded_text
from testbed.spec.check import check_scenario
from testbed.spec.models import Scenario
from testbed.spec.yamlsafe import MAX_YAML_DEPTH, load_bounded_yaml

_UNION_TAGS = {"lightpath_requests", "pp_jobs"}


def load_scenario(path: str | Path) -> Scenario:
    """Read, parse and fully validate a scenario file; paths inside become absolute."""
    p = Path(path)
    if not p.exists() and not p.is_symlink():
        raise SpecError("", "no such file", source=str(p))
    try:
        text = read_bounded_text(p, "", SPEC_MAX_BYTES)
    except InputError as exc:
        raise SpecError("", exc.message, source=str(p)) from None
    data = parse_yaml(text, source=str(p))
    return parse_scenario(data, base_dir=p.resolve().parent, source=str(p))


def parse_yaml(text: str, source: str = "<spec>") -> Any:
    """Parse YAML with libyaml where installed, refusing duplicate keys, deep nesting,
    alias bombs and over-long numbers (one-line SpecError, never a MemoryError)."""
    if len(text) > SPEC_MAX_BYTES:
        raise SpecError("", f"too large ({len(text)} characters; the limit is "
                        f"{SPEC_MAX_BYTES} bytes)", source=source)
    try:
        return load_bounded_yaml(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise SpecError("", f"invalid YAML: {where}{problem}", source=source) from None
    except RecursionError:
        raise SpecError("", f"invalid YAML: nested deeper than {MAX_YAML_DEPTH} levels",
                        source=source) from None


def parse_scenario(data: Any, base_dir: Path | None = None, source: str | None = None) -> Scenario:
    """Validate a decoded spec (dict) into a Scenario, then run the cross-field checks."""
    if data is None:
        raise SpecError("", "the file is empty; a scenario needs at least name, topology, "
                        "dcs and workload (see scenarios/quickstart.yaml)", source=source)
    if not isinstance(data, dict):
        kind = {"list": "a list", "str": "a single string", "int": "a number",
                "float": "a number", "bool": "true/false"}.get(type(data).__name__, "a value")
        raise SpecError("(root)", f"expected a mapping of keys (key: value lines), got {kind}",
                        source=source)
    try:
        scenario = Scenario.model_validate(data)
    except ValidationError as exc:
        path, message = format_validation_error(exc)
        raise SpecError(path, message, source=source) from None
    shown: dict[str, str] = {}
    if base_dir is not None:
        scenario, shown = _absolute_paths(scenario, base_dir, source)
    try:
        check_scenario(scenario)
    except InputError as exc:
        raise SpecError(exc.path, _as_given(exc.message, shown), source=source) from None
    return scenario


def _absolute_paths(scenario: Scenario, base_dir: Path,
                    source: str | None = None) -> tuple[Scenario, dict[str, str]]:
    """Relative file paths made absolute (base_dir), and each absolute path -> the path as
    the user gave it (beside the spec file as given on the command line) for messages."""
    updates: dict[str, Any] = {}
    shown: dict[str, str] = {}
    given_dir = Path(source).parent if source and not source.startswith("<") else None

    def absolute(rel: str) -> str:
        full = str(base_dir / rel)
        shown[full] = str(given_dir / rel) if given_dir is not None else rel
        return full

    if scenario.topology.file and not Path(scenario.topology.file).is_absolute():
        updates["topology"] = scenario.topology.model_copy(
            update={"file": absolute(scenario.topology.file)})
    trace = getattr(scenario.workload, "trace", None)
    if trace and not Path(trace).is_absolute():
        updates["workload"] = scenario.workload.model_copy(update={"trace": absolute(trace)})
    return (scenario.model_copy(update=updates) if updates else scenario), shown


def _as_given(message: str, shown: dict[str, str]) -> str:
    """The message with every absolute path LightPipe made shown as the user wrote it."""
    for full, given in sorted(shown.items(), key=lambda kv: -len(kv[0])):
        message = message.replace(full, given)
    return message


def loc_to_path(loc: tuple[int | str, ...]) -> str:
    """('dcs', 1, 'node') -> 'dcs[1].node', dropping union-member tags pydantic inserts."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in _UNION_TAGS or "[" in part or part.startswith("function-"):
            continue
        elif not part.isprintable() or not part.strip() or part != part.strip():
            out += f"[{part!r}]"  # a key no one could read as written
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
        from testbed.spec.suggest import did_you_mean

        return path, "unknown key" + did_you_mean(best["loc"])
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


def _short(value: Any, limit: int = 60) -> str:
    """A short rendering of a value, never serialising more than a bounded part of it."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 256:
        return f"an integer of {value.bit_length()} bits"
    try:
        text = json.dumps(_prune(value, limit), default=str)
    except (TypeError, ValueError):
        text = repr(_prune(value, limit))
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _prune(value: Any, budget: int, depth: int = 0) -> Any:
    """A copy of value cut to about budget items and characters (alias bombs stay small)."""
    if depth > 4:
        return "..."
    if isinstance(value, str):
        return value[:budget + 1]
    if isinstance(value, dict):
        items = list(value.items())[:8]
        return {str(k)[:budget]: _prune(v, budget, depth + 1) for k, v in items}
    if isinstance(value, (list, tuple)):
        return [_prune(v, budget, depth + 1) for v in list(value[:8])]
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 256:
        return f"<integer of {value.bit_length()} bits>"
    if isinstance(value, (int, float, bool)) or value is None:
        return value
    return repr(value)[:budget + 1]


def scenario_json_schema() -> dict[str, Any]:
    """JSON Schema of the scenario format, for editors."""
    schema = Scenario.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "LightPipe scenario"
    return schema
