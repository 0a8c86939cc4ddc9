"""The field reference of cards, boxes and runtime profiles, generated from their pydantic models.

``docs/reference.md`` (every field: its type, default and description) and
``docs/card.schema.json`` (a JSON Schema for editors) are written from the models themselves, so
they cannot drift from what ``validate`` accepts; ``tests/test_docs.py`` fails when the committed
files differ from what this module writes. Regenerate them with::

    python -m harness.card.reference
"""

from __future__ import annotations

import json
import sys
import types
import typing
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from harness.card.schema import Card
from harness.formats.safe_write import write_text_atomic
from harness.profiles.box import BoxSpec
from harness.profiles.schema import RuntimeProfile

__all__ = ["DOCS", "card_json_schema", "reference_markdown", "write_reference"]

DOCS = Path(__file__).resolve().parents[2] / "docs"
# The documents and the model each starts from.
ROOTS: tuple[tuple[str, type[BaseModel], str], ...] = (
    ("Campaign card", Card, "`campaigns/*.yaml`: what to compare, how, and what must hold."),
    ("Box", BoxSpec, "an entry of `boxes.yaml` (or an inline `box:`): where commands run."),
    (
        "Runtime profile",
        RuntimeProfile,
        "`runtimes/*.yaml`: how to boot a runtime, talk to it and read its counters.",
    ),
)


def _anchor(model: type[BaseModel]) -> str:
    return model.__name__.lower()


def _type_text(annotation: Any, nested: list[type[BaseModel]]) -> str:
    """A type as a reader writes it in YAML; models are linked and queued for their own table."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return _type_text(args[0], nested)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        if annotation not in nested:
            nested.append(annotation)
        return f"[{annotation.__name__}](#{_anchor(annotation)})"
    if origin is Literal:
        return " \\| ".join(f"`{a!r}`" if not isinstance(a, str) else f"`{a}`" for a in args)
    if origin in (typing.Union, types.UnionType):
        parts = [a for a in args if a is not type(None)]
        text = " or ".join(_type_text(a, nested) for a in parts)
        return text + (" or null" if len(parts) < len(args) else "")
    if origin in (list, tuple, set, frozenset):
        inner = [a for a in args if a is not Ellipsis]
        return f"list of {_type_text(inner[0], nested)}" if inner else "list"
    if origin is dict:
        return f"map of {_type_text(args[0], nested)} → {_type_text(args[1], nested)}"
    if annotation is Any:
        return "any"
    if isinstance(annotation, type):
        return {"str": "text", "int": "integer", "float": "number", "bool": "true/false"}.get(
            annotation.__name__, annotation.__name__
        )
    return str(annotation).replace("typing.", "")


def _default_text(info: FieldInfo) -> str:
    if info.is_required():
        return "**required**"
    if info.default_factory is not None:
        try:
            value = info.default_factory()  # type: ignore[call-arg]
        except TypeError:
            return "(computed)"
        if isinstance(value, BaseModel):
            if not value.model_fields_set:
                return "(its defaults)"
            value = value.model_dump(include=value.model_fields_set)
    else:
        value = info.default
    if value is PydanticUndefined:
        return "**required**"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if value == "":
        return '`""`'
    if value in ([], {}):
        return "empty"
    if isinstance(value, str):
        return f"`{value}`"
    return f"`{json.dumps(value, default=_plain)}`"


def _plain(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", exclude_defaults=True)
    return str(value)


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _model_table(model: type[BaseModel], nested: list[type[BaseModel]]) -> list[str]:
    lines = [f"### {model.__name__}", ""]
    doc = (model.__doc__ or "").strip().split("\n\n")[0]
    if doc:
        lines += [_cell(doc), ""]
    lines += ["| field | type | default | description |", "|---|---|---|---|"]
    for name, info in model.model_fields.items():
        key = info.alias or name
        kind = _type_text(info.annotation, nested)
        lines.append(
            f"| `{key}` | {kind} | {_default_text(info)} | {_cell(info.description or '')} |"
        )
    return [*lines, ""]


def reference_markdown() -> str:
    """``docs/reference.md``: one table per model, from each document's root model down."""
    out = [
        "# Field reference",
        "",
        "Generated from the pydantic models by `python -m harness.card.reference`; do not edit by",
        "hand (`tests/test_docs.py` fails when this file and the models disagree). Beyond the",
        "shapes below, `harness validate` checks what needs the card as a whole: the control is a",
        "cell, files exist, knobs are the runtime's, held-out prompts share nothing with the fit",
        "set. Editors can validate cards with the JSON Schema in `docs/card.schema.json`.",
        "",
    ]
    seen: set[type[BaseModel]] = set()
    for title, root, what in ROOTS:
        out += [f"## {title}", "", what, ""]
        queue = [root]
        while queue:
            model = queue.pop(0)
            if model in seen:
                continue
            seen.add(model)
            nested: list[type[BaseModel]] = []
            out += _model_table(model, nested)
            queue += [m for m in nested if m not in seen and m not in queue]
    return "\n".join(out).rstrip() + "\n"


def card_json_schema() -> str:
    """``docs/card.schema.json``: the card's JSON Schema, for editors (yaml-language-server)."""
    schema = Card.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "harness campaign card"
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


def write_reference(docs: Path = DOCS) -> list[Path]:
    """Write both files into ``docs``; return their paths."""
    reference, schema = docs / "reference.md", docs / "card.schema.json"
    write_text_atomic(reference, reference_markdown())
    write_text_atomic(schema, card_json_schema())
    return [reference, schema]


if __name__ == "__main__":
    for path in write_reference():
        sys.stdout.write(f"wrote {path}\n")
