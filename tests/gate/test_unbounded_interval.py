"""A sequential card's first look at 2 cycles on a noisy box: `harness gate` gives a verdict
(undecided, exit 1), never exit 3 (issue 54).

The look decides at a nominal α near 1e-7, so t on one df puts the interval's upper end past
the largest float: the comparison is inconclusive, verdict.json, the journal and analyze --json
stay valid JSON (null, no bare Infinity) and the terminal, record.md and the looks table print
"∞".
"""

from __future__ import annotations

import contextlib
import io
import json
import math
from pathlib import Path
from typing import Any

from harness.analyze.campaign import analyze_campaign
from harness.cli import main
from harness.execute.sequential import record_look
from tests.gate.campaigns import Run, Synth, build_campaign, card_text

EFFECT = {0: 3.0, 1: 0.5}  # log effect per cycle: a real gain, measured on a noisy box


def _speed(run: Run) -> float:
    return 100.0 * (math.exp(EFFECT[run["cycle"]]) if run["cell"] != "control" else 1.0)


def _strict(text: str) -> Any:
    """JSON as any other reader takes it: Infinity and NaN are not JSON."""

    def refuse(word: str) -> None:
        raise ValueError(f"not JSON: {word}")

    return json.loads(text, parse_constant=refuse)


def _gate(root: Path) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(["gate", str(root)], out=out)
    return code, out.getvalue(), err.getvalue()


def test_a_first_look_at_two_noisy_cycles_gates_undecided_not_exit_3(tmp_path: Path) -> None:
    text = card_text("  - {kind: better, metric: decode_tok_s}", cycles=2).replace(
        "design: {order: abba, cycles: 2,",
        "design: {order: abba, cycles: 2, sequential: true, max_cycles: 12,",
    )
    campaign = build_campaign(tmp_path / "first-look", text, Synth(speed=_speed))
    root = campaign.root
    analysis = analyze_campaign(root)
    (item,) = [c for c in analysis.comparisons if c.comparison.metric == "decode_tok_s"]
    assert item.comparison.alpha < 1e-4  # the first look's nominal level
    assert item.comparison.label == "inconclusive" and item.comparison.ci_high == math.inf
    record_look(campaign, analysis)  # what `run` journals at each look
    look = _strict(campaign.journal.path.read_text().splitlines()[-1])
    (journaled,) = [c for c in look["comparisons"] if c["metric"] == "decode_tok_s"]
    assert journaled["ci_high"] is None and journaled["label"] == "inconclusive"

    code, out, err = _gate(root)
    assert code == 1, f"{out}\n{err}"  # undecided: more cycles may settle it
    assert "internal error" not in err and "[0.000, ∞]" in out
    verdict = _strict((root / "verdict.json").read_text())
    (gate,) = verdict["gates"]
    assert gate["passed"] is False and "[0.000, ∞]" in gate["reason"]
    record = (root / "record.md").read_text()
    assert "| decode_tok_s |" in record and "[0.000, ∞] | inconclusive" in record
    # The looks table reads the journal's null upper bound back as "∞" too.
    assert "treat/warm decode_tok_s | 5.754 | [0.000, ∞]" in record
    summary = io.StringIO()
    assert main(["analyze", str(root), "--json"], out=summary) == 0
    _strict(summary.getvalue())
