"""A p95/p99 *better* needs the order-statistic bound, not only the point percentile (issue 56).

Each campaign is written as ``harness run`` leaves one (tests/gate/campaigns.py), analysed and
gated. The treatment is faster on every decode gap, so each run's point ITL p99 is lower and
the paired comparison says *better*; the gate also asks LoadGen's early-stopping bounds over
the gaps pooled per arm (harness/stats/tails.py) to separate.
"""

from __future__ import annotations

from pathlib import Path

from harness.analyze.campaign import analyze_campaign, write_analysis
from harness.gate.evaluate import evaluate_gates
from harness.stats.tails import min_samples
from tests.gate.campaigns import Synth, build_campaign, card_text, faster, only

GATE = "  - {kind: better, metric: itl_p99_ms}"


def _tail_gate(tmp_path: Path, synth: Synth) -> tuple[str, bool, bool, dict[str, object]]:
    campaign = build_campaign(tmp_path, card_text(GATE, cycles=3), synth)
    analysis = analyze_campaign(campaign.root)
    (comparison,) = [c for c in analysis.comparisons if c.comparison.metric == "itl_p99_ms"]
    assert comparison.comparison.label == "better"  # the point percentiles alone say better
    result = only(evaluate_gates(analysis))
    # A sequential design's stopping rule reads the same: the tail's better is decided only
    # once its bounds show it, so a look with the bound unshown grows the campaign.
    waiting = "treat/warm itl_p99_ms better, its tail bound not yet shown"
    assert (waiting in analysis.undecided()) == (not result.passed), analysis.undecided()
    return result.reason, result.passed, result.undecided, result.evidence["treat/warm"]


def test_too_few_gaps_for_the_p99_bound_are_inconclusive_not_better(tmp_path: Path) -> None:
    # 6 runs an arm × 4 scored requests × 16 gaps = 384 gaps: p99's bound needs 662.
    reason, passed, undecided, evidence = _tail_gate(tmp_path, Synth(speed=faster(1.5), gap_sd=0.3))
    assert not passed and undecided, reason
    assert reason.endswith(
        f"better, but inconclusive: the cell's upper bound on p99 needs {min_samples(0.99)} "
        "samples (have 384)"
    ), reason
    assert evidence["tail_bound"]["cell_upper"] is None  # type: ignore[index]


def test_a_point_p99_better_whose_bounds_overlap_is_not_better(tmp_path: Path) -> None:
    # 1,536 gaps an arm, 5% shorter in the cell: every run's p99 is lower, but the cell's 99%
    # upper bound (a high order statistic) is not below the control's lower bound.
    reason, passed, undecided, evidence = _tail_gate(
        tmp_path, Synth(speed=faster(1.05), gap_sd=0.3, tokens=65)
    )
    assert not passed and undecided, reason
    bound = evidence["tail_bound"]
    assert isinstance(bound, dict)
    assert bound["cell_n"] == bound["control_n"] == 1_536
    assert bound["cell_upper"] >= bound["control_lower"]
    assert "better, but the p99 bounds overlap: the cell's 99% upper bound" in reason, reason


def test_a_p99_better_the_bounds_also_show_is_better(tmp_path: Path) -> None:
    reason, passed, _, evidence = _tail_gate(
        tmp_path, Synth(speed=faster(1.5), gap_sd=0.3, tokens=65)
    )
    assert passed, reason
    bound = evidence["tail_bound"]
    assert isinstance(bound, dict) and bound["better"]
    assert bound["cell_upper"] < bound["control_lower"]
    assert "better; the p99 bounds show the cell better: the cell's 99% upper" in reason, reason


def test_the_bounds_are_written_with_the_analysis(tmp_path: Path) -> None:
    campaign = build_campaign(
        tmp_path, card_text(GATE, cycles=3), Synth(speed=faster(1.5), gap_sd=0.3, tokens=65)
    )
    analysis = analyze_campaign(campaign.root)
    folder = write_analysis(analysis)
    assert (folder / "tails.parquet").is_file()
    (row,) = analysis.to_json()["tails"]
    assert row["metric"] == "itl_p99_ms" and row["better"] and row["quantile"] == 0.99


def test_a_card_without_a_tail_gate_keeps_no_samples(tmp_path: Path) -> None:
    campaign = build_campaign(
        tmp_path,
        card_text("  - {kind: better, metric: decode_tok_s}", cycles=2),
        Synth(speed=faster(1.5)),
    )
    analysis = analyze_campaign(campaign.root)
    assert analysis.tails == [] and "tails" not in analysis.to_json()


def test_an_inconclusive_tail_also_says_how_many_samples_its_bound_needs(tmp_path: Path) -> None:
    # One cycle: no interval, and 2 runs × 4 requests × 16 gaps = 128 gaps an arm.
    campaign = build_campaign(tmp_path, card_text(GATE, cycles=1), Synth(speed=faster(1.5)))
    result = only(evaluate_gates(analyze_campaign(campaign.root)))
    assert not result.passed and result.undecided
    assert "over 1 cycle: inconclusive" in result.reason
    assert result.reason.endswith(
        "; and inconclusive: the cell's upper bound on p99 needs 662 samples (have 128)"
    ), result.reason
