"""The soak and lockstep gates: ring records, inter-token p99, RSS, divergent decisions.

Campaigns are built on disk by :mod:`tests.gate.campaigns` and gated without booting anything.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.analyze.campaign import analyze_campaign
from harness.errors import RecordError
from harness.formats.records import (
    write_json_atomic,
)
from harness.gate.evaluate import GateResult, evaluate_gates
from tests.campaign_dirs import start_with
from tests.gate.campaigns import (
    Run,
    Synth,
    build_campaign,
    card_text,
    only,
    verdict_of,
)


def _soak(root: Path, gate: str, synth: Synth) -> GateResult:
    text = card_text(f"  - {gate}", cycles=1, cells=("soak",), order="sequential")
    campaign = build_campaign(root, text, synth)
    return only(evaluate_gates(analyze_campaign(campaign.root)))


def _ring(steps: int = 601, capacity: int = 4096, spike_ms: float = 5.0) -> Synth:
    return Synth(ring=lambda run: (steps, capacity, spike_ms))


def test_soak_passes(tmp_path: Path) -> None:
    result = _soak(tmp_path, "{kind: soak, min_duration_s: 60, itl_p99_ms_max: 6}", _ring())
    assert result.passed, result.reason
    run = result.evidence["0000-soak-c0-warm-s0-r0"]
    assert run["duration_s"] == pytest.approx(60.005)
    assert run["lost_ring_records"] == 0 and run["itl_p99_ms"] == pytest.approx(5.0)


def test_soak_too_short_fails(tmp_path: Path) -> None:
    result = _soak(tmp_path, "{kind: soak, min_duration_s: 90}", _ring())
    assert not result.passed
    assert result.reason == "0000-soak-c0-warm-s0-r0: ran 60 s of 90 s"


def test_soak_lost_ring_records_fail(tmp_path: Path) -> None:
    # A 500-slot ring written 601 times: 101 records were overwritten before anyone read them.
    result = _soak(tmp_path, "{kind: soak, min_duration_s: 40}", _ring(capacity=500))
    assert not result.passed
    assert result.reason == "0000-soak-c0-warm-s0-r0: 101 ring records lost"
    loose = _soak(
        tmp_path / "b",
        "{kind: soak, min_duration_s: 40, max_lost_records: 101}",
        _ring(capacity=500),
    )
    assert loose.passed, loose.reason


def test_soak_inter_token_p99_over_bound_fails(tmp_path: Path) -> None:
    # 601 steps of 5 ms but eight of 80 ms: p99 (linear interpolation) lands on the slow ones.
    def ring(run: Run) -> tuple[int, int, float]:
        return (601, 4096, 80.0)

    within = _soak(tmp_path / "a", "{kind: soak, min_duration_s: 60, itl_p99_ms_max: 6}",
                   Synth(ring=ring))  # fmt: skip
    # One spike is under the 1% tail, so p99 stays at 5 ms.
    assert within.passed, within.reason
    slow = _soak(
        tmp_path / "b", "{kind: soak, min_duration_s: 60, itl_p99_ms_max: 4}", Synth(ring=ring)
    )
    assert not slow.passed
    assert slow.reason == "0000-soak-c0-warm-s0-r0: inter-token p99 5.00 ms > 4 ms"


def test_soak_without_a_ring_or_rss_fails_closed(tmp_path: Path) -> None:
    # run.json spans 8 s and says 0 records lost; neither is evidence without the ring (the span
    # includes the boot, and nothing counted the losses).
    for gate in (
        "{kind: soak, min_duration_s: 5}",
        "{kind: soak, min_duration_s: 5, itl_p99_ms_max: 50}",
    ):
        no_ring = _soak(tmp_path / gate[-3:-1], gate, Synth())
        assert not no_ring.passed and not no_ring.incomplete
        assert no_ring.reason == (
            "0000-soak-c0-warm-s0-r0: no ring records: duration, lost records and inter-token "
            "p99 cannot be shown (the runtime's ring was not collected)"
        )
        assert no_ring.evidence["0000-soak-c0-warm-s0-r0"]["duration_s"] is None
    rss = _soak(tmp_path / "b", "{kind: soak, min_duration_s: 5, rss_growth_pct_max: 10}", _ring())
    assert not rss.passed
    assert "RSS was not sampled, so growth cannot be bounded" in rss.reason


@pytest.mark.parametrize("status", ["failed", None])
def test_soak_that_crashed_or_never_ran_fails(tmp_path: Path, status: str | None) -> None:
    result = _soak(tmp_path, "{kind: soak, min_duration_s: 5}", Synth(status=lambda run: status))
    assert not result.passed
    assert result.reason.startswith(f"0000-soak-c0-warm-s0-r0: {status or 'missing'}: ")


# ---- lockstep ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("gate", "divergent", "passed"),
    [
        ("{kind: lockstep}", 0, True),
        ("{kind: lockstep}", 3, False),
        ("{kind: lockstep, max_divergent: 3}", 3, True),
        ("{kind: lockstep, max_divergent: 2}", 3, False),
    ],
)
def test_lockstep(tmp_path: Path, gate: str, divergent: int, passed: bool) -> None:
    campaign = build_campaign(tmp_path, card_text(f"  - {gate}", cycles=1), Synth())
    write_json_atomic(campaign.root / "lockstep.json", {"decisions": 900, "divergent": divergent})
    result = only(evaluate_gates(analyze_campaign(campaign.root)))
    assert result.passed is passed
    assert result.reason == f"900 decisions, {divergent} divergent"


def test_lockstep_fails_closed_without_a_result(tmp_path: Path) -> None:
    result = only(verdict_of(tmp_path, "  - {kind: lockstep}", cycles=1))
    assert not result.passed
    assert "no lockstep result" in result.reason and "harness simulate --lockstep" in result.reason


@pytest.mark.parametrize("divergent", [None, "3", True, 2.5])
def test_a_damaged_lockstep_record_is_bad_input_not_a_gate_result(
    tmp_path: Path, divergent: object
) -> None:
    campaign = build_campaign(tmp_path, card_text("  - {kind: lockstep}", cycles=1), Synth())
    result = {"decisions": 900} | ({} if divergent is None else {"divergent": divergent})
    write_json_atomic(campaign.root / "lockstep.json", result)
    with pytest.raises(RecordError, match=r"lockstep\.json: `divergent` must be a count"):
        evaluate_gates(analyze_campaign(campaign.root))


def test_a_damaged_quality_record_names_its_field(tmp_path: Path) -> None:
    campaign = build_campaign(tmp_path, card_text("  - {kind: quality, min_pass: 1}"), Synth())
    start_with(campaign.root, "quality.json", {"prompts": [{"check": {}}]})
    with pytest.raises(RecordError, match=r"quality\.json: `prompts` must be a list"):
        evaluate_gates(analyze_campaign(campaign.root))


# ---- verdict, JUnit and the CLI ------------------------------------------------------------------
