"""Extreme input to the statistics gets a label, never an exception (issue 54).

A sequential card's first look at 2 cycles decides at a tiny nominal level (t on one df), so a
noisy box's interval reaches past the largest float on the ratio scale: that bound is
``math.inf``, the label stands on the log scale, and every renderer prints "∞".
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from harness.analyze.compare import CellComparison, comparison_rows
from harness.catalog import METRICS
from harness.stats.cycles import Cycle, interval_text, log_to_ratio, margin_log
from harness.stats.decision import Comparison, compare_cycles
from harness.stats.labels import Label
from harness.stats.power import cycles_to_decide, needed_range
from harness.stats.sequential import SequentialPlan

PROMPTS = np.array([0.0, -0.07, 0.08, -0.03])  # aligned prompt effects, mean 0.005
SPREAD = (1.0, -1.3, 0.4, -0.2)  # each cycle's effect is effect + sd·SPREAD[j]


def _cycles(
    m: int, effect: float, sd: float, *, prompts: bool = True, identical: bool = False
) -> list[Cycle]:
    """m alternating cycles whose effects are effect + sd·SPREAD[j] (log scale), with aligned
    per-prompt logs (all equal with ``identical``) or block means only."""
    out = []
    for j in range(m):
        order = "ABBA" if j % 2 == 0 else "BAAB"
        offsets = np.zeros(4) if identical else PROMPTS - PROMPTS.mean()
        logs = tuple(
            4.0 + (effect + sd * SPREAD[j] if arm == "B" else 0.0) + offsets for arm in order
        )
        y = tuple(float(block.mean()) for block in logs)
        out.append(Cycle(j, order, (y[0], y[1], y[2], y[3]), logs if prompts else None, prompts))
    return out


def test_a_first_look_at_two_noisy_cycles_is_inconclusive_not_an_overflow() -> None:
    # The audit's card: a real positive effect on a noisy box, first look at 2 cycles. Its
    # interval's upper end, exp(D̄ + t(1 − 0.00025, 1 df)·SE) = exp(~1600), has no float.
    cycles = _cycles(2, effect=1.5, sd=1.0)
    c = compare_cycles(cycles, metric="decode_tok_s", alpha=0.0005, bootstrap_resamples=200)
    assert c.label == Label.INCONCLUSIVE
    assert c.ci_low is not None and c.ci_high == math.inf
    assert 0.0 <= c.ci_low < 1.0 < c.ratio
    assert c.tost_ci is not None and c.tost_ci[1] == math.inf
    assert interval_text(c.ci_low, c.ci_high) == "[0.000, ∞]"
    row = comparison_rows([CellComparison("treat", "control", "warm", c, ())])[0]
    assert row["ci_high"] is None  # JSON holds numbers: null, and "∞" where it is printed
    assert interval_text(row["ci_low"], row["ci_high"]) == "[0.000, ∞]"
    json.dumps(row, allow_nan=False)


def test_a_ratio_past_the_largest_float_is_infinite() -> None:
    assert log_to_ratio(0.0) == 1.0
    assert log_to_ratio(710.0) == math.inf
    assert log_to_ratio(-1e6) == 0.0
    assert interval_text(None, None) == "no interval"
    assert interval_text(float("nan"), None, "none") == "none"
    assert interval_text(0.912, 1.1264) == "[0.912, 1.126]"


@pytest.mark.parametrize("mean", [5.0, 0.01])
def test_cycles_needed_for_a_spread_past_any_float_is_the_search_cap(mean: float) -> None:
    # (z·s/Δ)² once raised OverflowError for an SD of 1e200 (log): float ** overflows.
    delta = margin_log(2.0)
    assert cycles_to_decide(1e200, mean, delta, 0.0005) == 100_000
    assert needed_range(100_000, 1e200, mean, delta, 0.0005, 3) is not None


# --- every float of a comparison over hostile input ------------------------------------------

# name: (metric, effect, sd, prompts, identical). bytes_read is deterministic (drift-proof, an
# exact zero-width interval where every cycle agrees); decode_tok_s is timed.
CASES = {
    "noisy-better": ("decode_tok_s", 5.0, 3.0, True, False),
    "noisy-worse": ("decode_tok_s", -5.0, 3.0, True, False),
    "huge-sd": ("decode_tok_s", 0.5, 1e6, False, False),
    "no-spread-prompts": ("decode_tok_s", 5.0, 0.0, True, False),
    "no-spread-summary": ("decode_tok_s", -5.0, 0.0, False, False),
    "identical-blocks": ("decode_tok_s", 0.0, 0.0, True, True),
    "rounding": ("decode_tok_s", 1e-12, 1e-13, True, False),
    "exact-counter": ("bytes_read", -5.0, 0.0, False, False),
}
SEQUENTIAL = SequentialPlan(2, 12, 1, 0.05)


def _ratio_ok(value: float | None) -> bool:
    """None, or a ratio in [0, ∞] (inf past the largest float; never NaN)."""
    return value is None or value >= 0.0


def _check(c: Comparison) -> None:
    assert isinstance(c.label, Label) and isinstance(c.raw_label, Label)
    ratios = [c.ratio, c.ci_low, c.ci_high, c.pair_ratio, c.control_level, c.cell_level]
    for pair in (c.bootstrap_ci, c.tost_ci):
        ratios.extend(pair or ())
    assert all(_ratio_ok(v) for v in ratios), ratios
    assert math.isfinite(c.mean_log_effect) and math.isfinite(c.drift_bias)
    assert c.sd_log_effect is None or math.isfinite(c.sd_log_effect)
    for p in (c.p_value, c.wilcoxon_p):
        assert p is None or 0.0 <= p <= 1.0
    assert c.cycles_needed is None or c.cycles_needed >= 1
    if c.ci_low is not None:
        assert c.ci_high is not None and c.ci_low <= c.ratio <= c.ci_high
        if c.ci_low < 1.0 < c.ci_high:  # an interval that holds 1 claims no difference
            assert not c.raw_label.claims_a_difference
    assert "inf" not in interval_text(c.ci_low, c.ci_high)
    _ = (c.needed_text, c.reason)  # the words are built without raising
    rows = comparison_rows([CellComparison("treat", "control", "warm", c, ())])
    json.dumps(rows, allow_nan=False)


@pytest.mark.parametrize("sequential", [None, SEQUENTIAL], ids=["fixed", "sequential"])
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("alpha", [0.0001, 0.0005, 0.05, 0.2])
@pytest.mark.parametrize("m", [2, 3, 4])
def test_hostile_comparisons_get_a_label(
    m: int, alpha: float, case: str, sequential: SequentialPlan | None
) -> None:
    metric, effect, sd, prompts, identical = CASES[case]
    cycles = _cycles(m, effect, sd, prompts=prompts, identical=identical)
    info = METRICS[metric]
    c = compare_cycles(
        cycles, metric=metric, alpha=alpha, sequential=sequential, bootstrap_resamples=200,
        higher_is_better=info.higher_is_better, drift_sensitive=not info.deterministic,
    )  # fmt: skip
    _check(c)
    if m == 2 and "noisy" in case and alpha <= 0.0005:
        assert c.ci_high == math.inf and c.label == Label.INCONCLUSIVE


@pytest.mark.parametrize("m", [2, 3, 4])
def test_hostile_comparisons_between_boxes_get_a_label(m: int) -> None:
    cycles = [
        Cycle(c.index, c.order, c.y, c.prompt_logs, c.prompts_aligned, box=f"box{c.index % 2}")
        for c in _cycles(m, 5.0, 3.0)
    ]
    c = compare_cycles(
        cycles, metric="decode_tok_s", alpha=0.0005, boxes="random", bootstrap_resamples=200
    )
    _check(c)
