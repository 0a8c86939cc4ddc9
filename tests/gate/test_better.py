"""The better and survives gates: the label, carry-over, drift, inconclusive advice, cache states.

Campaigns are built on disk by :mod:`tests.gate.campaigns` and gated without booting anything.
"""

from __future__ import annotations

import json
import math
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from harness.analyze.campaign import analyze_campaign
from harness.analyze.metrics import counter_metrics
from harness.formats.records import (
    RUN_OK,
)
from harness.gate.evaluate import evaluate_gates, write_verdict
from tests.gate.campaigns import (
    COUNTERS,
    Run,
    Synth,
    build_campaign,
    card_text,
    faster,
    only,
    verdict_of,
)


def test_better_passes_on_a_clear_speedup(tmp_path: Path) -> None:
    gates = "  - {kind: better, metric: decode_tok_s}\n  - {kind: better, metric: tpot_p50_ms}"
    verdict = verdict_of(tmp_path, gates, Synth(speed=faster(1.5)), cycles=3)
    speed, tpot = verdict.gates
    assert speed.passed and tpot.passed and verdict.passed, speed.reason + tpot.reason
    assert speed.evidence["treat/warm"]["label"] == "better"
    assert speed.evidence["treat/warm"]["ratio"] == pytest.approx(1.5, rel=0.01)
    assert tpot.evidence["treat/warm"]["ratio"] == pytest.approx(1 / 1.5, rel=0.01)
    assert speed.evidence["treat/warm"]["n_cycles"] == 3
    assert "treat/warm: ratio 1.50" in speed.reason and "over 3 cycles: better" in speed.reason
    # The evidence is plain JSON: ints stay ints and numbers are finite.
    assert isinstance(speed.evidence["treat/warm"]["n_cycles"], int)
    json.dumps(verdict.to_json(), allow_nan=False)


def test_better_fails_when_worse(tmp_path: Path) -> None:
    result = only(verdict_of(tmp_path, "  - {kind: better, metric: decode_tok_s}",
                             Synth(speed=faster(0.7)), cycles=2))  # fmt: skip
    assert not result.passed
    assert "ratio 0.700" in result.reason and result.reason.endswith(": worse")


@pytest.mark.parametrize("shared", [False, True])
def test_better_without_a_washout_needs_the_cycles_that_estimate_carry_over(
    tmp_path: Path, shared: bool
) -> None:
    # 1.5x faster on every block, on boots of their own or each cycle's four blocks on one boot
    # (design.boot: per-cycle). Washed, two cycles decide it; without a washout two cycles
    # cannot estimate the carry-over the block before could leave (heat, a page cache, a
    # queue): the gate fails and says how many cycles would, or to declare the washout.
    gate = "  - {kind: better, metric: decode_tok_s}"
    boot = (lambda run: f"boot-{run['cycle']}") if shared else None
    bare = Synth(speed=faster(1.5), boot=boot, washout=False)
    result = only(verdict_of(tmp_path / "two", gate, bare, cycles=2))
    assert not result.passed
    assert result.evidence["treat/warm"]["label"] == "carry-over"
    assert "no washout preceded the blocks, and 2 cycles cannot estimate" in result.reason
    assert "run 3" in result.reason and "design.washout" in result.reason
    assert "nan" not in result.reason
    washed = Synth(speed=faster(1.5), boot=boot)
    assert only(verdict_of(tmp_path / "washed", gate, washed, cycles=2)).passed
    three = only(verdict_of(tmp_path / "three", gate, bare, cycles=3))
    assert three.passed, three.reason


def test_better_fails_within_noise_on_an_a_a_campaign(tmp_path: Path) -> None:
    result = only(verdict_of(tmp_path, "  - {kind: better, metric: decode_tok_s}", cycles=2))
    assert not result.passed
    assert "within noise" in result.reason


def _inconsistent(run: Run) -> float:
    # Cycle effects +30%, −5%, +25%: large on average, but the CI includes 1.
    if run["cell"] == "control":
        return 100.0
    return 100.0 * (1.30, 0.95, 1.25)[run["cycle"]]


def test_better_fails_inconclusive_and_says_how_many_cycles(tmp_path: Path) -> None:
    result = only(verdict_of(tmp_path, "  - {kind: better, metric: decode_tok_s}",
                             Synth(speed=_inconsistent), cycles=3))  # fmt: skip
    assert not result.passed
    assert ": inconclusive" in result.reason
    assert "across the spread's 80% interval" in result.reason
    assert "would be needed" in result.reason
    row = result.evidence["treat/warm"]
    assert row["ci_low"] < 1 < row["ci_high"]


def test_an_inconclusive_gate_is_undecided_not_failed_everywhere(tmp_path: Path) -> None:
    verdict = verdict_of(tmp_path / "undecided", "  - {kind: better, metric: decode_tok_s}",
                         Synth(speed=_inconsistent), cycles=3)  # fmt: skip
    assert only(verdict).undecided and not only(verdict).passed
    assert (verdict.outcome, verdict.word, verdict.exit_code()) == ("undecided", "UNDECIDED", 1)
    write_verdict(verdict, tmp_path)
    assert json.loads((tmp_path / "verdict.json").read_text())["outcome"] == "undecided"
    failure = ET.parse(tmp_path / "verdict.junit.xml").getroot().find(".//failure")
    assert failure is not None and failure.get("type") == "undecided"
    assert str(failure.get("message")).startswith("undecided (inconclusive, not worse)")
    # Worse is decided: failed, not undecided.
    worse = verdict_of(tmp_path / "worse", "  - {kind: better, metric: decode_tok_s}",
                       Synth(speed=faster(0.7)), cycles=2)  # fmt: skip
    assert not only(worse).undecided and (worse.outcome, worse.word) == ("fail", "FAIL")


def _drifting(run: Run) -> float:
    # The box slows 10% per run, linearly in log speed, on top of a real 30% speed-up: the
    # mirrored order cancels linear drift, and the bias the flagged drift could cause (½|outer −
    # inner| = 10% a cycle) cannot explain a 30% effect.
    index = int(run["run_id"][:4])
    return 100.0 * math.exp(-0.10 * index) * (1.3 if run["cell"] == "treat" else 1.0)


def _drifting_small(run: Run) -> float:
    # The box slows 4% per run on top of a 5% speed-up: linear drift cancels in every cycle, and
    # the trend the other cycles show is taken out of the drift bound (issue 26: the bound once
    # charged ½|outer − inner| = 4% and called this confounded).
    index = int(run["run_id"][:4])
    return 100.0 * math.exp(-0.04 * index) * (1.05 if run["cell"] == "treat" else 1.0)


def test_better_survives_linear_drift_it_cannot_be_explained_by(tmp_path: Path) -> None:
    campaign = build_campaign(
        tmp_path,
        card_text("  - {kind: better, metric: decode_tok_s}", cycles=3),
        Synth(speed=_drifting),
    )
    analysis = analyze_campaign(campaign.root)
    assert {f["kind"] for f in analysis.flags if f["metric"] == "decode_tok_s"} == {"DRIFT"}
    result = only(evaluate_gates(analysis))
    assert result.passed, result.reason
    assert result.evidence["treat/warm"]["label"] == "better"
    assert result.evidence["treat/warm"]["ratio"] == pytest.approx(1.3, rel=0.01)


def test_linear_drift_is_not_charged_against_a_small_effect(tmp_path: Path) -> None:
    campaign = build_campaign(
        tmp_path,
        card_text("  - {kind: better, metric: decode_tok_s}", cycles=3),
        Synth(speed=_drifting_small),
    )
    analysis = analyze_campaign(campaign.root)
    assert analysis.flags  # the drift is on record
    result = only(evaluate_gates(analysis))
    assert result.passed, result.reason
    assert result.evidence["treat/warm"]["label"] == "better"


@pytest.mark.parametrize("status", ["failed", None])
def test_better_fails_closed_on_a_failed_or_missing_run(tmp_path: Path, status: str | None) -> None:
    # 0007 is a treat run of cycle 1; the other two cycles alone would say *better*.
    synth = Synth(
        speed=faster(1.5),
        status=lambda run: status if run["run_id"].startswith("0007") else RUN_OK,
    )
    result = only(verdict_of(tmp_path, "  - {kind: better, metric: decode_tok_s}", synth, cycles=2))
    assert not result.passed
    label = status or "missing"
    assert result.reason == f"treat/warm: runs not complete (0007-treat-c1-warm-s3-r0 ({label}))"


def test_better_fails_closed_without_any_comparison(tmp_path: Path) -> None:
    # The treatment never ran at all: no cycle is complete, so nothing was compared.
    synth = Synth(status=lambda run: None if run["cell"] == "treat" else RUN_OK)
    verdict = verdict_of(tmp_path, "  - {kind: better, metric: tpot_p95_ms}", synth)
    assert not only(verdict).passed and "runs not complete" in only(verdict).reason
    # With no run of the treatment in the plan's comparison, the gate still never passes.
    assert verdict.incomplete_runs and not verdict.passed


def test_better_fails_when_only_one_cycle_ran(tmp_path: Path) -> None:
    result = only(verdict_of(tmp_path, "  - {kind: better, metric: decode_tok_s}",
                             Synth(speed=faster(1.5)), cycles=1))  # fmt: skip
    assert not result.passed
    assert "over 1 cycle: inconclusive" in result.reason
    assert result.evidence["treat/warm"]["ci_low"] is None


def _no_misses_for_treat(run: Run) -> dict[str, float]:
    # A runtime that counts hits but not misses: the treatment's hit rate cannot be formed.
    out = dict(COUNTERS)
    if run["cell"] == "treat":
        del out["misses"]
    return out


def test_hit_rate_without_a_misses_counter_is_not_recorded() -> None:
    assert counter_metrics({"delta": {"hits": 600.0}})["hit_rate"] is None
    assert counter_metrics({"delta": {"hits": 0.0, "misses": 0.0}})["hit_rate"] is None
    assert counter_metrics({"delta": {"hits": 600.0, "misses": 0.0}})["hit_rate"] == 1.0
    assert counter_metrics({"delta": {"hits": 600.0, "misses": 200.0}})["hit_rate"] == 0.75


def test_better_hit_rate_fails_closed_without_misses(tmp_path: Path) -> None:
    synth = Synth(counters=_no_misses_for_treat)
    result = only(verdict_of(tmp_path, "  - {kind: better, metric: hit_rate}", synth, cycles=2))
    assert not result.passed
    assert result.reason.startswith("treat/warm: hit_rate was not recorded for runs 0001-treat-")
    assert "so the cell cannot be compared on it" in result.reason
    # The control reports both counters: only the treatment's runs are named.
    assert "control" not in result.reason.split(" (")[0]


# ---- survives ----------------------------------------------------------------------------------


SURVIVES = (
    "  - {kind: better, metric: decode_tok_s}\n  - {kind: survives, cache_states: [warm, cold]}"
)


def test_survives_when_better_in_every_cache_state(tmp_path: Path) -> None:
    verdict = verdict_of(
        tmp_path, SURVIVES, Synth(speed=faster(1.4)), states="[warm, cold]", cycles=2
    )
    better, survives = verdict.gates
    assert better.passed and survives.passed, survives.reason
    assert "better in every state (warm, cold) on decode_tok_s" in survives.reason
    assert set(survives.evidence["decode_tok_s"]) == {"treat/warm", "treat/cold"}


def test_survives_fails_when_better_in_only_one_state(tmp_path: Path) -> None:
    def warm_only(run: Run) -> float:
        boost = run["cell"] == "treat" and run["cache_state"] == "warm"
        return 100.0 * (1.4 if boost else 1.0)

    verdict = verdict_of(
        tmp_path, SURVIVES, Synth(speed=warm_only), states="[warm, cold]", cycles=2
    )
    survives = verdict.gates[1]
    assert not survives.passed
    assert "decode_tok_s treat/cold:" in survives.reason and "within noise" in survives.reason
    assert survives.evidence["decode_tok_s"]["treat/warm"]["label"] == "better"


def test_survives_with_explicit_metrics_and_no_metric(tmp_path: Path) -> None:
    gates = (
        "  - {kind: survives, cache_states: [warm, cold], metrics: [tpot_p50_ms, decode_tok_s]}\n"
        "  - {kind: survives, cache_states: [warm]}"
    )
    verdict = verdict_of(tmp_path, gates, Synth(speed=faster(1.4)), states="[warm, cold]", cycles=2)
    explicit, bare = verdict.gates
    assert explicit.passed, explicit.reason
    assert set(explicit.evidence) == {"tpot_p50_ms", "decode_tok_s"}
    assert not bare.passed and "no metric to check" in bare.reason


# ---- quality -----------------------------------------------------------------------------------


def _fleet(box_a: float, box_b: float) -> Synth:
    """Cycles dealt to two boxes in turn, the cell ``box_a``× faster on box a, ``box_b``× on b."""

    def speed(run: Run) -> float:
        if run["cell"] == "control":
            return 100.0
        return 100.0 * (box_a if run["cycle"] % 2 == 0 else box_b)

    return Synth(speed=speed, box=lambda run: "a" if run["cycle"] % 2 == 0 else "b")


def test_a_fleet_whose_boxes_disagree_fails_better_on_these_boxes_and_is_inconclusive_beyond(
    tmp_path: Path,
) -> None:
    # 20% faster on box a, no faster on box b: the pooled ratio (~1.10) is *better* between
    # cycles, but box b is not, and the interaction test says the boxes differ: not a pass.
    gate = "  - {kind: better, metric: decode_tok_s}"
    fixed = only(verdict_of(tmp_path / "fixed", gate, _fleet(1.20, 1.00), cycles=8))
    assert not fixed.passed and not fixed.undecided
    assert fixed.evidence["treat/warm"]["label"] == "better"
    assert "the effect differs between boxes (a 1.19" in fixed.reason
    assert "box b is not better on its own" in fixed.reason and "boxes: random" in fixed.reason
    # Both boxes better, by different amounts: a difference of size; the pooled label stands.
    sized = only(verdict_of(tmp_path / "sized", gate, _fleet(1.20, 1.04), cycles=8))
    assert sized.passed, sized.reason
    # The pass says which claim it makes: these two boxes, not boxes like them.
    assert "about these 2 boxes, analysis.boxes: fixed" in sized.reason, sized.reason
    # About boxes like these, the interval is between the two boxes (1 df): not decided.
    like = only(verdict_of(tmp_path / "random", gate, _fleet(1.20, 1.00), cycles=8, boxes="random"))
    assert not like.passed and like.undecided
    assert like.evidence["treat/warm"]["label"] == "inconclusive"
    # Boxes that agree pass either way.
    for boxes in ("fixed", "random"):
        agree = only(
            verdict_of(tmp_path / f"agree-{boxes}", gate, _fleet(1.12, 1.12), cycles=8, boxes=boxes)
        )
        assert agree.passed, agree.reason
        claim = "about these 2 boxes" if boxes == "fixed" else "about boxes like these"
        assert claim in agree.reason, agree.reason
