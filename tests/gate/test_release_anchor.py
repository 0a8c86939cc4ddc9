"""The ``regression`` gate anchored to a release (issue 56): small steps cannot creep past it.

A history of 8 releases, each build 0.5% slower at decode than the one before: every step is
within the 2% margin of the one before, so the per-step gate (``last: 1``) promotes each, while
against the first release the change adds up and the anchored gate fails from the release where
it passes the margin. The campaigns are written as ``harness run`` writes them
(:func:`build_campaign`), gated by ``harness gate`` (which writes the store's rows) and marked
with ``harness history release``.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
from pathlib import Path
from typing import Any

import pytest

from harness.card import RegressionGate
from harness.cli import main
from harness.gate.regression import regression_gate
from harness.gate.result import GateResult
from harness.history.releases import read_releases
from harness.history.store import read_history
from harness.spine import gate_campaign
from tests.gate.campaigns import Synth, build_campaign, card_text

STEP = 0.995  # each release's decode speed against the one before
RELEASES = 8
BASELINE = "  - {kind: counter, counter: swaps, max: 0}"  # passes: makes the first one promoted
PER_STEP = "  - {kind: regression, metric: decode_tok_s, last: 1}"
ANCHOR = RegressionGate(kind="regression", metric="decode_tok_s", against="release", release="v0")
ANCHORED = "  - {kind: regression, metric: decode_tok_s, against: release, release: v0}"


def _cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(list(argv), out=out)
    return code, out.getvalue(), err.getvalue()


def _gate(root: Path) -> tuple[int, dict[str, Any], str]:
    """``harness gate DIR``: its exit code, the verdict it wrote and what it printed on stderr."""
    code, _, err = _cli("gate", str(root), "--quiet")
    verdict: dict[str, Any] = json.loads((root / "verdict.json").read_text(encoding="utf-8"))
    return code, verdict, err


def _release(tmp: Path, k: int, gates: str) -> Path:
    """Release ``k``'s campaign under ``tmp/reports``: decode 100 × STEP^k tok/s, low noise."""
    speed = 100.0 * STEP**k
    return build_campaign(tmp, card_text(gates, cycles=3), Synth(speed=lambda run: speed)).root


def _history(tmp: Path) -> list[dict[str, GateResult | None]]:
    """The 8 releases, each gated per step and marked; returns per release the per-step
    verdict and the anchored gate's (against v0) over the same campaign."""
    figures: list[dict[str, GateResult | None]] = []
    for k in range(RELEASES):
        root = _release(tmp, k, BASELINE if k == 0 else f"{BASELINE}\n{PER_STEP}")
        # What `harness gate DIR` does (store rows included), less the report's figures.
        decision = gate_campaign(root, figures=False).decision
        assert decision.verdict.passed, decision.verdict.gates  # every step is promoted
        step = [g for g in decision.verdict.gates if g.kind == "regression"]
        assert _cli("history", "release", str(root), "--name", f"v{k}")[0] == 0
        # The anchored gate over the same campaign, as a card holding it would evaluate it.
        result = regression_gate(ANCHOR, decision.analysis)
        figures.append({"step": step[0] if step else None, "anchored": result})
    return figures


def test_releases_creeping_half_a_percent_pass_each_step_and_fail_against_the_first(
    tmp_path: Path,
) -> None:
    figures = _history(tmp_path)
    margin = 1 / 1.02  # the 2% margin on the log scale, as a ratio
    for k, row in enumerate(figures[1:], start=1):
        step, anchored = row["step"], row["anchored"]
        assert step is not None and anchored is not None
        assert step.passed and "against the last 1 promoted" in step.reason, step.reason
        evidence = anchored.evidence["treat/warm"]
        print(
            f"v{k}: per step PASS: {step.reason}\nv{k}: against v0 "
            f"{'PASS' if anchored.passed else 'FAIL'}: {anchored.reason}"
        )
        # The anchored gate fails exactly where the cumulative change passes the margin.
        assert evidence["ratio"] == pytest.approx(STEP**k, rel=2e-3)
        assert anchored.passed == (STEP**k > margin), anchored.reason
        assert "against release v0 (" in anchored.reason and "% interval" in anchored.reason
    anchored_passed = [bool(r["anchored"] and r["anchored"].passed) for r in figures[1:]]
    assert anchored_passed == [True] * 3 + [False] * 4  # v4: -1.99%, past 1/1.02 - 1 = -1.96%
    store = tmp_path / "reports" / "history"
    assert [r.name for r in read_releases(store)] == [f"v{k}" for k in range(RELEASES)]
    assert read_history(store)["passed"].astype(bool).all()  # every step was promoted

    # A card may hold both: the next build passes its step and fails against v0, exit 1.
    root = _release(tmp_path, RELEASES, f"{BASELINE}\n{PER_STEP}\n{ANCHORED}")
    code, verdict, _ = _gate(root)
    gates = {g["name"]: g for g in verdict["gates"]}
    assert code == 1
    assert gates["regression decode_tok_s vs last 1 promoted"]["passed"]
    both = gates["regression decode_tok_s vs release v0"]
    assert not both["passed"] and "may be worse than the 2% margin" in both["reason"]
    (v0,) = [r for r in read_releases(store) if r.name == "v0"]
    assert f"release v0 ({v0.stamp}, {v0.dir})" in both["reason"]
    assert both["evidence"]["release"]["name"] == "v0"
    low, high = both["evidence"]["treat/warm"]["interval"]
    assert low < STEP**RELEASES < high and not math.isclose(low, high)


def test_no_release_fails_closed_saying_how_to_mark_one(tmp_path: Path) -> None:
    first = _release(tmp_path, 0, BASELINE)
    assert _cli("gate", str(first))[0] == 0  # promoted, never marked
    gate = "  - {kind: regression, metric: decode_tok_s, against: release}"
    root = _release(tmp_path, 1, f"{BASELINE}\n{gate}")
    code, verdict, _ = _gate(root)
    (result,) = [g for g in verdict["gates"] if g["kind"] == "regression"]
    assert code == 1 and not result["passed"]
    assert "no release of 'gates' on box 'local' marked" in result["reason"]
    assert "harness history release DIR --name NAME" in result["reason"]
    assert result["name"] == "regression decode_tok_s vs release (newest)"
    # Marked, the default anchor is the release marked last.
    assert _cli("history", "release", str(first), "--name", "2026.12")[0] == 0
    code, verdict, _ = _gate(root)
    (result,) = [g for g in verdict["gates"] if g["kind"] == "regression"]
    assert code == 0 and "against release 2026.12 (" in result["reason"], result
    code, out, _ = _cli("history", "--reports", str(tmp_path / "reports"), "--releases", "--json")
    assert code == 0 and [r["name"] for r in json.loads(out)] == ["2026.12"]


def test_bad_anchors_are_exit_2_naming_file_and_field(tmp_path: Path) -> None:
    first = _release(tmp_path, 0, BASELINE)
    # Not gated yet: not in the store, so not promoted.
    code, _, err = _cli("history", "release", str(first), "--name", "v1")
    assert code == 2 and f"{first}: not in the results store" in err and "Traceback" not in err
    code, _, err = _cli("history", "release", str(tmp_path / "nowhere"))
    assert code == 2 and "no such campaign directory" in err
    # Gated and failed: not promoted.
    failing = _release(tmp_path, 0, "  - {kind: counter, counter: swaps, min: 1}")
    assert _cli("gate", str(failing))[0] == 1
    code, _, err = _cli("history", "release", str(failing), "--name", "v1")
    assert code == 2 and "passed: false in the results store" in err
    assert _cli("gate", str(first))[0] == 0
    code, _, err = _cli("history", "release", str(first), "--name", "v/1")
    assert code == 2 and "--name: 'v/1' is not a release name" in err
    assert _cli("history", "release", str(first), "--name", "v1")[0] == 0
    other = _release(tmp_path, 0, BASELINE)
    assert _cli("gate", str(other))[0] == 0
    code, _, err = _cli("history", "release", str(other), "--name", "v1")
    assert code == 2 and "--name: release v1 of 'gates' already marks" in err
    # A card naming a release nobody marked: exit 2 at the card's line and field.
    gate = "  - {kind: regression, metric: decode_tok_s, against: release, release: v9}"
    root = _release(tmp_path, 1, f"{BASELINE}\n{gate}")
    code, _, err = _cli("gate", str(root))
    assert code == 2 and "Traceback" not in err, err
    assert f"{root / 'card.yaml'}:" in err and "gates.1.release: no release 'v9'" in err
    assert "marked: v1 (box local)" in err
    # ... and `harness run` says so before it makes a campaign or boots anything.
    card = tmp_path / "anchored.yaml"
    card.write_text(card_text(f"{BASELINE}\n{gate}", cycles=3), encoding="utf-8")
    before = sorted((tmp_path / "reports" / "gates").iterdir())
    code, _, err = _cli("run", str(card), "--reports", str(tmp_path / "reports"), "--quiet")
    assert code == 2 and f"{card}:" in err and "gates.1.release: no release 'v9'" in err, err
    assert sorted((tmp_path / "reports" / "gates").iterdir()) == before
    # A damaged mark is named, never skipped.
    damaged = tmp_path / "reports" / "history" / "releases" / "gates--v2.json"
    damaged.write_text('{"name": 2}', encoding="utf-8")
    code, _, err = _cli("history", "--reports", str(tmp_path / "reports"), "--releases")
    assert code == 2 and f"{damaged}: name: missing or not a string" in err


@pytest.mark.parametrize(
    ("gate", "field", "message"),
    [
        ("{kind: regression, metric: decode_tok_s, release: v1}", "release", "add `against"),
        ("{kind: regression, metric: decode_tok_s, against: release, last: 2}", "last", "drop"),
        ("{kind: regression, metric: decode_tok_s, against: releases}", "against", "release"),
    ],
)
def test_a_card_whose_anchor_fields_disagree_is_refused(
    tmp_path: Path, gate: str, field: str, message: str
) -> None:
    card = tmp_path / "card.yaml"
    card.write_text(card_text(f"  - {gate}"), encoding="utf-8")
    code, _, err = _cli("validate", str(card))
    assert code == 2 and "Traceback" not in err
    (line,) = [x for x in err.splitlines() if f"gates.0.{field}" in x]
    assert line.startswith(f"{card}:") and message in line, err
