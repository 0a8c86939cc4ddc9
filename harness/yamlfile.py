"""YAML loading that remembers where every value came from.

Pydantic reports errors by location (``cells.adaptive.env``); users need a line number. We compose
the YAML node tree ourselves so each path maps to its line, and so duplicate keys are an error
instead of the silent overwrite PyYAML does by default.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from harness.errors import BadInput

Loc = tuple[str | int, ...]

# One constructor, reused: it resolves scalars (`2`, `true`, `null`) to their YAML types.
_SCALARS = yaml.SafeLoader("")


@dataclass
class YamlDoc:
    """A parsed YAML document with the line (1-based) of every mapping key and sequence item."""

    path: Path
    data: Any
    lines: dict[Loc, int] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def line_of(self, loc: Loc) -> int:
        """The line of ``loc`` or of its nearest located ancestor (1 for the document)."""
        probe = tuple(loc)
        while probe:
            if probe in self.lines:
                return self.lines[probe]
            probe = probe[:-1]
        return 1


def _convert(node: yaml.Node, loc: Loc, doc: YamlDoc) -> Any:
    if isinstance(node, yaml.MappingNode):
        out: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            key = _convert(key_node, loc, doc)
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
            out[key] = _convert(value_node, (*loc, key), doc)
        return out
    if isinstance(node, yaml.SequenceNode):
        items = []
        for index, item in enumerate(node.value):
            doc.lines[(*loc, index)] = item.start_mark.line + 1
            items.append(_convert(item, (*loc, index), doc))
        return items
    assert isinstance(node, yaml.ScalarNode)
    # Resolve the scalar with the safe constructor so `2`, `true`, `null` keep their YAML types.
    return _SCALARS.construct_object(node)


def _dotted(loc: Loc) -> str:
    return ".".join(str(part) for part in loc) or "(document)"


def load_yaml(path: Path) -> YamlDoc:
    """Parse ``path``: syntax errors raise BadInput with their line; key problems are collected."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise BadInput(f"{path}: cannot read: {exc.strerror}") from exc
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else 1
        problem = exc.problem or "invalid YAML"
        source_lines = text.splitlines()
        if line - 1 < len(source_lines) and "\t" in source_lines[line - 1]:
            problem += " (tabs cannot indent YAML; use spaces)"
        raise BadInput(f"{path}:{line}: YAML syntax error: {problem}") from exc
    doc = YamlDoc(path=path, data=None)
    if node is not None:
        doc.data = _convert(node, (), doc)
    return doc


def dotted(loc: Loc) -> str:
    """Render a location as ``cells.adaptive.env`` for messages."""
    return _dotted(loc)
