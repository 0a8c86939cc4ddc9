"""Prompt pools: JSONL files of prompts tagged with a domain and a fit/held-out split."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.errors import BadInput
from harness.formats.textfile import compile_pattern, parse_json, read_bytes

_ALLOWED_KEYS = {"id", "domain", "split", "prompt", "messages", "max_tokens", "check"}
_CHECK_KINDS = {"regex", "json_valid", "json_schema"}
_CHECK_KEYS = {
    "regex": ("kind", "pattern"),
    "json_valid": ("kind",),
    "json_schema": ("kind", "schema"),
}
# The JSON-schema subset the quality gate evaluates; anything else would be silently ignored.
SCHEMA_TYPES = ("array", "boolean", "integer", "null", "number", "object", "string")
SCHEMA_KEYWORDS = ("type", "required", "properties", "enum")


@dataclass(frozen=True)
class Prompt:
    """One prompt of a pool; ``text`` is the prompt or the rendered messages, for overlap checks."""

    id: str
    domain: str
    split: str
    prompt: str | None
    messages: tuple[dict[str, str], ...] | None
    max_tokens: int | None = None
    check: dict[str, Any] | None = field(default=None, compare=False)
    source: str = ""

    @property
    def text(self) -> str:
        """The prompt text, or the messages' contents joined."""
        if self.prompt is not None:
            return self.prompt
        return "\n".join(m.get("content", "") for m in self.messages or ())


def normalise(text: str) -> str:
    """Text compared for fit/held-out overlap: case-folded, whitespace collapsed."""
    return re.sub(r"\s+", " ", text).strip().casefold()


def check_problems(check: Any) -> list[str]:
    """What is wrong with a quality check, each as ``field: message``; [] when it is valid.

    A check that cannot fail (a regex without a pattern, an unknown schema type or keyword) would
    pass every answer, so each is refused with what to write instead.
    """
    kind = check.get("kind") if isinstance(check, dict) else None
    if not isinstance(kind, str) or kind not in _CHECK_KINDS:  # a list here is unhashable
        return [f"check.kind: must be one of {', '.join(sorted(_CHECK_KINDS))}"]
    allowed = _CHECK_KEYS[kind]
    problems = [
        f"check.{key}: unknown key for a {kind} check; it takes: {', '.join(allowed)}"
        for key in check
        if key not in allowed
    ]
    if kind == "regex":
        pattern = check.get("pattern")
        if not isinstance(pattern, str) or not pattern:
            problems.append(
                "check.pattern: a regex check needs a `pattern` (a regular expression string); "
                "without one it would match every answer"
            )
        else:
            try:
                compile_pattern(pattern)
            except (re.error, OverflowError, RecursionError) as exc:
                problems.append(f"check.pattern: not a regular expression: {exc}")
    elif kind == "json_schema":
        schema = check.get("schema")
        if not isinstance(schema, dict):
            problems.append("check.schema: a json_schema check needs a `schema` (a mapping)")
        else:
            problems.extend(_schema_problems(schema, "check.schema"))
    return problems


def _schema_problems(schema: dict[str, Any], where: str) -> list[str]:
    problems = [
        f"{where}.{key}: not supported (quality checks know {', '.join(SCHEMA_KEYWORDS)}): "
        "it would be ignored"
        for key in schema
        if key not in SCHEMA_KEYWORDS
    ]
    kind = schema.get("type")
    if kind is not None and kind not in SCHEMA_TYPES:
        problems.append(f"{where}.type: unknown type {kind!r}; one of {', '.join(SCHEMA_TYPES)}")
    required = schema.get("required")
    if required is not None and not (
        isinstance(required, list) and all(isinstance(name, str) for name in required)
    ):
        problems.append(f"{where}.required: must be a list of property names")
    enum = schema.get("enum")
    if enum is not None and not isinstance(enum, list):
        problems.append(f"{where}.enum: must be a list of allowed values")
    properties = schema.get("properties")
    if properties is not None:
        if not isinstance(properties, dict):
            problems.append(f"{where}.properties: must map property names to schemas")
        else:
            for name, sub in properties.items():
                if isinstance(sub, dict):
                    problems.extend(_schema_problems(sub, f"{where}.properties.{name}"))
                else:
                    problems.append(f"{where}.properties.{name}: must be a schema (a mapping)")
    return problems


def _parse_line(raw: dict[str, Any], where: str) -> tuple[Prompt | None, list[str]]:
    problems = []
    unknown = set(raw) - _ALLOWED_KEYS
    if unknown:
        problems.append(
            f"{where}: unknown keys {sorted(unknown)}; allowed: {sorted(_ALLOWED_KEYS)}"
        )
    for key in ("id", "domain", "split"):
        if not isinstance(raw.get(key), str) or not raw.get(key):
            problems.append(f"{where}: `{key}` must be a non-empty string")
    has_prompt = isinstance(raw.get("prompt"), str)
    messages = raw.get("messages")
    has_messages = isinstance(messages, list) and all(
        isinstance(m, dict) and isinstance(m.get("content"), str) for m in messages
    )
    if has_prompt == has_messages:
        problems.append(f"{where}: give exactly one of `prompt` (string) or `messages` (list)")
    max_tokens = raw.get("max_tokens")
    if max_tokens is not None and (
        isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1
    ):
        problems.append(f"{where}: `max_tokens` must be a positive integer")
    check = raw.get("check")
    if check is not None:
        problems.extend(f"{where}: {problem}" for problem in check_problems(check))
    if problems:
        return None, problems
    prompt = Prompt(
        id=raw["id"],
        domain=raw["domain"],
        split=raw["split"],
        prompt=raw["prompt"] if has_prompt else None,
        messages=tuple(messages) if has_messages and messages is not None else None,
        max_tokens=max_tokens,
        check=check,
        source=where,
    )
    return prompt, []


def load_pool(path: Path) -> list[Prompt]:
    """Read one JSONL pool; every bad line is reported at once as ``file:line: message``."""
    lines = read_bytes(path, BadInput, "prompt pool").split(b"\n")
    prompts: list[Prompt] = []
    problems: list[str] = []
    seen: dict[str, int] = {}
    for number, data in enumerate(lines, start=1):
        if not data.strip():
            continue
        where = f"{path}:{number}"
        # Each line on its own, so one bad line is reported with the others, at its number.
        try:
            line = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            problems.append(
                f"{where}: not UTF-8 text (byte 0x{data[exc.start]:02x}); save the pool as UTF-8"
            )
            continue
        try:
            raw = parse_json(line, str(path), BadInput, first_line=number)
        except BadInput as exc:
            problems.append(exc.message)
            continue
        if not isinstance(raw, dict):
            problems.append(f"{where}: each line must be a JSON object")
            continue
        prompt, line_problems = _parse_line(raw, where)
        problems.extend(line_problems)
        if prompt is None:
            continue
        if prompt.id in seen:
            problems.append(
                f"{where}: duplicate id {prompt.id!r} (first on line {seen[prompt.id]})"
            )
            continue
        seen[prompt.id] = number
        prompts.append(prompt)
    if problems:
        raise BadInput(f"{path}: invalid prompt pool", problems)
    if not prompts:
        raise BadInput(f"{path}: prompt pool is empty")
    return prompts
