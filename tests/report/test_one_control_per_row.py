"""One control per row: every control value, Δ and ratio in a report row comes from the same
paired blocks, so no row's Δ and ratio can point opposite ways.

The campaign is ladder-shaped: two cells share the control, and the control's blocks paired
with ``fast`` ran on a quicker box than those paired with ``slow``. The median of all the
control's runs then sits between the two cohorts: ``slow`` is better than its own control
(+5%) but slower than that median, the row the seed write-up got wrong (Δ −13.3% beside ratio
1.226)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from harness.analyze.campaign import analyze_campaign
from harness.gate.evaluate import evaluate_gates
from harness.report import build_context
from harness.report.record import render_record
from tests.gate.campaigns import Synth, build_campaign, card_text

GATES = "  - {kind: better, metric: decode_tok_s}"


def _speed(run: dict[str, Any]) -> float:
    # The control's blocks run at the speed of the cohort's box; each cell is +5% on its own.
    base = 200.0 if run["comparison"] == "fast" else 100.0
    return base * (1.05 if run["cell"] != "control" else 1.0)


def _sign(value: float) -> int:
    return 0 if math.isclose(value, 0.0, abs_tol=1e-9) else (1 if value > 0 else -1)


def test_every_rows_delta_and_ratio_agree(tmp_path: Path) -> None:
    text = card_text(GATES, cycles=3, cells=("control", "slow", "fast"))
    root = build_campaign(tmp_path / "ladder", text, Synth(speed=_speed))
    analysis = analyze_campaign(root.root)
    context = build_context(root.root, analysis, evaluate_gates(analysis), figures=False)
    rows = context["timing_rows"] + context["deterministic_rows"]
    assert {r["cell"] for r in rows} == {"slow", "fast"}
    for r in rows:
        item = next(
            c
            for c in analysis.comparisons
            if (c.cell, c.cache_state, c.comparison.metric) == (r["cell"], r["state"], r["metric"])
        )
        control, cell = item.comparison.control_level, item.comparison.cell_level
        assert control is not None and cell is not None
        assert math.isclose(cell / control, item.comparison.ratio, rel_tol=1e-9), r
        assert _sign(cell / control - 1) == _sign(r["ratio"] - 1), r
    slow = next(r for r in rows if r["cell"] == "slow" and r["metric"] == "decode_tok_s")
    # slow's control is the control of slow's own cohorts (~100 tok/s), not the median of all
    # the control's runs (~150).
    assert slow["ratio"] > 1.04 and 90 < float(slow["control_text"].split()[0]) < 110
    for table in context["frozen"]:
        for row in table["rows"]:
            if row["stat"] is not None:
                delta = row["cell"]["value"] / row["control"]["value"] - 1
                assert _sign(delta) == _sign(row["stat"]["ratio"] - 1), (table["title"], row)
            both = row["control"]["value"] and row["cell"]["value"]
            if both and table["cell"] == "slow":  # slow's own cohorts: +5% on every row
                assert row["cell"]["value"] > row["control"]["value"], row
    record = render_record(context)
    assert "| slow | control | warm | decode_tok_s | 99." in record
