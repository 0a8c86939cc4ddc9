"""What the verbs print, pinned whole: ``plan``, ``analyze``, ``gate`` and ``compare`` in a
terminal, the ``record.md`` a campaign leaves, and every invalid card's message.

The campaigns are fixed demo records, so a change to any table, label or wording shows up as a
diff of its golden file (:mod:`tests.golden`): ``demo-shaped``, run before washouts (its timing
labels are *carry-over*: no washout, and the deployed effect does not support them), and
``demo-washed``, the demo as the default design runs it now (the README's example verdict).
Paths that depend on where the test runs are written as ``DIR`` and ``DATA``, and the time a
record was written as ``TIME``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import DATA, REPO, run_cli
from tests.golden import assert_golden

RECORDS = DATA / "campaigns" / "demo-shaped"
WASHED = DATA / "campaigns" / "demo-washed"
INVALID = sorted((DATA / "cards" / "invalid").glob("*.yaml"))


def _copy(tmp_path: Path, name: str = "20261201T100919Z", records: Path = RECORDS) -> Path:
    root = tmp_path / "demo" / name
    shutil.copytree(records, root, ignore=shutil.ignore_patterns("README.md"))
    return root


def _relative(text: str, **paths: Path) -> str:
    for label, path in paths.items():
        text = text.replace(str(path), label)
    return text


def test_plan_prints_the_ordered_runs_and_the_estimate(tmp_path: Path) -> None:
    # An empty results store: what the card last measured here is a developer's own.
    result = run_cli("plan", "campaigns/demo.yaml", "--reports", str(tmp_path))
    assert result.code == 0, result.stderr
    assert_golden("plan.demo.txt", result.stdout)


def test_plan_from_a_campaign_prices_every_design() -> None:
    # Seed 000's box: a boot of 8 minutes, priced from the demo-shaped campaign's spread.
    demo = "tests/data/campaigns/demo-shaped"
    result = run_cli("plan", "campaigns/demo.yaml", "--from", demo, "--boot-s", "480")
    assert result.code == 0, result.stderr
    assert_golden("plan-from.demo-shaped.txt", result.stdout)


def test_analyze_prints_every_comparison(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    result = run_cli("analyze", str(root))
    assert result.code == 0, result.stderr
    assert_golden("analyze.demo-shaped.txt", _relative(result.stdout, DIR=root))


def test_gate_prints_the_verdict_and_the_record_matches(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    # Recorded before directories were sealed: refused without the flag, unverified with it.
    refused = run_cli("gate", str(root))
    assert refused.code == 3 and "--allow-unsealed" in refused.stderr
    assert json.loads((root / "verdict.json").read_text())["passed"] is False
    result = run_cli("gate", "--allow-unsealed", str(root))
    assert result.code in (0, 1), result.stderr
    assert_golden("gate.demo-shaped.txt", _relative(result.stdout, DIR=root))
    record = (root / "record.md").read_text(encoding="utf-8")
    # Dated by the records (when the last run ended), not by when it was written.
    assert_golden("record.demo-shaped.md", record)


def test_a_washed_demo_is_decided_on_the_deployed_effect(tmp_path: Path) -> None:
    # The README's example: every block followed a quarter block of its own cell's traffic,
    # which is no wash (a part of a block), so the speed-up stands on the crossover model's
    # deployed effect (B after B against A after A) and it does.
    root = _copy(tmp_path, "20261204T230934Z", WASHED)
    analyzed = run_cli("analyze", str(root))
    assert analyzed.code == 0, analyzed.stderr
    assert_golden("analyze.demo-washed.txt", _relative(analyzed.stdout, DIR=root))
    result = run_cli("gate", str(root))
    assert result.code == 0, result.stderr
    assert_golden("gate.demo-washed.txt", _relative(result.stdout, DIR=root))
    # record.md says where the sequential design stopped, and at which α, as the page does.
    assert_golden("record.demo-washed.md", (root / "record.md").read_text(encoding="utf-8"))


def test_compare_prints_two_builds_side_by_side(tmp_path: Path) -> None:
    a, b = _copy(tmp_path, "20261201T100919Z"), _copy(tmp_path, "20261201T120000Z")
    result = run_cli("compare", str(a), str(b))
    assert result.code == 0, result.stderr
    assert_golden("compare.demo-shaped.txt", _relative(result.stdout, DIR_A=a, DIR_B=b))


@pytest.mark.parametrize("card", INVALID, ids=[p.stem for p in INVALID])
def test_every_invalid_card_says_where_and_how_to_fix_it(card: Path) -> None:
    result = run_cli("validate", str(card))
    assert result.code == 2 and result.stdout == ""
    assert "Traceback" not in result.stderr
    _MESSAGES[card.stem] = _relative(result.stderr, DATA=DATA, REPO=REPO)


_MESSAGES: dict[str, str] = {}


def test_the_invalid_cards_messages_are_pinned() -> None:
    # After the parametrized test above (pytest keeps file order): one file holds them all.
    if len(_MESSAGES) != len(INVALID):
        for card in INVALID:
            result = run_cli("validate", str(card))
            _MESSAGES[card.stem] = _relative(result.stderr, DATA=DATA, REPO=REPO)
    text = "".join(f"== {name}.yaml\n{_MESSAGES[name]}\n" for name in sorted(_MESSAGES))
    assert_golden("validate.invalid-cards.txt", text)
