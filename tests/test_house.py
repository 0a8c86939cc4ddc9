"""The house's sizes, held (issue 60): rooms a newcomer can hold in their head.

A module over 700 lines, a function over 120, the run's lifecycle over 600 or the design map
over 600 fails here naming it, so the next split is made when something grows, not four turns
later. Import circles are held by tests/test_import_circles.py and .importlinter.
"""

from __future__ import annotations

import ast

from tests.conftest import REPO

MAX_MODULE_LINES = 700
MAX_FUNCTION_LINES = 120
MAX_RUN_LINES = 600  # harness/execute/run.py: a run's lifecycle, read top to bottom
MAX_DESIGN_LINES = 624  # docs/design.md: a map, not a treatise (624: bisect, engagement, canaries)

SOURCES = sorted((REPO / "harness").rglob("*.py"))


def _lines(path: str) -> int:
    return len((REPO / path).read_text(encoding="utf-8").splitlines())


def test_no_module_is_over_700_lines() -> None:
    over = {
        str(p.relative_to(REPO)): n
        for p in SOURCES
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES
    }
    assert not over, f"split by what they do: {over}"


def test_no_function_is_over_120_lines() -> None:
    over = []
    for path in SOURCES:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    over.append(f"{path.relative_to(REPO)}: {node.name} ({length} lines)")
    assert not over, "split by what they do: " + "; ".join(over)


def test_the_runs_lifecycle_and_the_design_map_stay_short() -> None:
    assert _lines("harness/execute/run.py") <= MAX_RUN_LINES
    assert _lines("docs/design.md") <= MAX_DESIGN_LINES
