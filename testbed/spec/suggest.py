"""'did you mean' for an unknown spec key: the valid keys at its place, closest first."""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Iterable, Sequence
from typing import Any

from pydantic import BaseModel


def _models(annotation: Any) -> list[type[BaseModel]]:
    """Pydantic models reachable from a type annotation (unions, lists, Annotated)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    out: list[type[BaseModel]] = []
    origin = typing.get_origin(annotation)
    if origin is not None or isinstance(annotation, types.UnionType):
        for arg in typing.get_args(annotation):
            out += _models(arg)
    return out


def keys_at(loc: Sequence[int | str], root: type[BaseModel] | None = None) -> list[str]:
    """Valid keys of the mapping that holds loc[-1] (every union member's keys)."""
    from testbed.spec.models import Scenario

    models: list[type[BaseModel]] = [root or Scenario]
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        nxt: list[type[BaseModel]] = []
        for m in models:
            field = m.model_fields.get(str(part))
            if field is not None:
                nxt += _models(field.annotation)
        if not nxt:  # a union tag in the location (e.g. 'pp_jobs'): stay at this level
            continue
        models = nxt
    keys: list[str] = []
    for m in models:
        keys += [k for k in m.model_fields if k not in keys]
    return keys


def close(word: str, choices: Iterable[str]) -> list[str]:
    return difflib.get_close_matches(word, list(choices), n=2, cutoff=0.6)


def did_you_mean(loc: Sequence[int | str]) -> str:
    """' (did you mean X?)', or the valid keys when none is close, or ''."""
    if not loc:
        return ""
    keys = keys_at(loc)
    hits = close(str(loc[-1]), keys)
    if hits:
        return f" (did you mean {' or '.join(hits)}?)"
    return f" (valid: {', '.join(keys)})" if keys and len(keys) <= 16 else ""
