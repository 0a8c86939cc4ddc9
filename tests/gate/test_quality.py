"""The quality gate: every check kind, k of n, the no-regression floor, failing closed.

Campaigns are built on disk by :mod:`tests.gate.campaigns` and gated without booting anything.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from harness.analyze.campaign import analyze_campaign
from harness.errors import VerificationError
from harness.formats.records import RUN_OK, write_sealed_json
from harness.gate.evaluate import Verdict, evaluate_gates
from harness.gate.quality import check_passes
from tests.campaign_dirs import start_with
from tests.gate.campaigns import (
    Run,
    Synth,
    build_campaign,
    card_text,
    only,
)

SUITE = [
    {"id": "q-ok", "domain": "en-prose", "check": {"kind": "regex", "pattern": r"^\s*OK"}},
    {"id": "q-json", "domain": "json", "check": {"kind": "json_valid"}},
    {
        "id": "q-schema",
        "domain": "json",
        "check": {
            "kind": "json_schema",
            "schema": {
                "type": "object",
                "required": ["name"],
                "properties": {
                    "name": {"type": "string"},
                    "size": {"type": "integer"},
                    "mode": {"enum": ["fast", "slow"]},
                },
            },
        },
    },
]
GOOD = {"q-ok": " OK.", "q-json": "[1, 2]", "q-schema": '{"name": "x", "size": 3, "mode": "fast"}'}


def _quality_campaign(
    root: Path, gates: str, answers: Callable[[Run, str], str], *, suite: bool = True
) -> Verdict:
    ids = tuple(str(p["id"]) for p in SUITE)
    campaign = build_campaign(root, card_text(gates), Synth(quality=answers, quality_ids=ids))
    if suite:
        # The suite as the harness's start writes it: sealed by campaign_start.
        start_with(campaign.root, "quality.json", {"prompts": SUITE})
    else:
        (campaign.root / "quality.json").unlink()
    return evaluate_gates(analyze_campaign(campaign.root))


def _answers(bad: dict[str, str], cells: tuple[str, ...] = ("treat",)) -> Callable[[Run, str], str]:
    def answer(run: Run, prompt_id: str) -> str:
        if run["cell"] in cells and prompt_id in bad:
            return bad[prompt_id]
        return GOOD.get(prompt_id, "")

    return answer


def test_quality_passes_every_check_kind(tmp_path: Path) -> None:
    # The suite's prompt ids are in quality.json; the run's requests carry them.
    result = only(_quality_campaign(tmp_path, "  - {kind: quality, min_pass: 3/3}", _answers({})))
    assert result.passed, result.reason
    assert result.evidence == {
        "control": {"passed": 3, "n": 3, "required": 3},
        "treat": {"passed": 3, "n": 3, "required": 3},
    }


@pytest.mark.parametrize(
    ("prompt_id", "bad"),
    [
        ("q-ok", "Sure: OK"),  # the regex is anchored
        ("q-json", "{'single': 'quotes'}"),
        ("q-schema", "not json"),
        ("q-schema", '{"size": 3}'),  # required name missing
        ("q-schema", '{"name": 7}'),  # wrong type
        ("q-schema", '{"name": "x", "size": 1.5}'),  # integer expected
        ("q-schema", '{"name": "x", "size": true}'),  # a boolean is not an integer
        ("q-schema", '{"name": "x", "mode": "medium"}'),  # not in the enum
        ("q-schema", '["name"]'),  # not an object
    ],
)
def test_quality_fails_a_check(tmp_path: Path, prompt_id: str, bad: str) -> None:
    verdict = _quality_campaign(
        tmp_path, "  - {kind: quality, min_pass: 3/3}", _answers({prompt_id: bad})
    )
    result = only(verdict)
    assert not result.passed
    assert result.reason == f"treat: 2/3 pass, need 3 (failing: {prompt_id})"
    assert result.evidence["control"]["passed"] == 3


@pytest.mark.parametrize(
    ("schema", "answer", "matches"),
    [
        ({"type": "number"}, "1.5", True),
        ({"type": "number"}, "3", True),
        ({"type": "number"}, "false", False),  # JSON booleans are not numbers
        ({"type": "integer"}, "true", False),
        ({"type": "boolean"}, "true", True),
        ({"enum": [1]}, "true", False),  # nor equal to 1
        ({"enum": [1]}, "1.0", True),  # JSON numbers compare by value
        ({"enum": [[0, 1]]}, "[false, true]", False),
        ({"type": "int"}, "3", False),  # an unknown type accepts nothing
    ],
)
def test_json_schema_checks_keep_booleans_apart(
    schema: dict[str, Any], answer: str, matches: bool
) -> None:
    assert check_passes({"kind": "json_schema", "schema": schema}, answer) is matches


def test_quality_fails_closed_on_an_invalid_check_in_the_campaign(tmp_path: Path) -> None:
    # A quality.json from before checks were validated: a regex without a pattern matched all.
    ids = tuple(str(p["id"]) for p in SUITE)
    campaign = build_campaign(
        tmp_path, card_text("  - {kind: quality, min_pass: 1}"),
        Synth(quality=_answers({}), quality_ids=ids),
    )  # fmt: skip
    suite = [{**SUITE[0], "check": {"kind": "regex"}}, *SUITE[1:]]
    start_with(campaign.root, "quality.json", {"prompts": suite})
    result = only(evaluate_gates(analyze_campaign(campaign.root)))
    assert not result.passed and not result.incomplete
    assert result.reason == (
        "quality check of prompt q-ok is invalid: check.pattern: a regex check needs a `pattern` "
        "(a regular expression string); without one it would match every answer"
    )


def test_quality_k_of_n_tolerates_a_failure(tmp_path: Path) -> None:
    answers = _answers({"q-ok": "no"}, cells=("control", "treat"))
    result = only(_quality_campaign(tmp_path, "  - {kind: quality, min_pass: 2}", answers))
    assert result.passed, result.reason


def test_quality_vs_is_a_no_regression_floor(tmp_path: Path) -> None:
    gate = "  - {kind: quality, min_pass: 1/3, vs: control}"
    regressed = only(_quality_campaign(tmp_path / "a", gate, _answers({"q-json": "oops"})))
    assert not regressed.passed
    assert regressed.reason == "treat: 2/3 pass, need 3 (control passes 3) (failing: q-json)"
    assert regressed.evidence["treat"]["reference"] == {"cell": "control", "passed": 3}
    # When the control also fails it, the treatment only has to match the control.
    both = _answers({"q-json": "oops"}, cells=("control", "treat"))
    held = only(_quality_campaign(tmp_path / "b", gate, both))
    assert held.passed, held.reason
    assert list(held.evidence) == ["treat"]


def test_a_bar_of_zero_met_by_nothing_is_not_read_as_quality(tmp_path: Path) -> None:
    # Seed 000's quality table: 0/12 pass in every cell. A no-regression gate passes (the
    # treatment passes as many as the control), but its reason must not say the cell passes.
    gate = "  - {kind: quality, min_pass: 0, vs: control}"
    nothing = _answers(dict.fromkeys(GOOD, "no"), cells=("control", "treat"))
    result = only(_quality_campaign(tmp_path, gate, nothing))
    assert result.passed, result.reason
    assert result.reason == (
        "every cell meets its bar on the quality suite (treat: 0/3 pass, need 0 (as many as "
        "control)); no prompt of the suite passes in any cell, so it shows nothing of quality"
    )


def test_quality_fails_closed_without_a_suite_or_answers(tmp_path: Path) -> None:
    # The suite the campaign started with, deleted: the directory no longer verifies.
    with pytest.raises(VerificationError, match=r"quality\.json: missing, but the journal sealed"):
        _quality_campaign(tmp_path / "a", "  - {kind: quality, min_pass: 1}", _answers({}),
                          suite=False)  # fmt: skip
    # A suite on disk but no quality answers in the runs: nothing passes.
    campaign = build_campaign(tmp_path / "b", card_text("  - {kind: quality, min_pass: 1}"),
                              Synth())  # fmt: skip
    result = only(evaluate_gates(analyze_campaign(campaign.root)))
    assert not result.passed and "0/2 pass, need 1" in result.reason


@pytest.mark.parametrize(
    ("gate", "missing", "who"),
    [
        ("{kind: quality, min_pass: 3/3}", "0002", "treat: runs not complete (0002-treat-"),
        ("{kind: quality, min_pass: 1, vs: control}", "0000", "reference control: runs not"),
    ],
)
def test_quality_fails_closed_on_a_missing_run(
    tmp_path: Path, gate: str, missing: str, who: str
) -> None:
    ids = tuple(str(p["id"]) for p in SUITE)
    synth = Synth(
        quality=_answers({}),
        quality_ids=ids,
        status=lambda run: None if run["run_id"].startswith(missing) else RUN_OK,
    )
    campaign = build_campaign(tmp_path, card_text(f"  - {gate}", cycles=2), synth)
    start_with(campaign.root, "quality.json", {"prompts": SUITE})
    result = only(evaluate_gates(analyze_campaign(campaign.root)))
    assert not result.passed
    assert who in result.reason and "(missing)" in result.reason
    assert result.incomplete


# ---- soak --------------------------------------------------------------------------------------


def test_a_suite_sealed_again_after_the_start_is_refused(tmp_path: Path) -> None:
    # The quality suite is what the campaign started with: loosening a check and journalling
    # the new digest (as anyone who can write the directory could) does not make it the suite.
    campaign = build_campaign(
        tmp_path, card_text("  - {kind: quality, min_pass: 2/2}"), Synth(quality=_answers({}))
    )
    loose = {"prompts": [{**SUITE[0], "check": {"kind": "regex", "pattern": ".*"}}, SUITE[1]]}
    write_sealed_json(campaign.root, campaign.root / "quality.json", loose)
    with pytest.raises(VerificationError, match=r"quality\.json: sealed again by journal line"):
        analyze_campaign(campaign.root)
