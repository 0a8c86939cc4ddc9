"""The exact-outputs gate: every output matches the reference, k of n, allow-lists, fail closed.

Campaigns are built on disk by :mod:`tests.gate.campaigns` and gated without booting anything.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.formats.records import (
    RUN_OK,
)
from tests.gate.campaigns import (
    HELDOUT,
    Run,
    Synth,
    only,
    verdict_of,
)


def test_exact_outputs_pass_when_every_prompt_matches(tmp_path: Path) -> None:
    gate = only(verdict_of(tmp_path, "  - {kind: exact_outputs, min_match: all}"))
    assert gate.passed, gate.reason
    assert gate.evidence["cells"]["treat"]["matched"] == 4
    assert "treat: 4/4" in gate.reason


def _one_differs(run: Run, prompt_id: str) -> str:
    if run["cell"] == "treat" and prompt_id == "py-held-1" and run["slot"] == 2:
        return "a different greedy continuation"
    return f"greedy text of {prompt_id}"


@pytest.mark.parametrize(
    ("gate", "passed"),
    [
        ("{kind: exact_outputs, min_match: all}", False),
        ("{kind: exact_outputs, min_match: 4/4}", False),
        ("{kind: exact_outputs, min_match: 3/4}", True),
        ("{kind: exact_outputs, min_match: 3}", True),
        ("{kind: exact_outputs, min_match: 7/8}", False),  # ceil(7/8 · 4) = 4
        ("{kind: exact_outputs, min_match: all, allow: [py-held-1]}", True),
        ("{kind: exact_outputs, min_match: all, allow: [en-held-1]}", False),
    ],
)
def test_exact_outputs_k_of_n_and_allow_list(tmp_path: Path, gate: str, passed: bool) -> None:
    result = only(verdict_of(tmp_path, f"  - {gate}", Synth(output=_one_differs)))
    assert result.passed is passed, result.reason
    cell = result.evidence["cells"]["treat"]
    assert cell["matched"] == 3 and cell["n"] == 4
    if "allow: [py-held-1]" in gate:
        assert cell["allowed_mismatches"] == ["py-held-1"] and "+1 allowed" in result.reason
    else:
        assert cell["mismatched"] == ["py-held-1"]
    if not passed:
        assert "treat: 3/4 match control" in result.reason and "differ: py-held-1" in result.reason


def test_exact_outputs_fail_closed_when_the_cell_has_no_outputs(tmp_path: Path) -> None:
    synth = Synth(status=lambda run: "failed" if run["cell"] == "treat" else RUN_OK)
    result = only(verdict_of(tmp_path, "  - {kind: exact_outputs, min_match: 1/4}", synth))
    assert not result.passed
    assert result.reason.startswith("treat: runs not complete (0001-treat-c0-warm-s1-r0 (failed)")
    assert result.evidence["cells"]["treat"]["missing"] == list(HELDOUT)


def test_exact_outputs_with_every_output_empty_is_not_a_match(tmp_path: Path) -> None:
    # Both arms answered nothing: equal hashes, but nothing was compared.
    synth = Synth(output=lambda run, prompt_id: "")
    result = only(verdict_of(tmp_path, "  - {kind: exact_outputs}", synth))
    assert not result.passed and not result.incomplete
    assert result.reason == (
        "treat: 0/4 match control, need 4; 4 prompts with an empty output in control (nothing "
        "compared is not a match)"
    )


def test_exact_outputs_fail_closed_without_reference_outputs(tmp_path: Path) -> None:
    synth = Synth(status=lambda run: None if run["cell"] == "control" else RUN_OK)
    result = only(verdict_of(tmp_path, "  - {kind: exact_outputs, min_match: 1/4}", synth))
    assert not result.passed
    assert result.reason == (
        "reference control: runs not complete "
        "(0000-control-c0-warm-s0-r0 (missing), 0003-control-c0-warm-s3-r0 (missing))"
    )


def test_exact_outputs_fail_closed_with_no_completed_run(tmp_path: Path) -> None:
    synth = Synth(status=lambda run: None)
    verdict = verdict_of(tmp_path, "  - {kind: exact_outputs}", synth)
    assert not only(verdict).passed
    assert "reference control: runs not complete" in only(verdict).reason
    assert len(verdict.incomplete_runs) == 4 and not verdict.passed


def test_exact_outputs_against_a_named_reference_cell(tmp_path: Path) -> None:
    def output(run: Run, prompt_id: str) -> str:
        return "changed" if run["cell"] == "control" else f"greedy text of {prompt_id}"

    result = only(
        verdict_of(
            tmp_path,
            "  - {kind: exact_outputs, vs: b, cells: [c]}",
            Synth(output=output),
            cells=("control", "b", "c"),
            cycles=2,
        )
    )
    assert result.passed, result.reason
    assert list(result.evidence["cells"]) == ["c"] and result.evidence["reference"] == "b"


@pytest.mark.parametrize(
    ("failing", "who"),
    [("0001", "treat: runs not complete (0001-treat-c0-warm-s1-r0 (failed))"),
     ("0003", "reference control: runs not complete (0003-control-c0-warm-s3-r0 (failed))")],
)  # fmt: skip
def test_exact_outputs_fail_closed_on_a_failed_run_even_when_others_cover_every_prompt(
    tmp_path: Path, failing: str, who: str
) -> None:
    # Every prompt still has outputs from the other runs; the failed run's outputs are unknown.
    synth = Synth(status=lambda run: "failed" if run["run_id"].startswith(failing) else RUN_OK)
    result = only(verdict_of(tmp_path, "  - {kind: exact_outputs, min_match: all}", synth,
                             cycles=2))  # fmt: skip
    assert not result.passed
    assert who in result.reason
    assert result.incomplete


# ---- counters --------------------------------------------------------------------------------
