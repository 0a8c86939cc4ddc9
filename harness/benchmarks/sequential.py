"""``harness bench sequential``: what sequential looks cost in errors and save in cycles.

Simulates mirrored campaigns (100,000 per case; 20,000 with ``quick``; seeded) and decides each
at every look of a design that looks after 3 cycles and then after every cycle up to 12, with
the analysis's labels applied to all campaigns at once (:mod:`harness.analyze.design_sim`, whose
labels the tests check against :func:`harness.analyze.stats.compare_cycles`). Blocks carry
boot-to-boot noise (6% per block, as a busy two-core box shows), a random linear drift, and in
one cycle in ten a step of ±10%. Side by side, in the same run:

- **A/A**: one-sided false *better* at the t-calibrated levels with the carry-over check (the
  analysis as it is; must be ≤ α/2), beside D̄ alone (no carry-over check) at the t-calibrated
  levels, at the normal-theory levels they replaced, and naively peeking at a fixed α;
- **A/A with 3% carry-over** (a control block right after a candidate block runs 3% slower):
  false *better* as analysed (≤ α/2), beside the decision without the crossover model's check;
- **+10%**: power and mean cycles, beside a fixed design of the cycles that gives the same
  power (found by simulation on the same noise).

A campaign stops at the first look where its one metric is decided (better, worse or within
noise), as the sequential loop does with every gated metric.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats as sps

from harness.analyze.cycles import margin_log
from harness.analyze.design_sim import BETTER, CARRY, WORSE, Scenario, run_looks, simulate_blocks
from harness.analyze.sequential import SequentialPlan, boundaries
from harness.benchmarks import Figure

FIRST, MAX = 3, 12
ALPHA = 0.05
MARGIN = margin_log(2.0)
NOISE = {"block_sd": 0.06, "drift_sd": 0.005, "step": 0.10, "step_chance": 0.1}
CARRY_OVER = math.log(0.97)
EFFECT = math.log(1.10)
SEED = 2026


def run_bench(quick: bool = False) -> list[Figure]:
    """Simulate the cases and report error rates, power and cycles, side by side."""
    n = 20_000 if quick else 100_000
    design = SequentialPlan(FIRST, MAX, 1, ALPHA)
    looks = design.scheduled()
    t_level = {m: design.nominal_alpha(m) for m in looks}
    fractions = tuple(m / MAX for m in looks)
    normal_level = {
        m: float(2.0 * sps.norm.sf(c))
        for m, c in zip(looks, boundaries(fractions, ALPHA), strict=True)
    }

    def blocks(seed: int, scenario: Scenario) -> np.ndarray:
        return simulate_blocks(np.random.default_rng(seed), n, MAX, scenario)

    null = blocks(SEED, Scenario(**NOISE))
    carried = blocks(SEED + 1, Scenario(carry_control=CARRY_OVER, **NOISE))
    real = blocks(SEED + 2, Scenario(effect=EFFECT, **NOISE))

    def rate(codes: np.ndarray, code: int) -> float:
        return float((codes == code).mean())

    seq_null, null_used = run_looks(null, looks, t_level.__getitem__, MARGIN)
    # D̄ alone (no carry-over check): what the look levels themselves spend.
    t_alone, _ = run_looks(null, looks, t_level.__getitem__, MARGIN, carry_check=False)
    normal_null, _ = run_looks(null, looks, normal_level.__getitem__, MARGIN, carry_check=False)
    naive_null, _ = run_looks(null, looks, lambda m: ALPHA, MARGIN, carry_check=False)
    seq_carry, _ = run_looks(carried, looks, t_level.__getitem__, MARGIN)
    old_carry, _ = run_looks(carried, looks, normal_level.__getitem__, MARGIN, carry_check=False)
    seq_real, real_used = run_looks(real, looks, t_level.__getitem__, MARGIN)
    alone_real, alone_used = run_looks(real, looks, t_level.__getitem__, MARGIN, carry_check=False)
    power = rate(seq_real, BETTER)
    cycles_used = float(real_used.mean())
    fixed_m, fixed_power = MAX, 0.0
    for m in range(FIRST, 2 * MAX + 1):
        longer = simulate_blocks(
            np.random.default_rng(SEED + 3), n, m, Scenario(effect=EFFECT, **NOISE)
        )
        codes, _ = run_looks(longer, [m], lambda _: ALPHA, MARGIN)
        fixed_m, fixed_power = m, rate(codes, BETTER)
        if fixed_power >= power:
            break
    half = ALPHA / 2
    se = math.sqrt(half * (1 - half) / n) * 100
    seq_better = rate(seq_null, BETTER)
    carry_better = rate(seq_carry, BETTER)
    return [
        Figure(
            "A/A false better, sequential",
            seq_better * 100,
            "%",
            f"{n} campaigns, looks at {FIRST}..{MAX} cycles (MC SE {se:.2f} points)",
            f"<= {half * 100:.1f}%",
            seq_better <= half,
        ),
        Figure("A/A false worse, sequential", rate(seq_null, WORSE) * 100, "%", "same campaigns"),
        Figure(
            "A/A false better, D̄ alone, t-calibrated levels",
            rate(t_alone, BETTER) * 100,
            "%",
            "without the carry-over check",
        ),
        Figure(
            "A/A false better, D̄ alone, normal-theory levels",
            rate(normal_null, BETTER) * 100,
            "%",
            "the boundaries before t calibration",
        ),
        Figure(
            "A/A false better, D̄ alone, naive peeking",
            rate(naive_null, BETTER) * 100,
            "%",
            "α each look",
        ),
        Figure("A/A mean cycles, sequential", float(null_used.mean()), "cycles"),
        Figure(
            "A/A + 3% carry-over, false better",
            carry_better * 100,
            "%",
            "control block after a candidate block 3% slower",
            f"<= {half * 100:.1f}%",
            carry_better <= half,
        ),
        Figure(
            "A/A + 3% carry-over, labelled carry-over",
            rate(seq_carry, CARRY) * 100,
            "%",
            "at the campaign's last look",
        ),
        Figure(
            "A/A + 3% carry-over, false better without the model",
            rate(old_carry, BETTER) * 100,
            "%",
            "D̄ alone at normal-theory levels (the decision before)",
        ),
        Figure("+10% power, sequential", power * 100, "%", f"max {MAX} cycles"),
        Figure("+10% mean cycles, sequential", cycles_used, "cycles"),
        Figure(
            "+10% power, D̄ alone",
            rate(alone_real, BETTER) * 100,
            "%",
            f"no carry-over check, mean {float(alone_used.mean()):.2f} cycles",
        ),
        Figure("fixed design of equal power", float(fixed_m), "cycles", "simulated, same noise"),
        Figure("+10% power, that fixed design", fixed_power * 100, "%", "simulated"),
        Figure(
            "sequential ÷ fixed cycles",
            cycles_used / fixed_m,
            "x",
            f"fixed {fixed_m} cycles",
            "< 1",
            cycles_used < fixed_m,
        ),
    ]
