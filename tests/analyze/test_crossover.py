"""The crossover model (harness.analyze.crossover) and the vectorised labels that simulate it."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from harness.analyze.crossover import MIN_CARRY_CYCLES, design_matrix, fit_arm_many, fit_crossover
from harness.analyze.cycles import Cycle
from harness.analyze.design_sim import (
    CODES,
    Scenario,
    decide_many,
    order_of,
    simulate_blocks,
)
from harness.analyze.stats import CARRY_OVER, carry_over_explains, compare_cycles


def _cycles(blocks: np.ndarray) -> list[Cycle]:
    m = blocks.size // 4
    return [Cycle(j, order_of(j), tuple(blocks[4 * j : 4 * j + 4])) for j in range(m)]  # type: ignore[arg-type]


@pytest.mark.parametrize("m", range(MIN_CARRY_CYCLES, 17))
def test_carry_over_is_not_aliased_with_the_arm_in_the_abba_baab_alternation(m: int) -> None:
    design = design_matrix([Cycle(j, order_of(j), (0.0, 0.0, 0.0, 0.0)) for j in range(m)])
    x = design.matrix
    assert design.carry_cols is not None
    assert np.linalg.matrix_rank(x) == x.shape[1] == 2 * m + 3  # every term estimable
    assert x.shape[0] - x.shape[1] == 2 * m - 3  # the residual df docs/design.md states
    # Not aliased, but correlated: τ̂'s variance over D̄'s (σ²/m) is bounded, never ∞.
    inflation = float(np.linalg.inv(x.T @ x)[m, m]) * m
    assert 1.0 < inflation < 3.5


def test_too_few_cycles_leave_carry_over_out() -> None:
    two = [Cycle(j, order_of(j), (0.0, 0.1, 0.2, 0.3)) for j in range(2)]
    fit = fit_crossover(two)
    assert fit is not None and fit.carry_control is None and fit.df == 8 - 5


def test_the_fit_recovers_every_term_from_noise_free_blocks() -> None:
    tau, beta, c_a, c_b = 0.05, 0.01, -0.03, 0.02
    levels = [0.0, 0.2, -0.1, 0.05, 0.3, 0.1]
    scenario = Scenario(effect=tau, block_sd=0.0, carry_control=c_a, carry_candidate=c_b)
    blocks = simulate_blocks(np.random.default_rng(0), 1, 6, scenario)[0] - 4.0
    for j, level in enumerate(levels):
        blocks[4 * j : 4 * j + 4] += level + beta * np.array([-1.5, -0.5, 0.5, 1.5])
    fit = fit_crossover(_cycles(blocks))
    assert fit is not None and fit.carry_control is not None and fit.carry_candidate is not None
    assert fit.arm.estimate == pytest.approx(tau, abs=1e-12)
    assert fit.trend.estimate == pytest.approx(beta, abs=1e-12)
    assert fit.carry_control.estimate == pytest.approx(c_a, abs=1e-12)
    assert fit.carry_candidate.estimate == pytest.approx(c_b, abs=1e-12)
    assert fit.residual_sd == pytest.approx(0.0, abs=1e-12)
    # D̄ carries the bias the model removes: −¾·c_A + ¼·c_B in the back-to-back alternation
    # (the first cycle's first block has no block before it, hence not exactly).
    plain = float(np.mean([c.effect for c in _cycles(blocks)]))
    assert plain - tau == pytest.approx(-0.75 * c_a + 0.25 * c_b, abs=0.01)


def test_fit_arm_many_matches_the_single_fit() -> None:
    blocks = simulate_blocks(np.random.default_rng(1), 5, 7, Scenario(block_sd=0.05))
    design = _cycles(blocks[0])
    many = fit_arm_many(design, blocks)
    assert many is not None
    for row in range(5):
        one = fit_crossover(_cycles(blocks[row]))
        assert one is not None
        assert many.estimate[row] == pytest.approx(one.arm.estimate, rel=1e-9)
        assert many.se[row] == pytest.approx(one.arm.se, rel=1e-9)
        assert many.df == one.df


def test_vectorised_labels_match_compare_cycles_campaign_by_campaign() -> None:
    # The scenario: 6 cycles, 2% block noise, no effect, a control block after a
    # candidate block 3% slower; both paths must give every campaign the same label.
    scenario = Scenario(block_sd=0.02, carry_control=math.log(0.97))
    blocks = simulate_blocks(np.random.default_rng(3), 200, 6, scenario)
    codes = decide_many(blocks, math.log1p(0.02), 0.05)
    for row in range(blocks.shape[0]):
        c = compare_cycles(_cycles(blocks[row]), metric="decode_tok_s", bootstrap_resamples=0)
        carried = carry_over_explains(c.raw_label, c.mean_log_effect, c.model)
        assert (CARRY_OVER if carried else c.raw_label) == CODES[int(codes[row])]


def _shared(cycles: list[Cycle]) -> list[Cycle]:
    return [replace(c, shared_boot=True) for c in cycles]


def test_on_a_shared_boot_a_label_carry_over_could_explain_unseen_fails_closed() -> None:
    # Two cycles, B clearly 10% faster, each block ±0.5%: decided on boots of their own (with
    # the warning that it assumes no carry-over); on shared boots the model cannot estimate the
    # carry-over the design invites from 2 cycles, so the label is *carry-over*, and 3 needed.
    rng = np.random.default_rng(5)
    blocks = simulate_blocks(rng, 1, 2, Scenario(effect=math.log(1.1), block_sd=0.005))[0]
    own = compare_cycles(_cycles(blocks), metric="decode_tok_s", bootstrap_resamples=0)
    assert own.label == "better" and any("assumes none" in w for w in own.warnings)
    shared = compare_cycles(_shared(_cycles(blocks)), metric="decode_tok_s", bootstrap_resamples=0)
    assert shared.raw_label == "better" and shared.label == CARRY_OVER
    assert shared.carry_over_explains and (shared.cycles_needed or 0) >= MIN_CARRY_CYCLES
    assert any("shared a boot" in w and "cannot estimate" in w for w in shared.warnings)
    assert not any("assumes none" in w for w in shared.warnings)
    # From 3 cycles the model estimates it, finds none to speak of, and the label stands.
    three = simulate_blocks(rng, 1, 3, Scenario(effect=math.log(1.1), block_sd=0.005))[0]
    decided = compare_cycles(_shared(_cycles(three)), metric="decode_tok_s", bootstrap_resamples=0)
    assert decided.label == "better", decided.warnings


def test_a_deterministic_counter_on_a_shared_boot_rules_carry_over_out_exactly() -> None:
    # A hit rate that each arm reads identically in both its blocks, whichever arm came first:
    # no carry-over, exactly, and the label stands from 2 cycles.
    a, b = math.log(0.80), math.log(0.88)
    steady = [Cycle(0, "ABBA", (a, b, b, a)), Cycle(1, "BAAB", (b, a, a, b))]
    ok = compare_cycles(
        _shared(steady), metric="hit_rate", drift_sensitive=False, bootstrap_resamples=0
    )
    assert ok.label == "better", ok.warnings
    assert any("show no carry-over" in w for w in ok.warnings)
    # The control reads lower after a candidate block: carry-over, and it fails closed.
    c = math.log(0.99)
    carried = [Cycle(0, "ABBA", (a, b, b, a + c)), Cycle(1, "BAAB", (b, a + c, a, b))]
    closed = compare_cycles(
        _shared(carried), metric="hit_rate", drift_sensitive=False, bootstrap_resamples=0
    )
    assert closed.raw_label == "better" and closed.label == CARRY_OVER
