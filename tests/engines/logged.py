"""Find an engine's own log call in its released source, to print its line as it would."""

from __future__ import annotations

import ast


def logger_call(source: str, needle: str, level: str = "info") -> ast.Call:
    """The first ``<logger>.<level>(...)`` in ``source`` whose message contains ``needle``;
    fails the test, saying so, when the release no longer logs it."""
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == level
            and node.args
            and needle in ast.unparse(node.args[0])
        ):
            return node
    raise AssertionError(f"the release no longer logs {needle!r}")
