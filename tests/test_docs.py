"""The front door cannot rot: the README's command tour and quick start run, and the generated
field reference matches the models it is generated from."""

from __future__ import annotations

import contextlib
import io
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness.card.reference import card_json_schema, reference_markdown
from harness.cli import main
from tests.conftest import REPO

README = (REPO / "README.md").read_text(encoding="utf-8")


def _block_after(heading: str) -> list[str]:
    """The lines of the first code block after ``heading``."""
    text = README[README.index(heading) :]
    return text.split("```")[1].strip("\n").splitlines()[0:]


TOUR = [
    line for line in _block_after("## A tour of the command line") if line.startswith("harness")
]
QUICK = _block_after("## Quick start")
REGENERATE = "regenerate with: python -m harness.card.reference"


def test_the_field_reference_is_generated_from_the_models() -> None:
    assert (REPO / "docs" / "reference.md").read_text(encoding="utf-8") == reference_markdown(), (
        REGENERATE
    )
    schema = (REPO / "docs" / "card.schema.json").read_text(encoding="utf-8")
    assert schema == card_json_schema(), REGENERATE


def _help(words: list[str]) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        code = main([*words, "--help"], out=out)
    return code, out.getvalue()


@pytest.mark.parametrize("line", TOUR, ids=[" ".join(t.split()[:3]) for t in TOUR])
def test_every_command_of_the_tour_exists_with_its_flags(line: str) -> None:
    words = line.split()[1:]
    verb = [w for w in words[:2] if re.fullmatch(r"[a-z][a-z0-9-]*", w)]
    if verb[0] == "refbox":
        # The reference runtime parses its own arguments (`harness refbox serve --help`).
        done = subprocess.run(
            [sys.executable, "-m", "harness", *verb, "--help"],
            capture_output=True,
            text=True,
            cwd=REPO,
            check=False,
        )
        code, text = done.returncode, done.stdout
    else:
        code, text = _help(verb)
    assert code == 0, f"`harness {' '.join(verb)} --help` exited {code}"
    command = line.split("  ")[0]  # the command; its description follows two spaces
    for flag in re.findall(r"(?<![\w-])--[a-z][a-z-]*", command):
        assert flag in text, f"{flag} of `{command.strip()}` is not an option of that verb"


def test_the_quick_start_validates_and_plans_a_card_of_your_own(tmp_path: Path) -> None:
    shutil.copytree(REPO / "campaigns", tmp_path / "campaigns", symlinks=False)
    ran = []
    for line in QUICK:
        command = line.split("#")[0].strip()
        if command.startswith(("cp ", "sed ")):
            subprocess.run(command, shell=True, cwd=tmp_path, check=True)
            ran.append(command.split()[0])
        elif command.startswith(("harness validate", "harness plan")):
            args = command.split()[1:]
            done = subprocess.run(
                [sys.executable, "-m", "harness", *args],
                capture_output=True,
                text=True,
                cwd=tmp_path,
                check=False,
                env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
            )
            assert done.returncode == 0, f"{command}: {done.stdout}{done.stderr}"
            ran.append(args[0])
            if args[0] == "plan":
                assert "mine:" in done.stdout and "estimated:" in done.stdout
    assert ran == ["cp", "sed", "validate", "plan"], ran


def test_the_readme_shows_the_verdict_the_golden_file_pins() -> None:
    golden = (REPO / "tests" / "data" / "golden" / "gate.demo-washed.txt").read_text()
    shown = "\n".join(line.rstrip() for line in golden.splitlines())
    assert shown in README, "update the README's verdict block from gate.demo-washed.txt"


def test_the_quick_starts_edit_asks_the_question_its_gates_ask() -> None:
    """The quick start's edit asks one question, the one the demo's gates ask (does this map
    beat the stale one?): the cells then differ in the map only, and plan prices the run's
    scale."""
    import re

    from harness.card import load_card
    from harness.report.labels import varied_against

    readme = (REPO / "README.md").read_text(encoding="utf-8")
    quick = readme.split("## Quick start", 1)[1].split("## ", 1)[0]
    assert "-o campaigns/maps/mine.json" in quick and "rowmap: maps/mine.json" in quick
    card = load_card(REPO / "campaigns" / "demo.yaml").card
    seed = card.cells["seed"]
    mine = seed.model_copy(update={"files": {**seed.files, "rowmap": "maps/mine.json"}})
    edited = card.model_copy(update={"cells": {**card.cells, "seed": mine}})
    assert varied_against(edited, "seed") == ["files.rowmap"]
    assert {g.metric for g in card.gates if g.kind == "better"} == {"decode_tok_s", "hit_rate"}
    scales = re.findall(r"harness (?:plan|run) campaigns/mine.yaml --scale (\S+)", quick)
    assert len(scales) == 2 and len(set(scales)) == 1, scales
