"""The library API (``harness.load_card`` … ``harness.render_report``): the CLI's pipeline, one
call per stage, for scripts and notebooks. ``run_campaign`` is exercised by the tiny report
campaign every report test shares (:func:`tests.report.test_report.make_tiny_campaign`)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import harness

REPO = Path(__file__).resolve().parent.parent
DEMO_SHAPED = REPO / "tests" / "data" / "campaigns" / "demo-shaped"


def test_import_harness_loads_no_stage() -> None:
    probe = (
        "import sys, harness\n"
        "print(sorted(m for m in sys.modules if m.startswith(('harness.', 'pydantic', 'numpy'))"
        " and m != 'harness.version'))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=REPO
    )
    assert done.stdout.strip() == "[]", done.stdout


def test_a_card_is_planned_without_a_box() -> None:
    loaded = harness.load_card(REPO / "campaigns" / "demo.yaml")
    plan = harness.build_plan(loaded)
    assert plan.runs and {run.cell for run in plan.runs} == set(loaded.card.cells)


def test_a_finished_campaign_is_analysed_gated_and_rendered(tmp_path: Path) -> None:
    root = tmp_path / "demo-shaped"
    shutil.copytree(DEMO_SHAPED, root)
    analysis = harness.analyze_campaign(root)
    verdict = harness.evaluate_gates(analysis)
    page = harness.render_report(root, analysis, verdict, figures=False)
    assert page == root / "report.html" and (root / "record.md").is_file()
    assert verdict.exit_code() in (0, 1)
    assert len(verdict.gates) == len(analysis.card.gates)


def test_an_unknown_name_is_an_attribute_error() -> None:
    try:
        harness.no_such_stage  # noqa: B018
    except AttributeError as exc:
        assert "no_such_stage" in str(exc)
    else:
        raise AssertionError("harness.no_such_stage resolved")


def _snapshot(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != ".lock"
    }


@pytest.mark.slow  # a real campaign, gated twice
def test_run_gate_and_the_library_leave_the_same_directory(tmp_path: Path) -> None:
    """`harness run` (through the library's run_campaign, which the tiny campaign used),
    `harness gate` and `harness.gate_campaign` walk one spine: on the same records they leave
    byte-identical campaign directories."""
    from tests.report.test_report import make_tiny_campaign

    ran = make_tiny_campaign(tmp_path / "tiny")
    root = tmp_path / "reports" / ran.parent.name / ran.name
    shutil.copytree(ran, root)
    after_run = _snapshot(root)
    assert "verdict.json" in after_run and "report.html" in after_run
    subprocess.run(
        [sys.executable, "-m", "harness", "gate", str(root), "--quiet"],
        capture_output=True, check=False, cwd=REPO,
    )  # fmt: skip
    after_cli = _snapshot(root)
    harness.gate_campaign(root)
    after_library = _snapshot(root)
    for name in sorted(set(after_run) | set(after_cli) | set(after_library)):
        assert after_run.get(name) == after_cli.get(name), f"{name}: run and gate differ"
        assert after_cli.get(name) == after_library.get(name), f"{name}: gate and library differ"


def test_no_module_imports_the_package_face() -> None:
    """The face (harness/__init__.py, the library API) sits above every stage: a module below it
    takes the version and the package's place from harness.version, the ground floor."""
    import ast

    offenders = []
    for path in sorted((REPO / "harness").rglob("*.py")):
        if path.parent == REPO / "harness" and path.name in ("__init__.py", "__main__.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import) and any(a.name == "harness" for a in node.names):
                offenders.append(f"{path.relative_to(REPO)}:{node.lineno}")
            if isinstance(node, ast.ImportFrom) and node.module == "harness" and node.level == 0:
                offenders.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not offenders, offenders
