"""The report states the tail bounds' method where a gate judges a tail metric (issue 56)."""

from __future__ import annotations

from pathlib import Path

from harness.analyze.campaign import analyze_campaign
from harness.gate.evaluate import evaluate_gates
from harness.report import render_report
from tests.gate.campaigns import Synth, build_campaign, card_text, faster


def test_the_method_and_each_rows_bounds_are_in_the_page_and_the_record(tmp_path: Path) -> None:
    gate = "  - {kind: better, metric: itl_p99_ms}"
    campaign = build_campaign(
        tmp_path, card_text(gate, cycles=3), Synth(speed=faster(1.05), gap_sd=0.3, tokens=65)
    )
    analysis = analyze_campaign(campaign.root)
    page = render_report(campaign.root, analysis, evaluate_gates(analysis), figures=False)
    html = page.read_text(encoding="utf-8")
    record = (campaign.root / "record.md").read_text(encoding="utf-8")
    for text in (html, record):
        assert "early-stopping estimate: the t-th largest sample" in text
        assert "p99 662, fewer is inconclusive" in text
        assert "the p99 bounds overlap" in text  # the itl_p99_ms row's note


def test_no_tail_gate_no_tail_method(tmp_path: Path) -> None:
    campaign = build_campaign(
        tmp_path,
        card_text("  - {kind: better, metric: decode_tok_s}", cycles=2),
        Synth(speed=faster(1.5)),
    )
    analysis = analyze_campaign(campaign.root)
    render_report(campaign.root, analysis, evaluate_gates(analysis), figures=False)
    assert "early-stopping" not in (campaign.root / "record.md").read_text(encoding="utf-8")
