"""Pydantic's validation errors as ``file:line: field.path: message`` lines of the YAML file.

Pydantic names a place by its path in the data, with union tags mixed in; users need the line,
and for an unknown key the key they probably meant.
"""

from __future__ import annotations

import difflib
import types
import typing
from typing import Annotated, Any, Union

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from harness.card.schema import GATE_KINDS, REMOVED_FIELDS
from harness.formats.yamlfile import Loc, YamlDoc, dotted


def _unwrap(annotation: Any) -> list[Any]:
    """The concrete types inside Optional/Union/Annotated."""
    origin = typing.get_origin(annotation)
    if origin is Annotated:
        return _unwrap(typing.get_args(annotation)[0])
    if origin in (Union, types.UnionType):
        out: list[Any] = []
        for arg in typing.get_args(annotation):
            out.extend(_unwrap(arg))
        return out
    return [annotation]


def _model_at(root: type[BaseModel], loc: Loc) -> type[BaseModel] | None:
    """The model class that owns the fields at ``loc`` (for did-you-mean on unknown keys)."""
    current: list[Any] = [root]
    for part in loc:
        following: list[Any] = []
        for candidate in current:
            origin = typing.get_origin(candidate)
            if isinstance(candidate, type) and issubclass(candidate, BaseModel):
                field = candidate.model_fields.get(str(part))
                if field is not None:
                    following.extend(_unwrap(field.annotation))
            elif origin in (list, dict):
                following.extend(_unwrap(typing.get_args(candidate)[-1]))
        current = following
    models = [c for c in current if isinstance(c, type) and issubclass(c, BaseModel)]
    return models[0] if len(models) == 1 else None


def _data_loc(loc: tuple[Any, ...], data: Any) -> Loc:
    """Drop pydantic's union tags from ``loc`` so it names a real place in the YAML."""
    out: list[str | int] = []
    current = data
    for part in loc:
        in_dict = isinstance(current, dict) and part in current
        in_list = isinstance(current, list) and isinstance(part, int) and part < len(current)
        if in_dict or in_list:
            current = current[part]
            out.append(part)
        elif isinstance(current, dict) and isinstance(part, str) and not _looks_like_tag(part):
            # A missing field; union tags (`better`, `str`, `BoxSpec`) are skipped.
            out.append(part)
        # anything else is a tag pydantic added; skip it
    return tuple(out)


def _looks_like_tag(part: str) -> bool:
    # `function-after[_kind_fields(), BoxSpec]`: a model validator's tag.
    return (
        part in GATE_KINDS
        or part[:1].isupper()
        or part in ("str", "int", "float", "bool")
        or part.startswith("function-")
    )


def _data_at(data: Any, loc: Loc) -> Any:
    """The value at ``loc``, or None where it is missing (a required field)."""
    for part in loc:
        try:
            data = data[part]
        except (KeyError, IndexError, TypeError):
            return None
    return data


def _union_noise(errors: list[tuple[Loc, ErrorDetails]], data: Any) -> set[int]:
    """Errors of a ``str | Model`` field given a mapping: "should be a valid string" says
    nothing when the mapping's own errors, at the same place or below, say what is wrong."""
    noise = set()
    for index, (loc, error) in enumerate(errors):
        if error["type"] != "string_type" or not isinstance(_data_at(data, loc), dict):
            continue
        others = [
            other for j, (other, _) in enumerate(errors) if j != index and other[: len(loc)] == loc
        ]
        if others:
            noise.add(index)
    return noise


def _unknown_key(model: type[BaseModel], loc: Loc) -> str:
    """The message for a key ``model`` does not have at ``loc``: removed, misspelt, or unknown."""
    owner = _model_at(model, loc[:-1])
    if owner is None:
        return "unknown key"
    removed = REMOVED_FIELDS.get((owner, str(loc[-1])))
    if removed is not None:
        return f"removed: {removed}"
    close = difflib.get_close_matches(str(loc[-1]), list(owner.model_fields), n=1)
    if close:
        return f"unknown key; did you mean `{close[0]}`?"
    return f"unknown key; allowed: {', '.join(owner.model_fields)}"


def pydantic_problems(
    exc: ValidationError, doc: YamlDoc, model: type[BaseModel], prefix: Loc = ()
) -> list[str]:
    """One ``file:line: path: message`` per distinct error of ``exc``, raised validating ``model``.

    ``prefix`` is where the validated data sits in ``doc`` (a box inside a boxes file).
    """
    problems: list[str] = []
    seen: set[tuple[Loc, str]] = set()
    data_root: Any = doc.data
    for part in prefix:
        data_root = data_root[part]
    errors = [(_data_loc(e["loc"], data_root), e) for e in exc.errors(include_url=False)]
    noise = _union_noise(errors, data_root)
    for index, (loc, error) in enumerate(errors):
        if index in noise:
            continue
        message = error["msg"]
        if error["type"] == "extra_forbidden":
            message = _unknown_key(model, loc)
        elif error["type"] == "union_tag_invalid":
            message = f"unknown gate kind; must be one of {', '.join(GATE_KINDS)}"
        elif error["type"] == "union_tag_not_found":
            message = f"missing `kind`; one of {', '.join(GATE_KINDS)}"
        elif error["type"] == "missing":
            message = "required field is missing"
        elif message.startswith("Value error, "):
            message = message[len("Value error, ") :]
        key = (loc, message)
        if key in seen:
            continue
        seen.add(key)
        full = (*prefix, *loc)
        problems.append(f"{doc.path}:{doc.line_of(full)}: {dotted(full)}: {message}")
    return problems
