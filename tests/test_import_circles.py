"""No module of harness/ imports itself round a circle: not at import time, not inside a
function, not under ``TYPE_CHECKING``. import-linter's layers hold the floors; a circle inside
one package, or one only the type checker sees, is this test's."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import REPO


def _modules() -> dict[str, Path]:
    found = {}
    for path in (REPO / "harness").rglob("*.py"):
        name = ".".join(path.relative_to(REPO).with_suffix("").parts)
        found[name.removesuffix(".__init__")] = path
    return found


def _imports(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module → the harness modules it imports anywhere in its text."""

    def resolve(target: str) -> str | None:
        while target not in modules:
            if "." not in target:
                return None
            target = target.rsplit(".", 1)[0]
        return target

    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [f"{node.module}.{alias.name}" for alias in node.names]
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            for target in targets:
                if target.startswith("harness"):
                    resolved = resolve(target)
                    if resolved is not None and resolved != name:
                        graph[name].add(resolved)
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected parts of more than one module (Tarjan's, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            step = next(edges, None)
            if step is not None:
                if step not in index:
                    index[step] = low[step] = len(index)
                    stack.append(step)
                    on_stack.add(step)
                    work.append((step, iter(sorted(graph[step]))))
                elif step in on_stack:
                    low[node] = min(low[node], index[step])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                part = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    part.append(member)
                    if member == node:
                        break
                if len(part) > 1:
                    circles.append(sorted(part))
    return circles


def test_no_module_of_harness_imports_itself_round_a_circle() -> None:
    assert _circles(_imports(_modules())) == []


def test_a_circle_of_two_is_found_and_a_module_that_only_imports_it_is_not() -> None:
    graph = {"a": {"b"}, "b": {"a"}, "c": {"a"}}
    assert _circles(graph) == [["a", "b"]]
