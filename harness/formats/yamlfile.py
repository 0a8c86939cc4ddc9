"""YAML loading that remembers where every value came from.

Pydantic reports errors by location (``cells.adaptive.env``); users need a line number. We compose
the YAML node tree ourselves so each path maps to its line, and so duplicate keys are an error
instead of the silent overwrite PyYAML does by default.

Loading is safe: only plain mappings, lists, strings, numbers, booleans, nulls and dates are
built; any other tag (``!!python/object:…``, ``!custom``, ``!!binary``) and merge keys are refused
naming their line, and aliases may not refer to themselves nor expand past
:data:`MAX_VALUES` values (the "billion laughs" file). Bytes that are not UTF-8, control
characters, over-long numbers and nesting past the parser's stack are errors with their line too.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from harness.errors import BadInput
from harness.formats.textfile import decode_utf8, read_bytes

Loc = tuple[str | int, ...]

# One constructor, reused: it resolves scalars (`2`, `true`, `null`) to their YAML types.
_SCALARS = yaml.SafeLoader("")
# libyaml's parser where PyYAML has it (about 15x faster; every command reads a card, a profile
# and the boxes file), the same node tree and line marks; the pure-Python one otherwise.
_FAST_LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_YAML_TAG = "tag:yaml.org,2002:"
# The tags a harness file may hold (explicitly or resolved): data, never objects.
_ALLOWED_TAGS = {
    _YAML_TAG + name for name in ("map", "seq", "str", "int", "float", "bool", "null", "timestamp")
}
# More values than any card holds by far; past it an alias bomb is stopped, not expanded.
MAX_VALUES = 100_000


@dataclass
class YamlDoc:
    """A parsed YAML document with the line (1-based) of every mapping key and sequence item."""

    path: Path
    data: Any
    lines: dict[Loc, int] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    text: str = ""
    values: int = 0
    seen: set[int] = field(default_factory=set)  # nodes converted once: a second is an alias
    aliased: bool = False

    def line_of(self, loc: Loc) -> int:
        """The line of ``loc`` or of its nearest located ancestor (1 for the document)."""
        probe = tuple(loc)
        while probe:
            if probe in self.lines:
                return self.lines[probe]
            probe = probe[:-1]
        return 1


def _fail(doc: YamlDoc, node: yaml.Node, message: str) -> BadInput:
    return BadInput(f"{doc.path}:{node.start_mark.line + 1}: {message}")


def _tag_text(tag: str) -> str:
    return "!!" + tag[len(_YAML_TAG) :] if tag.startswith(_YAML_TAG) else tag


def _convert(node: yaml.Node, loc: Loc, doc: YamlDoc, open_nodes: set[int]) -> Any:
    doc.values += 1
    doc.aliased = doc.aliased or id(node) in doc.seen
    doc.seen.add(id(node))
    if doc.values > MAX_VALUES:
        why = (
            "its anchors repeat values (aliases of aliases?); write the values out instead"
            if doc.aliased
            else "far more than any card or profile needs; split it, or generate the cells you "
            "compare with fewer knobs"
        )
        raise _fail(doc, node, f"the document expands to more than {MAX_VALUES:,} values: {why}")
    if node.tag not in _ALLOWED_TAGS:
        raise _fail(
            doc,
            node,
            f"YAML tag {_tag_text(node.tag)} is not allowed: harness files hold plain "
            "mappings, lists, strings and numbers; remove the tag",
        )
    if id(node) in open_nodes:
        raise _fail(doc, node, "an alias refers to the value that contains it; remove the loop")
    if isinstance(node, yaml.MappingNode):
        open_nodes.add(id(node))
        out: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            if key_node.tag == _YAML_TAG + "merge":
                raise _fail(
                    doc, key_node, "YAML merge keys (<<) are not supported; write the keys out"
                )
            key = _convert(key_node, loc, doc, open_nodes)
            line = key_node.start_mark.line + 1
            if isinstance(key, list | dict):
                doc.problems.append(f"{doc.path}:{line}: {_dotted(loc)}: keys must be scalars")
                continue
            if key in out:
                first = doc.lines.get((*loc, key), line)
                doc.problems.append(
                    f"{doc.path}:{line}: {_dotted((*loc, key))}: duplicate key "
                    f"(first defined on line {first}); remove one of them"
                )
                continue
            doc.lines[(*loc, key)] = line
            out[key] = _convert(value_node, (*loc, key), doc, open_nodes)
        open_nodes.discard(id(node))
        return out
    if isinstance(node, yaml.SequenceNode):
        open_nodes.add(id(node))
        items = []
        for index, item in enumerate(node.value):
            doc.lines[(*loc, index)] = item.start_mark.line + 1
            items.append(_convert(item, (*loc, index), doc, open_nodes))
        open_nodes.discard(id(node))
        return items
    assert isinstance(node, yaml.ScalarNode)
    if node.tag in (_YAML_TAG + "int", _YAML_TAG + "float") and ":" in node.value:
        # YAML 1.1's base 60 (`1:30:00` is 5400), which YAML 1.2 dropped: a time limit or a
        # clock time is meant as written, never as seconds.
        return node.value
    # Resolve the scalar with the safe constructor so `2`, `true`, `null` keep their YAML types.
    try:
        return _SCALARS.construct_object(node)
    except (yaml.YAMLError, ValueError, KeyError, TypeError, OverflowError) as exc:
        # `!!int x`, a date that is not one, or an integer past Python's digit limit.
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if "Exceeds the limit" in detail:  # Python's remedy (raise the limit) is not ours
            detail = f"more than {sys.get_int_max_str_digits()} digits"
        raise _fail(
            doc,
            node,
            f"{node.value[:40]!r} is not a valid {_tag_text(node.tag)} ({detail}); "
            "fix the value or quote it as a string",
        ) from None


def _dotted(loc: Loc) -> str:
    return ".".join(str(part) for part in loc) or "(document)"


def _syntax_error(path: Path, text: str, exc: yaml.YAMLError) -> BadInput:
    """A parser or reader error as ``file:line: message``."""
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else 1
        problem = exc.problem or "invalid YAML"
        source_lines = text.splitlines()
        if line - 1 < len(source_lines) and "\t" in source_lines[line - 1]:
            problem += " (tabs cannot indent YAML; use spaces)"
        return BadInput(f"{path}:{line}: YAML syntax error: {problem}")
    if isinstance(exc, yaml.reader.ReaderError):
        line = text.count("\n", 0, exc.position) + 1
        return BadInput(
            f"{path}:{line}: character #x{exc.character:04x} is not allowed in YAML (a NUL "
            "or other control character: the file is binary or corrupt); remove it"
        )
    return BadInput(f"{path}: YAML syntax error: {exc}")


def load_yaml(path: Path) -> YamlDoc:
    """Parse ``path``: syntax errors raise BadInput with their line; key problems are collected."""
    text = decode_utf8(read_bytes(path, BadInput, "file"), str(path), BadInput)
    try:
        try:
            node = yaml.compose(text, Loader=_FAST_LOADER)
        except yaml.YAMLError:
            # libyaml words its errors differently: the pure-Python parser says what is wrong.
            node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        raise _syntax_error(path, text, exc) from None
    except RecursionError:
        raise BadInput(f"{path}: YAML nested too deeply to read; the file is corrupt") from None
    doc = YamlDoc(path=path, data=None, text=text)
    if node is not None:
        try:
            doc.data = _convert(node, (), doc, set())
        except RecursionError:
            raise BadInput(f"{path}: YAML nested too deeply to read; the file is corrupt") from None
    return doc


def dotted(loc: Loc) -> str:
    """Render a location as ``cells.adaptive.env`` for messages."""
    return _dotted(loc)
